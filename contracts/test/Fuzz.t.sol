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
        assertEq(ledger.isClaimable(poolId, k), !open);

        bool invalidated;
        bool claimed;
        if (invalidateFirst) {
            invalidated = _tryInvalidate(poolId, k, deadline, nowTs, open);
            claimed = _tryClaim(poolId, k, deadline, nowTs, open, invalidated);
        } else {
            claimed = _tryClaim(poolId, k, deadline, nowTs, open, false);
            if (claimed) {
                vm.expectRevert(
                    abi.encodeWithSelector(WorkLedger.AlreadySettled.selector, k, WorkLedger.RecordStatus.Claimed)
                );
                vm.prank(VALIDATOR);
                ledger.invalidateWork(poolId, k, bytes32(0), true);
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
        if (!open) {
            vm.expectRevert(
                abi.encodeWithSelector(WorkLedger.DeadlinePassed.selector, k, uint40(deadline), uint64(nowTs))
            );
        }
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), true);
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
        assertFalse(ledger.isClaimable(poolId, k));
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
