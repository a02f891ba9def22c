// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

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
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, keccak256("evidence"), true);
    }

    function _appeal(bytes32 k) internal {
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
    }

    function _vote(bytes32 k, address who, bool uphold) internal {
        vm.prank(who);
        ledger.vote(poolId, k, uphold);
    }

    /// @dev The committee of `k`'s dispute, after the block its seed commits to.
    function _committee(bytes32 k) internal returns (address[] memory members) {
        vm.roll(block.number + 1);
        ledger.drawCommittee(poolId, k, pools.validatorsOf(poolId));
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
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotValidator.selector, poolId, stranger));
        vm.prank(stranger);
        ledger.invalidateWork(poolId, k, bytes32(0), true);
        // VALIDATOR is named by this pool but not by another one.
        PoolManager.PoolParams memory p = _params();
        vm.prank(STRANGER);
        uint256 other = pools.createPool(p);
        assertFalse(pools.isPoolValidator(other, VALIDATOR));
        assertTrue(pools.isPoolValidator(poolId, VALIDATOR));
    }

    function test_onlyTheOwnerNamesValidators() public {
        vm.expectRevert(abi.encodeWithSelector(PoolManager.NotPoolOwner.selector, poolId, COORD));
        vm.prank(COORD);
        pools.addValidator(poolId, address(0x77));
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x77));
        vm.expectRevert(abi.encodeWithSelector(PoolManager.AlreadyValidator.selector, poolId, address(0x77)));
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x77));
        bytes32 before = pools.validatorSetHash(poolId);
        vm.prank(POOL_OWNER);
        pools.removeValidator(poolId, JUROR1);
        assertTrue(pools.validatorSetHash(poolId) != before);
        assertEq(pools.validatorSetHash(poolId), keccak256(abi.encode(pools.validatorsOf(poolId))));
        assertFalse(pools.isPoolValidator(poolId, JUROR1));
        assertTrue(pools.isPoolValidator(poolId, address(0x77)));
        assertEq(pools.validatorsOf(poolId).length, 4);
        for (uint160 i; pools.validatorsOf(poolId).length < pools.MAX_POOL_VALIDATORS(); ++i) {
            vm.prank(POOL_OWNER);
            pools.addValidator(poolId, address(0x9000 + i));
        }
        vm.expectRevert(abi.encodeWithSelector(PoolManager.TooManyValidators.selector, poolId, 32));
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, address(0x8888));
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

    function test_softInvalidationRevokesWithoutSlash() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, keccak256("never served"), false);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Invalidated);
        assertEq(registry.stakeOf(ALICE), 200e18);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18, "no bond, no bounty");
        assertEq(uint256(ledger.poolAccount(poolId).invalidatedUnits), 5);
    }

    /// @dev A hard invalidation is not final at once: nothing is slashed, the record is neither
    /// claimable nor invalidated again, and the provider's stake stays until an appeal could end.
    function test_hardInvalidationWaitsForItsAppealPeriod() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18 - BOND);
        assertEq(ledger.bondsHeld(), BOND);
        assertEq(ledger.lockedUntil(ALICE), type(uint64).max, "locked while the dispute is open");
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed)
        );
        vm.prank(JUROR1);
        ledger.invalidateWork(poolId, k, bytes32(0), true);
        vm.warp(T0 + 1 days); // the record's deadline and the appeal end
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(ALICE);
        ledger.claim(poolId, _keys1(k));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AppealPeriodOver.selector, k, uint40(T0 + 1 days)));
        _appeal(k);
        ledger.finalizeInvalidation(poolId, k);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(token.balanceOf(VALIDATOR), 1_000e18 + SLASH / 10, "bond back plus bounty");
        assertEq(ledger.bondsHeld(), 0);
    }

    // ------------------------------------------------------------------ appeals

    /// @dev Attack from the issue: a validator invalidates honest work to collect the bounty. The
    /// provider appeals, the committee overturns it: the provider keeps its stake, is paid, and takes
    /// the liar's bond; the liar gets no bounty.
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
        _vote(k, c[0], false);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Disputed, "one vote decides nothing");
        _vote(k, c[1], false);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.verdict == WorkLedger.Verdict.Overturned);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Pending);
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertEq(token.balanceOf(ALICE), aliceBefore + BOND, "its own bond back plus the liar's");
        assertEq(token.balanceOf(VALIDATOR), 1_000e18 - BOND);
        // Never disputed twice; paid once final.
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AlreadyDisputed.selector, k));
        vm.prank(JUROR3);
        ledger.invalidateWork(poolId, k, bytes32(0), true);
        vm.warp(T0 + 1 days);
        assertEq(_claim(poolId, ALICE, k), 5 * uint256(RATE));
    }

    /// @dev A true invalidation stands through an appeal: the appellant loses its bond to the accuser.
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
        assertEq(ledger.bondsHeld(), 0);
    }

    function test_onlyTheProviderAppeals_andOnlyJurorsVoteOnce() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotRecordProvider.selector, k, ALICE, BOB));
        vm.prank(BOB);
        ledger.appeal(poolId, k);
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

    /// @dev No majority within the vote period: no slash and every bond back; the appealed record is
    /// revoked (attack from the review: an appellant that withholds its file so that nobody can vote
    /// must not be paid for the accused work).
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
    }

    /// @dev Attack from the review: a sybil with a little stake challenges a record to shield it from
    /// the pool's validators. A validator's invalidation supersedes the challenge.
    function test_aValidatorSupersedesAnOpenChallenge() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 bobBefore = token.balanceOf(BOB);
        vm.prank(BOB);
        ledger.challenge(poolId, k, bytes32("shield"));
        _accuse(k);
        assertEq(token.balanceOf(BOB), bobBefore, "the challenger's bond back");
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.kind == WorkLedger.DisputeKind.Accusation && x.accuser == VALIDATOR);
        assertEq(ledger.bondsHeld(), BOND);
        vm.warp(T0 + 1 days);
        ledger.finalizeInvalidation(poolId, k);
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
    }

    function test_aValidatorCannotInvalidateItsOwnWork() public {
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, ALICE);
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.OwnWork.selector, k));
        vm.prank(ALICE);
        ledger.invalidateWork(poolId, k, bytes32(0), false);
    }

    /// @dev While a dispute of the provider is open its stake cannot leave at all, even after the
    /// lock's time (attack from the review: nobody finalizes in time, the provider withdraws first).
    function test_anOpenDisputeLocksTheStakeUntilItIsResolved() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        assertEq(ledger.lockedUntil(ALICE), type(uint64).max);
        vm.startPrank(ALICE);
        pools.leavePool(poolId, node1);
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
    }

    function test_anArbiterThatIsAPartyLeavesItToTheCommittee() public {
        uint256 id = _pool(VALIDATOR); // the arbiter is also the accuser below
        address n = _member(id, CAROL, NODE2_PK, 200e18);
        _give(CAROL, BOND);
        bytes32 k = _recordOne(id, n, 5);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true);
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

    /// @dev Attack from the review: after an appeal the owner swaps honest validators for its own. The
    /// committee is drawn from the set the dispute opened under, whatever the set is now.
    function test_aValidatorSetChangeCannotSteerTheCommittee() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        _appeal(k);
        address[] memory atOpening = pools.validatorsOf(poolId);
        vm.startPrank(POOL_OWNER);
        pools.removeValidator(poolId, JUROR1);
        pools.removeValidator(poolId, JUROR2);
        pools.addValidator(poolId, address(0xCAFE));
        vm.stopPrank();
        vm.roll(block.number + 1);
        address[] memory now_ = pools.validatorsOf(poolId);
        bytes32 expected = keccak256(abi.encode(atOpening));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.WrongValidatorSet.selector, k, expected));
        ledger.drawCommittee(poolId, k, now_);
        ledger.drawCommittee(poolId, k, atOpening);
        assertTrue(ledger.getDispute(poolId, k).drawn);
        assertEq(ledger.jurorState(poolId, k, address(0xCAFE)), 0);
        // A drawn juror the owner removed since cannot vote.
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotJuror.selector, k, JUROR1));
        _vote(k, JUROR1, true);
    }

    /// @dev A seed block too old for its hash (256 blocks) is replaced by a later one; nothing is drawn
    /// before the seed block has a successor, and nobody votes before the draw.
    function test_aStaleSeedBlockIsCommittedAnew() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        _accuse(k);
        _appeal(k);
        address[] memory vs = pools.validatorsOf(poolId);
        ledger.drawCommittee(poolId, k, vs); // same block: nothing yet
        assertFalse(ledger.getDispute(poolId, k).drawn);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.CommitteeNotDrawn.selector, k));
        _vote(k, JUROR1, true);
        vm.roll(block.number + 300);
        ledger.drawCommittee(poolId, k, vs);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertFalse(x.drawn);
        assertEq(uint256(x.drawBlock), block.number);
        vm.roll(block.number + 1);
        ledger.drawCommittee(poolId, k, vs);
        assertTrue(ledger.getDispute(poolId, k).drawn);
        assertEq(uint256(ledger.getDispute(poolId, k).size), 3);
    }

    /// @dev Seeds differ per block: over many disputes every eligible validator gets drawn, and the
    /// accuser never is.
    function test_draws_coverEveryEligibleValidator() public {
        uint256[4] memory seen;
        address[4] memory all = [VALIDATOR, JUROR1, JUROR2, JUROR3];
        for (uint256 i; i < 12; ++i) {
            bytes32 k = _recordOne(poolId, node1, 1);
            vm.prank(BOB);
            ledger.challenge(poolId, k, bytes32(i));
            vm.roll(block.number + 1 + i);
            ledger.drawCommittee(poolId, k, pools.validatorsOf(poolId));
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
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true);
        vm.prank(CAROL);
        ledger.appeal(id, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotJuror.selector, k, JUROR1));
        vm.prank(JUROR1);
        ledger.vote(id, k, true);
        vm.prank(arbiter);
        ledger.vote(id, k, false);
        assertTrue(ledger.getDispute(id, k).verdict == WorkLedger.Verdict.Overturned);
    }

    // ------------------------------------------------------------------ challenges

    /// @dev Any staked provider challenges a record; a won challenge invalidates it, slashes its
    /// provider and pays the challenger the bounty.
    function test_aWonChallengeSlashesAndPaysTheChallenger() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 bobBefore = token.balanceOf(BOB);
        vm.prank(BOB);
        ledger.challenge(poolId, k, keccak256("chunk 3 fails"));
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
        vm.prank(BOB);
        ledger.challenge(poolId, k, keccak256("spite"));
        address[] memory c = _committee(k);
        _vote(k, c[0], false);
        _vote(k, c[1], false);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Pending);
        assertEq(token.balanceOf(ALICE), aliceBefore + BOND, "the challenger's bond");
        assertEq(registry.getProvider(ALICE).slashed, 0);
    }

    function test_challengeNeedsStakeAndAnotherProvidersOpenRecord() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotChallenger.selector, STRANGER));
        vm.prank(STRANGER);
        ledger.challenge(poolId, k, bytes32(0));
        // A stake below the pool's minimum is not enough (sybils would challenge for free).
        _registerProvider(CAROL, 100e18);
        vm.prank(CAROL);
        registry.unstake(90e18);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotChallenger.selector, CAROL));
        vm.prank(CAROL);
        ledger.challenge(poolId, k, bytes32(0));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.OwnWork.selector, k));
        vm.prank(ALICE);
        ledger.challenge(poolId, k, bytes32(0));
        vm.warp(T0 + 1 days);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.DeadlinePassed.selector, k, uint40(T0 + 1 days), uint64(T0 + 1 days))
        );
        vm.prank(BOB);
        ledger.challenge(poolId, k, bytes32(0));
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
        vm.prank(VALIDATOR);
        ledger.invalidateWork(id, k, bytes32(0), true);
        uint64 until = uint64(T0 + 10 days);
        assertEq(ledger.lockedUntil(CAROL), type(uint64).max);
        vm.startPrank(CAROL);
        pools.leavePool(id, n);
        registry.removeNode(n);
        registry.unstake(100e18);
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
        assertEq(token.balanceOf(CAROL), 100e18 - SLASH);
    }
}
