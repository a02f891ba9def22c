// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Fixture} from "../utils/Fixture.sol";
import {Handler} from "./Handler.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {PoolManager} from "../../src/PoolManager.sol";
import {WorkLedger} from "../../src/WorkLedger.sol";

/// @notice Deployment, handler and the invariant checks, shared by the campaign and the smoke test.
abstract contract InvariantsBase is Fixture {
    Handler internal handler;
    address[] internal actors;
    uint256[2] internal poolIdsArr;

    uint256 internal constant T0 = 1_700_000_000;
    uint256 internal constant COORD1_PK = 0xC001;
    uint256 internal constant COORD2_PK = 0xC002;
    address internal constant DAVE = address(0xDA);
    /// @dev Two more validator candidates, named by neither pool at the start (the handler names them).
    address internal constant JUROR4 = address(0x1A04);
    address internal constant JUROR5 = address(0x1A05);
    address[] internal vals;

    function setUp() public virtual override {
        super.setUp();
        vm.warp(T0);
        // A shorter unbonding period and a binding bounty cap, so a campaign reaches both.
        vm.prank(ADMIN);
        registry.setParameters(2 days, STAKE_PER_CU, MIN_STAKE, 1_000, 3e18);

        PoolManager.PoolParams memory p = _params();
        p.coordinator = vm.addr(COORD1_PK);
        p.validationWindow = 1 hours;
        p.rewardRate = 1e12;
        p.slashAmount = 50e18;
        p.minStake = 100e18;
        poolIdsArr[0] = _createDisputedPool(p, PoolManager.DisputeTerms(2 hours, 3 hours, 3, 5e18, address(0)));
        p.coordinator = vm.addr(COORD2_PK);
        p.validationWindow = 1 days;
        p.rewardRate = 3e12;
        p.slashAmount = 20e18;
        p.minStake = 300e18;
        poolIdsArr[1] = _createDisputedPool(p, PoolManager.DisputeTerms(1 days, 1 hours, 3, 1e18, address(0)));

        actors = [ALICE, BOB, CAROL, DAVE];
        for (uint256 i; i < actors.length; ++i) {
            _give(actors[i], 1e24);
        }
        _give(FUNDER, 1e30);
        vals = [VALIDATOR, JUROR1, JUROR2, JUROR3, JUROR4, JUROR5];
        for (uint256 i; i < vals.length; ++i) {
            _give(vals[i], 1e24); // their accusation bonds
        }

        handler = new Handler(
            Handler.Setup({
                token: token,
                registry: registry,
                pools: pools,
                ledger: ledger,
                admin: ADMIN,
                treasury: TREASURY,
                validator: VALIDATOR,
                poolOwner: POOL_OWNER,
                funder: FUNDER,
                outsider: STRANGER,
                providers: actors,
                poolIds: poolIdsArr,
                coordPks: [COORD1_PK, COORD2_PK],
                validators: vals
            })
        );
        // Seed budgets through the handler so its ghosts see them.
        handler.fundPool(0, 1e21);
        handler.fundPool(1, 1e21);

        targetContract(address(handler));
        bytes4[] memory sels = new bytes4[](30);
        sels[0] = Handler.register.selector;
        sels[1] = Handler.stake.selector;
        sels[2] = Handler.unstake.selector;
        sels[3] = Handler.withdraw.selector;
        sels[4] = Handler.addNode.selector;
        sels[5] = Handler.removeNode.selector;
        sels[6] = Handler.joinPool.selector;
        sels[7] = Handler.leavePool.selector;
        sels[8] = Handler.ejectNode.selector;
        sels[9] = Handler.blacklistNode.selector;
        sels[10] = Handler.recordWork.selector;
        sels[11] = Handler.recordDuplicate.selector;
        sels[12] = Handler.invalidateWork.selector;
        sels[13] = Handler.claim.selector;
        sels[14] = Handler.fundPool.selector;
        sels[15] = Handler.withdrawSurplus.selector;
        sels[16] = Handler.setBounty.selector;
        sels[17] = Handler.warp.selector;
        sels[18] = Handler.warpToDeadline.selector;
        sels[19] = Handler.tryUnauthorized.selector;
        sels[20] = Handler.settleAtDeadline.selector;
        sels[21] = Handler.finalizeInvalidation.selector;
        sels[22] = Handler.appeal.selector;
        sels[23] = Handler.challenge.selector;
        sels[24] = Handler.vote.selector;
        sels[25] = Handler.resolveLapsed.selector;
        sels[26] = Handler.addValidator.selector;
        sels[27] = Handler.removeValidator.selector;
        sels[28] = Handler.drawCommittee.selector;
        sels[29] = Handler.softDispute.selector;
        targetSelector(FuzzSelector({addr: address(handler), selectors: sels}));
    }

    function _createDisputedPool(PoolManager.PoolParams memory p, PoolManager.DisputeTerms memory d)
        internal
        returns (uint256 id)
    {
        id = _createPool(p);
        vm.startPrank(POOL_OWNER);
        pools.setDisputeTerms(id, d);
        pools.startPool(id);
        vm.stopPrank();
    }

    /// @dev A populated start (through the handler, so its model sees everything): four registered
    /// providers, eight bound nodes, six of them in the two pools, and two batches of work.
    function _prepopulate() internal {
        for (uint256 i; i < 4; ++i) {
            handler.register(i, 500e18 + i * 100e18);
        }
        for (uint256 n; n < 8; ++n) {
            handler.addNode(n % 4, n, 1);
        }
        for (uint256 n; n < 6; ++n) {
            handler.joinPool(n, n % 2);
        }
        handler.recordWork(0, 0, 4, 11);
        handler.recordWork(1, 0, 4, 12);
        require(handler.recCount() == 6 && handler.outcomeMismatches() == 0, "prepopulate");
    }

    // ------------------------------------------------------------------ stake

    /// @dev Per provider: deposited == staked + unbonding + withdrawn + slashed, and every field
    /// equals the handler's independent model.
    function _check_stakeConservationPerProvider() internal view {
        for (uint256 i; i < actors.length; ++i) {
            address a = actors[i];
            ProviderRegistry.Provider memory p = registry.getProvider(a);
            assertEq(p.deposited, p.staked + p.unbonding + p.withdrawn + p.slashed, "deposited split");
            assertEq(p.registered, handler.gRegistered(a), "registered");
            assertEq(p.deposited, handler.gDeposited(a), "deposited");
            assertEq(p.staked, handler.gStaked(a), "staked");
            assertEq(p.unbonding, handler.gUnbonding(a), "unbonding");
            assertEq(p.withdrawn, handler.gWithdrawn(a), "withdrawn");
            assertEq(p.slashed, handler.gSlashed(a), "slashed");
            assertEq(uint256(p.computeUnits), handler.gComputeUnits(a), "compute units");
            if (p.unbonding != 0) assertEq(uint256(p.unbondingEnd), handler.gUnbondingEnd(a), "unbonding end");
        }
    }

    /// @dev In total: the registry holds exactly totalStaked + totalUnbonding, the totals are the sums
    /// over providers, and every slashed token went to the treasury or a validator.
    function _check_stakeConservationTotal() internal view {
        uint256 staked;
        uint256 unbonding;
        uint256 deposited;
        uint256 out;
        for (uint256 i; i < actors.length; ++i) {
            ProviderRegistry.Provider memory p = registry.getProvider(actors[i]);
            staked += p.staked;
            unbonding += p.unbonding;
            deposited += p.deposited;
            out += p.withdrawn + p.slashed;
        }
        assertEq(registry.totalStaked(), staked, "totalStaked");
        assertEq(registry.totalUnbonding(), unbonding, "totalUnbonding");
        assertEq(token.balanceOf(address(registry)), staked + unbonding, "registry balance");
        assertEq(deposited, staked + unbonding + out, "deposits");
        // Bounties go to accusers (checked per payment by the handler); the treasury gets the rest of
        // every slash, every revoked reward, every lapse fee and the appeal bond of every upheld soft
        // dispute.
        assertEq(
            token.balanceOf(TREASURY),
            handler.gTotalSlashed() - handler.gTotalBounty() + handler.gTotalForfeited() + handler.gLapseFees()
                + handler.gBondsToTreasury(),
            "treasury"
        );
    }

    /// @dev No token is created or lost: the holders' balances add up to the supply.
    function _check_tokenSupplyAccountedFor() internal view {
        uint256 sum = token.balanceOf(address(registry)) + token.balanceOf(address(ledger)) + token.balanceOf(TREASURY)
            + token.balanceOf(FUNDER) + token.balanceOf(POOL_OWNER) + token.balanceOf(STRANGER);
        for (uint256 i; i < actors.length; ++i) {
            sum += token.balanceOf(actors[i]);
        }
        for (uint256 i; i < vals.length; ++i) {
            sum += token.balanceOf(vals[i]);
        }
        assertEq(sum, token.totalSupply(), "supply");
    }

    // ------------------------------------------------------------------ deadlines and settlement

    function _check_noClaimBeforeDeadline() internal view {
        assertEq(handler.claimsBeforeDeadline(), 0, "claim before deadline");
    }

    function _check_noInvalidationAtOrAfterDeadline() internal view {
        assertEq(handler.invalidationsAtOrAfterDeadline(), 0, "invalidation at/after deadline");
    }

    /// @dev Each record is recorded once, paid at most once, invalidated at most once, never both;
    /// the ledger's stored record matches the model.
    function _check_noRecordSettledTwice() internal view {
        uint256 n = handler.recCount();
        for (uint256 i; i < n; ++i) {
            Handler.Rec memory g = handler.recAt(i);
            assertEq(uint256(g.recordings), 1, "recorded twice");
            assertLe(g.claims, 1, "claimed twice");
            assertLe(g.invalidations, 1, "invalidated twice");
            assertLe(uint256(g.claims) + g.invalidations, 1, "claimed and invalidated");
            WorkLedger.Record memory r = ledger.getRecord(g.poolId, g.workKey);
            assertTrue(r.status == g.status, "status");
            assertEq(r.provider, g.provider, "provider");
            assertEq(uint256(r.deadline), g.deadline, "deadline");
            assertEq(uint256(r.units), uint256(g.units), "units");
            if (g.claims == 1) assertTrue(r.status == WorkLedger.RecordStatus.Claimed, "claimed status");
            if (g.invalidations == 1) assertTrue(r.status == WorkLedger.RecordStatus.Invalidated, "invalid status");
        }
    }

    // ------------------------------------------------------------------ access control

    function _check_onlyAuthorizedCallers() internal view {
        assertEq(handler.unauthorizedSuccesses(), 0, "a wrong caller succeeded");
        assertEq(handler.unexpectedRoleReverts(), 0, "a wrong caller failed for another reason");
    }

    // ------------------------------------------------------------------ ledger accounting

    function _check_ledgerPoolAccounting() internal view {
        uint256 budgets;
        for (uint256 i; i < 2; ++i) {
            uint256 id = poolIdsArr[i];
            WorkLedger.PoolAccount memory a = ledger.poolAccount(id);
            assertEq(
                uint256(a.budget) + a.claimedTokens + a.forfeitedTokens,
                handler.gFunded(id) - handler.gSurplusWithdrawn(id),
                "budget + claimed + forfeited == funded - withdrawn"
            );
            assertEq(uint256(a.forfeitedTokens), handler.gForfeited(id), "forfeited tokens");
            // A revoked reward never comes back: forfeited tokens are exactly the invalidated units' rewards.
            assertEq(
                uint256(a.forfeitedTokens), uint256(a.invalidatedUnits) * pools.poolTerms(id).rewardRate, "forfeited"
            );
            assertEq(
                uint256(a.recordedUnits),
                uint256(a.pendingUnits) + a.invalidatedUnits + a.claimedUnits,
                "recorded == pending + invalidated + claimed"
            );
            assertEq(uint256(a.recordedUnits), handler.gRecordedUnits(id), "recorded");
            assertEq(uint256(a.pendingUnits), handler.gPendingUnits(id), "pending");
            assertEq(uint256(a.invalidatedUnits), handler.gInvalidatedUnits(id), "invalidated");
            assertEq(uint256(a.claimedUnits), handler.gClaimedUnits(id), "claimed units");
            assertEq(uint256(a.claimedTokens), handler.gClaimedTokens(id), "claimed tokens");
            budgets += a.budget;
        }
        assertEq(token.balanceOf(address(ledger)), budgets + ledger.bondsHeld(), "ledger balance == budgets + bonds");
    }

    /// @dev Bonds in = bonds paid + bonds held; no slash before its appeal ended or was decided; the
    /// parties never sit on their own committee, nor anyone outside the set the dispute opened under or
    /// named after the work; a record is never claimable (nor claimed) while a dispute of it is open.
    function _check_disputes() internal view {
        assertEq(handler.gBondsIn(), handler.gBondsPaid() + ledger.bondsHeld(), "bonds in == paid + held");
        assertEq(handler.slashesBeforeAppealEnd(), 0, "slash before the appeal period ended");
        assertEq(handler.partiesOnCommittee(), 0, "a party on its own committee");
        assertEq(handler.committeeMismatches(), 0, "committee size or set");
        assertEq(handler.ineligibleJurors(), 0, "an ineligible juror drawn");
        assertEq(handler.claimsWhileDisputed(), 0, "claimed while disputed");
        uint256 n = handler.recCount();
        for (uint256 i; i < n; ++i) {
            Handler.Rec memory g = handler.recAt(i);
            WorkLedger.Dispute memory x = ledger.getDispute(g.poolId, g.workKey);
            assertTrue(x.kind == g.dkind, "dispute kind");
            assertTrue(x.verdict == g.verdict, "verdict");
            assertEq(x.accuser, g.accuser, "accuser");
            assertEq(x.hard, g.hard, "hard");
            assertEq(uint256(x.round), uint256(g.round), "round");
            assertEq(x.softCleared, g.softCleared, "soft cleared");
            if (g.dkind != WorkLedger.DisputeKind.None) {
                assertEq(uint256(x.openedAt), g.openedAt, "opened at");
                assertEq(uint256(x.recordedAt), g.recordedAt, "recorded at");
                assertEq(uint256(x.openedBlock), g.openedBlock, "opened in block");
            }
            if (handler.disputeOpenAt(i)) {
                assertTrue(g.status == WorkLedger.RecordStatus.Disputed, "open dispute, disputed record");
                assertFalse(_isClaimable(g.poolId, g.workKey), "claimable while disputed");
                assertEq(uint256(ledger.lockedUntil(g.provider)), type(uint64).max, "stake locked while disputed");
            }
        }
        // The ledger's open-dispute count of each provider agrees with the model (a superseded soft
        // dispute is no longer counted): its stake is locked for ever exactly while one is open.
        for (uint256 i; i < actors.length; ++i) {
            assertEq(
                ledger.lockedUntil(actors[i]) == type(uint64).max,
                handler.gOpenDisputes(actors[i]) != 0,
                "locked for ever iff a dispute is open"
            );
        }
    }

    /// @dev Solvent pools: the rewards reserved by pending records never exceed the pool's budget.
    function _check_reservedWithinFunds() internal view {
        for (uint256 i; i < 2; ++i) {
            uint256 id = poolIdsArr[i];
            WorkLedger.PoolAccount memory a = ledger.poolAccount(id);
            uint256 reserved = uint256(a.pendingUnits) * pools.poolTerms(id).rewardRate;
            assertLe(reserved, uint256(a.budget), "reserved rewards <= pool budget");
        }
    }

    /// @dev Stake backs the work: nothing recorded for an under-staked provider, nothing withdrawn
    /// while a record of the provider can still be invalidated, and the ledger's lock reaches every
    /// open record's deadline.
    function _check_stakeBacksWork() internal view {
        assertEq(handler.recordsUnderStaked(), 0, "work recorded for an under-staked provider");
        assertEq(handler.withdrawalsWhileLocked(), 0, "stake withdrawn while its work could be slashed");
        uint256 n = handler.recCount();
        for (uint256 i; i < n; ++i) {
            Handler.Rec memory r = handler.recAt(i);
            if (r.status != WorkLedger.RecordStatus.Pending) continue;
            assertGe(uint256(ledger.lockedUntil(r.provider)), r.deadline, "stake lock covers the record");
        }
    }

    // ------------------------------------------------------------------ model agreement

    /// @dev Every call succeeded exactly when the model said it should, and paid what it should.
    function _check_callsMatchModel() internal view {
        assertEq(handler.outcomeMismatches(), 0, handler.lastMismatch());
        assertEq(handler.paymentMismatches(), 0, "payment");
    }

    /// @dev Each provider's stake floor is the sum of the minimums of the distinct pools it is in.
    function _check_floorsMatchModel() internal view {
        for (uint256 i; i < actors.length; ++i) {
            assertEq(pools.stakeFloor(actors[i]), handler.gFloor(actors[i]), "stake floor");
        }
    }

    /// @dev The validator sets agree with the model (who, and when each was named).
    function _check_validatorsMatchModel() internal view {
        for (uint256 i; i < 2; ++i) {
            uint256 id = poolIdsArr[i];
            for (uint256 j; j < vals.length; ++j) {
                assertEq(uint256(pools.validatorSince(id, vals[j])), handler.gSince(id, vals[j]), "validator since");
            }
            assertEq(pools.validatorsOf(id).length, handler.gValidatorCount(id), "validator count");
            (address[] memory vs, uint64[] memory since) = pools.validatorEntries(id);
            assertEq(pools.validatorSetHash(id), keccak256(abi.encode(vs, since)), "validator set hash");
        }
    }

    /// @dev Membership agrees with the model and only bound nodes are members.
    function _check_membershipMatchesModel() internal view {
        for (uint256 i; i < 12; ++i) {
            address node = vm.addr(0xA000 + i);
            assertEq(pools.poolOf(node), handler.gPoolOf(node), "poolOf");
            assertEq(registry.providerOf(node), handler.gNodeProvider(node), "providerOf");
            if (pools.poolOf(node) != 0) assertTrue(registry.providerOf(node) != address(0), "member unbound");
        }
    }
}

/// @notice Protocol invariants under random sequences of register/stake/unstake/withdraw/addNode/
/// removeNode/join/leave/eject/blacklist/record/invalidate/claim/fund/withdrawSurplus/warp, the dispute
/// actions (accuse soft or hard, appeal, challenge, draw, vote, resolve, finalize; records reopened and
/// disputed again, soft disputes superseded by hard ones), validator-set changes and calls from wrong
/// accounts, driven by `Handler` (see its ghost variables).
contract InvariantsTest is InvariantsBase {
    function setUp() public override {
        super.setUp();
        _prepopulate();
    }

    function invariant_stakeConservationPerProvider() public view {
        _check_stakeConservationPerProvider();
    }

    function invariant_stakeConservationTotal() public view {
        _check_stakeConservationTotal();
    }

    function invariant_tokenSupplyAccountedFor() public view {
        _check_tokenSupplyAccountedFor();
    }

    function invariant_noClaimBeforeDeadline() public view {
        _check_noClaimBeforeDeadline();
    }

    function invariant_noInvalidationAtOrAfterDeadline() public view {
        _check_noInvalidationAtOrAfterDeadline();
    }

    function invariant_noRecordSettledTwice() public view {
        _check_noRecordSettledTwice();
    }

    function invariant_onlyAuthorizedCallers() public view {
        _check_onlyAuthorizedCallers();
    }

    function invariant_ledgerPoolAccounting() public view {
        _check_ledgerPoolAccounting();
    }

    function invariant_disputes() public view {
        _check_disputes();
    }

    function invariant_reservedWithinFunds() public view {
        _check_reservedWithinFunds();
    }

    function invariant_stakeBacksWork() public view {
        _check_stakeBacksWork();
    }

    function invariant_callsMatchModel() public view {
        _check_callsMatchModel();
    }

    function invariant_membershipMatchesModel() public view {
        _check_membershipMatchesModel();
    }

    function invariant_floorsMatchModel() public view {
        _check_floorsMatchModel();
    }

    function invariant_validatorsMatchModel() public view {
        _check_validatorsMatchModel();
    }
}

/// @notice Runs the handler through a fixed script, to show that every action can succeed (so the
/// random campaigns are not vacuous) and that the ghosts stay consistent.
contract HandlerSmokeTest is InvariantsBase {
    function test_handler_exercisesEveryAction() public {
        handler.register(0, 1_000e18); // ALICE
        handler.register(1, 1_000e18); // BOB
        handler.stake(0, 100e18);
        handler.addNode(0, 0, 1); // node 0 -> ALICE
        handler.addNode(1, 1, 2); // node 1 -> BOB
        handler.addNode(0, 2, 1); // node 2 -> ALICE
        handler.joinPool(0, 0); // node 0 -> pool 1
        handler.joinPool(1, 1); // node 1 -> pool 2
        handler.joinPool(2, 0); // node 2 -> pool 1: its minimum counts once in ALICE's floor
        assertEq(pools.stakeFloor(ALICE), 100e18);
        handler.recordWork(0, 0, 2, 1); // pool 1: nodes 0 and 2
        handler.recordWork(1, 1, 1, 2); // pool 2: node 1
        handler.recordDuplicate(0, 0);
        assertEq(handler.recCount(), 3);
        handler.invalidateWork(0, 0, bytes32(uint256(4)), 4); // soft: an accusation without a bond
        assertTrue(handler.recAt(0).status == WorkLedger.RecordStatus.Disputed);
        handler.warpToDeadline(1, 2); // one second after record 1's deadline
        handler.claim(1);
        handler.invalidateWork(1, 0, bytes32(uint256(1)), 4); // refused: already claimed
        handler.warp(2 days);
        handler.claim(2);
        handler.finalizeInvalidation(0); // the soft accusation stands: revoked, reward to the treasury
        assertTrue(handler.recAt(0).status == WorkLedger.RecordStatus.Invalidated);
        handler.leavePool(2, 0);
        handler.removeNode(2);
        handler.ejectNode(1, 1);
        handler.blacklistNode(0, 0); // node 0 blacklisted from pool 1
        handler.unstake(1, 10e18);
        handler.warp(3 days);
        handler.withdraw(1);
        handler.fundPool(0, 5e18);
        handler.withdrawSurplus(0, 1e18);
        handler.setBounty(5_000, 1);
        handler.recordWork(1, 1, 1, 3); // pool 2: node 1 is out (ejected), nothing recorded
        handler.joinPool(3, 1);
        handler.addNode(1, 3, 1); // node 3 -> BOB
        handler.joinPool(3, 1); // node 3 -> pool 2
        handler.recordWork(1, 3, 1, 4);
        assertEq(handler.recCount(), 4);
        handler.settleAtDeadline(3, 0, true); // one second before: claim refused, (soft) accusation accepted
        assertTrue(handler.recAt(3).status == WorkLedger.RecordStatus.Disputed);
        handler.recordWork(1, 3, 1, 5);
        handler.settleAtDeadline(4, 1, false); // at the deadline: accusation refused, claim accepted
        assertTrue(handler.recAt(4).status == WorkLedger.RecordStatus.Claimed);
        for (uint256 w; w < 15; ++w) {
            handler.tryUnauthorized(w, w, w);
        }

        // Disputes, all in pool 2 (appeal period 1 day, vote period 1 hour, bond 1e18).
        for (uint256 j = 6; j < 10; ++j) {
            handler.recordWork(1, 3, 1, j); // records 5..8, BOB's node 3
        }
        assertEq(handler.recCount(), 9);
        uint256 g = uint256(1) << 128; // guided: the handler picks a validator that may act, a drawn juror
        handler.invalidateWork(5, g, bytes32(uint256(1)), 1); // a forged signature: refused
        assertTrue(handler.recAt(5).status == WorkLedger.RecordStatus.Pending);
        handler.invalidateWork(5, g, bytes32(uint256(1)), 4); // accused, signed by the node
        uint256 deadline5 = handler.recAt(5).deadline;
        handler.appeal(5);
        handler.warp(10 minutes);
        handler.vote(5, g, false);
        handler.vote(5, g + 1, false); // two of three: overturned, the deadline stays (an accusation)
        assertTrue(handler.recAt(5).verdict == WorkLedger.Verdict.Overturned);
        assertTrue(handler.recAt(5).status == WorkLedger.RecordStatus.Pending);
        assertEq(handler.recAt(5).deadline, deadline5);
        handler.challenge(5, 0, bytes32("again"), 4); // ALICE challenges the reopened record
        handler.warp(2 hours);
        handler.resolveLapsed(5); // nobody voted: lapsed, the challenger pays the fee, reopened again
        assertTrue(handler.recAt(5).verdict == WorkLedger.Verdict.Lapsed);
        assertTrue(handler.recAt(5).status == WorkLedger.RecordStatus.Pending);
        handler.invalidateWork(6, g, bytes32(uint256(4)), 4); // soft
        handler.appeal(6); // a soft accusation appealed
        handler.vote(6, g, true);
        handler.vote(6, g + 1, true); // upheld: revoked, not slashed, the appeal bond to the treasury
        assertTrue(handler.recAt(6).status == WorkLedger.RecordStatus.Invalidated);
        handler.challenge(7, 0, bytes32("wrong"), 4); // ALICE challenges BOB's record
        handler.vote(7, g + 2, true);
        handler.vote(7, g + 3, true); // upheld: BOB slashed, ALICE paid
        assertTrue(handler.recAt(7).verdict == WorkLedger.Verdict.Upheld);
        handler.invalidateWork(8, g, bytes32(uint256(1)), 4); // hard, never appealed
        handler.finalizeInvalidation(8); // refused: the appeal period is not over

        // The owner changes the validator set while a dispute is open; its committee does not change.
        handler.addValidator(1, g + 4); // JUROR4 named in pool 2
        handler.recordWork(1, 3, 1, 10); // record 9, after JUROR4 was named
        handler.challenge(9, 0, bytes32("late"), 4);
        handler.removeValidator(4, g + 1); // JUROR1 removed from pool 2
        handler.drawCommittee(9, false, true); // refused: not the set the challenge opened under
        handler.drawCommittee(9, true, false); // stale seed: every eligible validator sits
        assertEq(uint256(ledger.getDispute(poolIdsArr[1], handler.recAt(9).workKey).size), 5);
        handler.vote(9, g + 1, false); // JUROR1, removed since, still votes
        handler.vote(9, g + 2, false);
        handler.vote(9, g + 3, false); // three of five: overturned
        assertTrue(handler.recAt(9).verdict == WorkLedger.Verdict.Overturned);
        handler.warp(1 days);
        handler.finalizeInvalidation(8);
        assertTrue(handler.recAt(8).status == WorkLedger.RecordStatus.Invalidated);

        // A hard dispute supersedes an open soft one; a record cleared of a soft accusation is never
        // softly accused again.
        for (uint256 j = 11; j < 14; ++j) {
            handler.recordWork(1, 3, 1, j); // records 10..12, BOB's node 3
        }
        assertEq(handler.recCount(), 13);
        handler.invalidateWork(10, g, bytes32(uint256(4)), 4); // soft
        handler.invalidateWork(10, g + 2, bytes32(uint256(1)), 4); // hard: supersedes it
        assertTrue(handler.recAt(10).hard && handler.recAt(10).verdict == WorkLedger.Verdict.Open);
        handler.invalidateWork(10, g + 3, bytes32(uint256(8)), 4); // soft: supersedes nothing, refused
        assertTrue(handler.recAt(10).hard);
        handler.invalidateWork(11, g, bytes32(uint256(4)), 4); // soft
        handler.appeal(11);
        handler.challenge(11, 0, bytes32("over it"), 4); // a challenge supersedes nothing: refused
        assertTrue(handler.recAt(11).dkind == WorkLedger.DisputeKind.Appeal && !handler.recAt(11).hard);
        handler.invalidateWork(11, g + 1, bytes32(uint256(1)), 4); // a validator's hard one supersedes it
        assertTrue(handler.recAt(11).dkind == WorkLedger.DisputeKind.Accusation && handler.recAt(11).hard);
        handler.appeal(11);
        handler.vote(11, g, true);
        handler.vote(11, g + 1, true); // upheld: BOB slashed
        assertTrue(handler.recAt(11).status == WorkLedger.RecordStatus.Invalidated);
        handler.invalidateWork(12, g, bytes32(uint256(4)), 4); // soft
        handler.appeal(12);
        handler.vote(12, g, false);
        handler.vote(12, g + 1, false); // overturned: cleared of soft accusations
        assertTrue(handler.recAt(12).softCleared);
        handler.invalidateWork(12, g + 1, bytes32(uint256(4)), 4); // soft again: refused
        assertTrue(handler.recAt(12).status == WorkLedger.RecordStatus.Pending);
        handler.invalidateWork(12, g + 1, bytes32(uint256(1)), 4); // hard: still possible
        assertTrue(handler.recAt(12).status == WorkLedger.RecordStatus.Disputed);
        handler.recordWork(1, 3, 1, 14); // record 13
        handler.softDispute(13, g, 2); // soft, appealed, overturned by two jurors
        assertTrue(handler.recAt(13).softCleared);
        handler.softDispute(13, g + 1, 0); // refused
        assertTrue(handler.recAt(13).status == WorkLedger.RecordStatus.Pending);
        handler.warp(1 days);
        handler.finalizeInvalidation(10);
        handler.finalizeInvalidation(12);
        assertTrue(handler.recAt(10).status == WorkLedger.RecordStatus.Invalidated);
        assertTrue(handler.recAt(12).status == WorkLedger.RecordStatus.Invalidated);

        string[37] memory names = [
            "register", "stake", "unstake", "withdraw", "addNode", "removeNode", "joinPool", "joinPoolAgain",
            "leavePool", "ejectNode", "blacklistNode", "recordWork", "softInvalidate", "accuse", "claim",
            "fundPool", "withdrawSurplus", "setBounty", "finalizeInvalidation", "appeal", "softAppeal",
            "challenge", "vote", "voteByRemovedJuror", "resolveLapsed", "lapsedChallenge", "reDispute",
            "reopenedLater", "addValidator", "removeValidator", "drawCommittee", "drawStale", "supersedeSoft",
            "supersedeSoftAppeal", "softCleared", "softClearedRefused", "softUpheldToTreasury"
        ];
        for (uint256 i; i < names.length; ++i) {
            assertGt(handler.successCount(names[i]), 0, names[i]);
        }
        assertGt(handler.unauthorizedAttempts(), 10);
        assertEq(handler.successCount("recordDuplicate"), 0);

        _check_stakeConservationPerProvider();
        _check_stakeConservationTotal();
        _check_tokenSupplyAccountedFor();
        _check_noClaimBeforeDeadline();
        _check_noInvalidationAtOrAfterDeadline();
        _check_noRecordSettledTwice();
        _check_onlyAuthorizedCallers();
        _check_ledgerPoolAccounting();
        _check_reservedWithinFunds();
        _check_stakeBacksWork();
        _check_disputes();
        _check_callsMatchModel();
        _check_membershipMatchesModel();
        _check_floorsMatchModel();
        _check_validatorsMatchModel();
    }
}

/// @notice The handler driven by a seeded random walk instead of the invariant fuzzer: every action
/// with uniformly random arguments (the fuzzer favours small dictionary values, which the handler
/// never guides), 1,500 steps per seed, every invariant checked along the way. Together with the
/// campaign this reaches the long dispute paths: re-disputes of reopened records, soft appeals,
/// hard disputes superseding soft ones, records cleared of soft accusations, lapsed challenges,
/// stale draws and validator-set changes while disputes are open.
contract HandlerRandomWalkTest is InvariantsBase {
    function setUp() public override {
        super.setUp();
        _prepopulate();
    }

    /// forge-config: default.fuzz.runs = 16
    function testFuzz_handler_randomWalk(uint256 seed) public {
        for (uint256 i; i < 1_500; ++i) {
            seed = uint256(keccak256(abi.encode(seed, i)));
            _step(seed);
            if (i % 250 == 249) _checkAll();
        }
        _checkAll();
    }

    function _step(uint256 seed) internal {
        uint256 w = seed % 30;
        uint256 a = uint256(keccak256(abi.encode(seed, 1)));
        uint256 b = uint256(keccak256(abi.encode(seed, 2)));
        uint256 c = uint256(keccak256(abi.encode(seed, 3)));
        uint256 d = uint256(keccak256(abi.encode(seed, 4)));
        if (w == 0) handler.register(a, b);
        else if (w == 1) handler.stake(a, b);
        else if (w == 2) handler.unstake(a, b);
        else if (w == 3) handler.withdraw(a);
        else if (w == 4) handler.addNode(a, b, uint64(c));
        else if (w == 5) handler.removeNode(a);
        else if (w == 6) handler.joinPool(a, b);
        else if (w == 7) handler.leavePool(a, b);
        else if (w == 8) handler.ejectNode(a, b);
        else if (w == 9) handler.blacklistNode(a, b);
        else if (w == 10) handler.recordWork(a, b, c, d);
        else if (w == 11) handler.recordDuplicate(a, b);
        else if (w == 12) handler.invalidateWork(a, b, bytes32(c), d);
        else if (w == 13) handler.claim(a);
        else if (w == 14) handler.fundPool(a, b);
        else if (w == 15) handler.withdrawSurplus(a, b);
        else if (w == 16) handler.setBounty(uint16(a), b);
        else if (w == 17) handler.warp(a);
        else if (w == 18) handler.warpToDeadline(a, b);
        else if (w == 19) handler.tryUnauthorized(a, b, c);
        else if (w == 20) handler.settleAtDeadline(a, b, c % 2 == 0);
        else if (w == 21) handler.finalizeInvalidation(a);
        else if (w == 22) handler.appeal(a);
        else if (w == 23) handler.challenge(a, b, bytes32(c), d);
        else if (w == 24) handler.vote(a, b, c % 3 != 0);
        else if (w == 25) handler.resolveLapsed(a);
        else if (w == 26) handler.addValidator(a, b);
        else if (w == 27) handler.removeValidator(a, b);
        else if (w == 28) handler.drawCommittee(a, b % 2 == 0, c % 3 == 0);
        else handler.softDispute(a, b, uint8(c));
    }

    function _checkAll() internal view {
        _check_callsMatchModel();
        _check_stakeConservationPerProvider();
        _check_stakeConservationTotal();
        _check_tokenSupplyAccountedFor();
        _check_noClaimBeforeDeadline();
        _check_noInvalidationAtOrAfterDeadline();
        _check_noRecordSettledTwice();
        _check_onlyAuthorizedCallers();
        _check_ledgerPoolAccounting();
        _check_reservedWithinFunds();
        _check_stakeBacksWork();
        _check_disputes();
        _check_membershipMatchesModel();
        _check_floorsMatchModel();
        _check_validatorsMatchModel();
    }
}
