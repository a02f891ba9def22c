// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Vm} from "./utils/Test.sol";
import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {PoolManager} from "../src/PoolManager.sol";
import {WorkLedger} from "../src/WorkLedger.sol";

/// @notice Issue 38 ("Disputes nobody can game"): the nine attacks of the review, and four more found
/// in the rules that replaced them (10 to 13), each replayed against the current contracts and shown
/// REFUSED: the attacker's call reverts with the specific error, or the attacker gains nothing and the
/// honest party loses nothing. Each test says what the old contracts allowed (the attacks as they
/// succeeded there were written as tests in the review).
contract DisputeAttacksTest is Fixture {
    uint256 internal constant T0 = 1_700_000_000;
    uint256 internal constant BOND = 10e18;
    uint256 internal constant FUND = 1_000e18;
    /// @dev Units of one record: 100 tokens of reward at RATE.
    uint48 internal constant UNITS = 1e8;
    uint256 internal constant REWARD = uint256(UNITS) * RATE;

    address internal constant PUPPET1 = address(0xB001);
    address internal constant PUPPET2 = address(0xB002);
    address internal constant PUPPET3 = address(0xB003);
    address internal constant JUROR4 = address(0x1A04);
    address internal constant JUROR5 = address(0x1A05);
    address internal constant DAVE = address(0xDA);
    /// @dev The event the old contracts emitted when they committed a committee draw to a new block.
    bytes32 internal constant COMMITTEE_REDRAW = keccak256("CommitteeRedraw(uint256,bytes32,uint64)");

    uint256 internal poolId;
    address internal node1;

    function setUp() public override {
        super.setUp();
        vm.warp(T0);
        poolId = _pool(1 days);
        node1 = _member(poolId, ALICE, NODE1_PK, 200e18);
        _give(ALICE, 100e18); // appeal bonds
        _give(VALIDATOR, 1_000e18); // accusation bonds
        _registerProvider(BOB, 100e18); // a staked provider that may challenge
        _give(BOB, 1_000e18); // challenge bonds
    }

    /// @dev A started pool (window 1 day, appeal 1 day, committees of three from VALIDATOR and the
    /// three jurors, bond BOND) with `votePeriod`, funded with FUND.
    function _pool(uint64 votePeriod) internal returns (uint256 id) {
        id = _createPool(_params());
        vm.startPrank(POOL_OWNER);
        pools.setDisputeTerms(id, PoolManager.DisputeTerms(1 days, votePeriod, 3, uint128(BOND), address(0)));
        pools.startPool(id);
        vm.stopPrank();
        _fundPool(id, FUND);
    }

    function _status(uint256 id, bytes32 k) internal view returns (WorkLedger.RecordStatus) {
        return ledger.getRecord(id, k).status;
    }

    function _accuse(address who, uint256 id, bytes32 k, bool hard) internal {
        bytes memory sig = hard ? _rolloutSig(id, k) : bytes("");
        vm.prank(who);
        ledger.invalidateWork(id, k, keccak256("evidence"), hard, sig);
    }

    function _challenge(address who, uint256 id, bytes32 k) internal {
        bytes memory sig = _rolloutSig(id, k);
        vm.prank(who);
        ledger.challenge(id, k, keccak256("chunk 3 fails"), sig);
    }

    function _vote(uint256 id, bytes32 k, address who, bool uphold) internal {
        vm.prank(who);
        ledger.vote(id, k, uphold);
    }

    /// @dev Draws the committee of `k`'s dispute from `vs`/`since` (one block later) and returns its
    /// members among `vs`.
    function _drawn(bytes32 k, address[] memory vs, uint64[] memory since) internal returns (address[] memory c) {
        vm.roll(block.number + 1);
        ledger.drawCommittee(poolId, k, vs, since);
        uint256 n;
        c = new address[](vs.length);
        for (uint256 i; i < vs.length; ++i) {
            if (ledger.jurorState(poolId, k, vs[i]) == 1) c[n++] = vs[i];
        }
        assembly ("memory-safe") {
            mstore(c, n)
        }
    }

    function _drawn(bytes32 k) internal returns (address[] memory) {
        (address[] memory vs, uint64[] memory since) = pools.validatorEntries(poolId);
        return _drawn(k, vs, since);
    }

    // ------------------------------------------------------------------ 1

    /// @dev Finding 1. Old contracts: the owner named itself validator after work was recorded
    /// (addValidator worked at any time), soft-invalidated every honest record one second before its
    /// deadline (no bond, no appeal, revoked at once) and withdrew the whole budget, the reserved
    /// rewards included. Now a validator named after a record was recorded may not act on it
    /// (NamedAfterWork); and one named before gains nothing by revoking: a soft invalidation only
    /// freezes the record for an appeal period (its reward still reserved, so `withdrawSurplus` cannot
    /// take it), the provider may appeal it, and a revocation that stands sends the reward to the
    /// treasury, never back to the pool.
    function test_finding1_ownerCannotRevokeHonestWorkToKeepTheBudget() public {
        address node2 = _member(poolId, CAROL, NODE2_PK, 200e18);
        bytes32 k1 = _recordOne(poolId, node1, UNITS);
        vm.warp(T0 + 1 hours);
        bytes32 k2 = _recordOne(poolId, node2, UNITS);
        vm.warp(T0 + 1 hours + 1);
        vm.prank(POOL_OWNER);
        pools.addValidator(poolId, POOL_OWNER);
        uint64 named = uint64(T0 + 1 hours + 1);

        // Named after the work: refused, soft or hard.
        vm.warp(T0 + 1 days - 1);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NamedAfterWork.selector, k1, named, uint40(T0)));
        vm.prank(POOL_OWNER);
        ledger.invalidateWork(poolId, k1, bytes32(0), false, "");
        bytes memory sig = _rolloutSig(poolId, k1);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NamedAfterWork.selector, k1, named, uint40(T0)));
        vm.prank(POOL_OWNER);
        ledger.invalidateWork(poolId, k1, bytes32(0), true, sig);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.NamedAfterWork.selector, k2, named, uint40(T0 + 1 hours))
        );
        vm.prank(POOL_OWNER);
        ledger.invalidateWork(poolId, k2, bytes32(0), false, "");
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SurplusTooLow.selector, FUND - 2 * REWARD, FUND));
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, FUND, POOL_OWNER);
        vm.warp(T0 + 1 hours + 1 days);
        assertEq(_claim(poolId, ALICE, k1), REWARD);
        assertEq(_claim(poolId, CAROL, k2), REWARD);

        // Named before the work: the owner may revoke it, but gets nothing for it.
        vm.warp(T0 + 2 days);
        bytes32 k3 = _recordOne(poolId, node1, UNITS);
        bytes32 k4 = _recordOne(poolId, node2, UNITS);
        vm.warp(T0 + 3 days - 1);
        vm.prank(POOL_OWNER);
        ledger.invalidateWork(poolId, k3, bytes32(0), false, "");
        vm.prank(POOL_OWNER);
        ledger.invalidateWork(poolId, k4, bytes32(0), false, "");
        uint256 free = FUND - 4 * REWARD; // what the owner could always take back
        assertEq(ledger.surplus(poolId), free, "revoked rewards stay reserved while the dispute is open");
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SurplusTooLow.selector, free, FUND));
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, FUND, POOL_OWNER);
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, free, POOL_OWNER);

        // ALICE appeals; the committee (the owner is a party, so not on it) overturns: she is paid.
        vm.prank(ALICE);
        ledger.appeal(poolId, k3);
        address[] memory c = _drawn(k3);
        assertEq(c.length, 3);
        _vote(poolId, k3, c[0], false);
        _vote(poolId, k3, c[1], false);
        assertTrue(_status(poolId, k3) == WorkLedger.RecordStatus.Pending);
        // CAROL does not appeal: once the appeal period is over the reward goes to the treasury.
        vm.warp(T0 + 4 days - 1);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.RewardForfeited(poolId, k4, TREASURY, REWARD);
        ledger.finalizeInvalidation(poolId, k4);
        assertEq(ledger.surplus(poolId), 0, "the forfeited reward did not come back to the pool");
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SurplusTooLow.selector, 0, 1));
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, 1, POOL_OWNER);
        assertEq(_claim(poolId, ALICE, k3), REWARD);

        assertEq(token.balanceOf(POOL_OWNER), free, "the owner got nothing by revoking");
        assertEq(token.balanceOf(TREASURY), REWARD);
        assertEq(token.balanceOf(address(ledger)), 0);
        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertEq(uint256(a.budget), 0);
        assertEq(uint256(a.forfeitedTokens), REWARD);
        assertEq(uint256(a.claimedTokens), 3 * REWARD);
    }

    // ------------------------------------------------------------------ 2

    /// @dev Finding 2. Old contracts: the committee's validator set was snapshotted when the provider
    /// appealed, not when the work was accused; between the accusation and the appeal the owner swapped
    /// the honest jurors for puppets, the committee drawn was all puppets, who upheld a false
    /// accusation (the honest provider slashed and its appeal bond lost). Now the set is the one the
    /// accusation opened under, puppets named after the record was recorded are not candidates (nor may
    /// they accuse it), and the honest jurors the owner removed since still sit and vote.
    function test_finding2_ownerCannotReseatTheJudgesBeforeTheAppeal() public {
        bytes32 k = _recordOne(poolId, node1, UNITS);
        vm.warp(T0 + 1);
        vm.startPrank(POOL_OWNER);
        pools.addValidator(poolId, PUPPET1);
        pools.addValidator(poolId, PUPPET2);
        pools.addValidator(poolId, PUPPET3);
        vm.stopPrank();
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NamedAfterWork.selector, k, uint64(T0 + 1), uint40(T0)));
        vm.prank(PUPPET1);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");

        (address[] memory atAccusation, uint64[] memory sinceAtAccusation) = pools.validatorEntries(poolId);
        _accuse(VALIDATOR, poolId, k, true); // the lie
        vm.startPrank(POOL_OWNER);
        pools.removeValidator(poolId, JUROR1);
        pools.removeValidator(poolId, JUROR2);
        pools.removeValidator(poolId, JUROR3);
        vm.stopPrank();

        uint256 aliceBefore = token.balanceOf(ALICE);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        (address[] memory now_, uint64[] memory sinceNow) = pools.validatorEntries(poolId);
        bytes32 snapshot = keccak256(abi.encode(atAccusation, sinceAtAccusation));
        vm.roll(block.number + 1);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.WrongValidatorSet.selector, k, snapshot));
        ledger.drawCommittee(poolId, k, now_, sinceNow);

        address[] memory c = _drawn(k, atAccusation, sinceAtAccusation);
        assertEq(c.length, 3);
        for (uint256 i; i < c.length; ++i) {
            assertTrue(c[i] == JUROR1 || c[i] == JUROR2 || c[i] == JUROR3, "the honest jurors, not the puppets");
        }
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NotJuror.selector, k, PUPPET1));
        _vote(poolId, k, PUPPET1, true);
        _vote(poolId, k, JUROR1, false); // removed from the pool, still on the committee
        _vote(poolId, k, JUROR2, false);

        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Overturned);
        assertEq(registry.getProvider(ALICE).slashed, 0, "the honest provider is not slashed");
        assertEq(token.balanceOf(ALICE), aliceBefore + BOND, "its bond back plus the liar's");
    }

    // ------------------------------------------------------------------ 3

    /// @dev Finding 3. Old contracts: a cheater's sybil challenged the record at once; nobody voted; the
    /// lapsed challenge left a dispute on file, so every validator was refused (AlreadyDisputed) until
    /// the deadline, the sybil had its whole bond back and the cheater claimed the full reward. Now the
    /// lapse costs the sybil LAPSE_FEE_BPS of its bond and the record is open again, to validators and
    /// to challengers, for the time its window had left when the sybil challenged it.
    function test_finding3_aLapsedSybilChallengeShieldsNothing() public {
        uint256 id = _pool(1 hours); // vote period shorter than the window
        address n = _member(id, CAROL, NODE2_PK, 200e18); // CAROL cheats, BOB is its sybil
        bytes32 k = _recordOne(id, n, UNITS);
        bytes32 k2 = _recordOne(id, n, UNITS);
        uint256 bobBefore = token.balanceOf(BOB);
        _challenge(BOB, id, k);
        _challenge(BOB, id, k2);
        vm.warp(T0 + 1 hours);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.WorkReopened(id, k, uint40(T0 + 1 hours + 1 days));
        ledger.resolveLapsed(id, k);
        ledger.resolveLapsed(id, k2);
        uint256 fee = BOND * ledger.LAPSE_FEE_BPS() / 10_000;
        assertEq(token.balanceOf(BOB), bobBefore - 2 * fee, "the sybil lost the lapse fee, twice");
        assertEq(token.balanceOf(TREASURY), 2 * fee);
        assertTrue(_status(id, k) == WorkLedger.RecordStatus.Pending);
        assertEq(uint256(ledger.getRecord(id, k).deadline), T0 + 1 hours + 1 days, "the day it had left");

        // At the old deadline the record is still open: a validator accuses it...
        vm.warp(T0 + 1 days);
        assertFalse(_isClaimable(id, k));
        _accuse(VALIDATOR, id, k, true);
        // ...and another challenger challenges the other one.
        _registerProvider(DAVE, 100e18);
        _give(DAVE, BOND);
        _challenge(DAVE, id, k2);
        assertEq(ledger.getDispute(id, k2).accuser, DAVE);

        vm.warp(T0 + 2 days);
        ledger.finalizeInvalidation(id, k);
        assertEq(registry.getProvider(CAROL).slashed, SLASH, "the cheater is slashed");
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, id));
        _claim(id, CAROL, k);
    }

    // ------------------------------------------------------------------ 4

    /// @dev Finding 4. Old contracts: an honest challenger found a bad record; a validator superseded
    /// the open challenge with its own hard invalidation and collected the bounty the challenger had
    /// earned (the challenger got only its bond back). Now nobody may act on a record while a dispute
    /// of it is open (AlreadySettled(Disputed)); the committee upholds the challenge and the challenger
    /// is paid the bounty.
    function test_finding4_aValidatorCannotTakeTheChallengersBounty() public {
        bytes32 k = _recordOne(poolId, node1, UNITS); // ALICE's bad record
        uint256 bobBefore = token.balanceOf(BOB);
        uint256 valBefore = token.balanceOf(VALIDATOR);
        _challenge(BOB, poolId, k);

        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed)
        );
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, keccak256("chunk 3 fails"), true, sig);

        address[] memory c = _drawn(k);
        _vote(poolId, k, c[0], true);
        _vote(poolId, k, c[1], true);

        assertEq(registry.getProvider(ALICE).slashed, SLASH);
        assertEq(token.balanceOf(BOB), bobBefore + SLASH / 10, "the challenger: bond back plus the bounty");
        assertEq(token.balanceOf(VALIDATOR), valBefore, "the validator: nothing");
    }

    // ------------------------------------------------------------------ 5

    /// @dev Finding 5. Old contracts: while the committee was upholding a challenge (one uphold cast),
    /// a validator colluding with the cheater superseded it with a soft invalidation: the cheater was
    /// never slashed and the committee could no longer vote. Now the downgrade is refused the same way
    /// (AlreadySettled(Disputed)), soft or hard, and the committee's majority slashes the cheater.
    function test_finding5_aChallengeCannotBeDowngradedToSoft() public {
        bytes32 k = _recordOne(poolId, node1, UNITS); // ALICE cheats
        _challenge(BOB, poolId, k);
        address[] memory c = _drawn(k);
        _vote(poolId, k, c[0], true);

        address colluder = c[2]; // any pool validator will do
        bytes memory settled =
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed);
        vm.expectRevert(settled);
        vm.prank(colluder);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(settled);
        vm.prank(colluder);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);

        _vote(poolId, k, c[1], true);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Upheld);
        assertTrue(_status(poolId, k) == WorkLedger.RecordStatus.Invalidated);
        assertEq(registry.getProvider(ALICE).slashed, SLASH, "the cheater is slashed");
        assertEq(registry.stakeOf(ALICE), 200e18 - SLASH);
    }

    // ------------------------------------------------------------------ 6

    /// @dev Finding 6. Old contracts: the coordinator recorded work the node never produced (no node
    /// signature was checked anywhere); a validator hard-invalidated it and the node's provider was
    /// slashed. Now a slash (a hard accusation or a challenge) needs the node's EIP-712 signature over
    /// the work, by a node bound to the record's provider: no signature, a key bound to nobody, a node
    /// of another provider, or the node's signature over another file are all refused, and nobody is
    /// slashed for unsigned work.
    function test_finding6_nobodyIsSlashedForWorkItNeverSigned() public {
        address node2 = _member(poolId, CAROL, NODE2_PK, 200e18); // another provider's node
        bytes32 forged = keccak256("a rollout node1 never signed");
        _record(poolId, _batch1(node1, forged, UNITS));
        bytes32 digest = ledger.rolloutDigest(poolId, forged);

        bytes[4] memory sigs;
        address[4] memory signers;
        sigs[0] = ""; // none
        sigs[1] = _sign(0xF0F0, digest); // the coordinator's own key, bound to nobody
        signers[1] = vm.addr(0xF0F0);
        sigs[2] = _sign(NODE2_PK, digest); // a node of CAROL
        signers[2] = node2;
        sigs[3] = _sign(NODE1_PK, ledger.rolloutDigest(poolId, keccak256("a file node1 did sign")));
        signers[3] = _recover(digest, sigs[3]);
        for (uint256 i; i < 4; ++i) {
            bytes memory err = i == 0
                ? abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 0)
                : abi.encodeWithSelector(WorkLedger.NotProvidersWork.selector, forged, signers[i], ALICE);
            vm.expectRevert(err);
            vm.prank(VALIDATOR);
            ledger.invalidateWork(poolId, forged, keccak256("garbage"), true, sigs[i]);
            vm.expectRevert(err);
            vm.prank(BOB);
            ledger.challenge(poolId, forged, keccak256("garbage"), sigs[i]);
        }
        assertTrue(_status(poolId, forged) == WorkLedger.RecordStatus.Pending);
        assertEq(ledger.bondsHeld(), 0);
        vm.warp(T0 + 3 days);
        assertEq(registry.getProvider(ALICE).slashed, 0, "nobody slashed for unsigned work");
        assertEq(registry.stakeOf(ALICE), 200e18);
    }

    // ------------------------------------------------------------------ 7

    /// @dev Finding 7. Old contracts: one 100-token stake backed three pools that each required 100
    /// and slashed 100 (the floor was the max of the pools' minimums, not their sum); the three slashes
    /// took 100 in total. Now joining a second pool needs both minimums (StakeTooLow); with the stake
    /// for all three, each pool slashes its full minimum; once a slash in one pool leaves the stake
    /// below the floor, work in the others is refused (StakeBelowMinimum); and the provider cannot
    /// unbind a node while its stake is locked (StakeLocked).
    function test_finding7_oneStakeCannotBackThreePools() public {
        PoolManager.PoolParams memory p = _params();
        p.minStake = 100e18;
        p.slashAmount = 100e18;
        address provider = address(0xDA7E);
        _registerProvider(provider, 100e18);
        uint256[3] memory ids;
        address[3] memory nodes;
        for (uint256 i; i < 3; ++i) {
            ids[i] = _createActivePool(p); // no bond
            _fundPool(ids[i], FUND);
            nodes[i] = _addNode(provider, 0x2001 + i, 1);
        }
        _join(ids[0], provider, 0x2001);
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory invite = _inviteSig(COORD_PK, ids[1], nodes[1], 777, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.StakeTooLow.selector, 100e18, 200e18));
        vm.prank(provider);
        pools.joinPool(ids[1], nodes[1], 777, expiry, invite);

        _give(provider, 200e18);
        vm.prank(provider);
        registry.stake(200e18);
        _join(ids[1], provider, 0x2002);
        _join(ids[2], provider, 0x2003);
        assertEq(pools.stakeFloor(provider), 300e18, "the sum of the three minimums");
        assertEq(registry.requiredStake(provider), 300e18);
        bytes32[3] memory ks;
        for (uint256 i; i < 3; ++i) {
            ks[i] = _recordOne(ids[i], nodes[i], UNITS);
            _accuse(VALIDATOR, ids[i], ks[i], true);
        }
        vm.warp(T0 + 1 days);
        ledger.finalizeInvalidation(ids[0], ks[0]);
        assertEq(registry.stakeOf(provider), 200e18);

        // Below the floor after the slash in the first pool: no more work recorded in the others.
        assertEq(ledger.recordable(ids[1], nodes[1]), 2);
        bytes32 next = _newKey();
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.StakeBelowMinimum.selector, ids[1], nodes[1], 200e18, 300e18)
        );
        _record(ids[1], _batch1(nodes[1], next, UNITS));
        // Nor may a node be unbound (and its signatures disowned) while the stake is locked.
        vm.prank(provider);
        pools.leavePool(ids[0], nodes[0]);
        vm.expectRevert(
            abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, type(uint64).max, T0 + 1 days)
        );
        vm.prank(provider);
        registry.removeNode(nodes[0]);

        ledger.finalizeInvalidation(ids[1], ks[1]);
        ledger.finalizeInvalidation(ids[2], ks[2]);
        assertEq(registry.getProvider(provider).slashed, 300e18, "each pool slashed its full minimum");
    }

    // ------------------------------------------------------------------ 8

    /// @dev Finding 8. Old contracts: if nobody drew within 256 blocks of the seed block, drawCommittee
    /// committed to a new block (CommitteeRedraw), so a party that disliked the committee the first
    /// seed gave could wait for a re-roll. Now the seed block never moves: past 256 blocks every
    /// eligible validator sits, and there is no second random draw.
    function test_finding8_noCommitteeReroll() public {
        vm.startPrank(POOL_OWNER);
        pools.addValidator(poolId, JUROR4);
        pools.addValidator(poolId, JUROR5);
        vm.stopPrank();
        bytes32 k = _recordOne(poolId, node1, UNITS);
        _accuse(VALIDATOR, poolId, k, true);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        uint64 first = ledger.getDispute(poolId, k).drawBlock;

        vm.roll(uint256(first) + 257); // the seed block's hash is gone
        vm.recordLogs();
        _draw(poolId, k);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        for (uint256 i; i < logs.length; ++i) {
            assertTrue(logs[i].topics[0] != COMMITTEE_REDRAW, "no re-commit");
        }
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.drawn);
        assertEq(uint256(x.drawBlock), first, "the seed block did not change");
        assertEq(uint256(x.size), 5, "every eligible validator sits (the accuser is not eligible)");
        address[5] memory eligible = [JUROR1, JUROR2, JUROR3, JUROR4, JUROR5];
        for (uint256 i; i < 5; ++i) {
            assertEq(ledger.jurorState(poolId, k, eligible[i]), 1);
        }
        // Drawing again changes nothing.
        vm.roll(block.number + 1);
        _draw(poolId, k);
        assertEq(uint256(ledger.getDispute(poolId, k).drawBlock), first);
        assertEq(uint256(ledger.getDispute(poolId, k).size), 5);
        _vote(poolId, k, JUROR1, false);
        _vote(poolId, k, JUROR4, false);
        _vote(poolId, k, JUROR5, false);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Overturned);
    }

    // ------------------------------------------------------------------ 9

    /// @dev Finding 9. Old contracts: a validator hard-accused honest work with no evidence at all;
    /// nobody appealed (the provider offline, or the appeal bond not worth it); finalizing paid the
    /// accuser its bond back plus the bounty. Now an unappealed accusation pays no bounty: the
    /// accuser's balance ends where it started (bond back only) and the slash goes to the treasury in
    /// full, with the record's reward.
    function test_finding9_anUnappealedFalseAccusationPaysNothing() public {
        bytes32 k = _recordOne(poolId, node1, UNITS); // honest work
        uint256 before = token.balanceOf(VALIDATOR);
        bytes memory sig = _rolloutSig(poolId, k); // every rollout file carries its node's signature
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        vm.warp(ledger.getDispute(poolId, k).appealEnd);
        vm.expectEmit(true, true, true, true, address(registry));
        emit ProviderRegistry.Slashed(ALICE, address(0), k, SLASH, 0, SLASH, 0);
        ledger.finalizeInvalidation(poolId, k);
        assertEq(token.balanceOf(VALIDATOR), before, "bond back, no bounty");
        assertEq(token.balanceOf(TREASURY), SLASH + REWARD, "the whole slash and the reward");
        assertEq(registry.getProvider(ALICE).slashed, SLASH);
    }

    // ------------------------------------------------------------------ 10

    /// @dev Attack 10, "soft-first shield". Earlier rules: nobody could act on a record while a dispute
    /// of it was open, so a validator colluding with a cheater soft-accused the cheater's record first;
    /// unappealed it was only revoked (no slash), and every honest validator and challenger was refused
    /// (AlreadySettled) until it ended. Now a hard accusation supersedes the open soft one (which ends
    /// Lapsed) and the cheater is slashed.
    function test_attack10_softFirstShield_anHonestHardAccusationSupersedesIt() public {
        bytes32 k = _recordOne(poolId, node1, UNITS); // ALICE cheats
        address colluder = JUROR1;
        _accuse(colluder, poolId, k, false); // the shield
        vm.warp(T0 + 1 hours);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Lapsed, WorkLedger.DisputeKind.Accusation, colluder, ALICE, ALICE, 0
        );
        _accuse(VALIDATOR, poolId, k, true);
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.hard && x.accuser == VALIDATOR && x.verdict == WorkLedger.Verdict.Open);
        // The colluder cannot take the record back with another soft accusation.
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed)
        );
        vm.prank(colluder);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
        vm.warp(x.appealEnd);
        ledger.finalizeInvalidation(poolId, k);
        assertEq(registry.getProvider(ALICE).slashed, SLASH, "the cheater is slashed");
        assertTrue(_status(poolId, k) == WorkLedger.RecordStatus.Invalidated);
        assertEq(token.balanceOf(TREASURY), SLASH + REWARD);
    }

    /// @dev Attack 10 with a challenge: a staked provider may not supersede the colluder's soft accusation
    /// (see why below); a validator's hard accusation does, and the cheater is slashed.
    function test_attack10_softFirstShield_aChallengeCannotReplaceIt_aValidatorCan() public {
        bytes32 k = _recordOne(poolId, node1, UNITS);
        _accuse(JUROR1, poolId, k, false);
        // A challenge does not supersede: one that lapsed (nobody can judge a withheld file) would reopen
        // the record without the soft accusation, a way for a cheater's sybil to wipe a revoke for 10%
        // of a bond.
        bytes memory sig = _rolloutSig(poolId, k);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Disputed));
        vm.prank(BOB);
        ledger.challenge(poolId, k, keccak256("chunk 3 fails"), sig);
        _accuse(VALIDATOR, poolId, k, true);
        vm.warp(ledger.getDispute(poolId, k).appealEnd);
        ledger.finalizeInvalidation(poolId, k);
        assertEq(registry.getProvider(ALICE).slashed, SLASH, "the cheater is slashed");
    }

    /// @dev Attack 10 when the cheater also appealed the colluder's soft accusation (so that the
    /// colluder's friends on the committee could clear it, or it would sit until the vote period
    /// ended): the honest hard accusation supersedes the open appeal, the cheater gets its appeal bond
    /// back, and is slashed anyway; its appeal of the hard accusation fails before a committee on
    /// which the colluder is outvoted, and that bond goes to the honest accuser.
    function test_attack10_softFirstShield_evenWhenTheCheaterAppealed() public {
        bytes32 k = _recordOne(poolId, node1, UNITS);
        address colluder = JUROR1;
        uint256 aliceStart = token.balanceOf(ALICE);
        uint256 valStart = token.balanceOf(VALIDATOR);
        _accuse(colluder, poolId, k, false);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        assertEq(ledger.bondsHeld(), BOND);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Lapsed, WorkLedger.DisputeKind.Appeal, colluder, ALICE, ALICE, BOND
        );
        _accuse(VALIDATOR, poolId, k, true);
        assertEq(token.balanceOf(ALICE), aliceStart, "the soft appeal's bond came back");
        assertEq(ledger.bondsHeld(), BOND, "the accuser's bond only");

        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        address[] memory c = _drawn(k); // JUROR1..3: the accuser is not eligible
        assertEq(c.length, 3);
        _vote(poolId, k, colluder, false);
        _vote(poolId, k, JUROR2, true);
        _vote(poolId, k, JUROR3, true);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Upheld);
        assertEq(registry.getProvider(ALICE).slashed, SLASH, "the cheater is slashed");
        assertEq(token.balanceOf(ALICE), aliceStart - BOND, "only the lost hard appeal's bond");
        assertEq(token.balanceOf(VALIDATOR), valStart + BOND + SLASH / 10, "both bonds and the bounty");
        assertEq(ledger.bondsHeld(), 0);
        assertEq(ledger.lockedUntil(ALICE) < type(uint64).max, true, "no dispute left open");
    }

    // ------------------------------------------------------------------ 11

    /// @dev Attack 11, repeated free soft accusations. Earlier rules: a soft accusation costs nothing,
    /// and each one overturned on appeal gave the record back the time its window had left, so a
    /// validator soft-accused an honest record again and again: the provider paid an appeal bond up
    /// front each time and was never paid. Now an overturned accusation leaves the deadline where it
    /// was, and a record cleared of a soft accusation may never be softly accused again (by anyone):
    /// the honest provider claims at its original deadline.
    function test_attack11_repeatedSoftAccusationsOfAnHonestRecord() public {
        bytes32 k = _recordOne(poolId, node1, UNITS);
        uint256 aliceStart = token.balanceOf(ALICE);
        vm.warp(T0 + 1 hours);
        _accuse(VALIDATOR, poolId, k, false);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        address[] memory c = _drawn(k);
        vm.warp(T0 + 20 hours);
        _vote(poolId, k, c[0], false);
        vm.recordLogs();
        _vote(poolId, k, c[1], false);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        for (uint256 i; i < logs.length; ++i) {
            assertTrue(logs[i].topics[0] != WorkLedger.WorkReopened.selector, "no time given back");
        }
        assertTrue(ledger.getDispute(poolId, k).softCleared);
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), T0 + 1 days, "the deadline never moved");

        address[4] memory vs = [VALIDATOR, JUROR1, JUROR2, JUROR3];
        for (uint256 i; i < vs.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(WorkLedger.SoftAccusedBefore.selector, k));
            vm.prank(vs[i]);
            ledger.invalidateWork(poolId, k, keccak256("again"), false, "");
        }
        vm.warp(T0 + 1 days - 1);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SoftAccusedBefore.selector, k));
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, keccak256("one second before"), false, "");
        assertFalse(_isClaimable(poolId, k));
        vm.warp(T0 + 1 days);
        assertEq(_claim(poolId, ALICE, k), REWARD, "paid at the original deadline");
        assertEq(token.balanceOf(ALICE), aliceStart + REWARD, "its appeal bond back, nothing lost");
        assertEq(token.balanceOf(VALIDATOR), 1_000e18, "the soft accuser neither paid nor gained");
    }

    /// @dev Attack 11 with a hard accusation in between: the hard one, overturned, does not lift the
    /// mark (the record stays cleared of soft accusations) and does not move the deadline either, and
    /// its accuser's bond pays the provider.
    function test_attack11_aHardAccusationDoesNotResetTheMark() public {
        bytes32 k = _recordOne(poolId, node1, UNITS);
        uint256 aliceStart = token.balanceOf(ALICE);
        _accuse(VALIDATOR, poolId, k, false);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        address[] memory c = _drawn(k);
        _vote(poolId, k, c[0], false);
        _vote(poolId, k, c[1], false);
        _accuse(VALIDATOR, poolId, k, true);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        c = _drawn(k);
        _vote(poolId, k, c[0], false);
        _vote(poolId, k, c[1], false);
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.SoftAccusedBefore.selector, k));
        vm.prank(JUROR2);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), T0 + 1 days);
        vm.warp(T0 + 1 days);
        assertEq(_claim(poolId, ALICE, k), REWARD);
        assertEq(token.balanceOf(ALICE), aliceStart + REWARD + BOND, "plus the false hard accuser's bond");
    }

    // ------------------------------------------------------------------ 12

    /// @dev Attack 12. Earlier rules: an upheld soft appeal paid the appellant's bond to the soft
    /// accuser, who had put up nothing: a validator soft-accused records whose providers would appeal
    /// and lose, and was paid for it at no risk. Now that bond goes to the treasury and the soft
    /// accuser ends where it started.
    function test_attack12_anUpheldSoftAppealPaysTheSoftAccuserNothing() public {
        bytes32 k = _recordOne(poolId, node1, UNITS);
        uint256 valStart = token.balanceOf(VALIDATOR);
        uint256 aliceStart = token.balanceOf(ALICE);
        _accuse(VALIDATOR, poolId, k, false);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        address[] memory c = _drawn(k);
        _vote(poolId, k, c[0], true);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Upheld, WorkLedger.DisputeKind.Appeal, VALIDATOR, ALICE, TREASURY, BOND
        );
        _vote(poolId, k, c[1], true);
        assertEq(token.balanceOf(VALIDATOR), valStart, "the soft accuser gets nothing");
        assertEq(token.balanceOf(ALICE), aliceStart - BOND);
        assertEq(token.balanceOf(TREASURY), REWARD + BOND, "the reward and the bond");
        assertEq(registry.getProvider(ALICE).slashed, 0, "a soft dispute never slashes");
        assertEq(ledger.bondsHeld(), 0);
    }

    // ------------------------------------------------------------------ 13

    /// @dev Attack 13. Earlier rules: when the vote period ended without a majority, the votes cast
    /// decided, so one corrupt juror of three voted to uphold a false challenge while the others had
    /// not voted yet, and the honest provider was slashed (its challenger paid the bounty). Now a
    /// minority of the committee never decides: the challenge lapses, nobody is slashed, the
    /// challenger pays the lapse fee and the record is paid once final.
    function test_attack13_oneJurorOfThreeCannotSlashAlone() public {
        bytes32 k = _recordOne(poolId, node1, UNITS); // honest
        uint256 bobBefore = token.balanceOf(BOB);
        _challenge(BOB, poolId, k); // false
        address[] memory c = _drawn(k);
        assertEq(c.length, 3);
        _vote(poolId, k, c[0], true); // the corrupt juror; the others stay silent
        vm.warp(T0 + 1 days);
        vm.expectEmit(true, true, true, true, address(ledger));
        emit WorkLedger.DisputeResolved(
            poolId, k, WorkLedger.Verdict.Lapsed, WorkLedger.DisputeKind.Challenge, BOB, ALICE, address(0), BOND
        );
        ledger.resolveLapsed(poolId, k);
        assertEq(registry.getProvider(ALICE).slashed, 0, "nobody slashed");
        assertEq(token.balanceOf(BOB), bobBefore - BOND / 10, "the challenger pays the lapse fee");
        assertTrue(_status(poolId, k) == WorkLedger.RecordStatus.Pending);
        uint40 deadline = ledger.getRecord(poolId, k).deadline;
        assertEq(uint256(deadline), T0 + 2 days, "a lapsed challenge gives back the day it held");
        vm.warp(deadline);
        assertEq(_claim(poolId, ALICE, k), REWARD);
    }

    /// @dev Attack 13 the other way: one juror of three votes to overturn a true accusation the cheater
    /// appealed, the others silent: the appeal lapses, and a lapsed appeal leaves the record revoked
    /// (no payment without a decision for it), with no bounty for anyone.
    function test_attack13_oneJurorOfThreeCannotClearACheaterAlone() public {
        bytes32 k = _recordOne(poolId, node1, UNITS); // ALICE cheats
        _accuse(VALIDATOR, poolId, k, true);
        vm.prank(ALICE);
        ledger.appeal(poolId, k);
        address[] memory c = _drawn(k);
        _vote(poolId, k, c[0], false);
        vm.warp(ledger.getDispute(poolId, k).voteEnd);
        ledger.resolveLapsed(poolId, k);
        assertTrue(ledger.getDispute(poolId, k).verdict == WorkLedger.Verdict.Lapsed);
        assertTrue(_status(poolId, k) == WorkLedger.RecordStatus.Invalidated, "not paid");
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        _claim(poolId, ALICE, k);
    }
}
