// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {PoolManager} from "../src/PoolManager.sol";
import {WorkLedger} from "../src/WorkLedger.sol";

/// @notice Property tests over amounts, times and signatures.
contract FuzzTest is Fixture {
    uint256 internal constant SECP256K1_N_MINUS_1 =
        115792089237316195423570985008687907852837564279074904382605163141518161494336;
    uint256 internal constant T0 = 1_700_000_000;
    address internal constant SLASHER = address(0x51A5);

    function setUp() public override {
        super.setUp();
        vm.warp(T0);
        vm.prank(ADMIN);
        registry.grantRole(SLASHER_ROLE, SLASHER);
    }

    function _min(uint256 a, uint256 b) internal pure returns (uint256) {
        return a < b ? a : b;
    }

    function _assertConserved(address provider) internal view {
        ProviderRegistry.Provider memory p = registry.getProvider(provider);
        assertEq(p.deposited, p.staked + p.unbonding + p.withdrawn + p.slashed, "deposited");
        assertEq(token.balanceOf(address(registry)), registry.totalStaked() + registry.totalUnbonding(), "balance");
    }

    /// @dev A pool with `window`, one member node of ALICE (staked `stakeAmount`) and a large budget.
    function _poolWithMember(uint64 window, uint256 stakeAmount) internal returns (uint256 poolId, address node) {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = window;
        poolId = _createActivePool(p);
        node = _member(poolId, ALICE, NODE1_PK, stakeAmount);
        _fundPool(poolId, 1e30);
    }

    // ------------------------------------------------------------------ stake / unstake / withdraw

    function testFuzz_stakeUnstakeWithdraw(uint256 initial, uint256 extra, uint256 unstakeAmt, uint256 wait) public {
        initial = bound(initial, MIN_STAKE, 1e30);
        extra = bound(extra, 0, 1e30);
        _registerProvider(ALICE, initial);
        if (extra != 0) {
            _give(ALICE, extra);
            vm.prank(ALICE);
            registry.stake(extra);
        }
        uint256 total = initial + extra;
        assertEq(registry.stakeOf(ALICE), total);
        assertEq(registry.totalStaked(), total);

        unstakeAmt = bound(unstakeAmt, 1, total);
        vm.prank(ALICE);
        registry.unstake(unstakeAmt);
        uint64 end = uint64(T0) + UNBONDING;
        assertEq(registry.stakeOf(ALICE), total - unstakeAmt);
        assertEq(registry.getProvider(ALICE).unbonding, unstakeAmt);
        assertEq(registry.totalUnbonding(), unstakeAmt);
        _assertConserved(ALICE);

        wait = bound(wait, 0, 2 * uint256(UNBONDING));
        vm.warp(T0 + wait);
        if (wait < UNBONDING) {
            vm.expectRevert(
                abi.encodeWithSelector(ProviderRegistry.StillUnbonding.selector, end, uint64(T0 + wait))
            );
            vm.prank(ALICE);
            registry.withdraw();
            assertEq(token.balanceOf(ALICE), 0);
        } else {
            vm.prank(ALICE);
            registry.withdraw();
            assertEq(token.balanceOf(ALICE), unstakeAmt);
            assertEq(registry.getProvider(ALICE).withdrawn, unstakeAmt);
            assertEq(registry.totalUnbonding(), 0);
        }
        _assertConserved(ALICE);
    }

    function testFuzz_unstake_revertsAboveStake(uint256 amount, uint256 over) public {
        amount = bound(amount, MIN_STAKE, 1e30);
        over = bound(over, 1, 1e30);
        _registerProvider(ALICE, amount);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.InsufficientStake.selector, amount, amount + over));
        vm.prank(ALICE);
        registry.unstake(amount + over);
    }

    function testFuzz_unstake_keepsStakeForComputeUnits(uint64 cu, uint256 amount) public {
        cu = uint64(bound(cu, 1, 100));
        uint256 staked = 2_000e18;
        _registerProvider(ALICE, staked);
        _addNode(ALICE, NODE1_PK, cu);
        uint256 need = uint256(cu) * STAKE_PER_CU;
        amount = bound(amount, 1, staked);
        if (staked - amount < need) {
            vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, staked - amount, need));
            vm.prank(ALICE);
            registry.unstake(amount);
            assertEq(registry.stakeOf(ALICE), staked);
        } else {
            vm.prank(ALICE);
            registry.unstake(amount);
            assertEq(registry.stakeOf(ALICE), staked - amount);
        }
        assertGe(registry.stakeOf(ALICE), registry.requiredStake(ALICE));
    }

    function testFuzz_addNode_requiresStake(uint256 staked, uint64 cu) public {
        staked = bound(staked, MIN_STAKE, 10_000e18);
        cu = uint64(bound(cu, 1, 2_000));
        _registerProvider(ALICE, staked);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _nodeSig(NODE1_PK, ALICE);
        uint256 need = uint256(cu) * STAKE_PER_CU;
        if (staked < need) {
            vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, staked, need));
        }
        vm.prank(ALICE);
        registry.addNode(node, cu, sig);
        assertEq(registry.providerOf(node), staked < need ? address(0) : ALICE);
    }

    // ------------------------------------------------------------------ slashing

    function testFuzz_slash(uint256 staked, uint256 unbonding, uint256 amount, uint16 bps, uint256 maxBounty) public {
        staked = bound(staked, MIN_STAKE, 1e30);
        unbonding = bound(unbonding, 0, staked);
        amount = bound(amount, 0, 3e30);
        bps = uint16(bound(bps, 0, 5_000));
        maxBounty = maxBounty % 4 == 0 ? type(uint256).max : bound(maxBounty, 0, 1e30);
        vm.prank(ADMIN);
        registry.setParameters(UNBONDING, STAKE_PER_CU, MIN_STAKE, bps, maxBounty);

        _registerProvider(ALICE, staked);
        if (unbonding != 0) {
            vm.prank(ALICE);
            registry.unstake(unbonding);
        }
        uint256 fromUnbonding = _min(amount, unbonding);
        uint256 fromStaked = _min(amount - fromUnbonding, staked - unbonding);
        uint256 expSlashed = fromUnbonding + fromStaked;
        uint256 expBounty = _min(expSlashed * bps / 10_000, maxBounty);

        vm.expectEmit(true, true, true, true, address(registry));
        emit ProviderRegistry.Slashed(ALICE, VALIDATOR, bytes32("r"), expSlashed, fromUnbonding, fromStaked, expBounty);
        vm.prank(SLASHER);
        (uint256 slashed, uint256 bounty) = registry.slash(ALICE, amount, VALIDATOR, bytes32("r"));

        assertEq(slashed, expSlashed, "slashed");
        assertEq(bounty, expBounty, "bounty");
        assertLe(bounty, slashed);
        ProviderRegistry.Provider memory p = registry.getProvider(ALICE);
        assertEq(p.unbonding, unbonding - fromUnbonding, "unbonding");
        assertEq(p.staked, staked - unbonding - fromStaked, "staked");
        assertEq(p.slashed, expSlashed);
        // Unbonding is always taken first: staked is touched only when unbonding is exhausted.
        if (fromStaked != 0) assertEq(p.unbonding, 0);
        assertEq(token.balanceOf(VALIDATOR), expBounty);
        assertEq(token.balanceOf(TREASURY), expSlashed - expBounty);
        assertEq(registry.totalStaked(), p.staked);
        assertEq(registry.totalUnbonding(), p.unbonding);
        _assertConserved(ALICE);
    }

    // ------------------------------------------------------------------ deadlines

    /// @dev Invalidation succeeds iff now < deadline; claiming succeeds iff now >= deadline; never both.
    function testFuzz_invalidateVsClaimAroundDeadline(uint64 window, uint256 offset, uint8 mode, bool invalidateFirst)
        public
    {
        window = uint64(bound(window, 1, 60 days));
        (uint256 poolId, address node) = _poolWithMember(window, 200e18);
        bytes32 k = _recordOne(poolId, node, 1_000);
        uint256 deadline = T0 + window;
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), deadline);

        // Hit the boundary often: one second before, at, and one second after the deadline.
        if (mode % 4 == 0) offset = window - 1;
        else if (mode % 4 == 1) offset = window;
        else if (mode % 4 == 2) offset = uint256(window) + 1;
        else offset = bound(offset, 0, 3 * uint256(window));
        uint256 nowTs = T0 + offset;
        vm.warp(nowTs);
        bool open = nowTs < deadline;
        assertEq(_isClaimable(poolId, k), !open);

        bool invalidated;
        bool claimed;
        if (invalidateFirst) {
            invalidated = _tryInvalidate(poolId, k, deadline, nowTs, open);
            claimed = _tryClaim(poolId, k, deadline, nowTs, open, invalidated);
        } else {
            claimed = _tryClaim(poolId, k, deadline, nowTs, open, false);
            if (claimed) {
                bytes memory sig = _rolloutSig(poolId, k);
                vm.expectRevert(
                    abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Claimed)
                );
                vm.prank(VALIDATOR);
                ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
            } else {
                invalidated = _tryInvalidate(poolId, k, deadline, nowTs, open);
            }
        }
        assertTrue(!(invalidated && claimed), "both settled");
        assertEq(invalidated, open, "invalidated iff before deadline");
        assertEq(claimed, !open, "claimed iff at/after deadline");
        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertEq(uint256(a.recordedUnits), uint256(a.pendingUnits) + a.invalidatedUnits + a.claimedUnits);
        assertEq(uint256(a.pendingUnits), 0);
    }

    function _tryInvalidate(uint256 poolId, bytes32 k, uint256 deadline, uint256 nowTs, bool open)
        internal
        returns (bool)
    {
        bytes memory sig = _rolloutSig(poolId, k);
        if (!open) {
            vm.expectRevert(
                abi.encodeWithSelector(WorkLedger.DeadlinePassed.selector, k, uint40(deadline), uint64(nowTs))
            );
        }
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
        bool ok = ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Disputed;
        assertEq(ok, open);
        if (ok) {
            // Final once the appeal period is over (and only then is the provider slashed).
            assertEq(registry.getProvider(ALICE).slashed, 0);
            uint256 t = block.timestamp;
            vm.warp(ledger.getDispute(poolId, k).appealEnd);
            ledger.finalizeInvalidation(poolId, k);
            vm.warp(t);
            assertEq(registry.getProvider(ALICE).slashed, SLASH);
        }
        return ok;
    }

    function _tryClaim(uint256 poolId, bytes32 k, uint256 deadline, uint256 nowTs, bool open, bool invalidated)
        internal
        returns (bool)
    {
        uint256 before = token.balanceOf(ALICE);
        deadline;
        nowTs;
        if (invalidated || open) vm.expectRevert(abi.encodeWithSelector(WorkLedger.NothingToClaim.selector, poolId));
        vm.prank(ALICE);
        ledger.claim(poolId, _keys1(k));
        bool ok = ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Claimed;
        assertEq(ok, !open && !invalidated);
        assertEq(token.balanceOf(ALICE) - before, ok ? 1_000 * uint256(RATE) : 0);
        return ok;
    }

    /// @dev Every record's deadline is `recordedAt + window` (24 h when the pool says 0), saturating
    /// at the uint40 limit instead of wrapping.
    function testFuzz_deadlineFromWindow(uint64 window, uint256 start) public {
        start = bound(start, T0, uint256(type(uint40).max) - 1);
        (uint256 poolId, address node) = _poolWithMember(window, 200e18);
        vm.warp(start);
        bytes32 k = _recordOne(poolId, node, 1);
        uint256 w = window == 0 ? 24 hours : window;
        uint256 expected = _min(start + w, type(uint40).max);
        assertEq(uint256(ledger.getRecord(poolId, k).deadline), expected);
        // Never final at recording time.
        assertFalse(_isClaimable(poolId, k));
    }

    // ------------------------------------------------------------------ invites

    function testFuzz_inviteExpiry(uint64 expiry, uint256 nowTs) public {
        uint256 poolId = _createActivePool();
        _registerProvider(ALICE, 200e18);
        address node = _addNode(ALICE, NODE1_PK, 1);
        nowTs = bound(nowTs, 1, type(uint64).max);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node, 1, expiry);
        vm.warp(nowTs);
        bool valid = nowTs < expiry;
        if (!valid) {
            vm.expectRevert(abi.encodeWithSelector(PoolManager.InviteExpired.selector, expiry, uint64(nowTs)));
        }
        vm.prank(ALICE);
        pools.joinPool(poolId, node, 1, expiry, sig);
        assertEq(pools.isMember(poolId, node), valid);
        assertEq(pools.isInviteUsed(poolId, 1), valid);
    }

    function testFuzz_invite_onlyCoordinatorKey(uint256 pk) public {
        pk = bound(pk, 1, SECP256K1_N_MINUS_1);
        uint256 poolId = _createActivePool();
        _registerProvider(ALICE, 200e18);
        address node = _addNode(ALICE, NODE1_PK, 1);
        uint64 expiry = uint64(block.timestamp + 1);
        bytes memory sig = _inviteSig(pk, poolId, node, 1, expiry);
        if (pk != COORD_PK) {
            vm.expectRevert(abi.encodeWithSelector(PoolManager.BadInviteSignature.selector, vm.addr(pk), COORD));
        }
        vm.prank(ALICE);
        pools.joinPool(poolId, node, 1, expiry, sig);
        assertEq(pools.isMember(poolId, node), pk == COORD_PK);
    }

    function testFuzz_nodeBinding_onlyNodeKey(uint256 pk) public {
        pk = bound(pk, 1, SECP256K1_N_MINUS_1);
        _registerProvider(ALICE, 200e18);
        address node = vm.addr(NODE1_PK);
        bytes memory sig = _sign(pk, registry.nodeBindingDigest(ALICE, node));
        if (pk != NODE1_PK) {
            vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.BadNodeSignature.selector, node, vm.addr(pk)));
        }
        vm.prank(ALICE);
        registry.addNode(node, 1, sig);
        assertEq(registry.providerOf(node), pk == NODE1_PK ? ALICE : address(0));
    }

    // ------------------------------------------------------------------ ledger amounts

    function testFuzz_recordBatchTotals(uint8 count, uint256 seed) public {
        count = uint8(bound(count, 1, 40));
        (uint256 poolId, address n1) = _poolWithMember(WINDOW, 200e18);
        address n2 = _addNode(ALICE, NODE2_PK, 1);
        _join(poolId, ALICE, NODE2_PK);
        WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](count);
        uint256 total;
        for (uint256 i; i < count; ++i) {
            uint48 units = uint48(bound(uint256(keccak256(abi.encode(seed, i))), 1, type(uint48).max));
            b[i] = _work(i % 2 == 0 ? n1 : n2, keccak256(abi.encode(seed, "k", i)), units);
            total += units;
        }
        vm.expectEmit(true, false, false, true, address(ledger));
        emit WorkLedger.WorkBatchRecorded(poolId, count, total, uint40(T0 + WINDOW));
        _record(poolId, b);
        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertEq(uint256(a.recordedUnits), total);
        assertEq(uint256(a.pendingUnits), total);
        for (uint256 i; i < count; ++i) {
            WorkLedger.Record memory r = ledger.getRecord(poolId, b[i].workKey);
            assertEq(uint256(r.units), uint256(b[i].units));
            assertEq(r.provider, ALICE);
            assertTrue(r.status == WorkLedger.RecordStatus.Pending);
        }
    }

    function testFuzz_claimReward(uint48 units, uint128 rate, uint256 budget) public {
        units = uint48(bound(units, 1, type(uint48).max));
        rate = uint128(bound(rate, 0, 1e24));
        uint256 reward = uint256(units) * rate;
        budget = bound(budget, 1, 1e38);
        PoolManager.PoolParams memory p = _params();
        p.rewardRate = rate;
        uint256 poolId = _createActivePool(p);
        address node = _member(poolId, ALICE, NODE1_PK, 200e18);
        _fundPool(poolId, budget);
        bytes32 k = _newKey();
        if (reward > budget) {
            // Recording reserves the reward: a pool never owes more than it holds.
            vm.expectRevert(abi.encodeWithSelector(WorkLedger.InsufficientPoolFunds.selector, poolId, budget, reward));
            _record(poolId, _batch1(node, k, units));
            assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.None);
            assertEq(ledger.surplus(poolId), budget);
        } else {
            _record(poolId, _batch1(node, k, units));
            assertEq(ledger.surplus(poolId), budget - reward);
            vm.warp(T0 + WINDOW);
            assertEq(_claim(poolId, ALICE, k), reward);
            assertEq(token.balanceOf(ALICE), reward);
            WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
            assertEq(uint256(a.budget) + a.claimedTokens, budget);
            assertEq(token.balanceOf(address(ledger)), a.budget);
        }
    }

    function testFuzz_fundAndWithdrawSurplus(uint256 fund, uint48 units, uint256 amount) public {
        fund = bound(fund, 1, 1e36);
        units = uint48(bound(units, 1, type(uint48).max));
        (uint256 poolId, address node) = _poolWithMember(WINDOW, 200e18);
        uint256 base = uint256(ledger.poolAccount(poolId).budget);
        _fundPool(poolId, fund);
        _recordOne(poolId, node, units);
        uint256 owed = uint256(units) * RATE;
        uint256 budget = base + fund;
        uint256 s = budget > owed ? budget - owed : 0;
        assertEq(ledger.surplus(poolId), s);
        amount = bound(amount, 1, budget);
        if (amount > s) {
            vm.expectRevert(abi.encodeWithSelector(WorkLedger.SurplusTooLow.selector, s, amount));
        }
        vm.prank(POOL_OWNER);
        ledger.withdrawSurplus(poolId, amount, CAROL);
        uint256 got = amount > s ? 0 : amount;
        assertEq(token.balanceOf(CAROL), got);
        assertEq(uint256(ledger.poolAccount(poolId).budget), budget - got);
        assertEq(token.balanceOf(address(ledger)), budget - got);
        // What stays always covers what is owed to pending records, if it did before.
        if (budget >= owed) assertGe(uint256(ledger.poolAccount(poolId).budget), owed);
    }
}

/// @notice Property tests of the dispute money rules (issue 38): the lapse fee, the time a reopened
/// record gets back, the stake floor, committees drawn from the dispute's own validator set, and
/// random dispute sequences that must never create, lose or double-pay a token.
contract DisputeFuzzTest is Fixture {
    uint256 internal constant T0 = 1_700_000_000;
    address internal constant ARBITER = address(0xA4B1);
    address internal constant DAVE = address(0xDA);

    uint256 internal poolId;
    address internal node1;
    uint256 internal funded;
    uint256 internal withdrawn;

    function setUp() public override {
        super.setUp();
        vm.warp(T0);
    }

    /// @dev A started pool with `window`, the dispute terms given, ALICE's node in it, BOB a staked
    /// challenger, everybody funded for bonds.
    function _disputedPool(uint64 window, PoolManager.DisputeTerms memory d) internal {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = window;
        poolId = _createPool(p);
        vm.startPrank(POOL_OWNER);
        pools.setDisputeTerms(poolId, d);
        pools.startPool(poolId);
        vm.stopPrank();
        node1 = _member(poolId, ALICE, NODE1_PK, 1_000e18);
        _registerProvider(BOB, 100e18);
        _fundPool(poolId, 1e24);
        funded = 1e24;
        _give(ALICE, 1e24);
        _give(BOB, 1e24);
        _give(VALIDATOR, 1e24);
        _give(JUROR1, 1e24);
    }

    function _challenge(address who, bytes32 k) internal {
        bytes memory sig = _rolloutSig(poolId, k);
        vm.prank(who);
        ledger.challenge(poolId, k, bytes32("evidence"), sig);
    }

    // ------------------------------------------------------------------ lapse fee

    /// @dev A lapsed challenge returns the bond less LAPSE_FEE_BPS of it (rounded down, so never more
    /// than 10 %), the fee to the treasury; nothing else moves and the bonds held go back to zero.
    function testFuzz_lapseFee(uint128 bond, uint64 votePeriod) public {
        bond = uint128(bound(bond, 0, 1e24));
        votePeriod = uint64(bound(votePeriod, 1, 90 days));
        _disputedPool(WINDOW, PoolManager.DisputeTerms(1 days, votePeriod, 3, bond, address(0)));
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 bobBefore = token.balanceOf(BOB);
        _challenge(BOB, k);
        assertEq(ledger.bondsHeld(), bond);
        assertEq(token.balanceOf(address(ledger)), uint256(ledger.poolAccount(poolId).budget) + bond);
        vm.warp(T0 + votePeriod);
        ledger.resolveLapsed(poolId, k);
        uint256 fee = uint256(bond) * ledger.LAPSE_FEE_BPS() / 10_000;
        assertLe(fee * 10, bond, "at most a tenth");
        assertEq(token.balanceOf(BOB), bobBefore - fee);
        assertEq(token.balanceOf(TREASURY), fee);
        assertEq(ledger.bondsHeld(), 0);
        assertEq(token.balanceOf(address(ledger)), uint256(ledger.poolAccount(poolId).budget));
        assertEq(registry.getProvider(ALICE).slashed, 0);
        assertTrue(ledger.getRecord(poolId, k).status == WorkLedger.RecordStatus.Pending);
    }

    /// @dev With no validator named (a slash no vote decided) the registry pays no bounty, whatever its
    /// bounty parameters: the treasury gets the whole slash.
    function testFuzz_slashWithoutValidatorPaysNoBounty(uint256 staked, uint256 amount, uint16 bps) public {
        staked = bound(staked, MIN_STAKE, 1e30);
        amount = bound(amount, 0, 2e30);
        bps = uint16(bound(bps, 0, 5_000));
        vm.prank(ADMIN);
        registry.setParameters(UNBONDING, STAKE_PER_CU, MIN_STAKE, bps, type(uint256).max);
        vm.prank(ADMIN);
        registry.grantRole(SLASHER_ROLE, address(this));
        _registerProvider(ALICE, staked);
        (uint256 slashed, uint256 bounty) = registry.slash(ALICE, amount, address(0), bytes32("r"));
        assertEq(slashed, amount < staked ? amount : staked);
        assertEq(bounty, 0);
        assertEq(token.balanceOf(TREASURY), slashed);
        assertEq(token.balanceOf(address(0)), 0);
    }

    // ------------------------------------------------------------------ reopening

    /// @dev A dispute that does not stand (overturned by the arbiter at any time, or a challenge that
    /// lapses) gives the record back the time its window had left when the dispute opened, counted
    /// from the verdict (never less than its old deadline); the stake stays locked until then and the
    /// record is claimable exactly from then.
    function testFuzz_reopenGivesBackTheTimeLeft(uint64 window, uint256 openAt, uint256 decideAt, bool lapse)
        public
    {
        window = uint64(bound(window, 2, 30 days));
        _disputedPool(window, PoolManager.DisputeTerms(1 days, 2 days, 3, 1e18, lapse ? address(0) : ARBITER));
        bytes32 k = _recordOne(poolId, node1, 5);
        uint256 deadline = T0 + window;
        openAt = bound(openAt, T0, deadline - 1);
        vm.warp(openAt);
        _challenge(BOB, k);
        uint256 voteEnd = openAt + 2 days;
        decideAt = lapse ? bound(decideAt, voteEnd, voteEnd + 10 days) : bound(decideAt, openAt, voteEnd - 1);
        vm.warp(decideAt);
        if (lapse) {
            ledger.resolveLapsed(poolId, k);
        } else {
            vm.prank(ARBITER);
            ledger.vote(poolId, k, false);
        }
        uint256 expected = decideAt + (deadline - openAt);
        if (expected < deadline) expected = deadline;
        WorkLedger.Record memory r = ledger.getRecord(poolId, k);
        assertTrue(r.status == WorkLedger.RecordStatus.Pending);
        assertEq(uint256(r.deadline), expected);
        assertGe(uint256(ledger.lockedUntil(ALICE)), expected);
        vm.warp(expected - 1);
        assertFalse(_isClaimable(poolId, k));
        vm.warp(expected);
        assertTrue(_isClaimable(poolId, k));
        assertEq(_claim(poolId, ALICE, k), 5 * uint256(RATE));
    }

    // ------------------------------------------------------------------ stake floor

    /// @dev Joining pools one after the other succeeds exactly while the stake covers the sum of their
    /// minimums; the floor is that sum.
    function testFuzz_floorIsTheSumOfMinimums(uint256[3] memory mins, uint256 stakeAmount) public {
        stakeAmount = bound(stakeAmount, MIN_STAKE, 1_500e18);
        _registerProvider(ALICE, stakeAmount);
        uint256 floor;
        for (uint256 i; i < 3; ++i) {
            mins[i] = bound(mins[i], 0, 600e18);
            PoolManager.PoolParams memory p = _params();
            p.minStake = mins[i];
            uint256 id = _createActivePool(p);
            address node = _addNode(ALICE, 0x5000 + i, 1);
            uint64 expiry = uint64(block.timestamp + 1 hours);
            bytes memory invite = _inviteSig(COORD_PK, id, node, i + 1, expiry);
            bool fits = stakeAmount >= floor + mins[i];
            if (!fits) {
                vm.expectRevert(abi.encodeWithSelector(PoolManager.StakeTooLow.selector, stakeAmount, floor + mins[i]));
            }
            vm.prank(ALICE);
            pools.joinPool(id, node, i + 1, expiry, invite);
            if (fits) floor += mins[i];
            assertEq(pools.stakeFloor(ALICE), floor);
        }
        uint256 cu = registry.getProvider(ALICE).computeUnits * STAKE_PER_CU;
        assertEq(registry.requiredStake(ALICE), floor > cu ? floor : cu);
    }

    // ------------------------------------------------------------------ committees

    /// @dev Validators named before the record (`before` of them besides the four of the fixture) and
    /// after it (`late`), the set changed again after the dispute opened: the committee comes from the
    /// set the dispute opened under, holds no party and nobody named after the record, and has
    /// min(3, eligible) members, or every eligible one once the seed block is more than 256 blocks old.
    function testFuzz_committeeComesFromTheDisputesOwnSet(uint8 before, uint8 late, uint256 wait, bool appealed)
        public
    {
        before = uint8(bound(before, 0, 6));
        late = uint8(bound(late, 0, 6));
        wait = bound(wait, 1, 600);
        _disputedPool(WINDOW, PoolManager.DisputeTerms(1 days, 1 days, 3, 1e18, address(0)));
        vm.startPrank(POOL_OWNER);
        for (uint160 i; i < before; ++i) {
            pools.addValidator(poolId, address(0x7000 + i));
        }
        vm.stopPrank();
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.warp(T0 + 1);
        vm.startPrank(POOL_OWNER);
        for (uint160 i; i < late; ++i) {
            pools.addValidator(poolId, address(0x7100 + i));
        }
        vm.stopPrank();
        (address[] memory vs, uint64[] memory since) = pools.validatorEntries(poolId);
        if (appealed) {
            bytes memory sig = _rolloutSig(poolId, k);
            vm.prank(VALIDATOR);
            ledger.invalidateWork(poolId, k, bytes32(0), true, sig);
            vm.prank(POOL_OWNER);
            pools.removeValidator(poolId, JUROR1); // after the accusation: JUROR1 stays a candidate
            vm.prank(ALICE);
            ledger.appeal(poolId, k);
        } else {
            _challenge(BOB, k);
            vm.prank(POOL_OWNER);
            pools.addValidator(poolId, address(0x7200)); // after the challenge: not a candidate
        }
        vm.roll(block.number + wait);
        ledger.drawCommittee(poolId, k, vs, since);
        uint256 eligible = 3 + before + (appealed ? 0 : 1); // the fixture's four, less the accuser
        WorkLedger.Dispute memory x = ledger.getDispute(poolId, k);
        assertTrue(x.drawn);
        uint256 want = wait > 256 || eligible < 3 ? eligible : 3;
        assertEq(uint256(x.size), want);
        uint256 seated;
        for (uint256 i; i < vs.length; ++i) {
            if (ledger.jurorState(poolId, k, vs[i]) == 0) continue;
            seated++;
            assertLe(uint256(since[i]), T0, "nobody named after the record");
            assertTrue(vs[i] != x.accuser && vs[i] != ALICE, "no party");
        }
        assertEq(seated, want);
        assertEq(ledger.jurorState(poolId, k, address(0x7200)), 0);
    }

    // ------------------------------------------------------------------ random sequences

    /// @dev A random sequence of dispute actions on a handful of records (soft and hard accusations,
    /// challenges with good and forged signatures, appeals, draws, votes, lapses, finalizations,
    /// claims, surplus withdrawals and time) never creates or loses a token: after every step the
    /// ledger holds the budget plus the bonds, the budget plus what was claimed and forfeited equals
    /// what was funded less what was withdrawn, the budget covers every pending record, and no record
    /// is claimable while a dispute of it is open.
    /// forge-config: default.fuzz.runs = 64
    function testFuzz_disputeSequencesConserveTokens(uint256 seed) public {
        _disputedPool(6 hours, PoolManager.DisputeTerms(1 hours, 1 hours, 3, 7e18, address(0)));
        _registerProvider(CAROL, 100e18);
        _give(CAROL, 1e24);
        bytes32[] memory ks = new bytes32[](5);
        for (uint256 i; i < ks.length; ++i) {
            ks[i] = _recordOne(poolId, node1, uint48(1 + i * 1_000));
        }
        for (uint256 step; step < 60; ++step) {
            seed = uint256(keccak256(abi.encode(seed, step)));
            _randomAction(seed, ks[(seed >> 8) % ks.length]);
            _assertMoneyAddsUp(ks);
        }
    }

    function _randomAction(uint256 seed, bytes32 k) internal {
        uint256 what = seed % 13;
        address accuser = [VALIDATOR, JUROR1][(seed >> 16) % 2];
        address challenger = [BOB, CAROL][(seed >> 24) % 2];
        bytes memory sig =
            (seed >> 32) % 8 == 0 ? _sign(0xF0F0, ledger.rolloutDigest(poolId, k)) : _rolloutSig(poolId, k);
        if (what == 0 || what == 1) {
            vm.prank(accuser);
            try ledger.invalidateWork(poolId, k, bytes32(seed), what == 1, what == 1 ? sig : bytes("")) {} catch {}
        } else if (what == 2) {
            vm.prank(challenger);
            try ledger.challenge(poolId, k, bytes32(seed), sig) {} catch {}
        } else if (what == 3) {
            vm.prank(ALICE);
            try ledger.appeal(poolId, k) {} catch {}
        } else if (what == 4 || what == 5) {
            vm.roll(block.number + 1 + (seed >> 40) % 300);
            (address[] memory vs, uint64[] memory since) = pools.validatorEntries(poolId);
            try ledger.drawCommittee(poolId, k, vs, since) {} catch {}
            _voteSomehow(seed, k);
        } else if (what == 6) {
            try ledger.resolveLapsed(poolId, k) {} catch {}
        } else if (what == 7) {
            try ledger.finalizeInvalidation(poolId, k) {} catch {}
        } else if (what == 8) {
            vm.prank(ALICE);
            try ledger.claim(poolId, _keys1(k)) {} catch {}
        } else if (what == 9) {
            uint256 s = ledger.surplus(poolId);
            uint256 amount = s == 0 ? 1 : 1 + (seed >> 64) % s;
            vm.prank(POOL_OWNER);
            try ledger.withdrawSurplus(poolId, amount, POOL_OWNER) {
                withdrawn += amount;
            } catch {}
        } else {
            vm.warp(block.timestamp + (seed >> 72) % 2 hours);
        }
    }

    /// @dev A juror votes on `k`: usually one drawn to its committee, else any of the pool's validators.
    function _voteSomehow(uint256 seed, bytes32 k) internal {
        address[4] memory js = [VALIDATOR, JUROR1, JUROR2, JUROR3];
        address juror = js[(seed >> 48) % 4];
        for (uint256 j; j < 4 && (seed >> 50) % 4 != 0; ++j) {
            address cand = js[(j + (seed >> 48)) % 4];
            if (ledger.jurorState(poolId, k, cand) == 1) {
                juror = cand;
                break;
            }
        }
        vm.prank(juror);
        try ledger.vote(poolId, k, (seed >> 56) % 3 != 0) {} catch {}
    }

    function _assertMoneyAddsUp(bytes32[] memory ks) internal view {
        WorkLedger.PoolAccount memory a = ledger.poolAccount(poolId);
        assertEq(token.balanceOf(address(ledger)), uint256(a.budget) + ledger.bondsHeld(), "ledger = budget + bonds");
        assertEq(
            uint256(a.budget) + a.claimedTokens + a.forfeitedTokens, funded - withdrawn, "budget accounting"
        );
        assertGe(uint256(a.budget), uint256(a.pendingUnits) * RATE, "pending rewards reserved");
        assertEq(uint256(a.forfeitedTokens), uint256(a.invalidatedUnits) * RATE, "revoked rewards forfeited");
        assertEq(
            uint256(a.recordedUnits), uint256(a.pendingUnits) + a.invalidatedUnits + a.claimedUnits, "units"
        );
        assertEq(token.balanceOf(address(registry)), registry.totalStaked() + registry.totalUnbonding(), "stake");
        address[9] memory holders =
            [ALICE, BOB, CAROL, VALIDATOR, JUROR1, TREASURY, POOL_OWNER, FUNDER, address(ledger)];
        uint256 sum = token.balanceOf(address(registry));
        for (uint256 i; i < holders.length; ++i) {
            sum += token.balanceOf(holders[i]);
        }
        assertEq(sum, token.totalSupply(), "supply");
        for (uint256 i; i < ks.length; ++i) {
            WorkLedger.Dispute memory x = ledger.getDispute(poolId, ks[i]);
            bool open = x.kind != WorkLedger.DisputeKind.None && x.verdict == WorkLedger.Verdict.Open;
            WorkLedger.RecordStatus st = ledger.getRecord(poolId, ks[i]).status;
            assertEq(open, st == WorkLedger.RecordStatus.Disputed, "disputed iff a dispute is open");
            if (open) assertFalse(_isClaimable(poolId, ks[i]), "claimable while disputed");
        }
    }
}
