// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20Errors} from "@openzeppelin/contracts/interfaces/draft-IERC6093.sol";
import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";
import {Vm} from "./utils/Test.sol";
import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {PoolManager} from "../src/PoolManager.sol";
import {WorkLedger} from "../src/WorkLedger.sol";

contract WorkLedgerTest is Fixture {
    uint256 internal poolId;
    address internal node1;
    address internal node2;
    address internal node3;
    uint256 internal constant BUDGET = 1_000_000e18;
    uint256 internal constant T0 = 1_700_000_000;

    function setUp() public override {
        super.setUp();
        vm.warp(T0);
        poolId = _createActivePool();
        node1 = _member(poolId, ALICE, NODE1_PK, 200e18);
        node2 = _member(poolId, ALICE, NODE2_PK, 200e18);
        node3 = _member(poolId, BOB, NODE3_PK, 200e18);
        _fundPool(poolId, BUDGET);
    }

    function _status(bytes32 key) internal view returns (WorkLedger.RecordStatus) {
        return ledger.getRecord(poolId, key).status;
    }

    // ------------------------------------------------------------------ constructor

    function test_constructor() public view {
        assertEq(address(ledger.token()), address(token));
        assertEq(address(ledger.registry()), address(registry));
        assertEq(address(ledger.pools()), address(pools));
        assertEq(ledger.MAX_BATCH(), 512);
    }

    // ------------------------------------------------------------------ recordWork

    function test_recordWork() public {
        bytes32 k1 = _newKey();
        bytes32 k2 = _newKey();
        bytes32 k3 = _newKey();
        WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](3);
        b[0] = _work(node1, k1, 100);
        b[1] = _work(node2, k2, 200);
        b[2] = _work(node3, k3, 300);
        uint40 deadline = uint40(T0 + WINDOW);

        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkRecorded(poolId, node1, k1, ALICE, 100, 7, keccak256(abi.encode("proof", k1)));
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkRecorded(poolId, node2, k2, ALICE, 200, 7, keccak256(abi.encode("proof", k2)));
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkRecorded(poolId, node3, k3, BOB, 300, 7, keccak256(abi.encode("proof", k3)));
        vm.expectEmit(true, false, false, true, address(ledger));
        emit WorkLedger.WorkBatchRecorded(poolId, 3, 600, deadline);
        _record(poolId, b);

        WorkLedger.Record memory r = ledger.getRecord(poolId, k3);
        assertEq(r.provider, BOB);
        assertEq(uint256(r.deadline), deadline);
        assertTrue(r.status == WorkLedger.RecordStatus.Pending);
        assertEq(uint256(r.units), 300);

        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertEq(uint256(a.pendingUnits), 600);
        assertEq(uint256(a.recordedUnits), 600);
        assertEq(uint256(a.invalidatedUnits), 0);
        assertEq(uint256(a.claimedUnits), 0);
        assertEq(uint256(a.budget), BUDGET);
        assertFalse(_isClaimable(poolId, k1));
        assertEq(ledger.surplus(poolId), BUDGET - 600 * uint256(RATE));
    }

    function test_recordWork_sameKeyInAnotherPoolIsIndependent() public {
        bytes32 k = _recordOne(poolId, node1, 10);
        uint256 other = _createActivePool();
        _fundPool(other, 1e18);
        _registerProvider(CAROL, 100e18);
        address n = _addNode(CAROL, 0x3333, 1);
        _join(other, CAROL, 0x3333);
        _record(other, _batch1(n, k, 20));
        assertEq(ledger.getRecord(other, k).provider, CAROL);
        assertEq(uint256(ledger.getRecord(other, k).units), 20);
        _invalidate(other, k);
        assertTrue(ledger.getRecord(other, k).status == WorkLedger.RecordStatus.Invalidated);
        assertTrue(_status(k) == WorkLedger.RecordStatus.Pending);
        assertEq(uint256(ledger.poolAccount(poolId).pendingUnits), 10);
    }

    function test_recordWork_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.UnknownPool.selector, 77));
        vm.prank(COORD);
        ledger.recordWork(77, _batch1(node1, bytes32(uint256(1)), 1));
    }

    function test_recordWork_revertsForNonCoordinator() public {
        WorkLedger.WorkInput[] memory b = _batch1(node1, bytes32(uint256(1)), 1);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotCoordinator.selector, poolId, POOL_OWNER));
        vm.prank(POOL_OWNER);
        ledger.recordWork(poolId, b);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotCoordinator.selector, poolId, ALICE));
        vm.prank(ALICE);
        ledger.recordWork(poolId, b);
    }

    function test_recordWork_revertsWhenPoolNotStarted() public {
        uint256 id = _createPool(_params());
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.PoolNotActive.selector, id, PoolManager.Status.Created));
        vm.prank(COORD);
        ledger.recordWork(id, _batch1(node1, bytes32(uint256(1)), 1));
    }

    function test_recordWork_revertsWhenPoolEnded() public {
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.PoolNotActive.selector, poolId, PoolManager.Status.Ended));
        vm.prank(COORD);
        ledger.recordWork(poolId, _batch1(node1, bytes32(uint256(1)), 1));
    }

    function test_recordWork_revertsOnEmptyBatch() public {
        WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](0);
        vm.expectRevert(WorkLedger.EmptyBatch.selector);
        vm.prank(COORD);
        ledger.recordWork(poolId, b);
    }

    function test_recordWork_revertsOnOversizedBatch() public {
        WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](513);
        for (uint256 i; i < 513; ++i) {
            b[i] = _work(node1, bytes32(i + 1), 1);
        }
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.BatchTooLarge.selector, 513, 512));
        vm.prank(COORD);
        ledger.recordWork(poolId, b);
    }

    function test_recordWork_maxBatchIsAccepted() public {
        WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](512);
        for (uint256 i; i < 512; ++i) {
            b[i] = _work(i % 2 == 0 ? node1 : node3, bytes32(i + 1), 1);
        }
        _record(poolId, b);
        assertEq(uint256(ledger.poolAccount(poolId).recordedUnits), 512);
    }

    function test_recordWork_revertsOnZeroUnits() public {
        WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](2);
        b[0] = _work(node1, bytes32(uint256(1)), 5);
        b[1] = _work(node2, bytes32(uint256(2)), 0);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.ZeroUnits.selector, bytes32(uint256(2))));
        vm.prank(COORD);
        ledger.recordWork(poolId, b);
    }

    function test_recordWork_revertsForNonMember() public {
        // Unknown address, a node of another pool, and a node that left are all refused.
        address stranger = vm.addr(0xDEAD);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotMember.selector, poolId, stranger));
        vm.prank(COORD);
        ledger.recordWork(poolId, _batch1(stranger, bytes32(uint256(1)), 1));

        vm.prank(ALICE);
        pools.leavePool(poolId, node2);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotMember.selector, poolId, node2));
        vm.prank(COORD);
        ledger.recordWork(poolId, _batch1(node2, bytes32(uint256(1)), 1));

        uint256 other = _createActivePool();
        _join(other, ALICE, NODE2_PK);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotMember.selector, poolId, node2));
        vm.prank(COORD);
        ledger.recordWork(poolId, _batch1(node2, bytes32(uint256(1)), 1));
    }

    function test_recordWork_revertsOnDuplicateKey() public {
        bytes32 k = _recordOne(poolId, node1, 10);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.DuplicateWork.selector, poolId, k));
        vm.prank(COORD);
        ledger.recordWork(poolId, _batch1(node2, k, 10));

        // A duplicate inside one batch is refused too, and nothing of the batch is kept.
        bytes32 k2 = _newKey();
        WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](2);
        b[0] = _work(node1, k2, 1);
        b[1] = _work(node3, k2, 1);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.DuplicateWork.selector, poolId, k2));
        vm.prank(COORD);
        ledger.recordWork(poolId, b);
        assertTrue(_status(k2) == WorkLedger.RecordStatus.None);

        // Settled records stay taken.
        _invalidate(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.DuplicateWork.selector, poolId, k));
        vm.prank(COORD);
        ledger.recordWork(poolId, _batch1(node1, k, 10));
    }

    function test_recordWork_defaultWindow() public {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = 0;
        uint256 id = _createActivePool(p);
        _fundPool(id, 1e18);
        _registerProvider(CAROL, 100e18);
        address n = _addNode(CAROL, 0x3333, 1);
        _join(id, CAROL, 0x3333);
        bytes32 k = _recordOne(id, n, 1);
        assertEq(uint256(ledger.getRecord(id, k).deadline), T0 + 24 hours);
    }

    /// @dev Regression: a window past 2^40 s used to wrap the uint40 deadline into the past, making
    /// the record claimable (final) at once. The deadline now saturates at type(uint40).max.
    function test_recordWork_hugeWindowSaturatesDeadline() public {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = uint64(1) << 40;
        uint256 id = _createActivePool(p);
        _fundPool(id, 1e18);
        _registerProvider(CAROL, 100e18);
        address n = _addNode(CAROL, 0x3333, 1);
        _join(id, CAROL, 0x3333);
        bytes32 k = _recordOne(id, n, 1);
        assertEq(uint256(ledger.getRecord(id, k).deadline), type(uint40).max);
        assertFalse(_isClaimable(id, k));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, id));
        vm.prank(CAROL);
        ledger.claim(id, _keys1(k));
        // Known limitation (reported with issue 38): the ledger derives a record's recording time as
        // `deadline - window`, which a saturated deadline no longer gives (here it is 0), so every
        // validator counts as named after the work (only a window of some 35,000 years saturates).
        bytes memory sig = _rolloutSig(id, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NamedAfterWork.selector, k, uint64(T0), uint40(0)));
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true, sig);
    }

    // ------------------------------------------------------------------ invalidateWork

    function test_invalidateWork() public {
        bytes32 k = _recordOne(poolId, node1, 100);
        _recordOne(poolId, node3, 40);
        vm.warp(T0 + WINDOW - 1);
        bytes32 evidence = keccak256("evidence");
        // A hard invalidation is an accusation first: nothing is slashed during the appeal period.
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkAccused(poolId, k, VALIDATOR, ALICE, evidence, uint40(T0 + WINDOW - 1 + 1 days), 0);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, evidence, true, sig);
        assertTrue(_status(k) == WorkLedger.RecordStatus.Disputed);
        assertEq(registry.stakeOf(ALICE), 200e18);
        assertEq(uint256(ledger.poolAccount(poolId).pendingUnits), 140, "still reserved while disputed");
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.AppealPeriodNotOver.selector, k, uint40(T0 + WINDOW - 1 + 1 days))
        );
        ledger.finalizeInvalidation(poolId, k);
        // Unappealed, anyone makes it final: the reserved reward goes to the treasury, 50e18 is slashed
        // from ALICE's 200e18 stake, all of it to the treasury (no vote decided it: no bounty).
        vm.warp(T0 + WINDOW - 1 + 1 days);
        uint256 reward = 100 * uint256(RATE);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.RewardForfeited(poolId, k, TREASURY, reward);
        vm.expectEmit(true, true, true, true, address(registry));
        emit ProviderRegistry.Slashed(ALICE, address(0), k, 50e18, 0, 50e18, 0);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkInvalidated(poolId, k, VALIDATOR, ALICE, 100, bytes32(0), 50e18, 0);
        vm.prank(STRANGER);
        ledger.finalizeInvalidation(poolId, k);

        assertTrue(_status(k) == WorkLedger.RecordStatus.Invalidated);
        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertEq(uint256(a.pendingUnits), 40);
        assertEq(uint256(a.invalidatedUnits), 100);
        assertEq(uint256(a.recordedUnits), 140);
        assertEq(uint256(a.forfeitedTokens), reward);
        assertEq(uint256(a.budget), BUDGET - reward, "a revoked reward leaves the budget");
        assertEq(registry.stakeOf(ALICE), 150e18);
        assertEq(registry.getProvider(ALICE).slashed, 50e18);
        assertEq(token.balanceOf(VALIDATOR), 0, "no bounty for an unappealed accusation");
        assertEq(token.balanceOf(TREASURY), 50e18 + reward);
        assertEq(token.balanceOf(address(ledger)), BUDGET - reward);
        assertFalse(_isClaimable(poolId, k));
        // Surplus does not grow: the revoked reward went to the treasury, not back to the pool.
        assertEq(ledger.surplus(poolId), BUDGET - reward - 40 * uint256(RATE));
    }

    function test_invalidateWork_slashesUnbondingFirst() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        vm.prank(ALICE);
        registry.unstake(30e18); // ALICE: 170 staked, 30 unbonding; nodes need 20
        _slashNow(poolId, k, bytes32(0));
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(p.unbonding, 0);
        assertEq(p.staked, 150e18);
        assertEq(p.slashed, 50e18);
    }

    function test_invalidateWork_worksAfterPoolEndedAndNodeLeft() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        _slashNow(poolId, k, bytes32(0));
        assertTrue(_status(k) == WorkLedger.RecordStatus.Invalidated);
    }

    function test_invalidateWork_zeroSlashPool() public {
        PoolManager.PoolParams memory p = _params();
        p.slashAmount = 0;
        uint256 id = _createActivePool(p);
        _fundPool(id, 1e18);
        _registerProvider(CAROL, 100e18);
        address n = _addNode(CAROL, 0x3333, 1);
        _join(id, CAROL, 0x3333);
        bytes32 k = _recordOne(id, n, 3);
        bytes memory sig = _rolloutSig(id, k);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true, sig);
        vm.warp(block.timestamp + 1 days);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkInvalidated(id, k, VALIDATOR, CAROL, 3, bytes32(0), 0, 0);
        ledger.finalizeInvalidation(id, k);
        assertEq(registry.stakeOf(CAROL), 100e18);
        assertEq(uint256(ledger.poolAccount(id).invalidatedUnits), 3);
    }

    function test_invalidateWork_revertsForNonValidator() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotValidator.selector, poolId, COORD));
        vm.prank(COORD);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotValidator.selector, poolId, ADMIN));
        vm.prank(ADMIN);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
    }

    function test_invalidateWork_revertsForUnknownWork() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.UnknownWork.selector, poolId, bytes32(uint256(123))));
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, bytes32(uint256(123)), bytes32(0), true, "");
        // The key is known only in its own pool.
        uint256 other = _createActivePool();
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.UnknownWork.selector, other, k));
        vm.prank(VALIDATOR);
        ledger.invalidateWork(other, k, bytes32(0), true, sig);
    }

    function test_invalidateWork_revertsWhenAlreadyInvalidated() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        _invalidate(poolId, k);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Invalidated)
        );
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        assertEq(registry.getProvider(ALICE).slashed, SLASH); // slashed once only
    }

    function test_invalidateWork_revertsWhenClaimed() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        vm.warp(T0 + WINDOW);
        _claim(poolId, ALICE, k);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Claimed));
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
    }

    function test_invalidateWork_revertsAtDeadline() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        uint40 deadline = uint40(T0 + WINDOW);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.DeadlinePassed.selector, k, deadline, uint64(deadline)));
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        vm.warp(uint256(deadline) + 1 days);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.DeadlinePassed.selector, k, deadline, uint64(deadline) + 1 days)
        );
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
    }

    function test_invalidateWork_revertsWithoutSlasherRole() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        vm.prank(ADMIN);
        registry.revokeRole(SLASHER_ROLE, address(ledger));
        bytes memory sig = _rolloutSig(poolId, k);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        vm.warp(block.timestamp + 1 days);
        vm.expectRevert(
            abi.encodeWithSelector(
                IAccessControl.AccessControlUnauthorizedAccount.selector, address(ledger), SLASHER_ROLE
            )
        );
        ledger.finalizeInvalidation(poolId, k);
        assertTrue(_status(k) == WorkLedger.RecordStatus.Disputed);
    }

    // ------------------------------------------------------------------ claim

    function test_claim_atDeadline() public {
        bytes32 k1 = _recordOne(poolId, node1, 100);
        bytes32 k2 = _recordOne(poolId, node2, 50);
        bytes32 k3 = _recordOne(poolId, node3, 7);
        vm.warp(T0 + WINDOW);
        assertTrue(_isClaimable(poolId, k1));
        bytes32[] memory ks = new bytes32[](2);
        ks[0] = k1;
        ks[1] = k2;
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkClaimed(poolId, k1, ALICE, 100, 100 * uint256(RATE));
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkClaimed(poolId, k2, ALICE, 50, 50 * uint256(RATE));
        vm.prank(ALICE);
        uint256 reward = ledger.claim(poolId, ks);

        assertEq(reward, 150 * uint256(RATE));
        assertEq(token.balanceOf(ALICE), reward);
        assertTrue(_status(k1) == WorkLedger.RecordStatus.Claimed);
        assertTrue(_status(k2) == WorkLedger.RecordStatus.Claimed);
        assertFalse(_isClaimable(poolId, k1));
        assertTrue(_isClaimable(poolId, k3));
        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertEq(uint256(a.budget), BUDGET - reward);
        assertEq(uint256(a.claimedTokens), reward);
        assertEq(uint256(a.claimedUnits), 150);
        assertEq(uint256(a.pendingUnits), 7);
        assertEq(uint256(a.recordedUnits), 157);
        assertEq(token.balanceOf(address(ledger)), BUDGET - reward);
    }

    function test_claim_worksAfterPoolEndedAndNodeLeft() public {
        bytes32 k = _recordOne(poolId, node1, 10);
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        vm.prank(POOL_OWNER);
        pools.endPool(poolId);
        vm.warp(T0 + WINDOW + 5);
        assertEq(_claim(poolId, ALICE, k), 10 * uint256(RATE));
    }

    function test_claim_zeroRewardRateMovesNoTokens() public {
        PoolManager.PoolParams memory p = _params();
        p.rewardRate = 0;
        uint256 id = _createActivePool(p);
        _registerProvider(CAROL, 100e18);
        address n = _addNode(CAROL, 0x3333, 1);
        _join(id, CAROL, 0x3333);
        bytes32 k = _recordOne(id, n, 9);
        vm.warp(T0 + WINDOW);
        vm.recordLogs();
        vm.prank(CAROL);
        uint256 reward = ledger.claim(id, _keys1(k));
        Vm.Log[] memory logs = vm.getRecordedLogs();
        assertEq(reward, 0);
        assertEq(logs.length, 1); // WorkClaimed only, no Transfer
        assertEq(logs[0].topics[0], WorkLedger.WorkClaimed.selector);
        assertEq(uint256(ledger.poolAccount(id).claimedUnits), 9);
    }

    function test_claim_revertsOnEmpty() public {
        vm.expectRevert(WorkLedger.EmptyBatch.selector);
        vm.prank(ALICE);
        ledger.claim(poolId, new bytes32[](0));
    }

    function test_claim_revertsOnOversizedBatch() public {
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.BatchTooLarge.selector, 513, 512));
        vm.prank(ALICE);
        ledger.claim(poolId, new bytes32[](513));
    }

    function test_claim_revertsForUnknownWork() public {
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(ALICE);
        ledger.claim(poolId, _keys1(bytes32(uint256(5))));
    }

    function test_claim_revertsForOtherProvider() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        vm.warp(T0 + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(BOB);
        ledger.claim(poolId, _keys1(k));
        // The node key itself is not the provider either.
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(node1);
        ledger.claim(poolId, _keys1(k));
    }

    function test_claim_revertsWhenAlreadyClaimed() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        vm.warp(T0 + WINDOW);
        _claim(poolId, ALICE, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(ALICE);
        ledger.claim(poolId, _keys1(k));
    }

    function test_claim_paysDuplicateKeyOnce() public {
        bytes32 k = _recordOne(poolId, node1, 3);
        vm.warp(T0 + WINDOW);
        bytes32[] memory ks = new bytes32[](2);
        ks[0] = k;
        ks[1] = k;
        vm.prank(ALICE);
        assertEq(ledger.claim(poolId, ks), 3 * uint256(RATE));
        assertTrue(_status(k) == WorkLedger.RecordStatus.Claimed);
    }

    /// @dev Attack from the issue: one record that cannot be claimed (not final, invalidated, someone
    /// else's, unknown) used to revert the provider's whole batch. Now the claimable ones are paid.
    function test_claim_oneBadKeyDoesNotBlockTheBatch() public {
        bytes32 good = _recordOne(poolId, node1, 2);
        bytes32 bad = _recordOne(poolId, node1, 5);
        _invalidate(poolId, bad);
        vm.warp(T0 + WINDOW);
        bytes32 late = _recordOne(poolId, node1, 7);
        bytes32[] memory ks = new bytes32[](4);
        ks[0] = bad;
        ks[1] = late;
        ks[2] = bytes32(uint256(5));
        ks[3] = good;
        vm.prank(ALICE);
        assertEq(ledger.claim(poolId, ks), 2 * uint256(RATE));
        assertTrue(_status(good) == WorkLedger.RecordStatus.Claimed);
        assertTrue(_status(late) == WorkLedger.RecordStatus.Pending);
    }

    function test_claim_revertsWhenInvalidated() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        _invalidate(poolId, k);
        vm.warp(T0 + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(ALICE);
        ledger.claim(poolId, _keys1(k));
    }

    function test_claim_revertsBeforeDeadline() public {
        bytes32 k = _recordOne(poolId, node1, 1);
        uint40 deadline = uint40(T0 + WINDOW);
        vm.warp(deadline - 1);
        assertFalse(_isClaimable(poolId, k));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(ALICE);
        ledger.claim(poolId, _keys1(k));
    }

    /// @dev Attack from the issue: recording did not reserve rewards, so a pool could owe more than it
    /// held. Now a batch the budget cannot cover is refused, and what was recorded is always paid.
    function test_recordWork_revertsWhenBudgetShort() public {
        PoolManager.PoolParams memory p = _params();
        p.rewardRate = 1e18;
        uint256 id = _createActivePool(p);
        _fundPool(id, 5e18);
        _registerProvider(CAROL, 100e18);
        address n = _addNode(CAROL, 0x3333, 1);
        _join(id, CAROL, 0x3333);
        bytes32 k1 = _recordOne(id, n, 4);
        bytes32 k = _newKey();
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.InsufficientPoolFunds.selector, id, 5e18, 6e18));
        _record(id, _batch1(n, k, 2));
        assertEq(ledger.surplus(id), 1e18);
        vm.prank(POOL_OWNER);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SurplusTooLow.selector, 1e18, 2e18));
        ledger.withdrawSurplus(id, 2e18, POOL_OWNER);
        _fundPool(id, 1e18);
        _record(id, _batch1(n, k, 2));
        vm.warp(T0 + WINDOW);
        vm.prank(CAROL);
        bytes32[] memory ks = new bytes32[](2);
        ks[0] = k1;
        ks[1] = k;
        assertEq(ledger.claim(id, ks), 6e18);
        assertEq(uint256(ledger.poolAccount(id).budget), 0);
    }

    // ------------------------------------------------------------------ fundPool

    function test_fundPool() public {
        _give(CAROL, 10e18);
        vm.expectEmit(true, true, false, true, address(ledger));
        emit WorkLedger.PoolFunded(poolId, CAROL, 10e18, BUDGET + 10e18);
        vm.prank(CAROL);
        ledger.fundPool(poolId, 10e18);
        assertEq(uint256(ledger.poolAccount(poolId).budget), BUDGET + 10e18);
        assertEq(token.balanceOf(address(ledger)), BUDGET + 10e18);
        assertEq(token.balanceOf(CAROL), 0);
    }

    function test_fundPool_createdAndEndedPoolsAccepted() public {
        uint256 id = _createPool(_params());
        _fundPool(id, 1e18);
        vm.prank(POOL_OWNER);
        pools.endPool(id);
        _fundPool(id, 1e18);
        assertEq(uint256(ledger.poolAccount(id).budget), 2e18);
    }

    function test_fundPool_revertsOnZero() public {
        vm.expectRevert(WorkLedger.ZeroAmount.selector);
        vm.prank(FUNDER);
        ledger.fundPool(poolId, 0);
    }

    function test_fundPool_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.UnknownPool.selector, 50));
        vm.prank(FUNDER);
        ledger.fundPool(50, 1);
    }

    function test_fundPool_revertsWithoutAllowance() public {
        token.mint(CAROL, 1e18);
        vm.expectRevert(
            abi.encodeWithSelector(IERC20Errors.ERC20InsufficientAllowance.selector, address(ledger), 0, 1e18)
        );
        vm.prank(CAROL);
        ledger.fundPool(poolId, 1e18);
    }

    /// @dev Regression: an amount above 2^128 used to be truncated into the uint128 budget while the
    /// full amount was transferred in, stranding the difference.
    function test_fundPool_revertsWhenBudgetWouldOverflow() public {
        uint256 huge = uint256(type(uint128).max) + 2;
        _give(CAROL, huge);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.BudgetOverflow.selector, BUDGET, huge));
        vm.prank(CAROL);
        ledger.fundPool(poolId, huge);
        // Topping the budget up to exactly type(uint128).max is fine.
        uint256 room = uint256(type(uint128).max) - BUDGET;
        vm.prank(CAROL);
        ledger.fundPool(poolId, room);
        assertEq(uint256(ledger.poolAccount(poolId).budget), type(uint128).max);
        assertEq(token.balanceOf(address(ledger)), type(uint128).max);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.BudgetOverflow.selector, type(uint128).max, 1));
        vm.prank(CAROL);
        ledger.fundPool(poolId, 1);
    }

    // ------------------------------------------------------------------ withdrawSurplus

    function test_withdrawSurplus() public {
        _recordOne(poolId, node1, 1_000);
        uint256 owed = 1_000 * uint256(RATE);
        uint256 s = ledger.surplus(poolId);
        assertEq(s, BUDGET - owed);
        vm.expectEmit(true, true, false, true, address(ledger));
        emit WorkLedger.SurplusWithdrawn(poolId, CAROL, s, owed);
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, s, CAROL);
        assertEq(token.balanceOf(CAROL), s);
        assertEq(uint256(ledger.poolAccount(poolId).budget), owed);
        assertEq(ledger.surplus(poolId), 0);
    }

    function test_withdrawSurplus_revertsAboveSurplus() public {
        _recordOne(poolId, node1, 1_000);
        uint256 s = ledger.surplus(poolId);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SurplusTooLow.selector, s, s + 1));
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, s + 1, POOL_OWNER);
    }

    function test_withdrawSurplus_revertsOnZero() public {
        vm.expectRevert(WorkLedger.ZeroAmount.selector);
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, 0, POOL_OWNER);
    }

    function test_withdrawSurplus_revertsForUnknownPool() public {
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.UnknownPool.selector, 60));
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(60, 1, POOL_OWNER);
    }

    function test_withdrawSurplus_revertsForNonOwner() public {
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotPoolOwner.selector, poolId, COORD));
        vm.prank(COORD);
        ledger.withdrawSurplus(poolId, 1, COORD);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotPoolOwner.selector, poolId, FUNDER));
        vm.prank(FUNDER);
        ledger.withdrawSurplus(poolId, 1, FUNDER);
    }

    function test_surplus_zeroWhenFullyReserved() public {
        PoolManager.PoolParams memory p = _params();
        p.rewardRate = 1e18;
        uint256 id = _createActivePool(p);
        _fundPool(id, 5e18);
        _registerProvider(CAROL, 100e18);
        address n = _addNode(CAROL, 0x3333, 1);
        _join(id, CAROL, 0x3333);
        _recordOne(id, n, 5);
        assertEq(ledger.surplus(id), 0);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SurplusTooLow.selector, 0, 1));
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(id, 1, POOL_OWNER);
    }

    // ------------------------------------------------------------------ views

    function test_views_unknownRecord() public view {
        WorkLedger.Record memory r = ledger.getRecord(poolId, bytes32(uint256(99)));
        assertTrue(r.status == WorkLedger.RecordStatus.None);
        assertEq(r.provider, address(0));
        assertFalse(_isClaimable(poolId, bytes32(uint256(99))));
        assertEq(uint256(ledger.poolAccount(99).budget), 0);
        assertEq(ledger.surplus(99), 0);
    }
}
