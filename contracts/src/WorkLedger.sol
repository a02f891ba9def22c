// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ProviderRegistry} from "./ProviderRegistry.sol";
import {PoolManager} from "./PoolManager.sol";
import {IStakeLock} from "./interfaces/IStakeLock.sol";

/// @title WorkLedger
/// @notice Recorded work, its validation window, invalidations and reward claims.
/// @dev Each record has one deadline, `recordedAt + validationWindow`. Strictly before it any validator
/// may invalidate the record (its units are revoked and the provider is slashed); at or after it the
/// record is final and only its provider may claim the reward. The lock and the window are the same
/// number, so nothing is claimable while it can still be revoked. A record is one storage slot, keyed
/// by `keccak256(poolId, workKey)`; history lives in events, and no function loops over stored sets.
///
/// Stake always backs the work: a record is refused when its provider's stake is below the pool's
/// minimum; every record locks its provider's stake until its deadline (`lockedUntil`, which the
/// registry checks before a withdrawal); and recording reserves the reward from the pool's budget
/// (a batch the budget cannot cover is refused), so a pool never owes more than it holds and every
/// final record can be paid.
contract WorkLedger is IStakeLock {
    using SafeERC20 for IERC20;

    /// @notice Most records per `recordWork` call (keeps a batch well inside a block).
    uint256 public constant MAX_BATCH = 512;

    enum RecordStatus {
        None,
        Pending,
        Invalidated,
        Claimed,
        Disputed
    }

    /// @notice What a dispute is about: a validator's hard invalidation waiting out its appeal period,
    /// an appeal of one, or an open challenge by a staked provider.
    enum DisputeKind {
        None,
        Accusation,
        Appeal,
        Challenge
    }

    /// @notice How a dispute ended: still open, the invalidation stands (slash), it was overturned
    /// (the record is pending again), or the vote lapsed without a majority (no slash, bonds back).
    enum Verdict {
        Open,
        Upheld,
        Overturned,
        Lapsed
    }

    /// @notice A record's dispute, three slots. A record is disputed once, except that a validator's
    /// invalidation may supersede an open challenge (which ends with the challenger's bond back).
    struct Dispute {
        address accuser;
        uint40 appealEnd;
        DisputeKind kind;
        Verdict verdict;
        uint40 voteEnd;
        uint64 drawBlock;
        uint8 size;
        uint8 upheld;
        uint8 overturned;
        bool drawn;
        bytes32 validatorSet;
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
    mapping(address => uint64) private _lockedUntil;
    mapping(bytes32 => Dispute) private _disputes;
    /// @dev Per committee (record key and its seed block): 1 drawn, 2 has voted.
    mapping(bytes32 => mapping(address => uint8)) private _jurors;
    /// @dev Open disputes per provider: while any is open its stake cannot be withdrawn at all.
    mapping(address => uint256) private _openDisputes;

    /// @notice Bonds held for open disputes (the ledger's balance is the budgets plus this).
    uint256 public bondsHeld;

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
    event WorkAccused(
        uint256 indexed poolId,
        bytes32 indexed workKey,
        address indexed accuser,
        address provider,
        bytes32 evidenceHash,
        uint40 appealEnd,
        uint256 bond
    );
    event WorkSoftInvalidated(
        uint256 indexed poolId, bytes32 indexed workKey, address indexed validator, address provider, uint48 units,
        bytes32 evidenceHash
    );
    event WorkAppealed(uint256 indexed poolId, bytes32 indexed workKey, address indexed provider, uint40 voteEnd, uint256 bond);
    event WorkChallenged(
        uint256 indexed poolId,
        bytes32 indexed workKey,
        address indexed challenger,
        address provider,
        bytes32 evidenceHash,
        uint40 voteEnd,
        uint256 bond
    );
    event CommitteeDrawn(uint256 indexed poolId, bytes32 indexed workKey, address[] members);
    event CommitteeRedraw(uint256 indexed poolId, bytes32 indexed workKey, uint64 drawBlock);
    event Voted(uint256 indexed poolId, bytes32 indexed workKey, address indexed voter, bool uphold);
    event DisputeResolved(
        uint256 indexed poolId,
        bytes32 indexed workKey,
        Verdict verdict,
        DisputeKind kind,
        address accuser,
        address provider,
        address bondsTo,
        uint256 bonds
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
    error NotValidator(uint256 poolId, address caller);
    error AlreadyDisputed(bytes32 workKey);
    error NotDisputed(bytes32 workKey, DisputeKind kind);
    error AppealPeriodOver(bytes32 workKey, uint40 appealEnd);
    error AppealPeriodNotOver(bytes32 workKey, uint40 appealEnd);
    error VotePeriodOver(bytes32 workKey, uint40 voteEnd);
    error VotePeriodNotOver(bytes32 workKey, uint40 voteEnd);
    error NotJuror(bytes32 workKey, address caller);
    error NotChallenger(address caller);
    error OwnWork(bytes32 workKey);
    error WrongValidatorSet(bytes32 workKey, bytes32 expected);
    error CommitteeNotDrawn(bytes32 workKey);
    error AlreadySettled(bytes32 workKey, RecordStatus status);
    error DeadlinePassed(bytes32 workKey, uint40 deadline, uint64 nowTime);
    error NotRecordProvider(bytes32 workKey, address provider, address caller);
    error InsufficientPoolFunds(uint256 poolId, uint256 budget, uint256 need);
    error StakeBelowMinimum(uint256 poolId, address node, uint256 stake, uint256 need);
    error NothingToClaim(uint256 poolId);
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
    /// is active, only for nodes that are members now and whose provider stakes at least the pool's
    /// minimum (and more than nothing), only when the pool's budget covers the batch's reward on top of
    /// what it already owes. Every record gets the deadline `block.timestamp + validationWindow` and
    /// locks its provider's stake until then.
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
        uint256 need = t.minStake == 0 ? 1 : t.minStake;
        uint256 total;
        address last;
        for (uint256 i; i < n; ++i) {
            address provider = providers[i];
            if (provider != last && provider != address(0)) {
                // One stake read and one lock update per run of records of the same provider.
                uint256 have = registry.stakeOf(provider);
                if (have < need) revert StakeBelowMinimum(poolId, batch[i].node, have, need);
                if (_lockedUntil[provider] < deadline) _lockedUntil[provider] = deadline;
                last = provider;
            }
            total += _store(poolId, batch[i], provider, deadline);
        }
        PoolAccount storage a = _accounts[poolId];
        uint256 owed = (uint256(a.pendingUnits) + total) * t.rewardRate;
        if (owed > a.budget) revert InsufficientPoolFunds(poolId, a.budget, owed);
        a.pendingUnits += uint64(total);
        a.recordedUnits += uint64(total);
        emit WorkBatchRecorded(poolId, n, total, deadline);
    }

    // ------------------------------------------------------------------ validator

    /// @notice One of the pool's validators invalidates a record strictly before its deadline.
    /// Soft (`hard` false): the units are revoked at once, nobody is slashed (data that was never
    /// served, failures the pool treats as soft). Hard: an accusation, not yet a slash: the validator
    /// puts up the pool's bond, and the provider has the appeal period to appeal (`appeal`). Unappealed,
    /// anyone makes it final after that period (`finalizeInvalidation`): the provider is slashed by the
    /// pool's slash amount, the validator gets its bond back and the registry's bounded bounty.
    /// @param poolId The pool.
    /// @param workKey The record's work key.
    /// @param evidenceHash Content hash of the evidence (published off chain).
    /// @param hard Whether the provider is accused (slash after the appeal period) or not.
    function invalidateWork(uint256 poolId, bytes32 workKey, bytes32 evidenceHash, bool hard) external {
        if (!pools.isPoolValidator(poolId, msg.sender)) revert NotValidator(poolId, msg.sender);
        bytes32 rk = _key(poolId, workKey);
        Record storage r = _records[rk];
        Dispute storage x = _disputes[rk];
        if (r.status == RecordStatus.Disputed && x.kind == DisputeKind.Challenge && x.verdict == Verdict.Open) {
            // A validator's verdict supersedes an open challenge (a sybil's challenge must not shield a
            // record from the pool's validators): the challenger gets its bond back.
            if (block.timestamp >= r.deadline) revert DeadlinePassed(workKey, r.deadline, uint64(block.timestamp));
            _supersede(poolId, workKey, r, x);
        } else {
            _open(poolId, rk, workKey);
        }
        address provider = r.provider;
        if (provider == msg.sender) revert OwnWork(workKey);
        if (!hard) {
            r.status = RecordStatus.Invalidated;
            uint48 units = r.units;
            PoolAccount storage a = _accounts[poolId];
            a.pendingUnits -= units;
            a.invalidatedUnits += units;
            emit WorkSoftInvalidated(poolId, workKey, msg.sender, provider, units, evidenceHash);
            return;
        }
        PoolManager.DisputeTerms memory d = pools.disputeTerms(poolId);
        r.status = RecordStatus.Disputed;
        uint40 appealEnd = _at(block.timestamp + d.appealPeriod);
        _disputes[rk] = Dispute({
            accuser: msg.sender,
            appealEnd: appealEnd,
            kind: DisputeKind.Accusation,
            verdict: Verdict.Open,
            voteEnd: 0,
            drawBlock: 0,
            size: 0,
            upheld: 0,
            overturned: 0,
            drawn: false,
            validatorSet: bytes32(0)
        });
        _openDisputes[provider] += 1;
        // The stake stays until an appeal filed at the last moment has been decided.
        _lock(provider, _at(uint256(appealEnd) + d.votePeriod));
        _takeBond(d.bond);
        emit WorkAccused(poolId, workKey, msg.sender, provider, evidenceHash, appealEnd, d.bond);
    }

    /// @notice Makes an unappealed hard invalidation final once its appeal period is over. Anyone.
    function finalizeInvalidation(uint256 poolId, bytes32 workKey) external {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        if (x.kind != DisputeKind.Accusation || x.verdict != Verdict.Open) revert NotDisputed(workKey, x.kind);
        if (block.timestamp < x.appealEnd) revert AppealPeriodNotOver(workKey, x.appealEnd);
        _resolve(poolId, workKey, rk, x, Verdict.Upheld);
    }

    /// @notice The record's provider appeals a hard invalidation before its appeal period ends, with
    /// the pool's bond. A committee of the pool's validators (or the pool's arbiter) decides within
    /// the vote period; the record is neither claimable nor invalidated meanwhile.
    function appeal(uint256 poolId, bytes32 workKey) external {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        if (x.kind != DisputeKind.Accusation || x.verdict != Verdict.Open) revert NotDisputed(workKey, x.kind);
        address provider = _records[rk].provider;
        if (msg.sender != provider) revert NotRecordProvider(workKey, provider, msg.sender);
        if (block.timestamp >= x.appealEnd) revert AppealPeriodOver(workKey, x.appealEnd);
        PoolManager.DisputeTerms memory d = pools.disputeTerms(poolId);
        x.kind = DisputeKind.Appeal;
        _openVote(poolId, x, d);
        _takeBond(d.bond);
        emit WorkAppealed(poolId, workKey, msg.sender, x.voteEnd, d.bond);
    }

    /// @notice Any staked provider other than the record's own challenges a record before its
    /// deadline, with the pool's bond and an evidence hash. A committee of the pool's validators (or
    /// the pool's arbiter) decides: upheld, the record is invalidated, its provider slashed and the
    /// challenger paid the bounty; overturned, the challenger's bond goes to the record's provider.
    function challenge(uint256 poolId, bytes32 workKey, bytes32 evidenceHash) external {
        uint256 minStake = pools.poolTerms(poolId).minStake;
        if (registry.stakeOf(msg.sender) < (minStake == 0 ? 1 : minStake)) revert NotChallenger(msg.sender);
        bytes32 rk = _key(poolId, workKey);
        Record storage r = _open(poolId, rk, workKey);
        address provider = r.provider;
        if (msg.sender == provider) revert OwnWork(workKey);
        PoolManager.DisputeTerms memory d = pools.disputeTerms(poolId);
        r.status = RecordStatus.Disputed;
        Dispute storage x = _disputes[rk];
        x.accuser = msg.sender;
        x.kind = DisputeKind.Challenge;
        _openVote(poolId, x, d);
        _openDisputes[provider] += 1;
        _lock(provider, x.voteEnd);
        _takeBond(d.bond);
        emit WorkChallenged(poolId, workKey, msg.sender, provider, evidenceHash, x.voteEnd, d.bond);
    }

    /// @notice Draws the committee of an appeal or a challenge, seeded by the hash of a block mined after
    /// the dispute opened (nobody could know it then), from the pool's validators as they were when it
    /// opened: `validators` must be that set (its hash is kept; `validatorsOf` at the opening block).
    /// If the seed block is too old for its hash, a later block is committed to instead. Anyone.
    function drawCommittee(uint256 poolId, bytes32 workKey, address[] calldata validators) external {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        _voting(x, workKey);
        if (x.drawn) return;
        if (keccak256(abi.encode(validators)) != x.validatorSet) revert WrongValidatorSet(workKey, x.validatorSet);
        if (block.number <= x.drawBlock) return; // its hash is not known yet
        bytes32 h = blockhash(x.drawBlock);
        if (h == bytes32(0)) {
            x.drawBlock = uint64(block.number);
            emit CommitteeRedraw(poolId, workKey, x.drawBlock);
            return;
        }
        address[] memory vs = validators;
        address provider = _records[rk].provider;
        // Candidates: every validator of the set except the two parties.
        uint256 n;
        for (uint256 i; i < vs.length; ++i) {
            if (vs[i] != x.accuser && vs[i] != provider) vs[n++] = vs[i];
        }
        uint256 k = pools.disputeTerms(poolId).committeeSize;
        if (k > n) k = n;
        address[] memory members = new address[](k);
        uint256 seed = uint256(keccak256(abi.encode(h, rk)));
        bytes32 ck = _committee(rk, x.drawBlock);
        for (uint256 i; i < k; ++i) {
            // Partial Fisher-Yates: pick from the candidates not yet picked.
            uint256 j = i + uint256(keccak256(abi.encode(seed, i))) % (n - i);
            (vs[i], vs[j]) = (vs[j], vs[i]);
            members[i] = vs[i];
            _jurors[ck][vs[i]] = 1;
        }
        x.size = uint8(k);
        x.drawn = true;
        emit CommitteeDrawn(poolId, workKey, members);
    }

    /// @notice A drawn committee member who is still one of the pool's validators (or the pool's
    /// arbiter, unless it is a party) votes on an appeal or a challenge before the vote period ends:
    /// `uphold` keeps the invalidation (slash), otherwise it is overturned. A majority of the committee
    /// decides at once; the arbiter's vote decides alone. The committee must be drawn first.
    function vote(uint256 poolId, bytes32 workKey, bool uphold) external {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        _voting(x, workKey);
        if (block.timestamp >= x.voteEnd) revert VotePeriodOver(workKey, x.voteEnd);
        address arbiter = pools.disputeTerms(poolId).arbiter;
        if (arbiter != address(0) && arbiter != x.accuser && arbiter != _records[rk].provider) {
            if (msg.sender != arbiter) revert NotJuror(workKey, msg.sender);
            emit Voted(poolId, workKey, msg.sender, uphold);
            _resolve(poolId, workKey, rk, x, uphold ? Verdict.Upheld : Verdict.Overturned);
            return;
        }
        if (!x.drawn) revert CommitteeNotDrawn(workKey);
        bytes32 ck = _committee(rk, x.drawBlock);
        if (_jurors[ck][msg.sender] != 1 || !pools.isPoolValidator(poolId, msg.sender)) {
            revert NotJuror(workKey, msg.sender);
        }
        _jurors[ck][msg.sender] = 2;
        emit Voted(poolId, workKey, msg.sender, uphold);
        uint256 half = uint256(x.size) / 2;
        if (uphold) {
            if (++x.upheld > half) _resolve(poolId, workKey, rk, x, Verdict.Upheld);
        } else {
            if (++x.overturned > half) _resolve(poolId, workKey, rk, x, Verdict.Overturned);
        }
    }

    /// @notice Closes an appeal or a challenge whose vote period ended without a majority: nobody is
    /// slashed and every bond goes back. A lapsed appeal leaves the record revoked (the accused work is
    /// not paid without a decision for it); a lapsed challenge leaves it pending. Anyone.
    function resolveLapsed(uint256 poolId, bytes32 workKey) external {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        _voting(x, workKey);
        if (block.timestamp < x.voteEnd) revert VotePeriodNotOver(workKey, x.voteEnd);
        _resolve(poolId, workKey, rk, x, Verdict.Lapsed);
    }

    // ------------------------------------------------------------------ provider

    /// @notice Claims the rewards of the caller's final records (deadline reached, not invalidated)
    /// among `workKeys`. A key that is not claimable by the caller now (unknown, another provider's,
    /// not final yet, settled) is skipped, so one record never blocks the others; the call reverts only
    /// when none of them is claimable. Every recorded reward was reserved, so a claim is always funded.
    /// @param poolId The pool.
    /// @param workKeys The records to claim.
    /// @return reward Tokens paid to the caller.
    function claim(uint256 poolId, bytes32[] calldata workKeys) external returns (uint256 reward) {
        if (workKeys.length == 0) revert EmptyBatch();
        if (workKeys.length > MAX_BATCH) revert BatchTooLarge(workKeys.length, MAX_BATCH);
        uint256 rate = pools.poolTerms(poolId).rewardRate;
        uint256 total;
        uint256 count;
        for (uint256 i; i < workKeys.length; ++i) {
            bytes32 k = workKeys[i];
            Record storage r = _records[_key(poolId, k)];
            if (r.status != RecordStatus.Pending || r.provider != msg.sender || block.timestamp < r.deadline) continue;
            r.status = RecordStatus.Claimed;
            total += r.units;
            ++count;
            emit WorkClaimed(poolId, k, msg.sender, r.units, uint256(r.units) * rate);
        }
        if (count == 0) revert NothingToClaim(poolId);
        reward = total * rate;
        PoolAccount storage a = _accounts[poolId];
        // Unreachable while recording reserves rewards (budget >= pendingUnits * rate); kept as a guard.
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

    /// @notice A record's dispute (kind None when it has none).
    function getDispute(uint256 poolId, bytes32 workKey) external view returns (Dispute memory) {
        return _disputes[_key(poolId, workKey)];
    }

    /// @notice Whether `who` sits on the committee of the record's dispute (drawn, not yet voted: 1;
    /// voted: 2; else 0).
    function jurorState(uint256 poolId, bytes32 workKey, address who) external view returns (uint8) {
        bytes32 rk = _key(poolId, workKey);
        return _jurors[_committee(rk, _disputes[rk].drawBlock)][who];
    }

    /// @inheritdoc IStakeLock
    /// @dev While any dispute of the provider is open, for ever (until it is resolved).
    function lockedUntil(address provider) external view returns (uint64) {
        if (_openDisputes[provider] != 0) return type(uint64).max;
        return _lockedUntil[provider];
    }

    /// @notice Why work of `node` could not be recorded in `poolId` now: 0 it can, 1 it is not a
    /// member, 2 its provider's stake is below the pool's minimum. (The budget is checked per batch.)
    function recordable(uint256 poolId, address node) external view returns (uint8) {
        PoolManager.Membership memory m = pools.membershipOf(node);
        if (poolId == 0 || m.poolId != poolId) return 1;
        uint256 need = pools.poolTerms(poolId).minStake;
        if (registry.stakeOf(m.provider) < (need == 0 ? 1 : need)) return 2;
        return 0;
    }

    /// @notice A pool's budget and unit totals.
    function poolAccount(uint256 poolId) external view returns (PoolAccount memory) {
        return _accounts[poolId];
    }

    /// @notice Budget not owed to pending records: what new records may still reserve, and what the
    /// owner may withdraw.
    function surplus(uint256 poolId) public view returns (uint256) {
        PoolAccount storage a = _accounts[poolId];
        uint256 owed = uint256(a.pendingUnits) * pools.poolTerms(poolId).rewardRate;
        return a.budget > owed ? a.budget - owed : 0;
    }

    /// @dev The record `rk` if it can still be invalidated or challenged: pending, before its deadline,
    /// never disputed.
    function _open(uint256 poolId, bytes32 rk, bytes32 workKey) private view returns (Record storage r) {
        r = _records[rk];
        RecordStatus s = r.status;
        if (s == RecordStatus.None) revert UnknownWork(poolId, workKey);
        if (s != RecordStatus.Pending) revert AlreadySettled(workKey, s);
        if (block.timestamp >= r.deadline) revert DeadlinePassed(workKey, r.deadline, uint64(block.timestamp));
        if (_disputes[rk].kind != DisputeKind.None) revert AlreadyDisputed(workKey);
    }

    /// @dev Opens the vote of an appeal or a challenge: its period, and the future block whose hash
    /// will seed the committee (with the validator set it is drawn from).
    function _openVote(uint256 poolId, Dispute storage x, PoolManager.DisputeTerms memory d) private {
        x.voteEnd = _at(block.timestamp + d.votePeriod);
        x.drawBlock = uint64(block.number);
        x.validatorSet = pools.validatorSetHash(poolId);
    }

    /// @dev Ends a dispute: moves the record, the units, the stake and the bonds.
    function _resolve(uint256 poolId, bytes32 workKey, bytes32 rk, Dispute storage x, Verdict v) private {
        x.verdict = v;
        Record storage r = _records[rk];
        address provider = r.provider;
        address accuser = x.accuser;
        _openDisputes[provider] -= 1;
        uint256 bond = pools.disputeTerms(poolId).bond;
        // Bonds put up: the accuser's always, the provider's when it appealed.
        uint256 held = x.kind == DisputeKind.Appeal ? 2 * bond : bond;
        bondsHeld -= held;
        address bondsTo;
        if (v == Verdict.Upheld) {
            bondsTo = accuser;
            _uphold(poolId, workKey, r, accuser, held);
        } else if (v == Verdict.Overturned) {
            r.status = RecordStatus.Pending;
            bondsTo = provider;
            if (held != 0) token.safeTransfer(provider, held);
        } else {
            if (x.kind == DisputeKind.Appeal) {
                r.status = RecordStatus.Invalidated; // revoked, not slashed
                PoolAccount storage a = _accounts[poolId];
                a.pendingUnits -= r.units;
                a.invalidatedUnits += r.units;
            } else {
                r.status = RecordStatus.Pending;
            }
            if (bond != 0) {
                token.safeTransfer(accuser, bond);
                if (x.kind == DisputeKind.Appeal) token.safeTransfer(provider, bond);
            }
        }
        emit DisputeResolved(poolId, workKey, v, x.kind, accuser, provider, bondsTo, held);
    }

    /// @dev The invalidation stands: units revoked, bonds to the accuser, the provider slashed (the
    /// accuser gets the registry's bounty).
    function _uphold(uint256 poolId, bytes32 workKey, Record storage r, address accuser, uint256 held) private {
        r.status = RecordStatus.Invalidated;
        uint48 units = r.units;
        PoolAccount storage a = _accounts[poolId];
        a.pendingUnits -= units;
        a.invalidatedUnits += units;
        if (held != 0) token.safeTransfer(accuser, held);
        address provider = r.provider;
        (uint256 slashed, uint256 bounty) = registry.slash(provider, pools.poolTerms(poolId).slashAmount, accuser, workKey);
        emit WorkInvalidated(poolId, workKey, accuser, provider, units, bytes32(0), slashed, bounty);
    }

    /// @dev An open challenge ends because a validator acts on its record: bond back, no verdict on it.
    function _supersede(uint256 poolId, bytes32 workKey, Record storage r, Dispute storage x) private {
        address challenger = x.accuser;
        uint256 bond = pools.disputeTerms(poolId).bond;
        x.verdict = Verdict.Lapsed;
        _openDisputes[r.provider] -= 1;
        bondsHeld -= bond;
        r.status = RecordStatus.Pending;
        if (bond != 0) token.safeTransfer(challenger, bond);
        emit DisputeResolved(poolId, workKey, Verdict.Lapsed, DisputeKind.Challenge, challenger, r.provider, address(0), bond);
    }

    /// @dev Reverts unless `x` is an open appeal or challenge.
    function _voting(Dispute storage x, bytes32 workKey) private view {
        if ((x.kind != DisputeKind.Appeal && x.kind != DisputeKind.Challenge) || x.verdict != Verdict.Open) {
            revert NotDisputed(workKey, x.kind);
        }
    }

    /// @dev The key of one committee: a record's, seeded at `drawBlock` (a superseded challenge's
    /// committee is another one).
    function _committee(bytes32 rk, uint64 drawBlock) private pure returns (bytes32) {
        return keccak256(abi.encode(rk, drawBlock));
    }

    function _takeBond(uint256 bond) private {
        if (bond == 0) return;
        bondsHeld += bond;
        token.safeTransferFrom(msg.sender, address(this), bond);
    }

    function _lock(address provider, uint40 until) private {
        if (_lockedUntil[provider] < until) _lockedUntil[provider] = until;
    }

    /// @dev A time as uint40, saturating (never wrapping into the past).
    function _at(uint256 t) private pure returns (uint40) {
        return t > type(uint40).max ? type(uint40).max : uint40(t);
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
