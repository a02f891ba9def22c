// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ProviderRegistry} from "./ProviderRegistry.sol";
import {PoolManager} from "./PoolManager.sol";

/// @title WorkLedger
/// @notice Recorded work, its validation window, invalidations and reward claims.
/// @dev Each record has one deadline, `recordedAt + validationWindow`. Strictly before it any validator
/// may invalidate the record (its units are revoked and the provider is slashed); at or after it the
/// record is final and only its provider may claim the reward. The lock and the window are the same
/// number, so nothing is claimable while it can still be revoked. A record is one storage slot, keyed
/// by `keccak256(poolId, workKey)`; history lives in events, and no function loops over stored sets.
contract WorkLedger {
    using SafeERC20 for IERC20;

    /// @notice Most records per `recordWork` call (keeps a batch well inside a block).
    uint256 public constant MAX_BATCH = 512;

    enum RecordStatus {
        None,
        Pending,
        Invalidated,
        Claimed
    }

    /// @notice One work record, packed in one slot.
    struct Record {
        address provider;
        uint40 deadline;
        RecordStatus status;
        uint48 units;
    }

    /// @notice One entry of a `recordWork` batch.
    struct WorkInput {
        address node;
        bytes32 workKey;
        uint48 units;
        uint32 policyVersion;
        bytes32 proofCommitment;
    }

    /// @notice A pool's reward budget and unit totals.
    struct PoolAccount {
        uint128 budget;
        uint64 pendingUnits;
        uint64 recordedUnits;
        uint64 invalidatedUnits;
        uint64 claimedUnits;
        uint128 claimedTokens;
    }

    /// @notice The reward token.
    IERC20 public immutable token;
    /// @notice Provider registry (validator role, slashing).
    ProviderRegistry public immutable registry;
    /// @notice Pool manager (coordinators, windows, membership).
    PoolManager public immutable pools;

    mapping(bytes32 => Record) private _records;
    mapping(uint256 => PoolAccount) private _accounts;

    event WorkRecorded(
        uint256 indexed poolId,
        address indexed node,
        bytes32 indexed workKey,
        address provider,
        uint48 units,
        uint32 policyVersion,
        bytes32 proofCommitment
    );
    event WorkBatchRecorded(uint256 indexed poolId, uint256 count, uint256 units, uint40 deadline);
    event WorkInvalidated(
        uint256 indexed poolId,
        bytes32 indexed workKey,
        address indexed validator,
        address provider,
        uint48 units,
        bytes32 evidenceHash,
        uint256 slashed,
        uint256 bounty
    );
    event WorkClaimed(
        uint256 indexed poolId, bytes32 indexed workKey, address indexed provider, uint48 units, uint256 reward
    );
    event PoolFunded(uint256 indexed poolId, address indexed funder, uint256 amount, uint256 budget);
    event SurplusWithdrawn(uint256 indexed poolId, address indexed to, uint256 amount, uint256 budget);

    error ZeroAmount();
    error UnknownPool(uint256 poolId);
    error NotCoordinator(uint256 poolId, address caller);
    error NotPoolOwner(uint256 poolId, address caller);
    error PoolNotActive(uint256 poolId, PoolManager.Status status);
    error EmptyBatch();
    error BatchTooLarge(uint256 size, uint256 max);
    error ZeroUnits(bytes32 workKey);
    error NotMember(uint256 poolId, address node);
    error DuplicateWork(uint256 poolId, bytes32 workKey);
    error UnknownWork(uint256 poolId, bytes32 workKey);
    error NotValidator(address caller);
    error AlreadySettled(bytes32 workKey, RecordStatus status);
    error DeadlinePassed(bytes32 workKey, uint40 deadline, uint64 nowTime);
    error DeadlineNotReached(bytes32 workKey, uint40 deadline, uint64 nowTime);
    error NotRecordProvider(bytes32 workKey, address provider, address caller);
    error InsufficientPoolFunds(uint256 poolId, uint256 budget, uint256 need);
    error SurplusTooLow(uint256 surplus, uint256 requested);
    error BudgetOverflow(uint256 budget, uint256 amount);

    /// @param token_ Reward token.
    /// @param registry_ Provider registry; this ledger needs its `SLASHER_ROLE`.
    /// @param pools_ Pool manager.
    constructor(IERC20 token_, ProviderRegistry registry_, PoolManager pools_) {
        token = token_;
        registry = registry_;
        pools = pools_;
    }

    // ------------------------------------------------------------------ coordinator

    /// @notice Records a batch of work for `poolId`. Only the pool's coordinator, only while the pool
    /// is active, only for nodes that are members now. Every record gets the deadline
    /// `block.timestamp + validationWindow`.
    /// @param poolId The pool.
    /// @param batch Records: node, work key (content hash of the rollout file, unique per pool),
    /// units (tokens generated), policy version and proof commitment.
    function recordWork(uint256 poolId, WorkInput[] calldata batch) external {
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        if (t.status == PoolManager.Status.None) revert UnknownPool(poolId);
        if (msg.sender != t.coordinator) revert NotCoordinator(poolId, msg.sender);
        if (t.status != PoolManager.Status.Active) revert PoolNotActive(poolId, t.status);
        uint256 n = batch.length;
        if (n == 0) revert EmptyBatch();
        if (n > MAX_BATCH) revert BatchTooLarge(n, MAX_BATCH);

        address[] memory nodes = new address[](n);
        for (uint256 i; i < n; ++i) {
            nodes[i] = batch[i].node;
        }
        address[] memory providers = pools.membersProviders(poolId, nodes);

        // Saturate instead of truncating: a window reaching past 2^40 s must not wrap the deadline
        // into the past (which would make the record final, hence claimable, at once).
        uint256 end = block.timestamp + t.validationWindow;
        uint40 deadline = end > type(uint40).max ? type(uint40).max : uint40(end);
        uint256 total;
        for (uint256 i; i < n; ++i) {
            total += _store(poolId, batch[i], providers[i], deadline);
        }
        PoolAccount storage a = _accounts[poolId];
        a.pendingUnits += uint64(total);
        a.recordedUnits += uint64(total);
        emit WorkBatchRecorded(poolId, n, total, deadline);
    }

    // ------------------------------------------------------------------ validator

    /// @notice Invalidates a record strictly before its deadline: revokes its units and slashes the
    /// provider by the pool's slash amount (the caller gets the registry's bounded bounty).
    /// @param poolId The pool.
    /// @param workKey The record's work key.
    /// @param evidenceHash Content hash of the evidence (published off chain).
    function invalidateWork(uint256 poolId, bytes32 workKey, bytes32 evidenceHash) external {
        if (!registry.isValidator(msg.sender)) revert NotValidator(msg.sender);
        Record storage r = _records[_key(poolId, workKey)];
        RecordStatus s = r.status;
        if (s == RecordStatus.None) revert UnknownWork(poolId, workKey);
        if (s != RecordStatus.Pending) revert AlreadySettled(workKey, s);
        if (block.timestamp >= r.deadline) revert DeadlinePassed(workKey, r.deadline, uint64(block.timestamp));
        r.status = RecordStatus.Invalidated;
        uint48 units = r.units;
        address provider = r.provider;
        PoolAccount storage a = _accounts[poolId];
        a.pendingUnits -= units;
        a.invalidatedUnits += units;
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        (uint256 slashed, uint256 bounty) = registry.slash(provider, t.slashAmount, msg.sender, workKey);
        emit WorkInvalidated(poolId, workKey, msg.sender, provider, units, evidenceHash, slashed, bounty);
    }

    // ------------------------------------------------------------------ provider

    /// @notice Claims the rewards of final records (deadline reached, not invalidated) of the caller.
    /// @param poolId The pool.
    /// @param workKeys The records to claim; all must belong to the caller.
    /// @return reward Tokens paid to the caller.
    function claim(uint256 poolId, bytes32[] calldata workKeys) external returns (uint256 reward) {
        if (workKeys.length == 0) revert EmptyBatch();
        if (workKeys.length > MAX_BATCH) revert BatchTooLarge(workKeys.length, MAX_BATCH);
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        uint256 total;
        for (uint256 i; i < workKeys.length; ++i) {
            bytes32 k = workKeys[i];
            Record storage r = _records[_key(poolId, k)];
            RecordStatus s = r.status;
            if (s == RecordStatus.None) revert UnknownWork(poolId, k);
            if (r.provider != msg.sender) revert NotRecordProvider(k, r.provider, msg.sender);
            if (s != RecordStatus.Pending) revert AlreadySettled(k, s);
            if (block.timestamp < r.deadline) revert DeadlineNotReached(k, r.deadline, uint64(block.timestamp));
            r.status = RecordStatus.Claimed;
            total += r.units;
            emit WorkClaimed(poolId, k, msg.sender, r.units, uint256(r.units) * t.rewardRate);
        }
        reward = total * t.rewardRate;
        PoolAccount storage a = _accounts[poolId];
        if (reward > a.budget) revert InsufficientPoolFunds(poolId, a.budget, reward);
        a.budget -= uint128(reward);
        a.pendingUnits -= uint64(total);
        a.claimedUnits += uint64(total);
        a.claimedTokens += uint128(reward);
        if (reward != 0) token.safeTransfer(msg.sender, reward);
    }

    // ------------------------------------------------------------------ budget

    /// @notice Adds reward tokens to a pool's budget (needs a prior token approval). Anyone may fund.
    function fundPool(uint256 poolId, uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        if (t.status == PoolManager.Status.None) revert UnknownPool(poolId);
        PoolAccount storage a = _accounts[poolId];
        // The budget is a uint128: refuse what would not fit instead of truncating `amount`
        // (which would take the full amount but credit only its low 128 bits).
        if (amount > type(uint128).max - a.budget) revert BudgetOverflow(a.budget, amount);
        a.budget += uint128(amount);
        emit PoolFunded(poolId, msg.sender, amount, a.budget);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @notice The pool owner takes back budget not owed to pending records.
    function withdrawSurplus(uint256 poolId, uint256 amount, address to) external {
        if (amount == 0) revert ZeroAmount();
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        if (t.status == PoolManager.Status.None) revert UnknownPool(poolId);
        if (pools.getPool(poolId).owner != msg.sender) revert NotPoolOwner(poolId, msg.sender);
        uint256 s = surplus(poolId);
        if (amount > s) revert SurplusTooLow(s, amount);
        PoolAccount storage a = _accounts[poolId];
        a.budget -= uint128(amount);
        emit SurplusWithdrawn(poolId, to, amount, a.budget);
        token.safeTransfer(to, amount);
    }

    // ------------------------------------------------------------------ views

    /// @notice A record (status None when unknown).
    function getRecord(uint256 poolId, bytes32 workKey) external view returns (Record memory) {
        return _records[_key(poolId, workKey)];
    }

    /// @notice Whether a record is final: pending and at or past its deadline, hence claimable.
    function isClaimable(uint256 poolId, bytes32 workKey) external view returns (bool) {
        Record storage r = _records[_key(poolId, workKey)];
        return r.status == RecordStatus.Pending && block.timestamp >= r.deadline;
    }

    /// @notice A pool's budget and unit totals.
    function poolAccount(uint256 poolId) external view returns (PoolAccount memory) {
        return _accounts[poolId];
    }

    /// @notice Budget not owed to pending records.
    function surplus(uint256 poolId) public view returns (uint256) {
        PoolAccount storage a = _accounts[poolId];
        uint256 owed = uint256(a.pendingUnits) * pools.poolTerms(poolId).rewardRate;
        return a.budget > owed ? a.budget - owed : 0;
    }

    /// @dev Checks and writes one record as a single packed SSTORE, then emits its event.
    function _store(uint256 poolId, WorkInput calldata w, address provider, uint40 deadline)
        private
        returns (uint256 units)
    {
        units = w.units;
        if (units == 0) revert ZeroUnits(w.workKey);
        if (provider == address(0)) revert NotMember(poolId, w.node);
        Record storage r = _records[_key(poolId, w.workKey)];
        if (r.status != RecordStatus.None) revert DuplicateWork(poolId, w.workKey);
        // provider | deadline << 160 | Pending << 200 | units << 208, the layout of `Record`.
        uint256 packed = uint256(uint160(provider)) | (uint256(deadline) << 160)
            | (uint256(uint8(RecordStatus.Pending)) << 200) | (units << 208);
        assembly ("memory-safe") {
            sstore(r.slot, packed)
        }
        emit WorkRecorded(poolId, w.node, w.workKey, provider, w.units, w.policyVersion, w.proofCommitment);
    }

    function _key(uint256 poolId, bytes32 workKey) private pure returns (bytes32 k) {
        assembly ("memory-safe") {
            mstore(0x00, poolId)
            mstore(0x20, workKey)
            k := keccak256(0x00, 0x40)
        }
    }
}
