// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {IERC20Errors} from "@openzeppelin/contracts/interfaces/draft-IERC6093.sol";
import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {IPoolMembership} from "../src/interfaces/IPoolMembership.sol";

contract ProviderRegistryTest is Fixture {
    address internal SLASHER = address(0x51A5);

    function setUp() public override {
        super.setUp();
        vm.prank(ADMIN);
        registry.grantRole(SLASHER_ROLE, SLASHER);
    }

    function _freshRegistry() internal returns (ProviderRegistry) {
        return new ProviderRegistry(IERC20(address(token)), ADMIN, TREASURY, UNBONDING, STAKE_PER_CU, MIN_STAKE);
    }

    // ------------------------------------------------------------------ constructor

    function test_constructor_setsState() public view {
        assertEq(address(registry.token()), address(token));
        assertEq(registry.treasury(), TREASURY);
        assertEq(address(registry.poolManager()), address(pools));
        assertEq(uint256(registry.unbondingPeriod()), UNBONDING);
        assertEq(registry.stakePerComputeUnit(), STAKE_PER_CU);
        assertEq(registry.minProviderStake(), MIN_STAKE);
        assertEq(uint256(registry.bountyBps()), 1_000);
        assertEq(registry.maxBounty(), type(uint256).max);
        assertEq(uint256(registry.MAX_BOUNTY_BPS()), 5_000);
        assertEq(registry.totalStaked(), 0);
        assertEq(registry.totalUnbonding(), 0);
        assertTrue(registry.hasRole(registry.DEFAULT_ADMIN_ROLE(), ADMIN));
        assertEq(registry.SLASHER_ROLE(), keccak256("SLASHER_ROLE"));
        assertEq(
            registry.NODE_BINDING_TYPEHASH(),
            keccak256("NodeBinding(address provider,address node,uint256 nonce,uint256 chainId,address registry)")
        );
    }

    function test_constructor_emitsInitialParameters() public {
        vm.expectEmit(false, false, false, true);
        emit ProviderRegistry.TreasuryUpdated(TREASURY);
        vm.expectEmit(false, false, false, true);
        emit ProviderRegistry.ParametersUpdated(UNBONDING, STAKE_PER_CU, MIN_STAKE, 1_000, type(uint256).max);
        _freshRegistry();
    }

    function test_constructor_revertsOnZeroToken() public {
        vm.expectRevert(ProviderRegistry.ZeroAddress.selector);
        new ProviderRegistry(IERC20(address(0)), ADMIN, TREASURY, UNBONDING, STAKE_PER_CU, MIN_STAKE);
    }

    function test_constructor_revertsOnZeroAdmin() public {
        vm.expectRevert(ProviderRegistry.ZeroAddress.selector);
        new ProviderRegistry(IERC20(address(token)), address(0), TREASURY, UNBONDING, STAKE_PER_CU, MIN_STAKE);
    }

    function test_constructor_revertsOnZeroTreasury() public {
        vm.expectRevert(ProviderRegistry.ZeroAddress.selector);
        new ProviderRegistry(IERC20(address(token)), ADMIN, address(0), UNBONDING, STAKE_PER_CU, MIN_STAKE);
    }

    // ------------------------------------------------------------------ registerProvider

    function test_registerProvider() public {
        _give(ALICE, 150e18);
        vm.expectEmit(true, false, false, true, address(registry));
        emit ProviderRegistry.ProviderRegistered(ALICE, 150e18);
        vm.expectEmit(true, false, false, true, address(registry));
        emit ProviderRegistry.Staked(ALICE, 150e18, 150e18);
        vm.prank(ALICE);
        registry.registerProvider(150e18);

        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertTrue(p.registered);
        assertEq(p.staked, 150e18);
        assertEq(p.deposited, 150e18);
        assertEq(p.unbonding, 0);
        assertEq(p.withdrawn, 0);
        assertEq(p.slashed, 0);
        assertEq(uint256(p.nodeCount), 0);
        assertEq(registry.stakeOf(ALICE), 150e18);
        assertEq(registry.totalStaked(), 150e18);
        assertEq(token.balanceOf(address(registry)), 150e18);
        assertEq(token.balanceOf(ALICE), 0);
    }

    function test_registerProvider_atExactMinimum() public {
        _registerProvider(ALICE, MIN_STAKE);
        assertEq(registry.stakeOf(ALICE), MIN_STAKE);
    }

    function test_registerProvider_revertsWhenAlreadyRegistered() public {
        _registerProvider(ALICE, MIN_STAKE);
        _give(ALICE, MIN_STAKE);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.AlreadyRegistered.selector, ALICE));
        vm.prank(ALICE);
        registry.registerProvider(MIN_STAKE);
    }

    function test_registerProvider_revertsBelowMinimum() public {
        _give(ALICE, MIN_STAKE);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, MIN_STAKE - 1, MIN_STAKE));
        vm.prank(ALICE);
        registry.registerProvider(MIN_STAKE - 1);
    }

    function test_registerProvider_revertsOnZeroWhenMinimumIsZero() public {
        vm.prank(ADMIN);
        registry.setParameters(UNBONDING, STAKE_PER_CU, 0, 1_000, type(uint256).max);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, 0, 1));
        vm.prank(ALICE);
        registry.registerProvider(0);
    }

    function test_registerProvider_revertsWithoutAllowance() public {
        token.mint(ALICE, MIN_STAKE);
        vm.expectRevert(
            abi.encodeWithSelector(IERC20Errors.ERC20InsufficientAllowance.selector, address(registry), 0, MIN_STAKE)
        );
        vm.prank(ALICE);
        registry.registerProvider(MIN_STAKE);
    }

    // ------------------------------------------------------------------ stake

    function test_stake() public {
        _registerProvider(ALICE, MIN_STAKE);
        _give(ALICE, 30e18);
        vm.expectEmit(true, false, false, true, address(registry));
        emit ProviderRegistry.Staked(ALICE, 30e18, MIN_STAKE + 30e18);
        vm.prank(ALICE);
        registry.stake(30e18);
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(p.staked, MIN_STAKE + 30e18);
        assertEq(p.deposited, MIN_STAKE + 30e18);
        assertEq(registry.totalStaked(), MIN_STAKE + 30e18);
        assertEq(token.balanceOf(address(registry)), MIN_STAKE + 30e18);
    }

    function test_stake_revertsWhenNotRegistered() public {
        _give(ALICE, 1e18);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NotRegistered.selector, ALICE));
        vm.prank(ALICE);
        registry.stake(1e18);
    }

    function test_stake_revertsOnZero() public {
        _registerProvider(ALICE, MIN_STAKE);
        vm.expectRevert(ProviderRegistry.ZeroAmount.selector);
        vm.prank(ALICE);
        registry.stake(0);
    }

    // ------------------------------------------------------------------ unstake

    function test_unstake() public {
        _registerProvider(ALICE, 200e18);
        vm.warp(1_000);
        uint64 end = uint64(1_000) + UNBONDING;
        vm.expectEmit(true, false, false, true, address(registry));
        emit ProviderRegistry.UnstakeRequested(ALICE, 60e18, 60e18, end);
        vm.prank(ALICE);
        registry.unstake(60e18);
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(p.staked, 140e18);
        assertEq(p.unbonding, 60e18);
        assertEq(uint256(p.unbondingEnd), end);
        assertEq(registry.totalStaked(), 140e18);
        assertEq(registry.totalUnbonding(), 60e18);
        assertEq(token.balanceOf(address(registry)), 200e18);
    }

    function test_unstake_restartsTimerAndAccumulates() public {
        _registerProvider(ALICE, 200e18);
        vm.warp(1_000);
        vm.prank(ALICE);
        registry.unstake(10e18);
        vm.warp(5_000);
        vm.expectEmit(true, false, false, true, address(registry));
        emit ProviderRegistry.UnstakeRequested(ALICE, 20e18, 30e18, uint64(5_000) + UNBONDING);
        vm.prank(ALICE);
        registry.unstake(20e18);
        assertEq(uint256(registry.getProvider(ALICE).unbondingEnd), uint256(5_000) + UNBONDING);
        assertEq(registry.getProvider(ALICE).unbonding, 30e18);
    }

    function test_unstake_everythingWithoutNodes() public {
        _registerProvider(ALICE, 200e18);
        vm.prank(ALICE);
        registry.unstake(200e18);
        assertEq(registry.stakeOf(ALICE), 0);
    }

    function test_unstake_revertsWhenNotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NotRegistered.selector, ALICE));
        vm.prank(ALICE);
        registry.unstake(1);
    }

    function test_unstake_revertsOnZero() public {
        _registerProvider(ALICE, MIN_STAKE);
        vm.expectRevert(ProviderRegistry.ZeroAmount.selector);
        vm.prank(ALICE);
        registry.unstake(0);
    }

    function test_unstake_revertsAboveStake() public {
        _registerProvider(ALICE, MIN_STAKE);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.InsufficientStake.selector, MIN_STAKE, MIN_STAKE + 1));
        vm.prank(ALICE);
        registry.unstake(MIN_STAKE + 1);
    }

    function test_unstake_revertsBelowRequiredForNodes() public {
        _registerProvider(ALICE, 100e18);
        _addNode(ALICE, NODE1_PK, 3); // needs 30e18
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, 29e18, 30e18));
        vm.prank(ALICE);
        registry.unstake(71e18);
        vm.prank(ALICE);
        registry.unstake(70e18);
        assertEq(registry.stakeOf(ALICE), 30e18);
    }

    // ------------------------------------------------------------------ withdraw

    function test_withdraw_atUnbondingEnd() public {
        _registerProvider(ALICE, 200e18);
        vm.warp(1_000);
        vm.prank(ALICE);
        registry.unstake(50e18);
        vm.warp(uint256(1_000) + UNBONDING);
        vm.expectEmit(true, false, false, true, address(registry));
        emit ProviderRegistry.Withdrawn(ALICE, 50e18);
        vm.prank(ALICE);
        registry.withdraw();
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(p.unbonding, 0);
        assertEq(p.withdrawn, 50e18);
        assertEq(p.staked, 150e18);
        assertEq(p.deposited, p.staked + p.unbonding + p.withdrawn + p.slashed);
        assertEq(registry.totalUnbonding(), 0);
        assertEq(token.balanceOf(ALICE), 50e18);
        assertEq(token.balanceOf(address(registry)), 150e18);
    }

    function test_withdraw_revertsWhileUnbonding() public {
        _registerProvider(ALICE, 200e18);
        vm.warp(1_000);
        vm.prank(ALICE);
        registry.unstake(50e18);
        uint64 end = uint64(1_000) + UNBONDING;
        vm.warp(end - 1);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StillUnbonding.selector, end, end - 1));
        vm.prank(ALICE);
        registry.withdraw();
    }

    function test_withdraw_revertsWhenNothingUnbonding() public {
        _registerProvider(ALICE, 200e18);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NothingUnbonding.selector, ALICE));
        vm.prank(ALICE);
        registry.withdraw();
    }

    function test_withdraw_revertsWhenNotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NotRegistered.selector, BOB));
        vm.prank(BOB);
        registry.withdraw();
    }

    // ------------------------------------------------------------------ addNode

    function test_addNode() public {
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _nodeSig(NODE1_PK, ALICE);
        vm.warp(12_345);
        vm.expectEmit(true, true, false, true, address(registry));
        emit ProviderRegistry.NodeAdded(ALICE, node, 4);
        vm.prank(ALICE);
        registry.addNode(node, 4, sig);

        ProviderRegistry.Node memory n = registry.getNode(node);
        assertEq(n.provider, ALICE);
        assertEq(uint256(n.computeUnits), 4);
        assertEq(uint256(n.addedAt), 12_345);
        assertEq(registry.providerOf(node), ALICE);
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(uint256(p.computeUnits), 4);
        assertEq(uint256(p.nodeCount), 1);
        assertEq(registry.requiredStake(ALICE), 4 * STAKE_PER_CU);
    }

    function test_addNode_exactlyCoveredByStake() public {
        _registerProvider(ALICE, 100e18);
        _addNode(ALICE, NODE1_PK, 6);
        _addNode(ALICE, NODE2_PK, 4); // 10 units * 10e18 == 100e18
        assertEq(registry.requiredStake(ALICE), 100e18);
        assertEq(uint256(registry.getProvider(ALICE).nodeCount), 2);
    }

    function test_addNode_revertsWhenNotRegistered() public {
        bytes memory sig = _nodeSig(NODE1_PK, ALICE);
        address node = vm.addr(NODE1_PK);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NotRegistered.selector, ALICE));
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsOnZeroNode() public {
        _registerProvider(ALICE, 100e18);
        vm.expectRevert(ProviderRegistry.ZeroAddress.selector);
        vm.prank(ALICE);
        registry.addNode(address(0), 1, "");
    }

    function test_addNode_revertsOnZeroComputeUnits() public {
        _registerProvider(ALICE, 100e18);
        bytes memory sig = _nodeSig(NODE1_PK, ALICE);
        address node = vm.addr(NODE1_PK);
        vm.expectRevert(ProviderRegistry.ZeroComputeUnits.selector);
        vm.prank(ALICE);
        registry.addNode(node, 0, sig);
    }

    function test_addNode_revertsWhenNodeTaken() public {
        _registerProvider(ALICE, 100e18);
        _registerProvider(BOB, 100e18);
        address node = _addNode(ALICE, NODE1_PK, 1);
        bytes memory sig = _nodeSig(NODE1_PK, BOB);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NodeAlreadyRegistered.selector, node, ALICE));
        vm.prank(BOB);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsForSignatureByAnotherKey() public {
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _sign(OTHER_PK, registry.nodeBindingDigest(ALICE, node));
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.BadNodeSignature.selector, node, vm.addr(OTHER_PK)));
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsForBindingSignedForAnotherProvider() public {
        // The node signed a binding to ALICE; BOB cannot reuse it to claim the node.
        _registerProvider(BOB, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _nodeSig(NODE1_PK, ALICE);
        address recovered = _recover(registry.nodeBindingDigest(BOB, node), sig);
        assertTrue(recovered != node);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.BadNodeSignature.selector, node, recovered));
        vm.prank(BOB);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsForBindingFromAnotherChain() public {
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _nodeSig(NODE1_PK, ALICE);
        vm.chainId(84532);
        address recovered = _recover(registry.nodeBindingDigest(ALICE, node), sig);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.BadNodeSignature.selector, node, recovered));
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsForBindingToAnotherRegistry() public {
        ProviderRegistry other = _freshRegistry();
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _sign(NODE1_PK, other.nodeBindingDigest(ALICE, node));
        address recovered = _recover(registry.nodeBindingDigest(ALICE, node), sig);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.BadNodeSignature.selector, node, recovered));
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsForMalformedSignature() public {
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = new bytes(64);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 64));
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsForHighSSignature() public {
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory good = _nodeSig(NODE1_PK, ALICE);
        (bytes memory sig, bytes32 highS) = _highS(good);
        // Raw ecrecover would accept it (same signer): the library must not.
        assertEq(_recover(registry.nodeBindingDigest(ALICE, node), sig), node);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, highS));
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsForUnrecoverableSignature() public {
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = abi.encodePacked(bytes32(0), bytes32(0), uint8(27));
        vm.expectRevert(ECDSA.ECDSAInvalidSignature.selector);
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
    }

    function test_addNode_revertsWhenStakeTooLow() public {
        _registerProvider(ALICE, 100e18);
        _addNode(ALICE, NODE1_PK, 8);
        bytes memory sig = _nodeSig(NODE2_PK, ALICE);
        address node2 = vm.addr(NODE2_PK);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, 100e18, 110e18));
        vm.prank(ALICE);
        registry.addNode(node2, 3, sig);
    }

    // ------------------------------------------------------------------ removeNode

    function test_removeNode() public {
        _registerProvider(ALICE, 100e18);
        address node = _addNode(ALICE, NODE1_PK, 5);
        _addNode(ALICE, NODE2_PK, 2);
        vm.expectEmit(true, true, false, true, address(registry));
        emit ProviderRegistry.NodeRemoved(ALICE, node, 5);
        vm.prank(ALICE);
        registry.removeNode(node);
        assertEq(registry.providerOf(node), address(0));
        assertEq(uint256(registry.getNode(node).computeUnits), 0);
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(uint256(p.computeUnits), 2);
        assertEq(uint256(p.nodeCount), 1);
        assertEq(registry.requiredStake(ALICE), 20e18);

        // The node may bind again, to another provider, with a fresh signature.
        _registerProvider(BOB, 100e18);
        _addNode(BOB, NODE1_PK, 1);
        assertEq(registry.providerOf(node), BOB);
    }

    /// @dev Attack: a provider keeps the node's old binding signature and, after the node left it,
    /// binds the node again without the node key's consent. The nonce makes each signature single-use.
    function test_addNode_oldBindingSignatureCannotBeReplayed() public {
        _registerProvider(ALICE, 100e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _nodeSig(NODE1_PK, ALICE);
        assertEq(registry.bindingNonce(node), 0);
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
        assertEq(registry.bindingNonce(node), 1);
        vm.prank(ALICE);
        registry.removeNode(node);
        address signer = _recover(registry.nodeBindingDigest(ALICE, node), sig);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.BadNodeSignature.selector, node, signer));
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
        bytes memory fresh = _nodeSig(NODE1_PK, ALICE);
        vm.prank(ALICE);
        registry.addNode(node, 1, fresh); // a fresh signature works
    }

    function test_removeNode_revertsForUnknownNode() public {
        address node = vm.addr(NODE1_PK);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.UnknownNode.selector, node));
        vm.prank(ALICE);
        registry.removeNode(node);
    }

    function test_removeNode_revertsForOtherProvider() public {
        _registerProvider(ALICE, 100e18);
        address node = _addNode(ALICE, NODE1_PK, 1);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NotNodeProvider.selector, node, BOB));
        vm.prank(BOB);
        registry.removeNode(node);
    }

    function test_removeNode_revertsWhileInPool() public {
        uint256 poolId = _createActivePool();
        address node = _member(poolId, ALICE, NODE1_PK, 100e18);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.NodeInPool.selector, node, poolId));
        vm.prank(ALICE);
        registry.removeNode(node);

        vm.prank(ALICE);
        pools.leavePool(poolId, node);
        vm.prank(ALICE);
        registry.removeNode(node);
        assertEq(registry.providerOf(node), address(0));
    }

    function test_removeNode_withoutPoolManager() public {
        ProviderRegistry r = _freshRegistry();
        _give(ALICE, 100e18);
        vm.startPrank(ALICE);
        token.approve(address(r), 100e18);
        r.registerProvider(100e18);
        address node = vm.addr(NODE1_PK);
        r.addNode(node, 1, _sign(NODE1_PK, r.nodeBindingDigest(ALICE, node)));
        r.removeNode(node);
        vm.stopPrank();
        assertEq(r.providerOf(node), address(0));
    }

    /// @dev Issue 38: a node stays bound while its provider's stake is locked (recorded work still
    /// open, or a dispute of it), so a slash can always check that the work's signer is the provider's.
    function test_removeNode_revertsWhileStakeLocked() public {
        uint256 id = _createActivePool();
        _fundPool(id, 1e24);
        address node = _member(id, ALICE, NODE1_PK, 200e18);
        _recordOne(id, node, 1);
        vm.prank(ALICE);
        pools.leavePool(id, node);
        uint64 until = uint64(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, until, uint64(block.timestamp)));
        vm.prank(ALICE);
        registry.removeNode(node);
        vm.warp(until);
        vm.prank(ALICE);
        registry.removeNode(node);
        assertEq(registry.providerOf(node), address(0));
    }

    // ------------------------------------------------------------------ slash

    function test_slash_takesUnbondingFirst() public {
        _registerProvider(ALICE, 200e18);
        vm.prank(ALICE);
        registry.unstake(30e18);
        bytes32 reason = keccak256("work");
        // 80 requested: 30 from unbonding, 50 from staked; bounty 10% = 8.
        vm.expectEmit(true, true, true, true, address(registry));
        emit ProviderRegistry.Slashed(ALICE, VALIDATOR, reason, 80e18, 30e18, 50e18, 8e18);
        vm.prank(SLASHER);
        (uint256 slashed, uint256 bounty) = registry.slash(ALICE, 80e18, VALIDATOR, reason);
        assertEq(slashed, 80e18);
        assertEq(bounty, 8e18);
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(p.unbonding, 0);
        assertEq(p.staked, 120e18);
        assertEq(p.slashed, 80e18);
        assertEq(p.deposited, p.staked + p.unbonding + p.withdrawn + p.slashed);
        assertEq(registry.totalStaked(), 120e18);
        assertEq(registry.totalUnbonding(), 0);
        assertEq(token.balanceOf(VALIDATOR), 8e18);
        assertEq(token.balanceOf(TREASURY), 72e18);
        assertEq(token.balanceOf(address(registry)), 120e18);
    }

    /// @dev With no validator (a slash no vote decided) nobody gets a bounty: the treasury gets it all.
    function test_slash_withoutValidatorPaysNoBounty() public {
        _registerProvider(ALICE, 200e18);
        bytes32 reason = keccak256("work");
        vm.expectEmit(true, true, true, true, address(registry));
        emit ProviderRegistry.Slashed(ALICE, address(0), reason, 80e18, 0, 80e18, 0);
        vm.prank(SLASHER);
        (uint256 slashed, uint256 bounty) = registry.slash(ALICE, 80e18, address(0), reason);
        assertEq(slashed, 80e18);
        assertEq(bounty, 0);
        assertEq(token.balanceOf(TREASURY), 80e18);
    }

    function test_slash_onlyFromUnbondingWhenEnough() public {
        _registerProvider(ALICE, 200e18);
        vm.prank(ALICE);
        registry.unstake(100e18);
        vm.prank(SLASHER);
        (uint256 slashed,) = registry.slash(ALICE, 40e18, VALIDATOR, bytes32(0));
        assertEq(slashed, 40e18);
        assertEq(registry.getProvider(ALICE).unbonding, 60e18);
        assertEq(registry.getProvider(ALICE).staked, 100e18);
        assertEq(registry.totalUnbonding(), 60e18);
    }

    function test_slash_capsAtWhatTheProviderHolds() public {
        _registerProvider(ALICE, 100e18);
        vm.prank(SLASHER);
        (uint256 slashed, uint256 bounty) = registry.slash(ALICE, 1_000e18, VALIDATOR, bytes32(0));
        assertEq(slashed, 100e18);
        assertEq(bounty, 10e18);
        assertEq(registry.stakeOf(ALICE), 0);
        assertEq(token.balanceOf(TREASURY), 90e18);

        // Nothing left: a second slash takes nothing and moves no tokens.
        vm.expectEmit(true, true, true, true, address(registry));
        emit ProviderRegistry.Slashed(ALICE, VALIDATOR, bytes32(uint256(1)), 0, 0, 0, 0);
        vm.prank(SLASHER);
        (slashed, bounty) = registry.slash(ALICE, 5e18, VALIDATOR, bytes32(uint256(1)));
        assertEq(slashed, 0);
        assertEq(bounty, 0);
        assertEq(token.balanceOf(TREASURY), 90e18);
    }

    function test_slash_bountyCappedByMaxBounty() public {
        vm.prank(ADMIN);
        registry.setParameters(UNBONDING, STAKE_PER_CU, MIN_STAKE, 5_000, 3e18);
        _registerProvider(ALICE, 100e18);
        vm.prank(SLASHER);
        (uint256 slashed, uint256 bounty) = registry.slash(ALICE, 50e18, VALIDATOR, bytes32(0));
        assertEq(slashed, 50e18);
        assertEq(bounty, 3e18); // min(25e18, 3e18)
        assertEq(token.balanceOf(VALIDATOR), 3e18);
        assertEq(token.balanceOf(TREASURY), 47e18);
    }

    function test_slash_zeroBountyBps() public {
        vm.prank(ADMIN);
        registry.setParameters(UNBONDING, STAKE_PER_CU, MIN_STAKE, 0, type(uint256).max);
        _registerProvider(ALICE, 100e18);
        vm.prank(SLASHER);
        (, uint256 bounty) = registry.slash(ALICE, 50e18, VALIDATOR, bytes32(0));
        assertEq(bounty, 0);
        assertEq(token.balanceOf(VALIDATOR), 0);
        assertEq(token.balanceOf(TREASURY), 50e18);
    }

    function test_slash_unregisteredProviderIsNoop() public {
        vm.prank(SLASHER);
        (uint256 slashed, uint256 bounty) = registry.slash(BOB, 50e18, VALIDATOR, bytes32(0));
        assertEq(slashed, 0);
        assertEq(bounty, 0);
        assertEq(registry.getProvider(BOB).slashed, 0);
    }

    function test_slash_revertsWithoutSlasherRole() public {
        _registerProvider(ALICE, 100e18);
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, VALIDATOR, SLASHER_ROLE)
        );
        vm.prank(VALIDATOR);
        registry.slash(ALICE, 1e18, VALIDATOR, bytes32(0));
    }

    // ------------------------------------------------------------------ governance

    function test_setPoolManager() public {
        ProviderRegistry r = _freshRegistry();
        vm.expectEmit(false, false, false, true, address(r));
        emit ProviderRegistry.PoolManagerSet(address(pools));
        vm.prank(ADMIN);
        r.setPoolManager(pools);
        assertEq(address(r.poolManager()), address(pools));
    }

    function test_setPoolManager_revertsOnZero() public {
        ProviderRegistry r = _freshRegistry();
        vm.expectRevert(ProviderRegistry.ZeroAddress.selector);
        vm.prank(ADMIN);
        r.setPoolManager(IPoolMembership(address(0)));
    }

    function test_setPoolManager_revertsWhenAlreadySet() public {
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.PoolManagerAlreadySet.selector, address(pools)));
        vm.prank(ADMIN);
        registry.setPoolManager(IPoolMembership(address(0x1234)));
    }

    function test_setPoolManager_revertsForNonAdmin() public {
        ProviderRegistry r = _freshRegistry();
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, ALICE, bytes32(0)));
        vm.prank(ALICE);
        r.setPoolManager(pools);
    }

    function test_setTreasury() public {
        vm.expectEmit(false, false, false, true, address(registry));
        emit ProviderRegistry.TreasuryUpdated(address(0x7777));
        vm.prank(ADMIN);
        registry.setTreasury(address(0x7777));
        assertEq(registry.treasury(), address(0x7777));

        // Slashes now go to the new treasury.
        _registerProvider(ALICE, 100e18);
        vm.prank(SLASHER);
        registry.slash(ALICE, 10e18, VALIDATOR, bytes32(0));
        assertEq(token.balanceOf(address(0x7777)), 9e18);
        assertEq(token.balanceOf(TREASURY), 0);
    }

    function test_setTreasury_revertsOnZero() public {
        vm.expectRevert(ProviderRegistry.ZeroAddress.selector);
        vm.prank(ADMIN);
        registry.setTreasury(address(0));
    }

    function test_setTreasury_revertsForNonAdmin() public {
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, BOB, bytes32(0)));
        vm.prank(BOB);
        registry.setTreasury(BOB);
    }

    function test_setParameters() public {
        vm.expectEmit(false, false, false, true, address(registry));
        emit ProviderRegistry.ParametersUpdated(1 days, 2e18, 5e18, 5_000, 9e18);
        vm.prank(ADMIN);
        registry.setParameters(1 days, 2e18, 5e18, 5_000, 9e18);
        assertEq(uint256(registry.unbondingPeriod()), 1 days);
        assertEq(registry.stakePerComputeUnit(), 2e18);
        assertEq(registry.minProviderStake(), 5e18);
        assertEq(uint256(registry.bountyBps()), 5_000);
        assertEq(registry.maxBounty(), 9e18);
    }

    function test_setParameters_revertsWhenBountyTooHigh() public {
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.BountyTooHigh.selector, uint16(5_001)));
        vm.prank(ADMIN);
        registry.setParameters(UNBONDING, STAKE_PER_CU, MIN_STAKE, 5_001, 0);
    }

    function test_setParameters_revertsForNonAdmin() public {
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, VALIDATOR, bytes32(0)));
        vm.prank(VALIDATOR);
        registry.setParameters(UNBONDING, STAKE_PER_CU, MIN_STAKE, 1_000, 0);
    }

    /// @dev The registry has one role besides its admin: the slasher (the work ledger). Who validates
    /// is each pool owner's choice, in the pool manager.
    function test_roles_grantRevokeRenounce() public {
        bytes32 role = SLASHER_ROLE;
        assertTrue(registry.hasRole(role, address(ledger)));
        assertEq(registry.getRoleAdmin(role), bytes32(0));
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, ALICE, bytes32(0)));
        vm.prank(ALICE);
        registry.grantRole(role, ALICE);
        vm.expectEmit(true, true, true, false, address(registry));
        emit IAccessControl.RoleGranted(role, CAROL, ADMIN);
        vm.prank(ADMIN);
        registry.grantRole(role, CAROL);
        vm.expectEmit(true, true, true, false, address(registry));
        emit IAccessControl.RoleRevoked(role, CAROL, ADMIN);
        vm.prank(ADMIN);
        registry.revokeRole(role, CAROL);
        assertFalse(registry.hasRole(role, CAROL));
        vm.expectRevert(IAccessControl.AccessControlBadConfirmation.selector);
        vm.prank(ALICE);
        registry.renounceRole(role, address(ledger));
        vm.prank(address(ledger));
        registry.renounceRole(role, address(ledger));
        assertFalse(registry.hasRole(role, address(ledger)));
    }

    function test_supportsInterface() public view {
        assertTrue(registry.supportsInterface(type(IAccessControl).interfaceId));
        assertTrue(registry.supportsInterface(0x01ffc9a7)); // ERC-165
        assertFalse(registry.supportsInterface(0xffffffff));
    }

    function test_eip712Domain() public view {
        (, string memory name, string memory version, uint256 chainId, address verifying,,) = registry.eip712Domain();
        assertEq(name, "IntellectProviderRegistry");
        assertEq(version, "1");
        assertEq(chainId, block.chainid);
        assertEq(verifying, address(registry));
    }

    // ------------------------------------------------------------------ views

    function test_domainSeparatorAndDigest_matchEip712() public view {
        bytes32 domain = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("IntellectProviderRegistry"),
                keccak256("1"),
                block.chainid,
                address(registry)
            )
        );
        assertEq(registry.domainSeparator(), domain);
        address node = vm.addr(NODE1_PK);
        bytes32 structHash = keccak256(
            abi.encode(registry.NODE_BINDING_TYPEHASH(), ALICE, node, uint256(0), block.chainid, address(registry))
        );
        assertEq(registry.nodeBindingDigest(ALICE, node), keccak256(abi.encodePacked("\x19\x01", domain, structHash)));
    }

    function test_views_unknownAccountsAreEmpty() public view {
        assertFalse(registry.getProvider(STRANGER).registered);
        assertEq(registry.stakeOf(STRANGER), 0);
        assertEq(registry.requiredStake(STRANGER), 0);
        assertEq(registry.providerOf(STRANGER), address(0));
        assertEq(registry.getNode(STRANGER).provider, address(0));
    }

    function test_requiredStake_followsParameters() public {
        _registerProvider(ALICE, 100e18);
        _addNode(ALICE, NODE1_PK, 3);
        assertEq(registry.requiredStake(ALICE), 30e18);
        vm.prank(ADMIN);
        registry.setParameters(UNBONDING, 1e18, MIN_STAKE, 1_000, type(uint256).max);
        assertEq(registry.requiredStake(ALICE), 3e18);
    }
}
