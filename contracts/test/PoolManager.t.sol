// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Vm} from "./utils/Test.sol";
import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {PoolManager} from "../src/PoolManager.sol";

contract PoolManagerTest is Fixture {
    uint256 internal poolId;
    address internal node1;
    address internal node2;

    function setUp() public override {
        super.setUp();
        poolId = _createActivePool();
        _registerProvider(ALICE, 200e18);
        node1 = _addNode(ALICE, NODE1_PK, 1);
        node2 = _addNode(ALICE, NODE2_PK, 1);
    }

    function _status(uint256 id) internal view returns (PoolManager.Status) {
        return pools.getPool(id).status;
    }

    // ------------------------------------------------------------------ constructor

    function test_constructor() public view {
        assertEq(address(pools.registry()), address(registry));
        assertEq(uint256(pools.DEFAULT_VALIDATION_WINDOW()), 24 hours);
        assertEq(pools.INVITE_TYPEHASH(), keccak256("Invite(uint256 poolId,address node,uint256 nonce,uint64 expiry)"));
    }

    function test_constructor_revertsOnZeroRegistry() public {
        vm.expectRevert(PoolManager.ZeroAddress.selector);
        new PoolManager(ProviderRegistry(address(0)));
    }

    // ------------------------------------------------------------------ createPool

    function test_createPool() public {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = 3 hours;
        p.rewardRate = 5;
        p.slashAmount = 6;
        p.minStake = 7;
        vm.warp(777);
        vm.expectEmit(true, true, true, true, address(pools));
        emit PoolManager.PoolCreated(2, POOL_OWNER, COORD, SPEC_URI, SPEC_HASH, 5, 3 hours, 6, 7);
        vm.expectEmit(true, false, false, true, address(pools));
        emit PoolManager.BootstrapUpdated(2, BOOTSTRAP);
        uint256 id = _createPool(p);
        assertEq(id, 2);
        assertEq(pools.poolCount(), 2);

        PoolManager.Pool memory pool = pools.getPool(id);
        assertEq(pool.owner, POOL_OWNER);
        assertTrue(pool.status == PoolManager.Status.Created);
        assertEq(uint256(pool.validationWindow), 3 hours);
        assertEq(pool.coordinator, COORD);
        assertEq(uint256(pool.members), 0);
        assertEq(uint256(pool.createdAt), 777);
        assertEq(uint256(pool.rewardRate), 5);
        assertEq(uint256(pool.slashAmount), 6);
        assertEq(pool.minStake, 7);
        assertEq(pool.specHash, SPEC_HASH);
        assertEq(pool.specURI, SPEC_URI);
        assertEq(pool.bootstrap, BOOTSTRAP);
    }

    function test_createPool_zeroWindowMeansDefaultAndEmptyBootstrapEmitsNothing() public {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = 0;
        p.bootstrap = "";
        vm.recordLogs();
        vm.prank(POOL_OWNER);
        uint256 id = pools.createPool(p);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        assertEq(logs.length, 2);
        assertEq(logs[0].topics[0], PoolManager.PoolCreated.selector);
        // The default dispute terms: one day to appeal, one to vote, committees of three, bond = slash.
        assertEq(logs[1].topics[0], PoolManager.DisputeTermsSet.selector);
        PoolManager.DisputeTerms memory d = pools.disputeTerms(id);
        assertEq(uint256(d.appealPeriod), 1 days);
        assertEq(uint256(d.votePeriod), 1 days);
        assertEq(uint256(d.committeeSize), 3);
        assertEq(uint256(d.bond), uint256(SLASH));
        assertEq(d.arbiter, address(0));
        assertEq(uint256(pools.getPool(id).validationWindow), 24 hours);
        assertEq(uint256(pools.poolTerms(id).validationWindow), 24 hours);
    }

    function test_createPool_revertsOnZeroCoordinator() public {
        PoolManager.PoolParams memory p = _params();
        p.coordinator = address(0);
        vm.expectRevert(PoolManager.ZeroAddress.selector);
        vm.prank(POOL_OWNER);
        pools.createPool(p);
    }

    // ------------------------------------------------------------------ startPool / endPool

    function test_startPool() public {
        uint256 id = _createPool(_params());
        vm.expectEmit(true, false, false, true, address(pools));
        emit PoolManager.PoolStarted(id);
        vm.prank(POOL_OWNER);
        pools.startPool(id);
        assertTrue(_status(id) == PoolManager.Status.Active);
    }

    function test_startPool_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownPool.selector, 99));
        vm.prank(POOL_OWNER);
        pools.startPool(99);
    }

    function test_startPool_revertsForNonOwner() public {
        uint256 id = _createPool(_params());
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolOwner.selector, id, COORD));
        vm.prank(COORD);
        pools.startPool(id);
    }

    function test_startPool_revertsWhenActive() public {
        vm.expectRevert(
            abi.encodeWithSelector(
                PoolManager.WrongPoolStatus.selector, poolId, PoolManager.Status.Active, PoolManager.Status.Created
            )
        );
        vm.prank(POOL_OWNER);
        pools.startPool(poolId);
    }

    function test_startPool_revertsWhenEnded() public {
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        vm.expectRevert(
            abi.encodeWithSelector(
                PoolManager.WrongPoolStatus.selector, poolId, PoolManager.Status.Ended, PoolManager.Status.Created
            )
        );
        vm.prank(POOL_OWNER);
        pools.startPool(poolId);
    }

    function test_endPool_fromActive() public {
        vm.expectEmit(true, false, false, true, address(pools));
        emit PoolManager.PoolEnded(poolId);
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        assertTrue(_status(poolId) == PoolManager.Status.Ended);
    }

    function test_endPool_fromCreated() public {
        uint256 id = _createPool(_params());
        vm.prank(POOL_OWNER);
        pools.endPool(id);
        assertTrue(_status(id) == PoolManager.Status.Ended);
    }

    function test_endPool_revertsWhenEnded() public {
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        vm.expectRevert(
            abi.encodeWithSelector(
                PoolManager.WrongPoolStatus.selector, poolId, PoolManager.Status.Ended, PoolManager.Status.Active
            )
        );
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
    }

    function test_endPool_revertsForNonOwner() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolOwner.selector, poolId, ALICE));
        vm.prank(ALICE);
        pools.endPool(poolId);
    }

    function test_endPool_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownPool.selector, 0));
        vm.prank(POOL_OWNER);
        pools.endPool(0);
    }

    // ------------------------------------------------------------------ setBootstrap

    function test_setBootstrap() public {
        vm.expectEmit(true, false, false, true, address(pools));
        emit PoolManager.BootstrapUpdated(poolId, "/dns4/boot.example/tcp/4001");
        vm.prank(POOL_OWNER);
        pools.setBootstrap(poolId, "/dns4/boot.example/tcp/4001");
        assertEq(pools.getPool(poolId).bootstrap, "/dns4/boot.example/tcp/4001");
    }

    function test_setBootstrap_revertsForNonOwner() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolOwner.selector, poolId, COORD));
        vm.prank(COORD);
        pools.setBootstrap(poolId, "x");
    }

    function test_setBootstrap_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownPool.selector, 5));
        vm.prank(POOL_OWNER);
        pools.setBootstrap(5, "x");
    }

    // ------------------------------------------------------------------ joinPool

    function test_joinPool() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 42, expiry);
        vm.warp(block.timestamp + 10);
        vm.expectEmit(true, true, true, true, address(pools));
        emit PoolManager.NodeJoined(poolId, node1, ALICE, 42);
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 42, expiry, sig);

        assertEq(pools.poolOf(node1), poolId);
        assertTrue(pools.isMember(poolId, node1));
        assertFalse(pools.isMember(poolId, node2));
        assertTrue(pools.isInviteUsed(poolId, 42));
        assertFalse(pools.isInviteUsed(poolId, 43));
        assertEq(uint256(pools.getPool(poolId).members), 1);
        PoolManager.Membership memory m = pools.membershipOf(node1);
        assertEq(uint256(m.poolId), poolId);
        assertEq(uint256(m.joinedAt), block.timestamp);
    }

    function test_joinPool_revertsForUnknownPool() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownPool.selector, 9));
        vm.prank(ALICE);
        pools.joinPool(9, node1, 1, expiry, "");
    }

    function test_joinPool_revertsWhenPoolNotStarted() public {
        uint256 id = _createPool(_params());
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, id, node1, 1, expiry);
        vm.expectRevert(
            abi.encodeWithSelector(
                PoolManager.WrongPoolStatus.selector, id, PoolManager.Status.Created, PoolManager.Status.Active
            )
        );
        vm.prank(ALICE);
        pools.joinPool(id, node1, 1, expiry, sig);
    }

    function test_joinPool_revertsWhenPoolEnded() public {
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 1, expiry);
        vm.expectRevert(
            abi.encodeWithSelector(
                PoolManager.WrongPoolStatus.selector, poolId, PoolManager.Status.Ended, PoolManager.Status.Active
            )
        );
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
    }

    function test_joinPool_revertsAtExpiry() public {
        vm.warp(10_000);
        uint64 expiry = 10_000;
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 1, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.InviteExpired.selector, expiry, uint64(10_000)));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
        // One second earlier it would have been fine.
        vm.warp(9_999);
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
        assertEq(pools.poolOf(node1), poolId);
    }

    function test_joinPool_revertsWhenInviteReused() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 5, expiry);
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 5, expiry, sig);
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        // Same invite again (and the same nonce for another node) is refused.
        vm.expectRevert(abi.encodeWithSelector(PoolManager.InviteAlreadyUsed.selector, poolId, 5));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 5, expiry, sig);
        bytes memory sig2 = _inviteSig(COORD_PK, poolId, node2, 5, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.InviteAlreadyUsed.selector, poolId, 5));
        vm.prank(ALICE);
        pools.joinPool(poolId, node2, 5, expiry, sig2);
    }

    function test_joinPool_revertsForInviteNotByCoordinator() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(OTHER_PK, poolId, node1, 1, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.BadInviteSignature.selector, vm.addr(OTHER_PK), COORD));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
    }

    function test_joinPool_revertsForInviteOfAnotherNode() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 1, expiry);
        address recovered = _recover(pools.inviteDigest(poolId, node2, 1, expiry), sig);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.BadInviteSignature.selector, recovered, COORD));
        vm.prank(ALICE);
        pools.joinPool(poolId, node2, 1, expiry, sig);
    }

    function test_joinPool_revertsForInviteOfAnotherPool() public {
        uint256 other = _createActivePool();
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, other, node1, 1, expiry);
        address recovered = _recover(pools.inviteDigest(poolId, node1, 1, expiry), sig);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.BadInviteSignature.selector, recovered, COORD));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
    }

    function test_joinPool_revertsForTamperedExpiry() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 1, expiry);
        address recovered = _recover(pools.inviteDigest(poolId, node1, 1, expiry + 1 days), sig);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.BadInviteSignature.selector, recovered, COORD));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry + 1 days, sig);
    }

    function test_joinPool_revertsForInviteFromAnotherChain() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 1, expiry);
        vm.chainId(84532);
        address recovered = _recover(pools.inviteDigest(poolId, node1, 1, expiry), sig);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.BadInviteSignature.selector, recovered, COORD));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
    }

    function test_joinPool_revertsForMalformedSignature() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 3));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, hex"010203");
    }

    function test_joinPool_revertsForHighSSignature() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        (bytes memory sig, bytes32 highS) = _highS(_inviteSig(COORD_PK, poolId, node1, 1, expiry));
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, highS));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
        assertFalse(pools.isInviteUsed(poolId, 1));
    }

    function test_joinPool_revertsForUnknownNode() public {
        address node3 = vm.addr(NODE3_PK);
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node3, 1, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownNode.selector, node3));
        vm.prank(ALICE);
        pools.joinPool(poolId, node3, 1, expiry, sig);
    }

    function test_joinPool_revertsForOtherProvider() public {
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 1, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotNodeProvider.selector, node1, BOB));
        vm.prank(BOB);
        pools.joinPool(poolId, node1, 1, expiry, sig);
    }

    function test_joinPool_revertsWhenBlacklisted() public {
        vm.prank(COORD);
        pools.blacklistNode(poolId, node1);
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node1, 1, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.Blacklisted.selector, poolId, node1));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 1, expiry, sig);
    }

    function test_joinPool_revertsWhenAlreadyInAPool() public {
        _join(poolId, ALICE, NODE1_PK);
        uint256 other = _createActivePool();
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, other, node1, 100, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.AlreadyInPool.selector, node1, poolId));
        vm.prank(ALICE);
        pools.joinPool(other, node1, 100, expiry, sig);
        // Also in the same pool.
        sig = _inviteSig(COORD_PK, poolId, node1, 101, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.AlreadyInPool.selector, node1, poolId));
        vm.prank(ALICE);
        pools.joinPool(poolId, node1, 101, expiry, sig);
    }

    function test_joinPool_revertsWhenStakeBelowPoolMinimum() public {
        PoolManager.PoolParams memory p = _params();
        p.minStake = 500e18;
        uint256 id = _createActivePool(p);
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, id, node1, 1, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.StakeTooLow.selector, 200e18, 500e18));
        vm.prank(ALICE);
        pools.joinPool(id, node1, 1, expiry, sig);

        // Staking up to the minimum makes the same invite work.
        _give(ALICE, 300e18);
        vm.prank(ALICE);
        registry.stake(300e18);
        vm.prank(ALICE);
        pools.joinPool(id, node1, 1, expiry, sig);
        assertTrue(pools.isMember(id, node1));
    }

    /// @dev Issue 38: a provider's stake must cover the minimum of every pool its nodes are in (each
    /// pool's minimum is stake that pool alone can slash); a pool's minimum counts once however many
    /// of the provider's nodes are in it, and leaves the floor with the last of them.
    function test_joinPool_stakeMustCoverTheSumOfThePoolsMinimums() public {
        _join(poolId, ALICE, NODE1_PK);
        assertEq(pools.stakeFloor(ALICE), POOL_MIN_STAKE);
        _join(poolId, ALICE, NODE2_PK);
        assertEq(pools.stakeFloor(ALICE), POOL_MIN_STAKE, "one pool, one minimum");
        PoolManager.PoolParams memory p = _params();
        p.minStake = 150e18;
        uint256 id = _createActivePool(p);
        address node3 = _addNode(ALICE, NODE3_PK, 1);
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, id, node3, 1, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.StakeTooLow.selector, 200e18, 250e18));
        vm.prank(ALICE);
        pools.joinPool(id, node3, 1, expiry, sig);
        _give(ALICE, 50e18);
        vm.prank(ALICE);
        registry.stake(50e18);
        vm.prank(ALICE);
        pools.joinPool(id, node3, 1, expiry, sig);
        assertEq(pools.stakeFloor(ALICE), 250e18);
        assertEq(registry.requiredStake(ALICE), 250e18);
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        assertEq(pools.stakeFloor(ALICE), 250e18, "node2 still in the first pool");
        vm.prank(ALICE);
        pools.leavePool(poolId, node2);
        assertEq(pools.stakeFloor(ALICE), 150e18);
        vm.prank(COORD);
        pools.ejectNode(id, node3);
        assertEq(pools.stakeFloor(ALICE), 0);
    }

    /// @dev The validator set and when each validator was named: what a dispute's committee is drawn
    /// from (`validatorSetHash` hashes both).
    function test_validatorEntries_recordWhenEachWasNamed() public {
        (address[] memory vs, uint64[] memory since) = pools.validatorEntries(poolId);
        assertEq(vs.length, 4);
        assertEq(since.length, 4);
        assertEq(pools.validatorSetHash(poolId), keccak256(abi.encode(vs, since)));
        vm.warp(block.timestamp + 5);
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x77));
        assertEq(uint256(pools.validatorSince(poolId, address(0x77))), block.timestamp);
        vm.prank(POOL_OWNER);
        pools.removeValidator(poolId, VALIDATOR);
        (vs, since) = pools.validatorEntries(poolId);
        assertEq(vs[0], address(0x77), "the last entry moved into the freed slot");
        assertEq(uint256(since[0]), block.timestamp, "with its time");
        assertEq(pools.validatorSince(poolId, VALIDATOR), 0);
        assertEq(pools.validatorSetHash(poolId), keccak256(abi.encode(vs, since)));
        vm.prank(POOL_OWNER);
        uint256 empty = pools.createPool(_params());
        assertEq(pools.validatorSetHash(empty), keccak256(abi.encode(new address[](0), new uint64[](0))));
    }

    // ------------------------------------------------------------------ leavePool

    function test_leavePool() public {
        _join(poolId, ALICE, NODE1_PK);
        _join(poolId, ALICE, NODE2_PK);
        vm.expectEmit(true, true, true, true, address(pools));
        emit PoolManager.NodeLeft(poolId, node1, ALICE);
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        assertEq(pools.poolOf(node1), 0);
        assertFalse(pools.isMember(poolId, node1));
        assertEq(uint256(pools.getPool(poolId).members), 1);
        assertEq(uint256(pools.membershipOf(node1).poolId), 0);
    }

    function test_leavePool_worksAfterPoolEnded() public {
        _join(poolId, ALICE, NODE1_PK);
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        assertEq(pools.poolOf(node1), 0);
    }

    function test_leavePool_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownPool.selector, 3));
        vm.prank(ALICE);
        pools.leavePool(3, node1);
    }

    function test_leavePool_revertsForOtherProvider() public {
        _join(poolId, ALICE, NODE1_PK);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotNodeProvider.selector, node1, BOB));
        vm.prank(BOB);
        pools.leavePool(poolId, node1);
    }

    function test_leavePool_revertsWhenNotInPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotInPool.selector, node1, poolId));
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        // In another pool: still not in this one.
        uint256 other = _createActivePool();
        _join(other, ALICE, NODE1_PK);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotInPool.selector, node1, poolId));
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
    }

    // ------------------------------------------------------------------ ejectNode

    function test_ejectNode_byCoordinator() public {
        _join(poolId, ALICE, NODE1_PK);
        vm.expectEmit(true, true, true, true, address(pools));
        emit PoolManager.NodeEjected(poolId, node1, COORD);
        vm.prank(COORD);
        pools.ejectNode(poolId, node1);
        assertEq(pools.poolOf(node1), 0);
        assertEq(uint256(pools.getPool(poolId).members), 0);
        // Not blacklisted: a fresh invite lets it back in.
        _join(poolId, ALICE, NODE1_PK);
        assertTrue(pools.isMember(poolId, node1));
    }

    function test_ejectNode_byOwner() public {
        _join(poolId, ALICE, NODE1_PK);
        vm.expectEmit(true, true, true, true, address(pools));
        emit PoolManager.NodeEjected(poolId, node1, POOL_OWNER);
        vm.prank(POOL_OWNER);
        pools.ejectNode(poolId, node1);
        assertFalse(pools.isMember(poolId, node1));
    }

    function test_ejectNode_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownPool.selector, 4));
        vm.prank(COORD);
        pools.ejectNode(4, node1);
    }

    function test_ejectNode_revertsForNonAdmin() public {
        _join(poolId, ALICE, NODE1_PK);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolAdmin.selector, poolId, ALICE));
        vm.prank(ALICE);
        pools.ejectNode(poolId, node1);
    }

    function test_ejectNode_revertsWhenNotInPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotInPool.selector, node2, poolId));
        vm.prank(COORD);
        pools.ejectNode(poolId, node2);
    }

    // ------------------------------------------------------------------ blacklistNode

    function test_blacklistNode_ejectsMember() public {
        _join(poolId, ALICE, NODE1_PK);
        vm.expectEmit(true, true, true, true, address(pools));
        emit PoolManager.NodeEjected(poolId, node1, COORD);
        vm.expectEmit(true, true, true, true, address(pools));
        emit PoolManager.NodeBlacklisted(poolId, node1, COORD);
        vm.prank(COORD);
        pools.blacklistNode(poolId, node1);
        assertTrue(pools.isBlacklisted(poolId, node1));
        assertEq(pools.poolOf(node1), 0);
        assertEq(uint256(pools.getPool(poolId).members), 0);
    }

    function test_blacklistNode_nonMemberEmitsOnlyBlacklisted() public {
        uint256 other = _createActivePool();
        _join(other, ALICE, NODE1_PK);
        vm.recordLogs();
        vm.prank(POOL_OWNER);
        pools.blacklistNode(poolId, node1);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        assertEq(logs.length, 1);
        assertEq(logs[0].topics[0], PoolManager.NodeBlacklisted.selector);
        assertTrue(pools.isBlacklisted(poolId, node1));
        assertFalse(pools.isBlacklisted(other, node1));
        // Membership elsewhere is untouched.
        assertEq(pools.poolOf(node1), other);
    }

    function test_blacklistNode_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.UnknownPool.selector, 8));
        vm.prank(COORD);
        pools.blacklistNode(8, node1);
    }

    function test_blacklistNode_revertsForNonAdmin() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolAdmin.selector, poolId, VALIDATOR));
        vm.prank(VALIDATOR);
        pools.blacklistNode(poolId, node1);
    }

    // ------------------------------------------------------------------ views

    function test_poolTerms() public view {
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        assertEq(t.coordinator, COORD);
        assertTrue(t.status == PoolManager.Status.Active);
        assertEq(uint256(t.validationWindow), WINDOW);
        assertEq(uint256(t.rewardRate), RATE);
        assertEq(uint256(t.slashAmount), SLASH);
        PoolManager.PoolTerms memory none = pools.poolTerms(99);
        assertTrue(none.status == PoolManager.Status.None);
        assertEq(none.coordinator, address(0));
    }

    function test_membersProviders() public {
        _join(poolId, ALICE, NODE1_PK);
        uint256 other = _createActivePool();
        _join(other, ALICE, NODE2_PK);
        address[] memory nodes = new address[](4);
        nodes[0] = node1;
        nodes[1] = node2;
        nodes[2] = vm.addr(NODE3_PK);
        nodes[3] = node1;
        address[] memory providers = pools.membersProviders(poolId, nodes);
        assertEq(providers.length, 4);
        assertEq(providers[0], ALICE);
        assertEq(providers[1], address(0));
        assertEq(providers[2], address(0));
        assertEq(providers[3], ALICE);
    }

    function test_isMember_poolZeroIsNever() public view {
        assertFalse(pools.isMember(0, node1));
        assertEq(pools.poolOf(node1), 0);
    }

    function test_eip712Domain() public view {
        (, string memory name, string memory version, uint256 chainId, address verifying,,) = pools.eip712Domain();
        assertEq(name, "IntellectPoolManager");
        assertEq(version, "1");
        assertEq(chainId, block.chainid);
        assertEq(verifying, address(pools));
    }

    function test_inviteDigestAndDomain_matchEip712() public view {
        bytes32 domain = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("IntellectPoolManager"),
                keccak256("1"),
                block.chainid,
                address(pools)
            )
        );
        assertEq(pools.domainSeparator(), domain);
        bytes32 structHash = keccak256(abi.encode(pools.INVITE_TYPEHASH(), poolId, node1, 9, uint64(1234)));
        assertEq(pools.inviteDigest(poolId, node1, 9, 1234), keccak256(abi.encodePacked("\x19\x01", domain, structHash)));
    }
}
