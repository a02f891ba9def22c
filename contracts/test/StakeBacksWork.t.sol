// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {PoolManager} from "../src/PoolManager.sol";
import {WorkLedger} from "../src/WorkLedger.sol";

/// @notice The attacks on stake from the economics issue, each one a test that now fails to cheat:
/// unstaking below a pool's minimum, working on after a slash to zero, and leaving with the stake
/// before an invalidation lands. (Unreserved rewards and a claim batch blocked by one record are in
/// WorkLedger.t.sol: `test_recordWork_revertsWhenBudgetShort`, `test_claim_oneBadKeyDoesNotBlockTheBatch`.)
contract StakeBacksWorkTest is Fixture {
    uint256 internal constant T0 = 1_700_000_000;
    uint256 internal poolId;
    address internal node1;

    function setUp() public override {
        super.setUp();
        vm.warp(T0);
        poolId = _createActivePool(); // minimum stake 100e18, slash 50e18, window 1 day
        _fundPool(poolId, 1_000_000e18);
        node1 = _member(poolId, ALICE, NODE1_PK, 100e18);
    }

    /// @dev Attack: join a pool whose minimum is 100, then unstake to 10 and keep being paid.
    function test_cannotUnstakeBelowThePoolMinimum() public {
        assertEq(pools.stakeFloor(ALICE), POOL_MIN_STAKE);
        assertEq(registry.requiredStake(ALICE), POOL_MIN_STAKE);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, 10e18, POOL_MIN_STAKE));
        vm.prank(ALICE);
        registry.unstake(90e18);
        // Extra stake above the floor may leave.
        _give(ALICE, 50e18);
        vm.prank(ALICE);
        registry.stake(50e18);
        vm.prank(ALICE);
        registry.unstake(50e18);
        assertEq(registry.stakeOf(ALICE), POOL_MIN_STAKE);
    }

    /// @dev The floor is the highest minimum among the provider's pools, and it falls only when the
    /// provider's last node leaves.
    function test_floorIsTheHighestMinimumUntilTheLastMembershipEnds() public {
        PoolManager.PoolParams memory p = _params();
        p.minStake = 300e18;
        uint256 big = _createActivePool(p);
        _give(ALICE, 200e18);
        vm.prank(ALICE);
        registry.stake(200e18);
        _addNode(ALICE, NODE2_PK, 1);
        _join(big, ALICE, NODE2_PK);
        assertEq(pools.stakeFloor(ALICE), 300e18);
        vm.prank(ALICE);
        pools.leavePool(big, vm.addr(NODE2_PK));
        assertEq(pools.stakeFloor(ALICE), 300e18, "still in a pool: the floor holds");
        vm.prank(COORD);
        pools.ejectNode(poolId, node1);
        assertEq(pools.stakeFloor(ALICE), 0);
        vm.prank(ALICE);
        registry.unstake(280e18); // only the compute units' 20e18 must stay
        assertEq(registry.stakeOf(ALICE), 20e18);
    }

    /// @dev Attack: a provider slashed to zero stays a member and its next work is recorded and paid.
    function test_noWorkRecordedBelowTheMinimum() public {
        PoolManager.PoolParams memory p = _params();
        p.slashAmount = 100e18;
        uint256 harsh = _createActivePool(p);
        _fundPool(harsh, 1e24);
        _registerProvider(BOB, 100e18);
        address n = _addNode(BOB, NODE3_PK, 1);
        _join(harsh, BOB, NODE3_PK);
        bytes32 k = _recordOne(harsh, n, 5);
        _slashNow(harsh, k, keccak256("evidence"));
        assertEq(registry.stakeOf(BOB), 0);
        assertTrue(pools.isMember(harsh, n), "still a member");
        assertEq(ledger.recordable(harsh, n), 2);
        bytes32 next = _newKey();
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.StakeBelowMinimum.selector, harsh, n, 0, POOL_MIN_STAKE));
        _record(harsh, _batch1(n, next, 5));
        assertTrue(ledger.getRecord(harsh, next).status == WorkLedger.RecordStatus.None);
        // Staking back up to the minimum makes its work recordable again.
        _give(BOB, 100e18);
        vm.prank(BOB);
        registry.stake(100e18);
        assertEq(ledger.recordable(harsh, n), 0);
        _record(harsh, _batch1(n, next, 5));
    }

    /// @dev A pool without a minimum still refuses work backed by nothing at all.
    function test_zeroMinimumStillNeedsSomeStake() public {
        PoolManager.PoolParams memory p = _params();
        p.minStake = 0;
        p.slashAmount = 1_000e18;
        uint256 lax = _createActivePool(p);
        _fundPool(lax, 1e24);
        _registerProvider(BOB, 100e18);
        address n = _addNode(BOB, NODE3_PK, 1);
        _join(lax, BOB, NODE3_PK);
        bytes32 k = _recordOne(lax, n, 5);
        _slashNow(lax, k, keccak256("evidence"));
        vm.expectRevert(abi.encodeWithSelector(WorkLedger.StakeBelowMinimum.selector, lax, n, 0, 1));
        _record(lax, _batch1(n, _newKey(), 5));
    }

    /// @dev Attack: with a window longer than the unbonding period, leave, unstake and withdraw
    /// before the invalidation lands, which then slashes nothing.
    function test_cannotWithdrawBeforeRecordedWorkIsFinal() public {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = UNBONDING + 3 days;
        uint256 slow = _createActivePool(p);
        _fundPool(slow, 1e24);
        _registerProvider(BOB, 100e18);
        address n = _addNode(BOB, NODE3_PK, 1);
        _join(slow, BOB, NODE3_PK);
        bytes32 k = _recordOne(slow, n, 5);
        uint64 deadline = uint64(T0 + UNBONDING + 3 days);
        assertEq(ledger.lockedUntil(BOB), deadline);

        vm.startPrank(BOB);
        pools.leavePool(slow, n);
        registry.removeNode(n);
        registry.unstake(100e18);
        vm.stopPrank();
        vm.warp(T0 + UNBONDING + 1);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, deadline, T0 + UNBONDING + 1));
        vm.prank(BOB);
        registry.withdraw();

        // The invalidation lands and takes the full slash from the unbonding tokens.
        _slashNow(slow, k, keccak256("evidence"));
        assertEq(registry.getProvider(BOB).slashed, SLASH);
        // Once the deadline has passed the rest may leave.
        vm.warp(deadline);
        vm.prank(BOB);
        registry.withdraw();
        assertEq(token.balanceOf(BOB), 100e18 - SLASH);
    }

    /// @dev The lock only moves forward: a later batch extends it, an earlier deadline never shortens it.
    function test_lockTakesTheLatestDeadline() public {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = 10 days;
        uint256 slow = _createActivePool(p);
        _fundPool(slow, 1e24);
        _addNode(ALICE, NODE2_PK, 1);
        _give(ALICE, 10e18);
        vm.prank(ALICE);
        registry.stake(10e18);
        _join(slow, ALICE, NODE2_PK);
        _recordOne(slow, vm.addr(NODE2_PK), 1);
        assertEq(ledger.lockedUntil(ALICE), T0 + 10 days);
        _recordOne(poolId, node1, 1); // 1-day window
        assertEq(ledger.lockedUntil(ALICE), T0 + 10 days);
        vm.warp(T0 + 1 days);
        _recordOne(slow, vm.addr(NODE2_PK), 1);
        assertEq(ledger.lockedUntil(ALICE), T0 + 11 days);
    }

    function test_setStakeLock_onceAndAdminOnly() public {
        assertEq(address(registry.stakeLock()), address(ledger));
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeLockAlreadySet.selector, address(ledger)));
        vm.prank(ADMIN);
        registry.setStakeLock(ledger);
    }

    /// @dev Fuzz: whatever the window and the time of the withdrawal, unbonding stake never leaves
    /// while a record of its provider can still be invalidated.
    function testFuzz_noWithdrawalWhileWorkIsOpen(uint64 window, uint256 at) public {
        window = uint64(bound(window, 1, 365 days));
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = window;
        uint256 id = _createActivePool(p);
        _fundPool(id, 1e24);
        _registerProvider(BOB, 100e18);
        address n = _addNode(BOB, NODE3_PK, 1);
        _join(id, BOB, NODE3_PK);
        _recordOne(id, n, 5);
        vm.startPrank(BOB);
        pools.leavePool(id, n);
        registry.removeNode(n);
        registry.unstake(100e18);
        vm.stopPrank();
        at = bound(at, T0, T0 + 2 * uint256(window) + UNBONDING);
        vm.warp(at);
        bool allowed = at >= T0 + UNBONDING && at >= T0 + window;
        if (!allowed) vm.expectRevert();
        vm.prank(BOB);
        registry.withdraw();
    }
}
