// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {PoolManager} from "../src/PoolManager.sol";
import {ProviderRegistry} from "../src/ProviderRegistry.sol";
import {WorkLedger} from "../src/WorkLedger.sol";

/// @notice Shared gas-measurement helpers. Every comparison measures the same operation on two
/// pools prepared the same way, after the same warm-up, so that the slots it touches are in the same
/// cold/warm/dirty state in both measurements; only the size of the stored sets differs.
abstract contract GasBase is Fixture {
    /// @dev Relative tolerance of the 10-vs-1,000 comparisons, in basis points (2 %).
    uint256 internal constant TOLERANCE_BPS = 200;

    function _assertSameGas(uint256 small, uint256 large, string memory what) internal {
        emit log_named_uint(string.concat(what, "_small"), small);
        emit log_named_uint(string.concat(what, "_large"), large);
        uint256 diff = small > large ? small - large : large - small;
        uint256 lo = small < large ? small : large;
        assertLe(diff * 10_000, lo * TOLERANCE_BPS, what);
    }

    function _gasRecord(uint256 poolId, WorkLedger.WorkInput[] memory b) internal returns (uint256 used) {
        WorkLedger l = ledger;
        vm.prank(COORD);
        uint256 g = gasleft();
        l.recordWork(poolId, b);
        used = g - gasleft();
    }

    /// @dev Binds `count` nodes (keys pkBase..pkBase+count-1) to `provider` and joins them to `poolId`.
    function _joinNodes(uint256 poolId, address provider, uint256 pkBase, uint256 count)
        internal
        returns (address[] memory nodes)
    {
        nodes = new address[](count);
        for (uint256 i; i < count; ++i) {
            nodes[i] = _addNode(provider, pkBase + i, 1);
            _join(poolId, provider, pkBase + i);
        }
    }

    /// @dev Records one record per node, in batches of at most 100; returns the keys.
    function _recordFor(uint256 poolId, address[] memory nodes) internal returns (bytes32[] memory keys) {
        keys = new bytes32[](nodes.length);
        uint256 done;
        while (done < nodes.length) {
            uint256 n = nodes.length - done;
            if (n > 100) n = 100;
            WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](n);
            for (uint256 i; i < n; ++i) {
                keys[done + i] = _newKey();
                b[i] = _work(nodes[done + i], keys[done + i], 100);
            }
            _record(poolId, b);
            done += n;
        }
    }

    function _batchFor(address[] memory nodes, uint256 count) internal returns (WorkLedger.WorkInput[] memory b) {
        b = new WorkLedger.WorkInput[](count);
        for (uint256 i; i < count; ++i) {
            b[i] = _work(nodes[i % nodes.length], _newKey(), 100);
        }
    }
}

/// @notice recordWork, joinPool, leavePool, ejectNode, invalidateWork and claim cost the same with 10
/// or 1,000 stored records and members.
contract GasScalingTest is GasBase {
    uint256 internal small;
    uint256 internal large;
    address[] internal smallNodes;
    address[] internal largeNodes;
    bytes32[] internal smallKeys;
    bytes32[] internal largeKeys;
    address[] internal smallFresh;
    address[] internal largeFresh;

    uint256 internal constant SMALL_PK = 0x10_0000;
    uint256 internal constant LARGE_PK = 0x20_0000;
    uint256 internal constant SMALL_N = 10;
    uint256 internal constant LARGE_N = 1_000;

    function setUp() public override {
        super.setUp();
        small = _createActivePool();
        large = _createActivePool();
        _registerProvider(ALICE, 1_000e18);
        _registerProvider(BOB, 20_000e18);
        _fundPool(small, 1e30);
        _fundPool(large, 1e30);

        smallNodes = _joinNodes(small, ALICE, SMALL_PK, SMALL_N);
        largeNodes = _joinNodes(large, BOB, LARGE_PK, LARGE_N);
        smallKeys = _recordFor(small, smallNodes);
        largeKeys = _recordFor(large, largeNodes);
        // Ten more members each, with no records yet.
        smallFresh = _joinNodes(small, ALICE, SMALL_PK + SMALL_N, 10);
        largeFresh = _joinNodes(large, BOB, LARGE_PK + LARGE_N, 10);
        // Two bound nodes each that have not joined.
        _addNode(ALICE, SMALL_PK + SMALL_N + 10, 1);
        _addNode(ALICE, SMALL_PK + SMALL_N + 11, 1);
        _addNode(BOB, LARGE_PK + LARGE_N + 10, 1);
        _addNode(BOB, LARGE_PK + LARGE_N + 11, 1);
    }

    function test_gas_setupSizes() public view {
        assertEq(uint256(pools.getPool(small).members), SMALL_N + 10);
        assertEq(uint256(pools.getPool(large).members), LARGE_N + 10);
        assertEq(uint256(ledger.poolAccount(small).recordedUnits), SMALL_N * 100);
        assertEq(uint256(ledger.poolAccount(large).recordedUnits), LARGE_N * 100);
    }

    function test_gas_recordWork_sameWith10Or1000Records() public {
        // Warm-up: one record on an old node of each pool.
        _record(small, _batchFor(_one(smallNodes[0]), 1));
        _record(large, _batchFor(_one(largeNodes[0]), 1));
        WorkLedger.WorkInput[] memory bs = _batchFor(smallFresh, 10);
        WorkLedger.WorkInput[] memory bl = _batchFor(largeFresh, 10);
        uint256 gs = _gasRecord(small, bs);
        uint256 gl = _gasRecord(large, bl);
        _assertSameGas(gs, gl, "recordWork10");
    }

    function test_gas_joinPool_sameWith10Or1000Members() public {
        _join(small, ALICE, SMALL_PK + SMALL_N + 10);
        _join(large, BOB, LARGE_PK + LARGE_N + 10);
        uint256 gs = _gasJoin(small, ALICE, SMALL_PK + SMALL_N + 11, 1_000_001);
        uint256 gl = _gasJoin(large, BOB, LARGE_PK + LARGE_N + 11, 1_000_002);
        assertTrue(pools.isMember(small, vm.addr(SMALL_PK + SMALL_N + 11)));
        assertTrue(pools.isMember(large, vm.addr(LARGE_PK + LARGE_N + 11)));
        _assertSameGas(gs, gl, "joinPool");
    }

    function test_gas_invalidate_sameWith10Or1000Records() public {
        _invalidate(small, smallKeys[0]);
        _invalidate(large, largeKeys[0]);
        uint256 gs = _gasInvalidate(small, smallKeys[1]);
        uint256 gl = _gasInvalidate(large, largeKeys[1]);
        assertTrue(ledger.getRecord(large, largeKeys[1]).status == WorkLedger.RecordStatus.Disputed);
        _assertSameGas(gs, gl, "invalidateWork");
    }

    /// @dev appeal, drawCommittee, vote, challenge and finalizeInvalidation cost the same with 10 or
    /// 1,000 records in the pool.
    function test_gas_disputes_sameWith10Or1000Records() public {
        _disputeGas(small, ALICE, BOB, [smallKeys[0], smallKeys[1], smallKeys[2], smallKeys[6]]); // warm-up
        _disputeGas(large, BOB, ALICE, [largeKeys[0], largeKeys[1], largeKeys[2], largeKeys[6]]);
        uint256[7] memory gs = _disputeGas(small, ALICE, BOB, [smallKeys[3], smallKeys[4], smallKeys[5], smallKeys[7]]);
        uint256[7] memory gl = _disputeGas(large, BOB, ALICE, [largeKeys[3], largeKeys[4], largeKeys[5], largeKeys[7]]);
        string[7] memory names =
            ["appeal", "drawCommittee", "vote", "challenge", "finalizeInvalidation", "softInvalidate", "resolveLapsed"];
        for (uint256 i; i < 7; ++i) {
            _assertSameGas(gs[i], gl[i], names[i]);
        }
    }

    /// @dev Gas of: the provider's appeal of k[0], the committee draw, a juror's vote, `challenger`'s
    /// challenge of k[1], finalizing an unappealed invalidation of k[2] (with its slash), a soft
    /// invalidation of k[3], and closing the challenge of k[1] once its vote lapsed.
    function _disputeGas(uint256 poolId, address provider, address challenger, bytes32[4] memory k)
        internal
        returns (uint256[7] memory g)
    {
        WorkLedger l = ledger;
        bytes memory sig = _rolloutSig(poolId, k[0]);
        vm.prank(VALIDATOR);
        l.invalidateWork(poolId, k[0], bytes32(0), true, sig);
        sig = _rolloutSig(poolId, k[2]);
        vm.prank(VALIDATOR);
        l.invalidateWork(poolId, k[2], bytes32(0), true, sig);
        vm.prank(provider);
        uint256 g0 = gasleft();
        l.appeal(poolId, k[0]);
        g[0] = g0 - gasleft();
        vm.roll(block.number + 1);
        g[1] = _drawGas(poolId, k[0]);
        address juror = l.jurorState(poolId, k[0], JUROR1) == 1 ? JUROR1 : JUROR2;
        vm.prank(juror);
        g0 = gasleft();
        l.vote(poolId, k[0], true);
        g[2] = g0 - gasleft();
        sig = _rolloutSig(poolId, k[1]);
        vm.prank(challenger);
        g0 = gasleft();
        l.challenge(poolId, k[1], bytes32(0), sig);
        g[3] = g0 - gasleft();
        vm.prank(VALIDATOR);
        g0 = gasleft();
        l.invalidateWork(poolId, k[3], bytes32(0), false, "");
        g[5] = g0 - gasleft();
        uint256 t = block.timestamp;
        vm.warp(t + 1 days);
        g0 = gasleft();
        l.finalizeInvalidation(poolId, k[2]);
        g[4] = g0 - gasleft();
        g0 = gasleft();
        l.resolveLapsed(poolId, k[1]);
        g[6] = g0 - gasleft();
        vm.warp(t);
    }

    function _drawGas(uint256 poolId, bytes32 key) internal returns (uint256 used) {
        WorkLedger l = ledger;
        (address[] memory vs, uint64[] memory since) = pools.validatorEntries(poolId);
        uint256 g = gasleft();
        l.drawCommittee(poolId, key, vs, since);
        used = g - gasleft();
    }

    /// @dev The owner's addValidator, removeValidator and rotateCoordinator cost the same in a pool of
    /// 10 or 1,000 records and members.
    function test_gas_poolAdmin_sameWith10Or1000RecordsAndMembers() public {
        _poolAdminGas(small, address(0xA11)); // warm-up
        _poolAdminGas(large, address(0xA11));
        uint256[3] memory gs = _poolAdminGas(small, address(0xA12));
        uint256[3] memory gl = _poolAdminGas(large, address(0xA12));
        assertEq(pools.getPool(large).coordinator, COORD);
        string[3] memory names = ["addValidator", "removeValidator", "rotateCoordinator"];
        for (uint256 i; i < 3; ++i) {
            _assertSameGas(gs[i], gl[i], names[i]);
        }
    }

    /// @dev Gas of: naming `v` a validator of `poolId`, removing it, and rotating the coordinator key
    /// away and back (the second rotation is measured).
    function _poolAdminGas(uint256 poolId, address v) internal returns (uint256[3] memory g) {
        PoolManager p = pools;
        vm.startPrank(POOL_OWNER);
        uint256 g0 = gasleft();
        p.addValidator(poolId, v);
        g[0] = g0 - gasleft();
        g0 = gasleft();
        p.removeValidator(poolId, v);
        g[1] = g0 - gasleft();
        p.rotateCoordinator(poolId, v);
        g0 = gasleft();
        p.rotateCoordinator(poolId, COORD);
        g[2] = g0 - gasleft();
        vm.stopPrank();
    }

    /// @dev unstake (which checks the floor of the provider's pools) and withdraw (which checks the
    /// stake lock of its recorded work) cost the same for a provider of 22 nodes and 10 records as for
    /// one of 1,012 nodes and 1,000 records.
    function test_gas_unstakeAndWithdraw_sameWith10Or1000NodesAndRecords() public {
        uint256[2] memory u;
        uint256[2] memory w;
        // Round 0 warms every slot both touch; round 1 measures, each provider already unbonding.
        for (uint256 round; round < 2; ++round) {
            _unstakeGas(ALICE);
            _unstakeGas(BOB);
            u[0] = _unstakeGas(ALICE);
            u[1] = _unstakeGas(BOB);
            vm.warp(block.timestamp + UNBONDING + WINDOW);
            w[0] = _withdrawGas(ALICE);
            w[1] = _withdrawGas(BOB);
        }
        _assertSameGas(u[0], u[1], "unstake");
        _assertSameGas(w[0], w[1], "withdraw");
    }

    function _unstakeGas(address provider) internal returns (uint256 used) {
        ProviderRegistry r = registry;
        vm.prank(provider);
        uint256 g = gasleft();
        r.unstake(1e18);
        used = g - gasleft();
    }

    function _withdrawGas(address provider) internal returns (uint256 used) {
        ProviderRegistry r = registry;
        vm.prank(provider);
        uint256 g = gasleft();
        r.withdraw();
        used = g - gasleft();
        assertEq(r.getProvider(provider).unbonding, 0);
    }

    function test_gas_claim_sameWith10Or1000Records() public {
        vm.warp(block.timestamp + WINDOW);
        _claim(small, ALICE, smallKeys[0]);
        _claim(large, BOB, largeKeys[0]);
        uint256 gs = _gasClaim(small, ALICE, smallKeys[1]);
        uint256 gl = _gasClaim(large, BOB, largeKeys[1]);
        assertTrue(ledger.getRecord(large, largeKeys[1]).status == WorkLedger.RecordStatus.Claimed);
        _assertSameGas(gs, gl, "claim");
    }

    function test_gas_leavePool_sameWith10Or1000Members() public {
        vm.prank(ALICE);
        pools.leavePool(small, smallFresh[0]);
        vm.prank(BOB);
        pools.leavePool(large, largeFresh[0]);
        uint256 gs = _gasMembership(small, ALICE, smallFresh[1], false);
        uint256 gl = _gasMembership(large, BOB, largeFresh[1], false);
        assertEq(uint256(pools.getPool(large).members), LARGE_N + 8);
        _assertSameGas(gs, gl, "leavePool");
    }

    function test_gas_ejectNode_sameWith10Or1000Members() public {
        vm.prank(COORD);
        pools.ejectNode(small, smallFresh[0]);
        vm.prank(COORD);
        pools.ejectNode(large, largeFresh[0]);
        uint256 gs = _gasMembership(small, COORD, smallFresh[1], true);
        uint256 gl = _gasMembership(large, COORD, largeFresh[1], true);
        assertFalse(pools.isMember(large, largeFresh[1]));
        _assertSameGas(gs, gl, "ejectNode");
    }

    function _gasMembership(uint256 poolId, address caller, address node, bool eject) internal returns (uint256 used) {
        PoolManager p = pools;
        vm.prank(caller);
        uint256 g = gasleft();
        if (eject) p.ejectNode(poolId, node);
        else p.leavePool(poolId, node);
        used = g - gasleft();
    }

    function _one(address a) internal pure returns (address[] memory r) {
        r = new address[](1);
        r[0] = a;
    }

    function _gasJoin(uint256 poolId, address provider, uint256 nodePk, uint256 nonce) internal returns (uint256 used) {
        address node = vm.addr(nodePk);
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(COORD_PK, poolId, node, nonce, expiry);
        PoolManager p = pools;
        vm.prank(provider);
        uint256 g = gasleft();
        p.joinPool(poolId, node, nonce, expiry, sig);
        used = g - gasleft();
    }

    function _gasInvalidate(uint256 poolId, bytes32 key) internal returns (uint256 used) {
        WorkLedger l = ledger;
        bytes memory sig = _rolloutSig(poolId, key);
        vm.prank(VALIDATOR);
        uint256 g = gasleft();
        l.invalidateWork(poolId, key, bytes32(uint256(1)), true, sig);
        used = g - gasleft();
    }

    function _gasClaim(uint256 poolId, address provider, bytes32 key) internal returns (uint256 used) {
        WorkLedger l = ledger;
        bytes32[] memory ks = _keys1(key);
        vm.prank(provider);
        uint256 g = gasleft();
        l.claim(poolId, ks);
        used = g - gasleft();
    }
}

/// @notice createPool and setDisputeTerms cost the same with 10 or 1,000 existing pools.
contract GasCreatePoolTest is GasBase {
    function test_gas_createPool_sameWith10Or1000Pools() public {
        PoolManager.PoolParams memory p = _params();
        PoolManager pm = pools;
        vm.startPrank(POOL_OWNER);
        PoolManager.DisputeTerms memory d = PoolManager.DisputeTerms(2 days, 1 days, 5, 1e18, address(0));
        while (pm.poolCount() < 10) pm.createPool(p);
        uint256 g = gasleft();
        uint256 id = pm.createPool(p);
        uint256 gs = g - gasleft();
        g = gasleft();
        pm.setDisputeTerms(id, d);
        uint256 ds = g - gasleft();
        while (pm.poolCount() < 1_000) pm.createPool(p);
        g = gasleft();
        id = pm.createPool(p);
        uint256 gl = g - gasleft();
        g = gasleft();
        pm.setDisputeTerms(id, d);
        uint256 dl = g - gasleft();
        vm.stopPrank();
        assertEq(pm.poolCount(), 1_001);
        _assertSameGas(gs, gl, "createPool");
        _assertSameGas(ds, dl, "setDisputeTerms");
    }
}

/// @notice Gas per record of a 100-record batch (figures are logged; the bound is generous).
contract GasPerRecordTest is GasBase {
    uint256 internal poolId;
    address[] internal distinct;
    address[] internal ten;

    function setUp() public override {
        super.setUp();
        poolId = _createActivePool();
        _fundPool(poolId, 1e30);
        _registerProvider(ALICE, 2_000e18);
        distinct = _joinNodes(poolId, ALICE, 0x30_0000, 100);
        ten = _joinNodes(poolId, ALICE, 0x40_0000, 10);
    }

    /// @dev Intrinsic calldata cost of a transaction carrying `data` (EIP-2028: 4 per zero byte, 16 per other).
    function _calldataGas(bytes memory data) internal pure returns (uint256 g) {
        for (uint256 i; i < data.length; ++i) {
            g += data[i] == 0 ? 4 : 16;
        }
    }

    function test_gas_perRecord_batchOf100() public {
        // Measured in a fresh transaction: membership and record slots are cold, as on chain.
        WorkLedger.WorkInput[] memory b1 = _batchFor(distinct, 100);
        WorkLedger.WorkInput[] memory b2 = _batchFor(ten, 100);
        uint256 g1 = _gasRecord(poolId, b1);
        uint256 g2 = _gasRecord(poolId, b2);
        uint256 perDistinct = g1 / 100;
        uint256 perTen = g2 / 100;
        emit log_named_uint("gas_per_record_100_distinct", perDistinct);
        emit log_named_uint("gas_per_record_100_from_10_nodes", perTen);
        // Whole-transaction estimate: 21,000 base + calldata + execution, per record.
        uint256 cd = _calldataGas(abi.encodeCall(WorkLedger.recordWork, (poolId, b1)));
        emit log_named_uint("tx_gas_per_record_est_100_distinct", (21_000 + cd + g1) / 100);

        assertEq(uint256(ledger.poolAccount(poolId).recordedUnits), 200 * 100);
        assertLt(perDistinct, 40_000, "per record, distinct nodes");
        assertLt(perTen, 40_000, "per record, ten nodes");
        // Repeated nodes are never dearer than distinct ones (warm membership slots).
        assertLe(perTen, perDistinct);
    }
}
