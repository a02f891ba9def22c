// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {PoolManager} from "../src/PoolManager.sol";
import {WorkLedger} from "../src/WorkLedger.sol";

/// @notice The attacks on stake from the economics issue, each one a test that now fails to cheat:
/// unstaking below a pool's minimum, one stake backing several pools, working on after a slash, and
/// leaving with the stake (or unbinding the node) before an invalidation lands. (Unreserved rewards
/// and a claim batch blocked by one record are in WorkLedger.t.sol: `test_recordWork_revertsWhenBudgetShort`,
/// `test_claim_oneBadKeyDoesNotBlockTheBatch`.)
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

    /// @dev The floor is the sum of the minimums of the distinct pools the provider's nodes are in (each
    /// pool's minimum is stake that pool alone can slash): a pool's minimum counts once however many of
    /// the provider's nodes are in it, and leaves the floor with the provider's last node there.
    function test_floorIsTheSumOfThePoolsMinimums() public {
        PoolManager.PoolParams memory p = _params();
        p.minStake = 300e18;
        uint256 big = _createActivePool(p);
        _addNode(ALICE, NODE2_PK, 1);
        _addNode(ALICE, NODE3_PK, 1);
        // 100 staked covers the first pool only: the second needs 100 + 300.
        uint64 expiry = uint64(block.timestamp + 1);
        bytes memory invite = _inviteSig(COORD_PK, big, vm.addr(NODE2_PK), 999, expiry);
        vm.expectRevert(abi.encodeWithSelector(PoolManager.StakeTooLow.selector, 100e18, 400e18));
        vm.prank(ALICE);
        pools.joinPool(big, vm.addr(NODE2_PK), 999, expiry, invite);
        _give(ALICE, 300e18);
        vm.prank(ALICE);
        registry.stake(300e18);
        _join(big, ALICE, NODE2_PK);
        assertEq(pools.stakeFloor(ALICE), 400e18);
        assertEq(registry.requiredStake(ALICE), 400e18);
        _join(big, ALICE, NODE3_PK); // a second node in the same pool: its minimum counts once
        assertEq(pools.stakeFloor(ALICE), 400e18);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeTooLow.selector, 399e18, 400e18));
        vm.prank(ALICE);
        registry.unstake(1e18);
        vm.prank(ALICE);
        pools.leavePool(big, vm.addr(NODE2_PK));
        assertEq(pools.stakeFloor(ALICE), 400e18, "another node still in the big pool");
        vm.prank(ALICE);
        pools.leavePool(big, vm.addr(NODE3_PK));
        assertEq(pools.stakeFloor(ALICE), POOL_MIN_STAKE, "the big pool's minimum left with its last node");
        vm.prank(COORD);
        pools.ejectNode(poolId, node1);
        assertEq(pools.stakeFloor(ALICE), 0);
        vm.prank(ALICE);
        registry.unstake(370e18); // only the compute units' 30e18 must stay
        assertEq(registry.stakeOf(ALICE), 30e18);
    }

    /// @dev Attack (issue 38): a slash in one pool leaves the stake below the sum of the provider's
    /// pools' minimums; its work in its other pools is refused until it tops the stake up, although
    /// what is left still covers each pool's minimum alone.
    function test_noWorkRecordedBelowTheFloorAfterASlashElsewhere() public {
        PoolManager.PoolParams memory p = _params();
        p.slashAmount = 100e18;
        uint256 second = _createActivePool(p);
        _fundPool(second, 1e24);
        _give(ALICE, 100e18);
        vm.prank(ALICE);
        registry.stake(100e18); // 200: both minimums
        address n2 = _addNode(ALICE, NODE2_PK, 1);
        _join(second, ALICE, NODE2_PK);
        assertEq(pools.stakeFloor(ALICE), 200e18);
        bytes32 k = _recordOne(second, n2, 5);
        _slashNow(second, k, keccak256("evidence"));
        assertEq(registry.stakeOf(ALICE), 100e18, "still the first pool's minimum");
        assertEq(ledger.recordable(poolId, node1), 2);
        bytes32 next = _newKey();
        vm.expectRevert(
            abi.encodeWithSelector(WorkLedger.StakeBelowMinimum.selector, poolId, node1, 100e18, 200e18)
        );
        _record(poolId, _batch1(node1, next, 5));
        _give(ALICE, 100e18);
        vm.prank(ALICE);
        registry.stake(100e18);
        assertEq(ledger.recordable(poolId, node1), 0);
        _record(poolId, _batch1(node1, next, 5));
    }

    /// @dev A node cannot be unbound while its provider's stake is locked: a slash needs a signature of
    /// a node still bound to the provider, so unbinding must not make the provider's work unslashable.
    function test_noNodeRemovedWhileTheStakeIsLocked() public {
        bytes32 k = _recordOne(poolId, node1, 5);
        vm.prank(ALICE);
        pools.leavePool(poolId, node1);
        vm.expectRevert(abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, uint64(T0 + WINDOW), T0));
        vm.prank(ALICE);
        registry.removeNode(node1);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, k, bytes32(0), false, "");
        vm.warp(T0 + 100 days);
        vm.expectRevert(
            abi.encodeWithSelector(ProviderRegistry.StakeLocked.selector, type(uint64).max, T0 + 100 days)
        );
        vm.prank(ALICE);
        registry.removeNode(node1);
        ledger.finalizeInvalidation(poolId, k);
        vm.prank(ALICE);
        registry.removeNode(node1);
        assertEq(registry.providerOf(node1), address(0));
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
        registry.unstake(90e18); // the node stays bound while the stake is locked: 10e18 for its unit
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
        assertEq(token.balanceOf(BOB), 90e18 - SLASH);
    }

    /// @dev The lock only moves forward: a later batch extends it, an earlier deadline never shortens it.
    function test_lockTakesTheLatestDeadline() public {
        PoolManager.PoolParams memory p = _params();
        p.validationWindow = 10 days;
        uint256 slow = _createActivePool(p);
        _fundPool(slow, 1e24);
        _addNode(ALICE, NODE2_PK, 1);
        _give(ALICE, 100e18);
        vm.prank(ALICE);
        registry.stake(100e18); // both pools' minimums
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
        registry.unstake(90e18);
        vm.stopPrank();
        at = bound(at, T0, T0 + 2 * uint256(window) + UNBONDING);
        vm.warp(at);
        bool allowed = at >= T0 + UNBONDING && at >= T0 + window;
        if (!allowed) vm.expectRevert();
        vm.prank(BOB);
        registry.withdraw();
    }
}
