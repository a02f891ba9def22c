// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Vm} from "./utils/Test.sol";
import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {PoolManager} from "../src/PoolManager.sol";
import {WorkLedger} from "../src/WorkLedger.sol";

/// @notice Accountable invalidation: soft and hard invalidations, appeals, open challenges, committees
/// drawn from the pool's own validators, an arbiter, and the bonds that make lying cost the liar.
contract DisputesTest is Fixture {
    uint256 internal constant T0 = 1_700_000_000;
    uint256 internal constant BOND = 10e18;
    uint256 internal poolId;
    address internal node1;

    function setUp() public override {
        super.setUp();
        vm.warp(T0);
        poolId = _pool(address(0));
        node1 = _member(poolId, ALICE, NODE1_PK, 200e18);
        _give(ALICE, 100e18); // for appeal bonds
        _give(VALIDATOR, 1_000e18);
        _give(BOB, 1_000e18);
        vm.prank(BOB);
        registry.registerProvider(100e18); // a staked provider that may challenge
    }

    /// @dev A started pool (window 1 day) whose disputes take a bond of 10e18: one day to appeal,
    /// one day to vote, committees of three from VALIDATOR and the three jurors.
    function _pool(address arbiter) internal returns (uint256 id) {
        id = _createPool(_params());
        vm.startPrank(POOL_OWNER);
        pools.setDisputeTerms(id, PoolManager.DisputeTerms(1 days, 1 days, 3, uint128(BOND), arbiter));
        pools.startPool(id);
        vm.stopPrank();
        _fundPool(id, 1e24);
    }

    function _accuse(bytes32 k) internal {
        bytes memory sig = _rolloutSig(poolId, k);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, keccak256("evidence"), true, sig);
    }

    function _softAccuse(bytes32 k) internal {
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, keccak256("never served"), false, "");
    }

    function _challenge(address who, bytes32 k, bytes32 evidence) internal {
        bytes memory sig = _rolloutSig(poolId, k);
        vm.prank(who);
        ledger.challenge(poolId, k, evidence, sig);
    }

    function _appeal(bytes32 k) internal {
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
    }

    function _vote(bytes32 k, address who, bool uphold) internal {
        vm.prank(who);
        ledger.vote(poolId, k, uphold);
    }

    /// @dev The committee of `k`'s dispute, after the block its seed commits to (the pool's validator
    /// set must be the one the dispute opened under).
    function _committee(bytes32 k) internal returns (address[] memory members) {
        vm.roll(block.number + 1);
        _draw(poolId, k);
        address[4] memory all = [VALIDATOR, JUROR1, JUROR2, JUROR3];
        uint256 n;
        members = new address[](3);
        for (uint256 i; i < 4; ++i) {
            if (ledger.jurorState(poolId, k, all[i]) == 1) members[n++] = all[i];
        }
        assertEq(n, 3, "committee of three");
    }

    // ------------------------------------------------------------------ scoped validators

    /// @dev Attack from the issue: any holder of the old global validator role invalidated any pool's
    /// record. Now only the validators the pool's owner named may, and only in that pool.
    function test_aValidatorActsOnlyInPoolsThatNameIt() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        address stranger = address(0x5555);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotValidator.selector, poolId, stranger));
        vm.prank(stranger);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        // VALIDATOR is named by this pool but not by another one.
        PoolManager.PoolParams memory p = _params();
        vm.prank(STRANGER);
        uint256 other = pools.createPool(p);
        assertFalse(pools.isPoolValidator(other, VALIDATOR));
        assertEq(pools.validatorSince(other, VALIDATOR), 0);
        assertTrue(pools.isPoolValidator(poolId, VALIDATOR));
        assertEq(pools.validatorSince(poolId, VALIDATOR), T0);
    }

    /// @dev The set hash covers who the validators are and when each was named (a removal moves the
    /// last entry, with its time, into the freed slot).
    function test_onlyTheOwnerNamesValidators() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolOwner.selector, poolId, COORD));
        vm.prank(COORD);
        pools.addValidator(poolId, address(0x77));
        vm.warp(T0 + 1);
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x77));
        vm.expectRevert(abi.encodeWithSelector(PoolManager.AlreadyValidator.selector, poolId, address(0x77)));
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x77));
        bytes32 before = pools.validatorSetHash(poolId);
        vm.prank(POOL_OWNER);
        pools.removeValidator(poolId, JUROR1);
        assertTrue(pools.validatorSetHash(poolId) != before);
        (address[] memory vs, uint64[] memory since) = pools.validatorEntries(poolId);
        assertEq(pools.validatorSetHash(poolId), keccak256(abi.encode(vs, since)));
        assertEq(vs.length, 4);
        assertEq(since.length, 4);
        assertEq(vs[1], address(0x77), "the last entry fills the freed slot");
        assertEq(uint256(since[1]), T0 + 1, "with its own time");
        assertEq(pools.validatorSince(poolId, address(0x77)), T0 + 1);
        assertEq(pools.validatorSince(poolId, JUROR1), 0);
        assertFalse(pools.isPoolValidator(poolId, JUROR1));
        assertTrue(pools.isPoolValidator(poolId, address(0x77)));
        for (uint160 i; pools.validatorsOf(poolId).length < pools.MAX_POOL_VALIDATORS(); ++i) {
            vm.prank(POOL_OWNER);
            pools.addValidator(poolId, address(0x9000 + i));
        }
        vm.expectRevert(abi.encodeWithSelector(PoolManager.TooManyValidators.selector, poolId, 32));
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x8888));
    }

    /// @dev A validator named after a record was recorded may not accuse it (the provider's node joined
    /// under the validators named before); work recorded after the naming it may.
    function test_aValidatorNamedAfterTheWorkCannotAccuseIt() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.warp(T0 + 1);
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x77));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NamedAfterWork.selector, k, uint64(T0 + 1), uint40(T0)));
        vm.prank(address(0x77));
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
        bytes32 later = _recordOne(poolId, node1, 5);
        vm.prank(address(0x77));
        ledger.invalidateWork(poolId, later, bytes32(0), false, "");
        assertTrue(ledger.getRecord(poolId, later).status == WorkLedger.RecordStatus.Disputed);
    }

    function test_disputeTermsAreFixedOnceThePoolStarts() public {
        vm.expectRevert(
            abi.encodeWithSelector(
                PoolManager.WrongPoolStatus.selector, poolId, PoolManager.Status.Active, PoolManager.Status.Created
            )
        );
        vm.prank(POOL_OWNER);
        pools.setDisputeTerms(poolId, PoolManager.DisputeTerms(1, 1, 1, 0, address(0)));
    }

    function test_ownerRotatesTheCoordinatorKey() public {
        address fresh = vm.addr(0xF2E5);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolOwner.selector, poolId, COORD));
        vm.prank(COORD);
        pools.rotateCoordinator(poolId, fresh);
        vm.prank(POOL_OWNER);
        pools.rotateCoordinator(poolId, fresh);
        assertEq(pools.poolTerms(poolId).coordinator, fresh);
        // The old key can no longer record or invite.
        bytes32 k = _newKey();
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotCoordinator.selector, poolId, COORD));
        _record(poolId, _batch1(node1, k, 1));
        vm.prank(fresh);
        ledger.recordWork(poolId, _batch1(node1, k, 1));
    }

    // ------------------------------------------------------------------ soft and hard

    /// @dev A soft invalidation is an accusation too: no bond and no slash, but the record is frozen
    /// (its reward still reserved) for the appeal period; unappealed, it is revoked and its reward goes
    /// to the treasury, never back to the pool.
    function test_softInvalidationRevokesAfterItsAppealPeriod() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 reward = 5 * uint256(RATE);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkSoftInvalidated(
            poolId, k, VALIDATOR, ALICE, 5, keccak256("never served"), uint40(T0 + 1 days)
        );
        _softAccuse(k);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.kind == WorkLedger.DisputeKind.Accusation && !x.hard && x.accuser == VALIDATOR);
        assertEq(uint256(x.appealEnd), T0 + 1 days);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Disputed);
        assertEq(uint256(ledger.poolAccount(poolId).pendingUnits), 5, "still reserved");
        assertEq(ledger.bondsHeld(), 0, "no bond");
        assertEq(ledger.lockedUntil(ALICE), type(uint64).max);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AppealPeriodNotOver.selector, k, uint40(T0 + 1 days)));
        ledger.finalizeInvalidation(poolId, k);
        vm.warp(T0 + 1 days);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        _claim(poolId, ALICE, k);
        uint256 budget = ledger.poolAccount(poolId).budget;
        uint256 s = ledger.surplus(poolId);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.RewardForfeited(poolId, k, TREASURY, reward);
        ledger.finalizeInvalidation(poolId, k);
        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(uint256(a.invalidatedUnits), 5);
        assertEq(uint256(a.pendingUnits), 0);
        assertEq(uint256(a.forfeitedTokens), reward);
        assertEq(uint256(a.budget), budget - reward);
        assertEq(ledger.surplus(poolId), s, "the surplus does not grow");
        assertEq(token.balanceOf(TREASURY), reward);
        assertEq(registry.stakeOf(ALICE), 200e18);
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18, "no bond, no bounty");
    }

    /// @dev A soft invalidation can be appealed like a hard one; overturned, the provider gets its bond
    /// back and the record is paid at its own deadline (the soft accuser put up nothing, so loses
    /// nothing; an overturned accusation never moves the deadline). The record is cleared of soft
    /// accusations for good: another one is refused (SoftAccusedBefore), a hard one is not.
    function test_aSoftInvalidationIsOverturnedOnAppeal() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _softAccuse(k);
        assertFalse(ledger.getDispute(poolId, k).softCleared);
        uint256 aliceBefore = token.balanceOf(ALICE);
        _appeal(k);
        assertEq(ledger.bondsHeld(), BOND);
        assertTrue(ledger.getDispute(poolId, k).kind == WorkLedger.DisputeKind.Appeal);
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        vm.recordLogs();
        _vote(k, c[1], false);
        _assertNotReopened();
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.verdict == WorkLedger.Verdict.Overturned);
        assertTrue(x.softCleared, "cleared of soft accusations");
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Pending);
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), T0 + 1 days, "the deadline did not move");
        assertEq(token.balanceOf(ALICE), aliceBefore);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18);
        assertEq(ledger.bondsHeld(), 0);

        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SoftAccusedBefore.selector, k));
        _softAccuse(k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SoftAccusedBefore.selector, k));
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, keccak256("another reason"), false, "");

        vm.warp(T0 + 1 days);
        assertEq(_claim(poolId, ALICE, k), 5 * uint256(RATE));
    }

    /// @dev A record cleared of a soft accusation may still be accused hard (and challenged); the
    /// hard dispute keeps the mark, so after it is overturned too the record is still never softly
    /// accused again.
    function test_aSoftClearedRecordCanStillBeAccusedHard() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _softAccuse(k);
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        _vote(k, c[1], false);
        _accuse(k);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.hard && x.kind == WorkLedger.DisputeKind.Accusation && x.softCleared);
        _appeal(k);
        c = _committee(k);
        _vote(k, c[0], false);
        _vote(k, c[1], false);
        assertTrue(ledger.getDispute(poolId, k).softCleared);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SoftAccusedBefore.selector, k));
        _softAccuse(k);
        _challenge(BOB, k, keccak256("still bad"));
        assertTrue(ledger.getDispute(poolId, k).kind == WorkLedger.DisputeKind.Challenge);
    }

    /// @dev Upheld on appeal, a soft invalidation revokes the record, nobody is slashed, and the
    /// appellant's bond goes to the treasury: the soft accuser risked nothing, so it gains nothing.
    function test_anUpheldSoftAppealRevokesWithoutSlash() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _softAccuse(k);
        uint256 aliceBefore = token.balanceOf(ALICE);
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], true);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Upheld, WorkLedger.DisputeKind.Appeal, VALIDATOR, ALICE, TREASURY, BOND
        );
        _vote(k, c[1], true);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Upheld);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertEq(token.balanceOf(ALICE), aliceBefore - BOND);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18, "the soft accuser gets nothing");
        assertEq(token.balanceOf(TREASURY), 5 * uint256(RATE) + BOND, "the reward and the appeal bond");
        assertEq(ledger.bondsHeld(), 0);
    }

    /// @dev The same through the arbiter: an upheld soft appeal's bond goes to the treasury.
    function test_anArbiterUpholdingASoftAppealPaysTheTreasury() public {
        address arbiter = address(0xA4B1);
        uint256 id = _pool(arbiter);
        address n = _member(id, CAROL, NODE2_PK, 200e18);
        _give(CAROL, BOND);
        bytes32 k = _recordOne(id, n, 5);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, keccak256("never served"), false, "");
        vm.prank(CAROL);
        ledger.appeal(id, k);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            id, k, WorkLedger.Verdict.Upheld, WorkLedger.DisputeKind.Appeal, VALIDATOR, CAROL, TREASURY, BOND
        );
        vm.prank(arbiter);
        ledger.vote(id, k, true);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18);
        assertEq(token.balanceOf(CAROL), 0);
        assertEq(token.balanceOf(TREASURY), 5 * uint256(RATE) + BOND);
        assertEq(registry.getProvider(CAROL).slashed, 0);
    }

    /// @dev A hard invalidation is not final at once: nothing is slashed, the record is neither
    /// claimable nor accused again, and the provider's stake stays until an appeal could end.
    /// Unappealed, the slash goes to the treasury in full: no bounty for a verdict nobody voted on.
    function test_hardInvalidationWaitsForItsAppealPeriod() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18 - BOND);
        assertEq(ledger.bondsHeld(), BOND);
        assertEq(ledger.lockedUntil(ALICE), type(uint64).max, "locked while the dispute is open");
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed)
        );
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        vm.warp(T0 + 1 days); // the record's deadline and the appeal end
        assertFalse(_isClaimable(poolId, k), "never claimable while disputed");
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(ALICE);
        ledger.claim(poolId, _keys1(k));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AppealPeriodOver.selector, k, uint40(T0 + 1 days)));
        _appeal(k);
        ledger.finalizeInvalidation(poolId, k);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18, "bond back, no bounty");
        assertEq(token.balanceOf(TREASURY), SLASH + 5 * uint256(RATE), "the slash and the reward");
        assertEq(ledger.bondsHeld(), 0);
    }

    // ------------------------------------------------------------------ appeals

    /// @dev Attack from the issue: a validator invalidates honest work to collect the bounty. The
    /// provider appeals, the committee overturns it: the provider keeps its stake, takes the liar's
    /// bond, and its record is pending again with its deadline unchanged (an accusation was the
    /// validators' own turn, so an overturned one gives no time back: no WorkReopened).
    function test_aFalseInvalidationIsOverturnedOnAppeal() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        uint256 aliceBefore = token.balanceOf(ALICE);
        _appeal(k);
        assertEq(ledger.bondsHeld(), 2 * BOND);
        address[] memory c = _committee(k);
        for (uint256 i; i < 3; ++i) {
            assertTrue(c[i] != VALIDATOR, "the accuser is never on its own committee");
        }
        vm.warp(T0 + 6 hours);
        _vote(k, c[0], false);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Disputed, "one vote decides nothing");
        vm.recordLogs();
        _vote(k, c[1], false);
        _assertNotReopened();
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.verdict == WorkLedger.Verdict.Overturned);
        assertFalse(x.softCleared, "a hard accusation clears nothing");
        WorkLedger.Record memory r = ledger.getRecord(poolId, k);
        assertTrue(r.status == WorkLedger.RecordStatus.Pending);
        assertEq(uint256(r.deadline), T0 + 1 days, "the deadline stays");
        assertGe(ledger.lockedUntil(ALICE), T0 + 1 days, "the stake stays until then");
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertEq(token.balanceOf(ALICE), aliceBefore + BOND, "its own bond back plus the liar's");
        assertEq(token.balanceOf(VALIDATOR), 1_000e18 - BOND);
        // Still open to disputes before its deadline; final and paid at it.
        vm.warp(T0 + 1 days - 1);
        assertFalse(_isClaimable(poolId, k));
        vm.warp(T0 + 1 days);
        assertEq(_claim(poolId, ALICE, k), 5 * uint256(RATE));
    }

    /// @dev Overturned after the record's deadline (the appeal and the vote outlast it), the record is
    /// final at once: the deadline is not extended, so it is claimable right away and no longer open
    /// to disputes.
    function test_anAccusationOverturnedAfterTheDeadlineIsFinalAtOnce() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.warp(T0 + 20 hours);
        _accuse(k);
        vm.warp(T0 + 1 days + 1 hours); // past the deadline, inside the appeal period
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        vm.recordLogs();
        _vote(k, c[1], false);
        _assertNotReopened();
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), T0 + 1 days);
        assertTrue(_isClaimable(poolId, k));
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(
            abi.encodeWithSelector(
                WorkLedger.DeadlinePassed.selector, k, uint40(T0 + 1 days), uint64(block.timestamp)
            )
        );
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        assertEq(_claim(poolId, ALICE, k), 5 * uint256(RATE));
    }

    /// @dev No WorkReopened among the logs recorded since `vm.recordLogs()`.
    function _assertNotReopened() internal {
        Vm.Log[] memory logs = vm.getRecordedLogs();
        for (uint256 i; i < logs.length; ++i) {
            assertTrue(logs[i].topics[0] != WorkLedger.WorkReopened.selector, "no WorkReopened");
        }
    }

    /// @dev An overturned accusation leaves the record open to another dispute (no outcome shields a
    /// record); the new one replaces the old and votes in its own committee round.
    function test_aReopenedRecordCanBeDisputedAgain() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        _vote(k, c[1], false);
        assertEq(uint256(ledger.getDispute(poolId, k).round), 1);

        _give(JUROR3, BOND);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.prank(JUROR3);
        ledger.invalidateWork(poolId, k, keccak256("second look"), true, sig);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.kind == WorkLedger.DisputeKind.Accusation && x.verdict == WorkLedger.Verdict.Open);
        assertEq(x.accuser, JUROR3);
        assertEq(uint256(x.round), 1, "no vote opened yet");
        uint256 aliceBefore = token.balanceOf(ALICE);
        _appeal(k);
        assertEq(uint256(ledger.getDispute(poolId, k).round), 2);
        c = _committee(k); // a fresh committee: nobody has voted in it
        for (uint256 i; i < 3; ++i) {
            assertTrue(c[i] != JUROR3, "the new accuser is not on it");
        }
        _vote(k, c[0], true);
        _vote(k, c[1], true);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(token.balanceOf(ALICE), aliceBefore - BOND);
        assertEq(token.balanceOf(JUROR3), 2 * BOND + SLASH / 10, "both bonds and the bounty");
    }

    /// @dev A true invalidation stands through an appeal: the appellant loses its bond to the accuser,
    /// which is paid the bounty (a committee decided).
    function test_aTrueInvalidationStandsThroughAnAppeal() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        uint256 aliceBefore = token.balanceOf(ALICE);
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], true);
        _vote(k, c[1], false);
        _vote(k, c[2], true);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Upheld);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(token.balanceOf(ALICE), aliceBefore - BOND);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18 + BOND + SLASH / 10);
        assertEq(token.balanceOf(TREASURY), SLASH - SLASH / 10 + 5 * uint256(RATE));
        assertEq(ledger.bondsHeld(), 0);
    }

    function test_onlyTheProviderAppeals_andOnlyJurorsVoteOnce() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotRecordProvider.selector, k, ALICE, BOB));
        vm.prank(BOB);
        ledger.appeal(poolId, k);
        _appeal(k);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.NotDisputed.selector, k, WorkLedger.DisputeKind.Appeal)
        );
        _appeal(k);
        address[] memory c = _committee(k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotJuror.selector, k, VALIDATOR));
        _vote(k, VALIDATOR, true);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotJuror.selector, k, ALICE));
        _vote(k, ALICE, false);
        _vote(k, c[0], true);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotJuror.selector, k, c[0]));
        _vote(k, c[0], true);
        vm.warp(T0 + 1 days);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.VotePeriodOver.selector, k, uint40(T0 + 1 days)));
        _vote(k, c[1], true);
    }

    /// @dev No vote within the vote period: no slash and every bond back; the appealed record is
    /// revoked, its reward to the treasury (attack from the review: an appellant that withholds its
    /// file so that nobody can vote must not be paid for the accused work).
    function test_aLapsedAppealSlashesNobodyAndPaysNothing() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        _appeal(k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.VotePeriodNotOver.selector, k, uint40(T0 + 1 days)));
        ledger.resolveLapsed(poolId, k);
        vm.warp(T0 + 1 days);
        uint256 aliceBefore = token.balanceOf(ALICE);
        ledger.resolveLapsed(poolId, k);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Lapsed);
        assertEq(token.balanceOf(ALICE), aliceBefore + BOND);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18);
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(uint256(ledger.poolAccount(poolId).invalidatedUnits), 5);
        assertEq(token.balanceOf(TREASURY), 5 * uint256(RATE));
        assertEq(ledger.bondsHeld(), 0);
    }

    /// @dev A vote period that ends without a majority of the committee lapses, whatever votes were
    /// cast: one uphold of a committee of three, the others silent, decides nothing. The lapsed appeal
    /// slashes nobody, returns both bonds and leaves the record revoked.
    function test_resolveLapsed_aMinorityNeverDecides() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        uint256 aliceBefore = token.balanceOf(ALICE);
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], true);
        vm.warp(T0 + 1 days);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Lapsed, WorkLedger.DisputeKind.Appeal, VALIDATOR, ALICE, address(0), 2 * BOND
        );
        ledger.resolveLapsed(poolId, k);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.verdict == WorkLedger.Verdict.Lapsed);
        assertEq(uint256(x.upheld), 1);
        assertEq(registry.getProvider(ALICE).slashed, 0, "no slash");
        assertEq(token.balanceOf(VALIDATOR), 1_000e18, "bond back, no bounty");
        assertEq(token.balanceOf(ALICE), aliceBefore, "bond back");
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(token.balanceOf(TREASURY), 5 * uint256(RATE));
    }

    /// @dev A tie lapses: the challenger pays the lapse fee, the record is open again with the time it
    /// had left.
    function test_resolveLapsed_aTieLapses() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 bobBefore = token.balanceOf(BOB);
        _challenge(BOB, k, keccak256("maybe"));
        address[] memory c = _committee(k);
        _vote(k, c[0], true);
        _vote(k, c[1], false);
        vm.warp(T0 + 1 days);
        ledger.resolveLapsed(poolId, k);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Lapsed);
        uint256 fee = BOND * ledger.LAPSE_FEE_BPS() / 10_000;
        assertEq(token.balanceOf(BOB), bobBefore - fee);
        assertEq(token.balanceOf(TREASURY), fee);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Pending);
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), T0 + 2 days);
        assertEq(registry.getProvider(ALICE).slashed, 0);
    }

    /// @dev A challenge nobody decides costs the challenger `LAPSE_FEE_BPS` of its bond (it held the
    /// record's judges for a vote period) and gives the record back the time it had left.
    function test_aLapsedChallengeCostsTheFeeAndReopens() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.warp(T0 + 6 hours);
        uint256 bobBefore = token.balanceOf(BOB);
        _challenge(BOB, k, keccak256("maybe"));
        vm.warp(T0 + 6 hours + 1 days);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkReopened(poolId, k, uint40(T0 + 2 days));
        ledger.resolveLapsed(poolId, k);
        assertEq(token.balanceOf(BOB), bobBefore - BOND / 10);
        assertEq(token.balanceOf(TREASURY), BOND / 10);
        assertEq(ledger.bondsHeld(), 0);
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), T0 + 2 days);
        assertEq(ledger.lockedUntil(ALICE), T0 + 2 days);
        assertFalse(_isClaimable(poolId, k));
    }

    /// @dev Attack from the review (finding 4 of issue 38): while one dispute of a record is open
    /// nobody else may act on it, neither a validator (which used to supersede a challenge and take its
    /// bounty) nor another challenger.
    function test_nobodyElseActsOnADisputedRecord() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _challenge(BOB, k, bytes32("first"));
        bytes memory sig = _rolloutSig(poolId, k);
        bytes memory settled =
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed);
        vm.expectRevert(settled);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        vm.expectRevert(settled);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
        _registerProvider(CAROL, 100e18);
        _give(CAROL, BOND);
        vm.expectRevert(settled);
        vm.prank(CAROL);
        ledger.challenge(poolId, k, bytes32("second"), sig);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.kind == WorkLedger.DisputeKind.Challenge && x.accuser == BOB);
        assertEq(ledger.bondsHeld(), BOND);
    }

    // ------------------------------------------------------------------ superseding a soft dispute

    /// @dev A hard accusation before the deadline supersedes an open, unappealed soft accusation: the
    /// soft one ends Lapsed (no bond was held, so none moves), the provider's open-dispute count
    /// drops with it, and the hard one opens normally; unappealed, it slashes.
    function test_aHardAccusationSupersedesAnUnappealedSoftOne() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _softAccuse(k);
        _give(JUROR1, BOND);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.warp(T0 + 1 hours);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Lapsed, WorkLedger.DisputeKind.Accusation, VALIDATOR, ALICE, ALICE, 0
        );
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkAccused(
            poolId, k, JUROR1, ALICE, keccak256("signed and wrong"), uint40(T0 + 25 hours), BOND
        );
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, keccak256("signed and wrong"), true, sig);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.hard && x.kind == WorkLedger.DisputeKind.Accusation && x.verdict == WorkLedger.Verdict.Open);
        assertEq(x.accuser, JUROR1);
        assertEq(uint256(x.recordedAt), T0);
        assertEq(ledger.bondsHeld(), BOND);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Disputed);
        vm.warp(T0 + 25 hours);
        ledger.finalizeInvalidation(poolId, k);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(token.balanceOf(JUROR1), BOND, "bond back, no bounty (unappealed)");
        // One dispute was open at a time: with the hard one resolved, nothing holds the stake.
        assertLt(ledger.lockedUntil(ALICE), type(uint64).max, "the open-dispute count is back to zero");
    }

    /// @dev A validator's hard accusation supersedes an open soft appeal: the appellant's bond goes back
    /// to it, and the accusation's own appeal votes in a new committee round (the soft appeal's jurors
    /// no longer count). A challenge does not supersede (one that lapsed would reopen the record
    /// without the soft accusation it replaced).
    function test_aHardAccusationSupersedesAnOpenSoftAppeal_aChallengeDoesNot() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _softAccuse(k);
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        assertEq(uint256(ledger.getDispute(poolId, k).round), 1);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed));
        vm.prank(BOB);
        ledger.challenge(poolId, k, keccak256("chunk 3 fails"), sig);

        _give(JUROR1, BOND);
        uint256 aliceBefore = token.balanceOf(ALICE);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Lapsed, WorkLedger.DisputeKind.Appeal, VALIDATOR, ALICE, ALICE, BOND
        );
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, keccak256("chunk 3 fails"), true, sig);
        assertEq(token.balanceOf(ALICE), aliceBefore + BOND, "the appeal bond back");
        assertEq(ledger.bondsHeld(), BOND, "only the accuser's bond");
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.kind == WorkLedger.DisputeKind.Accusation && x.hard && x.accuser == JUROR1);
        for (uint256 i; i < 3; ++i) {
            assertEq(ledger.jurorState(poolId, k, c[i]), 0, "the old committee is gone");
        }
        _appeal(k);
        assertEq(uint256(ledger.getDispute(poolId, k).round), 2, "a new round");
        c = _committee(k);
        _vote(k, c[0], true);
        _vote(k, c[1], true);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(ledger.bondsHeld(), 0);
    }

    /// @dev A soft accusation supersedes nothing, and nothing supersedes a hard dispute (a hard
    /// accusation, its appeal, or a challenge).
    function test_onlyAHardDisputeSupersedes_andOnlyASoftOne() public {
        _give(JUROR1, 10 * BOND);
        bytes32 k = _recordOne(poolId, node1, 5);
        bytes memory sig = _rolloutSig(poolId, k);
        bytes memory settled =
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed);
        _softAccuse(k);
        vm.expectRevert(settled);
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
        _appeal(k);
        vm.expectRevert(settled);
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");

        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig); // supersedes the soft appeal
        for (uint256 i; i < 2; ++i) {
            if (i == 1) _appeal(k); // and its appeal
            vm.expectRevert(settled);
            vm.prank(VALIDATOR);
            ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
            vm.expectRevert(settled);
            _softAccuse(k);
            vm.expectRevert(settled);
            vm.prank(BOB);
            ledger.challenge(poolId, k, bytes32(0), sig);
        }
        assertEq(ledger.getDispute(poolId, k).accuser, JUROR1);
    }

    /// @dev Superseding is a hard dispute like any other: not at or after the deadline, not without
    /// the node's signature, not by someone who may not accuse or challenge; a refused attempt leaves
    /// the soft dispute as it was.
    function test_aRefusedHardDisputeLeavesTheSoftOneOpen() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.warp(T0 + 23 hours);
        _softAccuse(k);
        bytes memory forged = _sign(0xF0F0, ledger.rolloutDigest(poolId, k));
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.NotProvidersWork.selector, k, vm.addr(0xF0F0), ALICE)
        );
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), true, forged);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotValidator.selector, poolId, STRANGER));
        vm.prank(STRANGER);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed));
        vm.prank(BOB);
        ledger.challenge(poolId, k, bytes32(0), sig);
        vm.warp(T0 + 1 days);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.DeadlinePassed.selector, k, uint40(T0 + 1 days), uint64(T0 + 1 days))
        );
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(!x.hard && x.kind == WorkLedger.DisputeKind.Accusation && x.verdict == WorkLedger.Verdict.Open);
        assertEq(x.accuser, VALIDATOR);
        assertEq(ledger.bondsHeld(), 0);
    }

    /// @dev An accusation that was not appealed has no committee: `jurorState` is 0 for everyone, even
    /// when the record's earlier vote (an overturned appeal) drew one in the same round.
    function test_anUnappealedAccusationHasNoCommittee() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        _appeal(k);
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        _vote(k, c[1], false);
        assertEq(ledger.jurorState(poolId, k, c[0]), 2, "the appeal's voters, while it is the record's dispute");
        _give(JUROR3, BOND);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.prank(JUROR3);
        ledger.invalidateWork(poolId, k, keccak256("second look"), true, sig);
        assertEq(uint256(ledger.getDispute(poolId, k).round), 1, "the same round, no vote opened");
        for (uint256 i; i < 3; ++i) {
            assertEq(ledger.jurorState(poolId, k, c[i]), 0);
        }
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotDisputed.selector, k, WorkLedger.DisputeKind.Accusation));
        _vote(k, c[2], true);
    }

    function test_aValidatorCannotInvalidateItsOwnWork() public {
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, ALICE);
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.OwnWork.selector, k));
        vm.prank(ALICE);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
    }

    /// @dev While a dispute of the provider is open its stake cannot leave at all, even after the
    /// lock's time (attack from the review: nobody finalizes in time, the provider withdraws first),
    /// and its node stays bound.
    function test_anOpenDisputeLocksTheStakeUntilItIsResolved() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        assertEq(ledger.lockedUntil(ALICE), type(uint64).max);
        vm.startPrank(ALICE);
        pools.leavePool(poolId, node1);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, type(uint64).max, T0));
        registry.removeNode(node1);
        registry.unstake(150e18);
        vm.stopPrank();
        vm.warp(T0 + 30 days);
        vm.expectRevert(
            abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, type(uint64).max, T0 + 30 days)
        );
        vm.prank(ALICE);
        registry.withdraw();
        ledger.finalizeInvalidation(poolId, k);
        assertEq(ledger.lockedUntil(ALICE), T0 + 2 days);
        vm.prank(ALICE);
        registry.withdraw();
        vm.prank(ALICE);
        registry.removeNode(node1);
    }

    function test_anArbiterThatIsAPartyLeavesItToTheCommittee() public {
        uint256 id = _pool(VALIDATOR); // the arbiter is also the accuser below
        address n = _member(id, CAROL, NODE2_PK, 200e18);
        _give(CAROL, BOND);
        bytes32 k = _recordOne(id, n, 5);
        bytes memory sig = _rolloutSig(id, k);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true, sig);
        vm.prank(CAROL);
        ledger.appeal(id, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.CommitteeNotDrawn.selector, k));
        vm.prank(VALIDATOR);
        ledger.vote(id, k, true);
    }

    function test_disputePeriodsAreCapped() public {
        uint256 id = _createPool(_params());
        vm.expectRevert(PoolManager.BadDisputeTerms.selector);
        vm.prank(POOL_OWNER);
        pools.setDisputeTerms(id, PoolManager.DisputeTerms(91 days, 1 days, 3, 0, address(0)));
    }

    /// @dev Attack from the review (finding 2 of issue 38): between the accusation and the appeal the
    /// owner swaps honest validators for its own. The committee is drawn from the set the accusation
    /// opened under, whatever the set is now, and a drawn juror the owner removed since still votes.
    function test_aValidatorSetChangeCannotSteerTheCommittee() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        (address[] memory vs0, uint64[] memory since0) = pools.validatorEntries(poolId);
        _accuse(k);
        vm.startPrank(POOL_OWNER);
        pools.removeValidator(poolId, JUROR1);
        pools.removeValidator(poolId, JUROR2);
        pools.addValidator(poolId, address(0xCAFE));
        vm.stopPrank();
        _appeal(k);
        vm.roll(block.number + 1);
        (address[] memory vs1, uint64[] memory since1) = pools.validatorEntries(poolId);
        bytes32 expected = keccak256(abi.encode(vs0, since0));
        assertEq(ledger.getDispute(poolId, k).validatorSet, expected);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.WrongValidatorSet.selector, k, expected));
        ledger.drawCommittee(poolId, k, vs1, since1);
        // Nor may the caller lie about when the validators were named.
        uint64[] memory forged = new uint64[](since0.length);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.WrongValidatorSet.selector, k, expected));
        ledger.drawCommittee(poolId, k, vs0, forged);
        ledger.drawCommittee(poolId, k, vs0, since0);
        assertTrue(ledger.getDispute(poolId, k).drawn);
        assertEq(ledger.jurorState(poolId, k, address(0xCAFE)), 0);
        assertEq(ledger.jurorState(poolId, k, JUROR1), 1);
        assertEq(ledger.jurorState(poolId, k, JUROR2), 1);
        assertEq(ledger.jurorState(poolId, k, JUROR3), 1);
        // The drawn jurors the owner removed since still vote.
        _vote(k, JUROR1, false);
        _vote(k, JUROR2, false);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Overturned);
    }

    /// @dev Nothing is drawn before the seed block has a successor, and nobody votes before the draw.
    /// A seed block too old for its hash (more than 256 blocks) is never replaced (that would let a
    /// party wait for a committee it likes): every eligible validator sits instead.
    function test_aStaleSeedBlockSeatsEveryEligibleValidator() public {
        address juror4 = address(0x1A04);
        address juror5 = address(0x1A05);
        vm.startPrank(POOL_OWNER);
        pools.addValidator(poolId, juror4);
        pools.addValidator(poolId, juror5);
        vm.stopPrank();
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        _appeal(k);
        uint64 seedBlock = ledger.getDispute(poolId, k).drawBlock;
        _draw(poolId, k); // same block: nothing yet
        assertFalse(ledger.getDispute(poolId, k).drawn);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.CommitteeNotDrawn.selector, k));
        _vote(k, JUROR1, true);
        vm.roll(uint256(seedBlock) + 257);
        vm.recordLogs();
        _draw(poolId, k);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        assertEq(logs.length, 1);
        assertEq(logs[0].topics[0], WorkLedger.CommitteeDrawn.selector, "drawn, not re-committed");
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.drawn);
        assertEq(uint256(x.drawBlock), seedBlock, "the seed block never moves");
        assertEq(uint256(x.size), 5, "all five eligible validators (the accuser is not one)");
        address[5] memory all = [JUROR1, JUROR2, JUROR3, juror4, juror5];
        for (uint256 i; i < 5; ++i) {
            assertEq(ledger.jurorState(poolId, k, all[i]), 1);
        }
        assertEq(ledger.jurorState(poolId, k, VALIDATOR), 0);
        // Three of five decide.
        _vote(k, juror4, false);
        _vote(k, juror5, false);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Open);
        _vote(k, JUROR1, false);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Overturned);
    }

    /// @dev 256 blocks after its seed block the hash is still known: a random committee of three.
    function test_aSeedBlock256BlocksOldStillDrawsAtRandom() public {
        vm.startPrank(POOL_OWNER);
        pools.addValidator(poolId, address(0x1A04));
        pools.addValidator(poolId, address(0x1A05));
        vm.stopPrank();
        bytes32 k = _recordOne(poolId, node1, 5);
        _challenge(BOB, k, bytes32("x"));
        vm.roll(uint256(ledger.getDispute(poolId, k).drawBlock) + 256);
        _draw(poolId, k);
        assertEq(uint256(ledger.getDispute(poolId, k).size), 3);
    }

    /// @dev Seeds differ per block: over many disputes every eligible validator gets drawn, and the
    /// accuser never is.
    function test_draws_coverEveryEligibleValidator() public {
        uint256[4] memory seen;
        address[4] memory all = [VALIDATOR, JUROR1, JUROR2, JUROR3];
        for (uint256 i; i < 12; ++i) {
            bytes32 k = _recordOne(poolId, node1, 1);
            _challenge(BOB, k, bytes32(i));
            vm.roll(block.number + 1 + i);
            _draw(poolId, k);
            for (uint256 j; j < 4; ++j) {
                if (ledger.jurorState(poolId, k, all[j]) == 1) seen[j]++;
            }
        }
        for (uint256 j; j < 4; ++j) {
            assertGt(seen[j], 0, "every candidate drawn at least once");
            assertLt(seen[j], 12, "nobody drawn every time");
        }
    }

    function test_anArbiterDecidesAlone() public {
        address arbiter = address(0xA4B1);
        uint256 id = _pool(arbiter);
        address n = _member(id, CAROL, NODE2_PK, 200e18);
        _give(CAROL, BOND);
        bytes32 k = _recordOne(id, n, 5);
        bytes memory sig = _rolloutSig(id, k);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true, sig);
        vm.prank(CAROL);
        ledger.appeal(id, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotJuror.selector, k, JUROR1));
        vm.prank(JUROR1);
        ledger.vote(id, k, true);
        vm.prank(arbiter);
        ledger.vote(id, k, false);
        assertTrue(ledger.getDispute(id, k).verdict == WorkLedger.Verdict.Overturned);
        assertTrue(ledger.getRecord(id, k).status == WorkLedger.RecordStatus.Pending);
    }

    // ------------------------------------------------------------------ challenges

    /// @dev Any staked provider challenges a record; a won challenge invalidates it, slashes its
    /// provider and pays the challenger the bounty.
    function test_aWonChallengeSlashesAndPaysTheChallenger() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 bobBefore = token.balanceOf(BOB);
        _challenge(BOB, k, keccak256("chunk 3 fails"));
        assertEq(token.balanceOf(BOB), bobBefore - BOND);
        assertEq(ledger.lockedUntil(ALICE), type(uint64).max);
        address[] memory c = _committee(k);
        _vote(k, c[0], true);
        _vote(k, c[1], true);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(token.balanceOf(BOB), bobBefore + SLASH / 10, "bond back plus bounty");
    }

    function test_aLostChallengePaysTheProvider() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 aliceBefore = token.balanceOf(ALICE);
        _challenge(BOB, k, keccak256("spite"));
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        _vote(k, c[1], false);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Pending);
        assertEq(token.balanceOf(ALICE), aliceBefore + BOND, "the challenger's bond");
        assertEq(registry.getProvider(ALICE).slashed, 0);
    }

    function test_challengeNeedsStakeAndAnotherProvidersOpenRecord() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotChallenger.selector, STRANGER));
        vm.prank(STRANGER);
        ledger.challenge(poolId, k, bytes32(0), sig);
        // A stake below the pool's minimum is not enough (sybils would challenge for free).
        _registerProvider(CAROL, 100e18);
        vm.prank(CAROL);
        registry.unstake(90e18);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotChallenger.selector, CAROL));
        vm.prank(CAROL);
        ledger.challenge(poolId, k, bytes32(0), sig);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.OwnWork.selector, k));
        vm.prank(ALICE);
        ledger.challenge(poolId, k, bytes32(0), sig);
        vm.warp(T0 + 1 days);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.DeadlinePassed.selector, k, uint40(T0 + 1 days), uint64(T0 + 1 days))
        );
        vm.prank(BOB);
        ledger.challenge(poolId, k, bytes32(0), sig);
    }

    /// @dev Stake cannot leave before an appeal of the provider's work could be decided, even when
    /// the unbonding period is shorter than appeal + vote.
    function test_noWithdrawalWhileADisputeCanStillBeDecided() public {
        uint256 id = _createPool(_params());
        vm.startPrank(POOL_OWNER);
        pools.setDisputeTerms(id, PoolManager.DisputeTerms(5 days, 5 days, 3, uint128(BOND), address(0)));
        pools.startPool(id);
        vm.stopPrank();
        _fundPool(id, 1e24);
        address n = _member(id, CAROL, NODE2_PK, 100e18);
        bytes32 k = _recordOne(id, n, 5);
        bytes memory sig = _rolloutSig(id, k);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true, sig);
        uint64 until = uint64(T0 + 10 days);
        assertEq(ledger.lockedUntil(CAROL), type(uint64).max);
        vm.startPrank(CAROL);
        pools.leavePool(id, n);
        registry.unstake(90e18); // the node stays bound: 10e18 for its compute unit
        vm.stopPrank();
        vm.warp(T0 + UNBONDING + 1);
        vm.expectRevert(
            abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, type(uint64).max, T0 + UNBONDING + 1)
        );
        vm.prank(CAROL);
        registry.withdraw();
        // Unappealed, the slash lands on the unbonding stake; the time lock still runs to its end.
        vm.warp(T0 + 5 days);
        ledger.finalizeInvalidation(id, k);
        assertEq(ledger.lockedUntil(CAROL), until);
        assertEq(registry.getProvider(CAROL).slashed, SLASH);
        vm.warp(until);
        vm.prank(CAROL);
        registry.withdraw();
        assertEq(token.balanceOf(CAROL), 90e18 - SLASH);
    }
}
