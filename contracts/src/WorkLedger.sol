// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ProviderRegistry} from "./ProviderRegistry.sol";
import {PoolManager} from "./PoolManager.sol";
import {IStakeLock} from "./interfaces/IStakeLock.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @title WorkLedger
/// @notice Recorded work, its validation window, invalidations and reward claims.
/// @dev Each record has one deadline, `recordedAt + validationWindow`. Strictly before it the pool's
/// validators (those named by then) may accuse it and staked providers may challenge it; at or after
/// it, unless a dispute holds it, the record is final and only its provider may claim the reward. A
/// dispute that does not stand gives the record back the time its window had left, so nothing is
/// claimable while it can still be revoked, and no dispute outcome shields a record. A record is one
/// storage slot, keyed by `keccak256(poolId, workKey)`; history lives in events, and no function loops
/// over stored sets.
///
/// Stake always backs the work: a record is refused when its provider's stake is below the pool's
/// minimum or the sum of its pools' minimums; every record locks its provider's stake until its
/// deadline (`lockedUntil`, which the registry checks before a withdrawal or a node's removal); and
/// recording reserves the reward from the pool's budget (a batch the budget cannot cover is refused),
/// so a pool never owes more than it holds and every final record can be paid. A revoked record's
/// reward goes to the treasury, never back to the pool. A slash needs the node's own signature over
/// the work (`rolloutDigest`).
contract WorkLedger is IStakeLock, EIP712 {
    using SafeERC20 for IERC20;

    /// @notice Most records per `recordWork` call (keeps a batch well inside a block).
    uint256 public constant MAX_BATCH = 512;
    /// @notice EIP-712 type a node signs for each rollout file it makes (its work key, in one pool),
    /// under this ledger's domain (name "IntellectWorkLedger", version "1", chain, this address).
    bytes32 private constant ROLLOUT_TYPEHASH = keccak256("Rollout(bytes32 workKey,uint256 poolId)");
    /// @notice Share of its bond a challenger loses, to the treasury, when its challenge lapses (it held
    /// the record's judges for a vote period and nobody could decide).
    uint256 public constant LAPSE_FEE_BPS = 1_000;

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

    /// @notice A record's latest dispute, three slots. One dispute of a record is open at a time and
    /// nobody may take it over; one that does not stand (overturned, or a lapsed challenge) leaves the
    /// record open to a new one, which replaces it here (earlier ones live in events).
    /// @param hard A slash is at stake (hard accusations, challenges); a soft accusation only revokes.
    /// @param openedAt When this dispute was opened (a reopened record gets the time it had left then).
    /// @param recordedAt When the record was recorded (validators named later may not act on it).
    /// @param round Votes opened on this record so far (each has its own committee).
    /// @param softCleared A soft accusation of the record was overturned: no other soft one.
    /// @param openedBlock The block it was opened in (read `PoolManager.validatorEntries` there to draw).
    /// @param validatorSet `PoolManager.validatorSetHash` when the dispute opened: its committee's pool.
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
        bool hard;
        uint40 openedAt;
        uint40 recordedAt;
        uint16 round;
        bool softCleared;
        uint40 openedBlock;
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
        uint128 forfeitedTokens;
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
        bytes32 evidenceHash, uint40 appealEnd
    );
    event RewardForfeited(uint256 indexed poolId, bytes32 indexed workKey, address indexed to, uint256 amount);
    event WorkReopened(uint256 indexed poolId, bytes32 indexed workKey, uint40 deadline);
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
    error SoftAccusedBefore(bytes32 workKey);
    error NamedAfterWork(bytes32 workKey, uint64 validatorSince, uint40 recordedAt);
    error NotProvidersWork(bytes32 workKey, address signer, address provider);
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
    constructor(IERC20 token_, ProviderRegistry registry_, PoolManager pools_) EIP712("IntellectWorkLedger", "1") {
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
                // One stake read and one lock update per run of records of the same provider. The stake
                // must cover the minimum of every pool the provider is in (its floor), not just this one's.
                uint256 have = registry.stakeOf(provider);
                uint256 floor = pools.stakeFloor(provider);
                if (have < need || have < floor) {
                    revert StakeBelowMinimum(poolId, batch[i].node, have, floor > need ? floor : need);
                }
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

    /// @notice One of the pool's validators accuses a record strictly before its deadline; the record is
    /// frozen (neither claimable nor revoked) for the pool's appeal period, during which its provider
    /// may appeal (`appeal`). Unappealed, anyone makes it final after that period
    /// (`finalizeInvalidation`): the record is revoked and its reserved reward goes to the treasury (never
    /// back to the pool, so neither the owner nor its validators gain by revoking), and a hard accusation
    /// also slashes the provider by the pool's slash amount, all of it to the treasury (a bounty is paid
    /// only for a verdict a committee or the arbiter reached).
    /// Soft (`hard` false, for data never served or failures the pool treats as soft): no bond, no slash.
    /// Hard: the validator puts up the pool's bond and must show the node's own signature over the work
    /// (`rolloutDigest`, signed by a node bound to the record's provider): nobody is slashed for work it
    /// did not sign. Only validators named at or before the record was recorded may accuse it (its
    /// members joined under that set), and the validator set the committee of an appeal will be drawn
    /// from is fixed now.
    /// @param poolId The pool.
    /// @param workKey The record's work key.
    /// @param evidenceHash Content hash of the evidence (published off chain).
    /// @param hard Whether the provider is accused (slash) or the record only revoked.
    /// @param nodeSignature For a hard accusation, the node's EIP-712 `Rollout` signature (else ignored).
    function invalidateWork(
        uint256 poolId,
        bytes32 workKey,
        bytes32 evidenceHash,
        bool hard,
        bytes calldata nodeSignature
    ) external {
        bytes32 rk = _key(poolId, workKey);
        Record storage r = _open(poolId, rk, workKey, hard);
        if (hard) _checkSigned(poolId, workKey, r.provider, nodeSignature);
        (uint40 appealEnd, uint256 bond) = _accuse(poolId, workKey, rk, r, hard);
        if (!hard) {
            emit WorkSoftInvalidated(poolId, workKey, msg.sender, r.provider, r.units, evidenceHash, appealEnd);
            return;
        }
        _takeBond(bond);
        emit WorkAccused(poolId, workKey, msg.sender, r.provider, evidenceHash, appealEnd, bond);
    }

    /// @dev Opens the caller's accusation of `r` if it may: one of the pool's validators, named at or
    /// before the record was recorded, not the record's provider.
    function _accuse(uint256 poolId, bytes32 workKey, bytes32 rk, Record storage r, bool hard)
        private
        returns (uint40 appealEnd, uint256 bond)
    {
        if (!hard && _disputes[rk].softCleared) revert SoftAccusedBefore(workKey);
        uint40 recordedAt = _recordedAt(poolId, rk, r);
        uint64 since = pools.validatorSince(poolId, msg.sender);
        if (since == 0) revert NotValidator(poolId, msg.sender);
        if (since > recordedAt) revert NamedAfterWork(workKey, since, recordedAt);
        address provider = r.provider;
        if (provider == msg.sender) revert OwnWork(workKey);
        PoolManager.DisputeTerms memory d = pools.disputeTerms(poolId);
        appealEnd = _at(block.timestamp + d.appealPeriod);
        bond = d.bond;
        _begin(poolId, rk, DisputeKind.Accusation, hard, recordedAt).appealEnd = appealEnd;
        r.status = RecordStatus.Disputed;
        _openDisputes[provider] += 1;
        // The stake stays until an appeal filed at the last moment has been decided.
        _lock(provider, _at(uint256(appealEnd) + d.votePeriod));
    }

    /// @notice Makes an unappealed accusation final once its appeal period is over. Anyone.
    function finalizeInvalidation(uint256 poolId, bytes32 workKey) external {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        if (x.kind != DisputeKind.Accusation || x.verdict != Verdict.Open) revert NotDisputed(workKey, x.kind);
        if (block.timestamp < x.appealEnd) revert AppealPeriodNotOver(workKey, x.appealEnd);
        _resolve(poolId, workKey, rk, x, Verdict.Upheld);
    }

    /// @notice The record's provider appeals an accusation (hard or soft) before its appeal period ends,
    /// with the pool's bond. A committee drawn from the validators of the set fixed at the accusation (or
    /// the pool's arbiter) decides within the vote period; the record is neither claimable nor revoked
    /// meanwhile.
    function appeal(uint256 poolId, bytes32 workKey) external {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        if (x.kind != DisputeKind.Accusation || x.verdict != Verdict.Open) revert NotDisputed(workKey, x.kind);
        address provider = _records[rk].provider;
        if (msg.sender != provider) revert NotRecordProvider(workKey, provider, msg.sender);
        if (block.timestamp >= x.appealEnd) revert AppealPeriodOver(workKey, x.appealEnd);
        PoolManager.DisputeTerms memory d = pools.disputeTerms(poolId);
        x.kind = DisputeKind.Appeal;
        _openVote(x, d);
        _takeBond(d.bond);
        emit WorkAppealed(poolId, workKey, msg.sender, x.voteEnd, d.bond);
    }

    /// @notice Any staked provider other than the record's own challenges a record before its
    /// deadline, with the pool's bond, an evidence hash and the node's signature over the work. A
    /// committee of the pool's validators (or the pool's arbiter) decides: upheld, the record is revoked,
    /// its provider slashed and the challenger paid the bounty; overturned, the challenger's bond goes to
    /// the record's provider. Nobody else may act on the record while the challenge is open (the first
    /// disputer keeps its claim); a challenge that does not stand leaves the record open again, with the
    /// time its window had left when the challenge opened. A lapsed challenge (no majority) costs the
    /// challenger `LAPSE_FEE_BPS` of its bond, to the treasury.
    function challenge(uint256 poolId, bytes32 workKey, bytes32 evidenceHash, bytes calldata nodeSignature)
        external
    {
        bytes32 rk = _key(poolId, workKey);
        Record storage r = _open(poolId, rk, workKey, false);
        _checkSigned(poolId, workKey, r.provider, nodeSignature);
        (uint40 voteEnd, uint256 bond) = _challenge(poolId, workKey, rk, r);
        _takeBond(bond);
        emit WorkChallenged(poolId, workKey, msg.sender, r.provider, evidenceHash, voteEnd, bond);
    }

    /// @dev Opens the caller's challenge of `r` if it may: staked at least the pool's minimum, not the
    /// record's provider.
    function _challenge(uint256 poolId, bytes32 workKey, bytes32 rk, Record storage r)
        private
        returns (uint40 voteEnd, uint256 bond)
    {
        uint256 minStake = pools.poolTerms(poolId).minStake;
        if (registry.stakeOf(msg.sender) < (minStake == 0 ? 1 : minStake)) revert NotChallenger(msg.sender);
        address provider = r.provider;
        if (msg.sender == provider) revert OwnWork(workKey);
        PoolManager.DisputeTerms memory d = pools.disputeTerms(poolId);
        Dispute storage x = _begin(poolId, rk, DisputeKind.Challenge, true, _recordedAt(poolId, rk, r));
        r.status = RecordStatus.Disputed;
        _openVote(x, d);
        _openDisputes[provider] += 1;
        voteEnd = x.voteEnd;
        _lock(provider, voteEnd);
        bond = d.bond;
    }

    /// @notice Draws the committee of an appeal or a challenge, seeded by the hash of a block mined after
    /// the vote opened (nobody could know it then), from the pool's validators as they were when the
    /// dispute opened (`validators` and `since` must be that set: `validatorEntries` at the block of the
    /// accusation or challenge), leaving out the two parties and validators named after the record was
    /// recorded. If the seed block is too old for its hash (nobody drew within 256 blocks), every
    /// eligible validator sits: waiting never gives a party a second draw. Anyone.
    function drawCommittee(uint256 poolId, bytes32 workKey, address[] calldata validators, uint64[] calldata since)
        external
    {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        _voting(x, workKey);
        if (x.drawn) return;
        if (keccak256(abi.encode(validators, since)) != x.validatorSet) {
            revert WrongValidatorSet(workKey, x.validatorSet);
        }
        if (block.number <= x.drawBlock) return; // its hash is not known yet
        bytes32 h = blockhash(x.drawBlock);
        (address[] memory vs, uint256 n) = _candidates(x, validators, since, _records[rk].provider);
        uint256 k = pools.disputeTerms(poolId).committeeSize;
        if (k > n || h == bytes32(0)) k = n;
        address[] memory members = new address[](k);
        uint256 seed = uint256(keccak256(abi.encode(h, rk)));
        bytes32 ck = _committee(rk, x.round);
        for (uint256 i; i < k; ++i) {
            // Partial Fisher-Yates: pick from the candidates not yet picked (all of them when stale).
            uint256 j = h == bytes32(0) ? i : i + uint256(keccak256(abi.encode(seed, i))) % (n - i);
            (vs[i], vs[j]) = (vs[j], vs[i]);
            members[i] = vs[i];
            _jurors[ck][vs[i]] = 1;
        }
        x.size = uint8(k);
        x.drawn = true;
        emit CommitteeDrawn(poolId, workKey, members);
    }

    /// @notice A drawn committee member (or the pool's arbiter, unless it is a party) votes on an appeal
    /// or a challenge before the vote period ends: `uphold` keeps the invalidation, otherwise it is
    /// overturned. A majority of the committee decides at once; the arbiter's vote decides alone. The
    /// committee was fixed by its draw: what the owner does to the validator set afterwards changes
    /// nothing.
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
        bytes32 ck = _committee(rk, x.round);
        if (_jurors[ck][msg.sender] != 1) revert NotJuror(workKey, msg.sender);
        _jurors[ck][msg.sender] = 2;
        emit Voted(poolId, workKey, msg.sender, uphold);
        uint256 half = uint256(x.size) / 2;
        if (uphold) {
            if (++x.upheld > half) _resolve(poolId, workKey, rk, x, Verdict.Upheld);
        } else {
            if (++x.overturned > half) _resolve(poolId, workKey, rk, x, Verdict.Overturned);
        }
    }

    /// @notice Closes an appeal or a challenge whose vote period ended without a majority of the
    /// committee (a minority of it never decides): nobody is slashed, a lapsed appeal leaves the record
    /// revoked (the accused work is not paid without a decision for it) with both bonds back, a lapsed
    /// challenge leaves the record open again and costs the challenger `LAPSE_FEE_BPS` of its bond.
    /// Anyone.
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

    /// @notice A record's dispute (kind None when it has none).
    function getDispute(uint256 poolId, bytes32 workKey) external view returns (Dispute memory) {
        return _disputes[_key(poolId, workKey)];
    }

    /// @notice Whether `who` sits on the committee of the record's dispute (drawn, not yet voted: 1;
    /// voted: 2; else 0).
    function jurorState(uint256 poolId, bytes32 workKey, address who) external view returns (uint8) {
        bytes32 rk = _key(poolId, workKey);
        Dispute storage x = _disputes[rk];
        if (x.kind != DisputeKind.Appeal && x.kind != DisputeKind.Challenge) return 0;
        return _jurors[_committee(rk, x.round)][who];
    }

    /// @inheritdoc IStakeLock
    /// @dev While any dispute of the provider is open, for ever (until it is resolved).
    function lockedUntil(address provider) external view returns (uint64) {
        if (_openDisputes[provider] != 0) return type(uint64).max;
        return _lockedUntil[provider];
    }

    /// @notice Why work of `node` could not be recorded in `poolId` now: 0 it can, 1 it is not a
    /// member, 2 its provider's stake is below the pool's minimum or below the sum of the minimums of
    /// its pools (`PoolManager.stakeFloor`). (The budget is checked per batch.)
    function recordable(uint256 poolId, address node) external view returns (uint8) {
        PoolManager.Membership memory m = pools.membershipOf(node);
        if (poolId == 0 || m.poolId != poolId) return 1;
        uint256 need = pools.poolTerms(poolId).minStake;
        uint256 have = registry.stakeOf(m.provider);
        if (have < (need == 0 ? 1 : need) || have < pools.stakeFloor(m.provider)) return 2;
        return 0;
    }

    /// @notice The EIP-712 digest a node signs for its rollout file `workKey` in `poolId`.
    function rolloutDigest(uint256 poolId, bytes32 workKey) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(ROLLOUT_TYPEHASH, workKey, poolId)));
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

    /// @dev The record `rk` if it can be disputed now, before its deadline: pending (no dispute of it is
    /// open), or, for a validator's hard accusation (`hard`), held by a soft accusation, which then ends.
    /// That can only raise the outcome: a soft accuser holds no bond and no claim, a provider that
    /// appealed it gets its bond back, and the hard accusation ends at worst in a revoke (appealed,
    /// undecided) or as overturned on a file the committee found sound. (A challenge does not supersede:
    /// one that lapses would reopen the record without the soft accusation.) A dispute that did not
    /// stand leaves its record open again.
    function _open(uint256 poolId, bytes32 rk, bytes32 workKey, bool hard) private returns (Record storage r) {
        r = _records[rk];
        RecordStatus s = r.status;
        if (s == RecordStatus.None) revert UnknownWork(poolId, workKey);
        Dispute storage x = _disputes[rk];
        bool soft = s == RecordStatus.Disputed && !x.hard && hard;
        if (s != RecordStatus.Pending && !soft) revert AlreadySettled(workKey, s);
        if (block.timestamp >= r.deadline) revert DeadlinePassed(workKey, r.deadline, uint64(block.timestamp));
        if (!soft) return r;
        x.verdict = Verdict.Lapsed;
        address provider = r.provider;
        _openDisputes[provider] -= 1;
        r.status = RecordStatus.Pending;
        uint256 held = x.kind == DisputeKind.Appeal ? pools.disputeTerms(poolId).bond : 0;
        bondsHeld -= held;
        if (held != 0) token.safeTransfer(provider, held);
        emit DisputeResolved(poolId, workKey, Verdict.Lapsed, x.kind, x.accuser, provider, provider, held);
    }

    /// @dev When the record was recorded: its deadline less the pool's window, kept by its first dispute
    /// (a dispute that did not stand moves the deadline).
    function _recordedAt(uint256 poolId, bytes32 rk, Record storage r) private view returns (uint40) {
        Dispute storage x = _disputes[rk];
        if (x.openedAt != 0) return x.recordedAt;
        uint256 window = pools.poolTerms(poolId).validationWindow;
        return r.deadline > window ? uint40(r.deadline - window) : 0;
    }

    /// @dev Opens a dispute of `rk` by the caller, with the pool's validator set as it is now (its
    /// committee, if any, is drawn from it). Earlier disputes of the record live in events.
    function _begin(uint256 poolId, bytes32 rk, DisputeKind kind, bool hard, uint40 recordedAt)
        private
        returns (Dispute storage x)
    {
        x = _disputes[rk];
        _disputes[rk] = Dispute({
            accuser: msg.sender,
            appealEnd: 0,
            kind: kind,
            verdict: Verdict.Open,
            voteEnd: 0,
            drawBlock: 0,
            size: 0,
            upheld: 0,
            overturned: 0,
            drawn: false,
            hard: hard,
            openedAt: _at(block.timestamp),
            recordedAt: recordedAt,
            round: x.round,
            softCleared: x.softCleared,
            openedBlock: uint40(block.number),
            validatorSet: pools.validatorSetHash(poolId)
        });
    }

    /// @dev Opens the vote of an appeal or a challenge: its period, a new committee round, and the
    /// block (this one, whose hash nobody knows yet) whose hash will seed the committee.
    function _openVote(Dispute storage x, PoolManager.DisputeTerms memory d) private {
        x.voteEnd = _at(block.timestamp + d.votePeriod);
        x.drawBlock = uint64(block.number);
        x.round += 1;
    }

    /// @dev Ends a dispute: moves the record, the units, the stake and the bonds.
    function _resolve(uint256 poolId, bytes32 workKey, bytes32 rk, Dispute storage x, Verdict v) private {
        x.verdict = v;
        Record storage r = _records[rk];
        address provider = r.provider;
        address accuser = x.accuser;
        _openDisputes[provider] -= 1;
        uint256 bond = pools.disputeTerms(poolId).bond;
        // Bonds put up: the accuser's unless its accusation was soft, the provider's when it appealed.
        uint256 accuserBond = x.hard ? bond : 0;
        uint256 held = accuserBond + (x.kind == DisputeKind.Appeal ? bond : 0);
        bondsHeld -= held;
        address bondsTo;
        if (v == Verdict.Upheld) {
            // A soft accuser risked nothing, so it gains nothing: a lost soft appeal's bond goes to the treasury.
            bondsTo = x.hard ? accuser : registry.treasury();
            if (held != 0) token.safeTransfer(bondsTo, held);
            _revoke(poolId, workKey, r);
            if (x.hard) _slash(poolId, workKey, r, x);
        } else if (v == Verdict.Overturned) {
            bondsTo = provider;
            if (held != 0) token.safeTransfer(provider, held);
            _reopen(poolId, workKey, r, x);
        } else if (x.kind == DisputeKind.Appeal) {
            if (accuserBond != 0) token.safeTransfer(accuser, accuserBond);
            if (bond != 0) token.safeTransfer(provider, bond);
            _revoke(poolId, workKey, r); // not paid without a decision for it, not slashed
        } else {
            uint256 fee = held * LAPSE_FEE_BPS / 10_000;
            if (held - fee != 0) token.safeTransfer(accuser, held - fee);
            if (fee != 0) token.safeTransfer(registry.treasury(), fee);
            _reopen(poolId, workKey, r, x);
        }
        emit DisputeResolved(poolId, workKey, v, x.kind, accuser, provider, bondsTo, held);
    }

    /// @dev Slashes the provider of an upheld hard dispute. The bounty only for a verdict that was voted
    /// on: an unappealed accusation pays none (lying would pay whenever the victim cannot appeal).
    function _slash(uint256 poolId, bytes32 workKey, Record storage r, Dispute storage x) private {
        address accuser = x.accuser;
        address hunter = x.kind == DisputeKind.Accusation ? address(0) : accuser;
        (uint256 slashed, uint256 bounty) =
            registry.slash(r.provider, pools.poolTerms(poolId).slashAmount, hunter, workKey);
        emit WorkInvalidated(poolId, workKey, accuser, r.provider, r.units, bytes32(0), slashed, bounty);
    }

    /// @dev Revokes a record: its units leave the pool's pending total and its reserved reward goes to
    /// the treasury (a revoked reward never returns to the pool's budget).
    function _revoke(uint256 poolId, bytes32 workKey, Record storage r) private {
        r.status = RecordStatus.Invalidated;
        uint48 units = r.units;
        PoolAccount storage a = _accounts[poolId];
        a.pendingUnits -= units;
        a.invalidatedUnits += units;
        uint256 amount = uint256(units) * pools.poolTerms(poolId).rewardRate;
        if (amount == 0) return;
        a.budget -= uint128(amount); // reserved when recorded: budget >= pendingUnits * rate
        a.forfeitedTokens += uint128(amount);
        address treasury = registry.treasury();
        emit RewardForfeited(poolId, workKey, treasury, amount);
        token.safeTransfer(treasury, amount);
    }

    /// @dev A dispute that did not stand: the record is pending again. After a challenge (which held off
    /// the pool's validators) it is open to them and to other challengers for the time its window had
    /// left when the challenge opened; after an accusation (the validators' own turn) the deadline stays,
    /// and a record cleared of a soft accusation cannot be accused softly again.
    function _reopen(uint256 poolId, bytes32 workKey, Record storage r, Dispute storage x) private {
        r.status = RecordStatus.Pending;
        if (x.kind != DisputeKind.Challenge) {
            if (!x.hard) x.softCleared = true;
            return;
        }
        uint256 left = r.deadline > x.openedAt ? r.deadline - x.openedAt : 0;
        uint40 end = _at(block.timestamp + left);
        if (end <= r.deadline) return;
        r.deadline = end;
        _lock(r.provider, end);
        emit WorkReopened(poolId, workKey, end);
    }

    /// @dev Reverts unless `signature` is a node's EIP-712 `Rollout` signature over the work and the
    /// node is bound to `provider` (the registry keeps the binding while the provider's stake is locked).
    function _checkSigned(uint256 poolId, bytes32 workKey, address provider, bytes calldata signature)
        private
        view
    {
        address signer = ECDSA.recover(rolloutDigest(poolId, workKey), signature);
        if (registry.providerOf(signer) != provider) revert NotProvidersWork(workKey, signer, provider);
    }

    /// @dev Who may sit on `x`'s committee, first `n` of `vs`: the validators of its set but the two
    /// parties and those named after the record was recorded.
    function _candidates(Dispute storage x, address[] calldata validators, uint64[] calldata since, address provider)
        private
        view
        returns (address[] memory vs, uint256 n)
    {
        vs = validators;
        address accuser = x.accuser;
        uint40 recordedAt = x.recordedAt;
        for (uint256 i; i < vs.length; ++i) {
            if (vs[i] != accuser && vs[i] != provider && since[i] <= recordedAt) vs[n++] = vs[i];
        }
    }

    /// @dev Reverts unless `x` is an open appeal or challenge.
    function _voting(Dispute storage x, bytes32 workKey) private view {
        if ((x.kind != DisputeKind.Appeal && x.kind != DisputeKind.Challenge) || x.verdict != Verdict.Open) {
            revert NotDisputed(workKey, x.kind);
        }
    }

    /// @dev The key of one committee: a record's, in its `round`-th vote.
    function _committee(bytes32 rk, uint16 round) private pure returns (bytes32) {
        return keccak256(abi.encode(rk, round));
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
