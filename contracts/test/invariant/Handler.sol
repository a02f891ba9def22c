// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {TestBase} from "../utils/Test.sol";
import {IntellectToken} from "../../src/IntellectToken.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {PoolManager} from "../../src/PoolManager.sol";
import {WorkLedger} from "../../src/WorkLedger.sol";

/// @notice Drives random sequences of protocol actions through several actors and keeps an
/// independent model (ghost state) of what every call should do. Every call goes through try/catch:
/// a success the model did not expect, or a failure it did not expect, is counted in
/// `outcomeMismatches`; safety violations have their own counters, which the invariants require to
/// stay zero. Disputes follow the rules of issue 38: soft and hard accusations both wait out an
/// appeal period, one dispute of a record at a time (but a validator's hard accusation supersedes
/// an open soft dispute, which ends Lapsed with the appeal bond back), a dispute that does not stand
/// reopens its record (so records are disputed again), with the time it had left only after a
/// challenge, a record cleared of a soft accusation is never softly accused again, a minority of a
/// committee never decides (no majority by the vote's end: lapsed), an upheld soft appeal's bond and
/// every revoked reward go to the treasury, committees come from the validator set as it was when the
/// dispute opened (the owner changes the set meanwhile), and a slash needs the node's signature over
/// the work.
contract Handler is TestBase {
    struct Setup {
        IntellectToken token;
        ProviderRegistry registry;
        PoolManager pools;
        WorkLedger ledger;
        address admin;
        address treasury;
        address validator;
        address poolOwner;
        address funder;
        address outsider;
        address[] providers;
        uint256[2] poolIds;
        uint256[2] coordPks;
        address[] validators;
    }

    /// @dev Ghost of one work record, keyed by keccak256(poolId, workKey), and of its latest dispute.
    struct Rec {
        uint256 poolId;
        bytes32 workKey;
        address provider;
        address node;
        uint256 recordedAt;
        uint256 deadline;
        uint48 units;
        WorkLedger.RecordStatus status;
        uint8 recordings;
        uint8 claims;
        uint8 invalidations;
        uint8 disputes;
        WorkLedger.DisputeKind dkind;
        WorkLedger.Verdict verdict;
        bool hard;
        address accuser;
        uint256 openedAt;
        uint256 openedBlock;
        uint256 appealEnd;
        uint256 voteEnd;
        uint256 drawBlock;
        uint32 round;
        bool drawn;
        uint8 size;
        uint8 up;
        uint8 down;
        /// @dev A soft accusation of it was overturned: no other soft one (the ledger's `softCleared`).
        bool softCleared;
    }

    /// @dev What a verdict should move: the expected slash and the balances before it.
    struct Slash {
        uint256 fromUnbonding;
        uint256 fromStaked;
        uint256 bounty;
        uint256 treasuryBefore;
        uint256 accBefore;
        uint256 provBefore;
    }

    uint256 internal constant N_NODES = 12;
    uint256 internal constant NODE_PK_BASE = 0xA000;
    /// @dev A key bound to nobody, to forge rollout signatures with.
    uint256 internal constant FORGER_PK = 0xF0F0;

    IntellectToken public token;
    ProviderRegistry public registry;
    PoolManager public pools;
    WorkLedger public ledger;
    address public admin;
    address public treasury;
    address public validator;
    address public poolOwner;
    address public funder;
    address public outsider;
    address[] public providers;
    uint256[2] public poolIds;
    uint256[2] internal coordPks;
    address[2] public coords;
    /// @dev Everyone the owner may name a validator of either pool (VALIDATOR and the jurors first).
    address[] public validators;

    // ------------------------------------------------------------------ ghost: clock and parameters
    uint256 public time;
    uint256 internal nonceCounter;
    uint256 internal keyCounter;
    uint16 public bountyBps;
    uint256 public maxBounty;

    // ------------------------------------------------------------------ ghost: stake model
    mapping(address => bool) public gRegistered;
    mapping(address => uint256) public gDeposited;
    mapping(address => uint256) public gStaked;
    mapping(address => uint256) public gUnbonding;
    mapping(address => uint256) public gUnbondingEnd;
    mapping(address => uint256) public gWithdrawn;
    mapping(address => uint256) public gSlashed;
    mapping(address => uint256) public gComputeUnits;
    uint256 public gTotalSlashed;
    uint256 public gTotalBounty;

    // ------------------------------------------------------------------ ghost: nodes and membership
    mapping(address => address) public gNodeProvider;
    mapping(address => uint64) public gNodeUnits;
    mapping(address => uint256) public gPoolOf;
    mapping(uint256 => mapping(address => bool)) public gBlacklisted;
    mapping(address => uint256) public gMemberships;
    /// @dev The provider's stake floor: the sum of the minimums of the distinct pools it is in.
    mapping(address => uint256) public gFloor;
    mapping(address => mapping(uint256 => uint256)) public gNodesIn;
    mapping(address => uint256) public gLockedUntil;
    mapping(address => uint256) public gOpenDisputes;

    // ------------------------------------------------------------------ ghost: validators
    mapping(uint256 => mapping(address => uint256)) public gSince;
    mapping(uint256 => uint256) public gValidatorCount;

    // ------------------------------------------------------------------ ghost: ledger
    bytes32[] internal recIds;
    mapping(bytes32 => Rec) internal recs;
    /// @dev The validator set (and naming times) each record's latest dispute opened under.
    mapping(bytes32 => address[]) internal snapVs;
    mapping(bytes32 => uint64[]) internal snapSince;
    mapping(uint256 => uint256) public gFunded;
    mapping(uint256 => uint256) public gSurplusWithdrawn;
    mapping(uint256 => uint256) public gClaimedTokens;
    mapping(uint256 => uint256) public gForfeited;
    mapping(uint256 => uint256) public gRecordedUnits;
    mapping(uint256 => uint256) public gPendingUnits;
    mapping(uint256 => uint256) public gInvalidatedUnits;
    mapping(uint256 => uint256) public gClaimedUnits;
    uint256 public gTotalForfeited;
    uint256 public gLapseFees;
    /// @dev Appeal bonds of upheld soft disputes, paid to the treasury (a soft accuser risked nothing).
    uint256 public gBondsToTreasury;

    // ------------------------------------------------------------------ violations (must stay 0)
    uint256 public claimsBeforeDeadline;
    uint256 public claimsWhileDisputed;
    uint256 public invalidationsAtOrAfterDeadline;
    uint256 public unauthorizedSuccesses;
    uint256 public unexpectedRoleReverts;
    uint256 public outcomeMismatches;
    uint256 public paymentMismatches;
    uint256 public recordsUnderStaked;
    uint256 public withdrawalsWhileLocked;
    uint256 public slashesBeforeAppealEnd;
    uint256 public partiesOnCommittee;
    uint256 public committeeMismatches;
    uint256 public ineligibleJurors;

    // ------------------------------------------------------------------ ghost: disputes
    uint256 public gBondsIn;
    uint256 public gBondsPaid;
    string public lastMismatch;

    // ------------------------------------------------------------------ coverage
    mapping(bytes32 => uint256) public successes;
    uint256 public unauthorizedAttempts;

    constructor(Setup memory s) {
        token = s.token;
        registry = s.registry;
        pools = s.pools;
        ledger = s.ledger;
        admin = s.admin;
        treasury = s.treasury;
        validator = s.validator;
        poolOwner = s.poolOwner;
        funder = s.funder;
        outsider = s.outsider;
        providers = s.providers;
        poolIds = s.poolIds;
        coordPks = s.coordPks;
        coords[0] = vm.addr(s.coordPks[0]);
        coords[1] = vm.addr(s.coordPks[1]);
        time = block.timestamp;
        bountyBps = registry.bountyBps();
        maxBounty = registry.maxBounty();
        validators = s.validators;
        for (uint256 i; i < 2; ++i) {
            (address[] memory vs, uint64[] memory since) = pools.validatorEntries(s.poolIds[i]);
            for (uint256 j; j < vs.length; ++j) {
                gSince[s.poolIds[i]][vs[j]] = since[j];
            }
            gValidatorCount[s.poolIds[i]] = vs.length;
        }
    }

    modifier synced() {
        vm.warp(time);
        _;
    }

    // ------------------------------------------------------------------ helpers

    function _actor(uint256 seed) internal view returns (address) {
        return providers[seed % providers.length];
    }

    function _nodePk(uint256 seed) internal pure returns (uint256) {
        return NODE_PK_BASE + (seed % N_NODES);
    }

    function _check(bool expected, bool ok, string memory what) internal {
        if (expected != ok) {
            outcomeMismatches++;
            lastMismatch = what;
        }
        if (ok) successes[keccak256(bytes(what))]++;
    }

    function _hit(string memory what) internal {
        successes[keccak256(bytes(what))]++;
    }

    function _sign(uint256 pk, bytes32 digest) internal pure returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(pk, digest);
        return abi.encodePacked(r, s, v);
    }

    function _budget(uint256 poolId) internal view returns (uint256) {
        return gFunded[poolId] - gSurplusWithdrawn[poolId] - gClaimedTokens[poolId] - gForfeited[poolId];
    }

    function _rate(uint256 poolId) internal view returns (uint256) {
        return pools.poolTerms(poolId).rewardRate;
    }

    function _pickRec(uint256 seed) internal view returns (bytes32 id, bool found) {
        if (recIds.length == 0) return (bytes32(0), false);
        uint256 start = seed % recIds.length;
        if (_guided(seed)) {
            for (uint256 j; j < recIds.length; ++j) {
                bytes32 cand = recIds[(start + j) % recIds.length];
                if (recs[cand].status == WorkLedger.RecordStatus.Pending) return (cand, true);
            }
        }
        return (recIds[start], true);
    }

    /// @dev Like `_pickRec`, but when guided a record still open to the dispute (before its deadline,
    /// pending or, for a `hard` one, held by an open soft dispute it would supersede). Half the guided
    /// hard picks look for a soft dispute to supersede first; one guided soft pick in eight looks for
    /// a record cleared of soft accusations first (which must refuse it).
    function _pickOpen(uint256 seed, bool hard) internal view returns (bytes32 id, bool found) {
        if (recIds.length == 0) return (bytes32(0), false);
        uint256 start = seed % recIds.length;
        if (_guided(seed)) {
            uint256 prefer = (seed >> 130) % 8;
            if ((hard && prefer < 4) || (!hard && prefer == 0)) {
                for (uint256 j; j < recIds.length; ++j) {
                    bytes32 cand = recIds[(start + j) % recIds.length];
                    Rec storage r = recs[cand];
                    if (time >= r.deadline) continue;
                    if (hard ? _softOpen(r) : r.softCleared && r.status == WorkLedger.RecordStatus.Pending) {
                        return (cand, true);
                    }
                }
            }
            for (uint256 j; j < recIds.length; ++j) {
                bytes32 cand = recIds[(start + j) % recIds.length];
                Rec storage r = recs[cand];
                if (time >= r.deadline) continue;
                if (r.status == WorkLedger.RecordStatus.Pending || (hard && _softOpen(r))) return (cand, true);
            }
        }
        return (recIds[start], true);
    }

    /// @dev Whether `r` is held by an open soft dispute (an accusation or its appeal), which a hard
    /// dispute before the deadline supersedes.
    function _softOpen(Rec storage r) internal view returns (bool) {
        return r.status == WorkLedger.RecordStatus.Disputed && !r.hard && r.verdict == WorkLedger.Verdict.Open;
    }

    /// @dev Three calls in four (by the seed's high bits, so small hand-written seeds are never
    /// guided) pick a target the model says the action can succeed on; the rest take the seed as is,
    /// which exercises the failure paths.
    function _guided(uint256 seed) internal pure returns (bool) {
        return (seed >> 128) % 4 != 0;
    }

    uint8 internal constant UNBOUND = 0;
    uint8 internal constant IDLE = 1;
    uint8 internal constant MEMBER = 2;

    /// @dev The node key for `seed`; when guided, the first node from there in the wanted state.
    function _pickNode(uint256 seed, uint8 kind, uint256 poolId) internal view returns (uint256) {
        uint256 start = seed % N_NODES;
        if (_guided(seed)) {
            for (uint256 j; j < N_NODES; ++j) {
                uint256 pk = NODE_PK_BASE + (start + j) % N_NODES;
                address a = vm.addr(pk);
                bool hit;
                if (kind == UNBOUND) hit = gNodeProvider[a] == address(0);
                else if (kind == IDLE) hit = gNodeProvider[a] != address(0) && gPoolOf[a] == 0;
                else hit = gPoolOf[a] != 0 && (poolId == 0 || gPoolOf[a] == poolId);
                if (hit) return pk;
            }
        }
        return NODE_PK_BASE + start;
    }

    /// @dev The actor for `seed`; when guided, the first one from there that is (or is not) registered.
    function _pickActor(uint256 seed, bool registered) internal view returns (address) {
        uint256 start = seed % providers.length;
        if (_guided(seed)) {
            for (uint256 j; j < providers.length; ++j) {
                address a = providers[(start + j) % providers.length];
                if (gRegistered[a] == registered) return a;
            }
        }
        return providers[start];
    }

    /// @dev A validator candidate for `seed`; when guided, the first one from there that may accuse `r`
    /// (named in its pool at or before it was recorded).
    function _pickAccuser(uint256 seed, Rec storage r) internal view returns (address) {
        uint256 start = seed % validators.length;
        if (_guided(seed)) {
            for (uint256 j; j < validators.length; ++j) {
                address a = validators[(start + j) % validators.length];
                uint256 since = gSince[r.poolId][a];
                if (since != 0 && since <= r.recordedAt) return a;
            }
        }
        return validators[start];
    }

    /// @dev A rollout signature for `r`: usually its node's; one time in eight (by `seed`) a node key
    /// taken from the seed (perhaps another provider's), a key bound to nobody, or none at all.
    /// `good`: the model's view of whether the ledger accepts it (a node bound to r's provider).
    function _rolloutSig(Rec storage r, uint256 seed) internal view returns (bytes memory sig, bool good) {
        bytes32 digest = ledger.rolloutDigest(r.poolId, r.workKey);
        uint256 mode = seed % 32;
        if (mode >= 4) return (_sign(NODE_PK_BASE + _pkIndex(r.node), digest), gNodeProvider[r.node] == r.provider);
        if (mode == 0) return ("", false);
        if (mode == 1) return (_sign(FORGER_PK, digest), false);
        uint256 other = _nodePk(seed / 32);
        return (_sign(other, digest), gNodeProvider[vm.addr(other)] == r.provider);
    }

    function _pkIndex(address node) internal pure returns (uint256) {
        for (uint256 i; i < N_NODES; ++i) {
            if (vm.addr(NODE_PK_BASE + i) == node) return i;
        }
        revert("unknown node");
    }

    // ------------------------------------------------------------------ providers

    function register(uint256 actorSeed, uint256 amount) external synced {
        address p = _pickActor(actorSeed, false);
        amount = bound(amount, 0, 1_000e18);
        bool expected = !gRegistered[p] && amount != 0 && amount >= registry.minProviderStake();
        vm.prank(p);
        try registry.registerProvider(amount) {
            _check(expected, true, "register");
            gRegistered[p] = true;
            gDeposited[p] += amount;
            gStaked[p] += amount;
        } catch {
            _check(expected, false, "register");
        }
    }

    function stake(uint256 actorSeed, uint256 amount) external synced {
        address p = _pickActor(actorSeed, true);
        amount = bound(amount, 0, 500e18);
        bool expected = gRegistered[p] && amount != 0;
        vm.prank(p);
        try registry.stake(amount) {
            _check(expected, true, "stake");
            gDeposited[p] += amount;
            gStaked[p] += amount;
        } catch {
            _check(expected, false, "stake");
        }
    }

    function unstake(uint256 actorSeed, uint256 amount) external synced {
        address p = _pickActor(actorSeed, true);
        amount = bound(amount, 0, gStaked[p] + 10e18);
        uint256 need = gComputeUnits[p] * registry.stakePerComputeUnit();
        if (gFloor[p] > need) need = gFloor[p];
        bool expected = gRegistered[p] && amount != 0 && amount <= gStaked[p] && gStaked[p] - amount >= need;
        vm.prank(p);
        try registry.unstake(amount) {
            _check(expected, true, "unstake");
            gStaked[p] -= amount;
            gUnbonding[p] += amount;
            gUnbondingEnd[p] = time + registry.unbondingPeriod();
        } catch {
            _check(expected, false, "unstake");
        }
    }

    function withdraw(uint256 actorSeed) external synced {
        address p = _pickActor(actorSeed, true);
        bool expected = gRegistered[p] && gUnbonding[p] != 0 && time >= gUnbondingEnd[p] && time >= gLockedUntil[p]
            && gOpenDisputes[p] == 0;
        uint256 before = token.balanceOf(p);
        vm.prank(p);
        try registry.withdraw() {
            _check(expected, true, "withdraw");
            if (_hasOpenRecord(p)) withdrawalsWhileLocked++;
            if (token.balanceOf(p) - before != gUnbonding[p]) paymentMismatches++;
            gWithdrawn[p] += gUnbonding[p];
            gUnbonding[p] = 0;
        } catch {
            _check(expected, false, "withdraw");
        }
    }

    // ------------------------------------------------------------------ nodes

    function addNode(uint256 actorSeed, uint256 nodeSeed, uint64 cu) external synced {
        address p = _pickActor(actorSeed, true);
        uint256 pk = _pickNode(nodeSeed, UNBOUND, 0);
        address node = vm.addr(pk);
        cu = uint64(bound(cu, 1, 3));
        bytes memory sig = _sign(pk, registry.nodeBindingDigest(p, node));
        bool expected = gRegistered[p] && gNodeProvider[node] == address(0)
            && (gComputeUnits[p] + cu) * registry.stakePerComputeUnit() <= gStaked[p];
        vm.prank(p);
        try registry.addNode(node, cu, sig) {
            _check(expected, true, "addNode");
            gNodeProvider[node] = p;
            gNodeUnits[node] = cu;
            gComputeUnits[p] += cu;
        } catch {
            _check(expected, false, "addNode");
        }
    }

    /// @dev Unbinding a node: only out of every pool, and not while its provider's stake is locked (a
    /// slash needs the signature of a node still bound to the provider).
    function removeNode(uint256 nodeSeed) external synced {
        address node = vm.addr(_pickNode(nodeSeed, IDLE, 0));
        address p = gNodeProvider[node];
        address caller = p == address(0) ? _actor(nodeSeed) : p;
        bool expected = p != address(0) && gPoolOf[node] == 0 && time >= gLockedUntil[p] && gOpenDisputes[p] == 0;
        vm.prank(caller);
        try registry.removeNode(node) {
            _check(expected, true, "removeNode");
            if (_hasOpenRecord(p)) withdrawalsWhileLocked++;
            gComputeUnits[p] -= gNodeUnits[node];
            gNodeProvider[node] = address(0);
            gNodeUnits[node] = 0;
        } catch {
            _check(expected, false, "removeNode");
        }
    }

    // ------------------------------------------------------------------ membership

    /// @dev A join needs the stake to cover the provider's floor plus this pool's minimum (when it is
    /// the provider's first node there).
    function joinPool(uint256 nodeSeed, uint256 poolSeed) external synced {
        uint256 pk = _pickNode(nodeSeed, IDLE, 0);
        address node = vm.addr(pk);
        uint256 i = poolSeed % 2;
        uint256 poolId = poolIds[i];
        address p = gNodeProvider[node];
        address caller = p == address(0) ? _actor(nodeSeed) : p;
        uint256 nonce = ++nonceCounter;
        uint64 expiry = uint64(time + 1 hours);
        bytes memory sig = _sign(coordPks[i], pools.inviteDigest(poolId, node, nonce, expiry));
        uint256 min = pools.getPool(poolId).minStake;
        uint256 need = gNodesIn[p][poolId] == 0 ? gFloor[p] + min : gFloor[p];
        bool expected =
            p != address(0) && gPoolOf[node] == 0 && !gBlacklisted[poolId][node] && gStaked[p] >= need;
        vm.prank(caller);
        try pools.joinPool(poolId, node, nonce, expiry, sig) {
            _check(expected, true, "joinPool");
            gPoolOf[node] = poolId;
            gMemberships[p]++;
            if (gNodesIn[p][poolId]++ == 0) gFloor[p] += min;
            if (gNodesIn[p][poolId] > 1) _hit("joinPoolAgain");
        } catch {
            _check(expected, false, "joinPool");
        }
    }

    function leavePool(uint256 nodeSeed, uint256 poolSeed) external synced {
        address node = vm.addr(_pickNode(nodeSeed, MEMBER, 0));
        address p = gNodeProvider[node];
        address caller = p == address(0) ? _actor(nodeSeed) : p;
        uint256 poolId = gPoolOf[node] != 0 ? gPoolOf[node] : poolIds[poolSeed % 2];
        bool expected = p != address(0) && gPoolOf[node] == poolId;
        vm.prank(caller);
        try pools.leavePool(poolId, node) {
            _check(expected, true, "leavePool");
            _left(node);
        } catch {
            _check(expected, false, "leavePool");
        }
    }

    function ejectNode(uint256 nodeSeed, uint256 poolSeed) external synced {
        uint256 i = poolSeed % 2;
        uint256 poolId = poolIds[i];
        address node = vm.addr(_pickNode(nodeSeed, MEMBER, poolId));
        bool expected = gPoolOf[node] == poolId;
        vm.prank(coords[i]);
        try pools.ejectNode(poolId, node) {
            _check(expected, true, "ejectNode");
            _left(node);
        } catch {
            _check(expected, false, "ejectNode");
        }
    }

    function blacklistNode(uint256 nodeSeed, uint256 poolSeed) external synced {
        // Rare: a blacklisted node never comes back to that pool.
        if (nodeSeed % 4 != 0) return;
        address node = vm.addr(_nodePk(nodeSeed / 4));
        uint256 i = poolSeed % 2;
        uint256 poolId = poolIds[i];
        vm.prank(poolSeed % 3 == 0 ? poolOwner : coords[i]);
        try pools.blacklistNode(poolId, node) {
            _check(true, true, "blacklistNode");
            gBlacklisted[poolId][node] = true;
            if (gPoolOf[node] == poolId) _left(node);
        } catch {
            _check(true, false, "blacklistNode");
        }
    }

    /// @dev The model of a membership ending: the pool's minimum leaves the provider's floor with its
    /// last node in that pool.
    function _left(address node) internal {
        uint256 poolId = gPoolOf[node];
        gPoolOf[node] = 0;
        address p = gNodeProvider[node];
        gMemberships[p]--;
        if (--gNodesIn[p][poolId] == 0) {
            uint256 min = pools.getPool(poolId).minStake;
            gFloor[p] = min >= gFloor[p] ? 0 : gFloor[p] - min;
        }
    }

    /// @dev Whether `p` has a record that can still be invalidated (its stake must not leave).
    function _hasOpenRecord(address p) internal view returns (bool) {
        for (uint256 i; i < recIds.length; ++i) {
            Rec storage r = recs[recIds[i]];
            if (r.provider != p) continue;
            if (r.status == WorkLedger.RecordStatus.Disputed) return true;
            if (r.status == WorkLedger.RecordStatus.Pending && time < r.deadline) return true;
        }
        return false;
    }

    // ------------------------------------------------------------------ validators

    /// @dev The owner names a validator of a pool (it may act on work recorded from now on only).
    function addValidator(uint256 poolSeed, uint256 vSeed) external synced {
        uint256 poolId = poolIds[poolSeed % 2];
        address v = validators[vSeed % validators.length];
        if (_guided(vSeed)) {
            for (uint256 j; j < validators.length; ++j) {
                address cand = validators[(vSeed % validators.length + j) % validators.length];
                if (gSince[poolId][cand] == 0) {
                    v = cand;
                    break;
                }
            }
        }
        bool expected = gSince[poolId][v] == 0;
        vm.prank(poolOwner);
        try pools.addValidator(poolId, v) {
            _check(expected, true, "addValidator");
            gSince[poolId][v] = time;
            gValidatorCount[poolId]++;
        } catch {
            _check(expected, false, "addValidator");
        }
    }

    /// @dev The owner removes a validator (one in four calls only, so the sets do not run dry).
    function removeValidator(uint256 poolSeed, uint256 vSeed) external synced {
        if (poolSeed % 4 != 0) return;
        uint256 poolId = poolIds[(poolSeed / 4) % 2];
        address v = validators[vSeed % validators.length];
        if (_guided(vSeed)) {
            for (uint256 j; j < validators.length; ++j) {
                address cand = validators[(vSeed % validators.length + j) % validators.length];
                if (gSince[poolId][cand] != 0) {
                    v = cand;
                    break;
                }
            }
        }
        bool expected = gSince[poolId][v] != 0;
        vm.prank(poolOwner);
        try pools.removeValidator(poolId, v) {
            _check(expected, true, "removeValidator");
            gSince[poolId][v] = 0;
            gValidatorCount[poolId]--;
        } catch {
            _check(expected, false, "removeValidator");
        }
    }

    // ------------------------------------------------------------------ ledger

    function recordWork(uint256 poolSeed, uint256 nodeSeed, uint256 count, uint256 unitsSeed) external synced {
        uint256 i = poolSeed % 2;
        uint256 poolId = poolIds[i];
        count = bound(count, 1, 4);
        nodeSeed %= N_NODES;
        unitsSeed %= 1e9;
        WorkLedger.WorkInput[] memory tmp = new WorkLedger.WorkInput[](count);
        uint256 n;
        for (uint256 j; j < N_NODES && n < count; ++j) {
            address node = vm.addr(_nodePk(nodeSeed + j));
            if (gPoolOf[node] != poolId) continue;
            bytes32 workKey = _freshKey(poolId, unitsSeed + j, tmp, n);
            uint48 units = uint48(bound(uint256(keccak256(abi.encode(unitsSeed, j))), 1, 1_000_000));
            tmp[n++] = WorkLedger.WorkInput(node, workKey, units, uint32(j), keccak256(abi.encode(workKey)));
        }
        if (n == 0) return;
        WorkLedger.WorkInput[] memory batch = new WorkLedger.WorkInput[](n);
        for (uint256 j; j < n; ++j) {
            batch[j] = tmp[j];
        }
        vm.prank(coords[i]);
        try ledger.recordWork(poolId, batch) {
            _check(_recordable(poolId, batch), true, "recordWork");
            _recorded(poolId, batch);
        } catch {
            _check(_recordable(poolId, batch), false, "recordWork");
        }
    }

    /// @dev The model's view of a batch: refused when a provider stakes less than the pool's minimum
    /// (at least 1) or its floor, or when the budget cannot reserve it.
    function _recordable(uint256 poolId, WorkLedger.WorkInput[] memory batch) internal view returns (bool) {
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        uint256 need = t.minStake == 0 ? 1 : t.minStake;
        uint256 total;
        for (uint256 j; j < batch.length; ++j) {
            address p = gNodeProvider[batch[j].node];
            if (gStaked[p] < need || gStaked[p] < gFloor[p]) return false;
            total += batch[j].units;
        }
        return (gPendingUnits[poolId] + total) * t.rewardRate <= _budget(poolId);
    }

    function _recorded(uint256 poolId, WorkLedger.WorkInput[] memory batch) internal {
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        uint256 deadline = time + t.validationWindow;
        for (uint256 j; j < batch.length; ++j) {
            address prov = gNodeProvider[batch[j].node];
            uint256 have = registry.stakeOf(prov);
            if (have < (t.minStake == 0 ? 1 : t.minStake) || have < pools.stakeFloor(prov)) recordsUnderStaked++;
            if (deadline > gLockedUntil[prov]) gLockedUntil[prov] = deadline;
            bytes32 id = keccak256(abi.encode(poolId, batch[j].workKey));
            Rec storage r = recs[id];
            if (r.recordings == 0) recIds.push(id);
            r.recordings++;
            r.poolId = poolId;
            r.workKey = batch[j].workKey;
            r.provider = prov;
            r.node = batch[j].node;
            r.recordedAt = time;
            r.deadline = deadline;
            r.units = batch[j].units;
            r.status = WorkLedger.RecordStatus.Pending;
            gRecordedUnits[poolId] += batch[j].units;
            gPendingUnits[poolId] += batch[j].units;
        }
    }

    /// @dev A key not yet recorded in `poolId` nor among the first `n` entries of the batch being built:
    /// usually new, sometimes one already used in the other pool (keys are per pool, so that must be
    /// accepted).
    function _freshKey(uint256 poolId, uint256 seed, WorkLedger.WorkInput[] memory batch, uint256 n)
        internal
        returns (bytes32)
    {
        if (seed % 3 == 0 && recIds.length != 0) {
            Rec storage other = recs[recIds[seed % recIds.length]];
            bool inBatch;
            for (uint256 j; j < n; ++j) {
                if (batch[j].workKey == other.workKey) inBatch = true;
            }
            if (
                !inBatch && other.poolId != poolId
                    && recs[keccak256(abi.encode(poolId, other.workKey))].recordings == 0
            ) return other.workKey;
        }
        return keccak256(abi.encode("key", ++keyCounter));
    }

    /// @dev Re-records an existing key in its pool: must always be refused.
    function recordDuplicate(uint256 recSeed, uint256 nodeSeed) external synced {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        uint256 i = r.poolId == poolIds[0] ? 0 : 1;
        nodeSeed %= N_NODES;
        address node;
        for (uint256 j; j < N_NODES; ++j) {
            address cand = vm.addr(_nodePk(nodeSeed + j));
            if (gPoolOf[cand] == r.poolId) {
                node = cand;
                break;
            }
        }
        if (node == address(0)) return;
        WorkLedger.WorkInput[] memory batch = new WorkLedger.WorkInput[](1);
        batch[0] = WorkLedger.WorkInput(node, r.workKey, 1, 0, bytes32(0));
        vm.prank(coords[i]);
        try ledger.recordWork(r.poolId, batch) {
            _check(false, true, "recordDuplicate");
            r.recordings++;
        } catch {
            _check(false, false, "recordDuplicate");
        }
    }

    // ------------------------------------------------------------------ disputes

    /// @dev A validator (or someone who is not one) accuses a record: soft or hard by the evidence,
    /// with the node's signature or a forged one by `sigSeed`.
    function invalidateWork(uint256 recSeed, uint256 accuserSeed, bytes32 evidence, uint256 sigSeed)
        external
        synced
    {
        (bytes32 id, bool found) = _pickOpen(recSeed, uint256(evidence) % 4 != 0);
        if (found) _invalidate(id, accuserSeed, evidence, sigSeed);
    }

    /// @dev A validator softly accuses a record (when guided, one open to it, now and then one cleared
    /// of soft accusations, which must refuse it); by `mode`, its provider appeals at once (1 to 3) and
    /// two jurors vote on the appeal at once, both to overturn (2) or both to uphold (3). Soft
    /// disputes are a quarter of `invalidateWork`'s, and a vote decided in time is rare in a random
    /// walk; this feeds the paths that start from one: a hard accusation or a challenge superseding
    /// it (with or without an appeal bond to return), an upheld soft appeal (its bond to the
    /// treasury), an overturned one (the record cleared of soft accusations) and the refusal of the
    /// next soft accusation. Every call goes through the same model as the single actions.
    function softDispute(uint256 recSeed, uint256 accuserSeed, uint8 mode) external synced {
        (bytes32 id, bool found) = _pickOpen(recSeed, false);
        if (!found) return;
        _invalidate(id, accuserSeed, bytes32(0), 4);
        Rec storage r = recs[id];
        mode %= 4;
        if (mode == 0 || !_softOpen(r) || r.dkind != WorkLedger.DisputeKind.Accusation) return;
        _appeal(id);
        if (mode == 1 || !_voteOpen(r)) return;
        uint256 g = (uint256(1) << 128) | accuserSeed % 1024; // guided: a drawn juror
        _vote(id, g, mode == 3);
        _vote(id, g + 1, mode == 3);
    }

    /// @dev Moves the clock to one second before, at, or one second after a record's deadline (if
    /// that is not in the past), then tries both to invalidate and to claim it, in either order.
    function settleAtDeadline(uint256 recSeed, uint256 delta, bool claimFirst) external {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (!found) return;
        uint256 target = recs[id].deadline + (delta % 3) - 1;
        if (target > time) time = target;
        vm.warp(time);
        uint256 g = (uint256(1) << 128) + delta % 1024; // guided accuser, the node's own signature
        if (claimFirst) {
            _claimRec(id);
            _invalidate(id, g, bytes32(delta), 4);
        } else {
            _invalidate(id, g, bytes32(delta), 4);
            _claimRec(id);
        }
    }

    function _invalidate(bytes32 id, uint256 accuserSeed, bytes32 evidence, uint256 sigSeed) internal {
        Rec storage r = recs[id];
        address accuser = _pickAccuser(accuserSeed, r);
        bool hard = uint256(evidence) % 4 != 0;
        (bytes memory sig, bool good) = _rolloutSig(r, sigSeed);
        bool allowed = _mayAccuse(r, accuser, hard) && (good || !hard);
        bool expected = allowed && (hard || !r.softCleared);
        bool supersedes = hard && _softOpen(r);
        uint256 provBefore = token.balanceOf(r.provider);
        vm.prank(accuser);
        try ledger.invalidateWork(r.poolId, r.workKey, evidence, hard, hard ? sig : bytes("")) {
            _check(expected, true, hard ? "accuse" : "softInvalidate");
            if (supersedes) _superseded(r, provBefore);
            _accused(id, hard, accuser);
        } catch {
            _check(expected, false, hard ? "accuse" : "softInvalidate");
            if (allowed && !expected) _hit("softClearedRefused");
        }
    }

    /// @dev Whether `accuser` may accuse `r` now (signature and the soft mark aside): before the
    /// deadline, one of the pool's validators named at or before the record was recorded, not its
    /// provider, the record pending or (`hard`) held by an open soft dispute.
    function _mayAccuse(Rec storage r, address accuser, bool hard) internal view returns (bool) {
        uint256 since = gSince[r.poolId][accuser];
        return (r.status == WorkLedger.RecordStatus.Pending || (hard && _softOpen(r))) && time < r.deadline
            && since != 0 && since <= r.recordedAt && accuser != r.provider;
    }

    /// @dev The model of an accusation the ledger accepted.
    function _accused(bytes32 id, bool hard, address accuser) internal {
        Rec storage r = recs[id];
        if (time >= r.deadline) invalidationsAtOrAfterDeadline++;
        PoolManager.DisputeTerms memory d = pools.disputeTerms(r.poolId);
        _opened(id, WorkLedger.DisputeKind.Accusation, hard, accuser);
        r.appealEnd = time + d.appealPeriod;
        r.voteEnd = 0;
        if (hard) gBondsIn += d.bond;
        _lockUntil(r.provider, r.appealEnd + d.votePeriod);
    }

    /// @dev The model of a hard dispute superseding `r`'s open soft one (called after the call that
    /// did it, with the provider's balance before): the soft one ends Lapsed, the provider's appeal
    /// bond (if it appealed) goes back to it, and its open-dispute count drops.
    function _superseded(Rec storage r, uint256 provBefore) internal {
        uint256 held = r.dkind == WorkLedger.DisputeKind.Appeal ? pools.disputeTerms(r.poolId).bond : 0;
        _hit(r.dkind == WorkLedger.DisputeKind.Appeal ? "supersedeSoftAppeal" : "supersedeSoft");
        r.verdict = WorkLedger.Verdict.Lapsed;
        gOpenDisputes[r.provider]--;
        gBondsPaid += held;
        if (token.balanceOf(r.provider) - provBefore != held) paymentMismatches++;
    }

    /// @dev The model of a dispute opening on `id`: the record is frozen, the dispute replaces the
    /// last one, and the validator set it opened under is kept for its committee.
    function _opened(bytes32 id, WorkLedger.DisputeKind kind, bool hard, address accuser) internal {
        Rec storage r = recs[id];
        if (r.disputes++ != 0) _hit("reDispute");
        r.status = WorkLedger.RecordStatus.Disputed;
        r.dkind = kind;
        r.verdict = WorkLedger.Verdict.Open;
        r.hard = hard;
        r.accuser = accuser;
        r.openedAt = time;
        r.openedBlock = block.number;
        r.drawn = false;
        r.size = 0;
        r.up = 0;
        r.down = 0;
        gOpenDisputes[r.provider]++;
        (address[] memory vs, uint64[] memory since) = pools.validatorEntries(r.poolId);
        snapVs[id] = vs;
        snapSince[id] = since;
        if (ledger.getDispute(r.poolId, r.workKey).validatorSet != keccak256(abi.encode(vs, since))) {
            committeeMismatches++;
        }
    }

    function _lockUntil(address p, uint256 until) internal {
        if (until > gLockedUntil[p]) gLockedUntil[p] = until;
    }

    /// @dev Anyone makes an unappealed accusation final after its appeal period.
    function finalizeInvalidation(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        bool expected =
            r.dkind == WorkLedger.DisputeKind.Accusation && r.verdict == WorkLedger.Verdict.Open && time >= r.appealEnd;
        Slash memory sl = _before(r);
        vm.prank(outsider);
        try ledger.finalizeInvalidation(r.poolId, r.workKey) {
            _check(expected, true, "finalizeInvalidation");
            if (time < r.appealEnd) slashesBeforeAppealEnd++;
            _settle(r, WorkLedger.Verdict.Upheld, sl);
        } catch {
            _check(expected, false, "finalizeInvalidation");
        }
    }

    /// @dev The record's provider appeals an accusation (hard or soft) within the appeal period.
    function appeal(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (found) _appeal(id);
    }

    function _appeal(bytes32 id) internal {
        Rec storage r = recs[id];
        bool expected =
            r.dkind == WorkLedger.DisputeKind.Accusation && r.verdict == WorkLedger.Verdict.Open && time < r.appealEnd;
        PoolManager.DisputeTerms memory d = pools.disputeTerms(r.poolId);
        vm.prank(r.provider);
        try ledger.appeal(r.poolId, r.workKey) {
            _check(expected, true, "appeal");
            if (!r.hard) _hit("softAppeal");
            r.dkind = WorkLedger.DisputeKind.Appeal;
            _voteOpened(r, d);
            gBondsIn += d.bond;
        } catch {
            _check(expected, false, "appeal");
        }
    }

    function _voteOpened(Rec storage r, PoolManager.DisputeTerms memory d) internal {
        r.voteEnd = time + d.votePeriod;
        r.drawBlock = block.number;
        r.round++;
    }

    /// @dev A staked provider other than the record's own challenges it before its deadline, with the
    /// node's signature (or a forged one).
    function challenge(uint256 recSeed, uint256 actorSeed, bytes32 evidence, uint256 sigSeed) external synced {
        (bytes32 id, bool found) = _pickOpen(recSeed, true);
        if (!found) return;
        Rec storage r = recs[id];
        address who = _actor(actorSeed);
        if (who == r.provider && _guided(actorSeed)) who = _actor(actorSeed % providers.length + 1);
        (bytes memory sig, bool good) = _rolloutSig(r, sigSeed);
        bool expected = _mayChallenge(r, who) && good;
        vm.prank(who);
        try ledger.challenge(r.poolId, r.workKey, evidence, sig) {
            _check(expected, true, "challenge");
            _opened(id, WorkLedger.DisputeKind.Challenge, true, who);
            PoolManager.DisputeTerms memory d = pools.disputeTerms(r.poolId);
            _voteOpened(r, d);
            gBondsIn += d.bond;
            _lockUntil(r.provider, r.voteEnd);
        } catch {
            _check(expected, false, "challenge");
        }
    }

    /// @dev Whether `who` may challenge `r` now (signature aside): staked the pool's minimum (at least
    /// 1), not its provider, before the deadline, the record pending (a challenge supersedes nothing:
    /// one that lapsed would reopen the record without the soft accusation it replaced).
    function _mayChallenge(Rec storage r, address who) internal view returns (bool) {
        uint256 minStake = pools.poolTerms(r.poolId).minStake;
        return gStaked[who] >= (minStake == 0 ? 1 : minStake) && who != r.provider
            && r.status == WorkLedger.RecordStatus.Pending && time < r.deadline;
    }

    /// @dev Anyone draws the committee of an open vote: one block after its seed block, or more than
    /// 256 blocks after it (`stale`: every eligible validator sits), with the validator set the dispute
    /// opened under or (`currentSet`) the pool's set now, which is refused unless it is the same.
    function drawCommittee(uint256 recSeed, bool stale, bool currentSet) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        vm.roll(block.number + (stale ? 257 : 1));
        address[] memory vs = snapVs[id];
        uint64[] memory since = snapSince[id];
        if (currentSet) (vs, since) = pools.validatorEntries(r.poolId);
        bool sameSet = keccak256(abi.encode(vs, since)) == keccak256(abi.encode(snapVs[id], snapSince[id]));
        bool expected = _voteOpen(r) && (r.drawn || sameSet);
        try ledger.drawCommittee(r.poolId, r.workKey, vs, since) {
            _check(expected, true, "drawCommittee");
            if (expected && !r.drawn) _drew(id);
        } catch {
            _check(expected, false, "drawCommittee");
        }
    }

    /// @dev Checks a committee just drawn: its size (every eligible validator of the dispute's set when
    /// the seed block was stale, else min(committee size, eligible)), and that every member is eligible.
    function _drew(bytes32 id) internal {
        Rec storage r = recs[id];
        WorkLedger.Dispute memory x = ledger.getDispute(r.poolId, r.workKey);
        if (!x.drawn || x.drawBlock != r.drawBlock || x.round != r.round) {
            committeeMismatches++;
            return;
        }
        bool stale = block.number > r.drawBlock + 256;
        if (stale) _hit("drawStale");
        uint256 eligible = _seatable(id, address(0));
        uint256 k = pools.disputeTerms(r.poolId).committeeSize;
        uint256 want = stale || k > eligible ? eligible : k;
        if (x.size != want) committeeMismatches++;
        uint256 seated;
        for (uint256 i; i < validators.length; ++i) {
            if (ledger.jurorState(r.poolId, r.workKey, validators[i]) == 0) continue;
            seated++;
            if (_seatable(id, validators[i]) == 0) ineligibleJurors++;
        }
        if (seated != want) committeeMismatches++;
        if (
            ledger.jurorState(r.poolId, r.workKey, r.accuser) != 0
                || ledger.jurorState(r.poolId, r.workKey, r.provider) != 0
        ) partiesOnCommittee++;
        r.drawn = true;
        r.size = x.size;
    }

    /// @dev How many entries of the set `id`'s dispute opened under may sit on its committee (not a
    /// party, named at or before the record was recorded); only those equal to `who` unless it is 0.
    function _seatable(bytes32 id, address who) internal view returns (uint256 n) {
        Rec storage r = recs[id];
        address[] storage vs = snapVs[id];
        uint64[] storage since = snapSince[id];
        for (uint256 i; i < vs.length; ++i) {
            if (who != address(0) && vs[i] != who) continue;
            if (vs[i] != r.accuser && vs[i] != r.provider && since[i] <= r.recordedAt) n++;
        }
    }

    /// @dev A drawn juror votes on an appeal or a challenge (the committee is drawn first if it was
    /// not; a juror the owner removed from the pool since still votes). The model decides whether the
    /// vote may count and whether it ends the dispute.
    function vote(uint256 recSeed, uint256 jurorSeed, bool uphold) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (found) _vote(id, jurorSeed, uphold);
    }

    function _vote(bytes32 id, uint256 jurorSeed, bool uphold) internal {
        Rec storage r = recs[id];
        if (_voteOpen(r) && !r.drawn) {
            vm.roll(block.number + 1);
            try ledger.drawCommittee(r.poolId, r.workKey, snapVs[id], snapSince[id]) {
                _drew(id);
            } catch {
                _check(true, false, "drawCommittee");
            }
        }
        address who = validators[jurorSeed % validators.length];
        if (_guided(jurorSeed)) {
            for (uint256 j; j < validators.length; ++j) {
                address cand = validators[(jurorSeed % validators.length + j) % validators.length];
                if (ledger.jurorState(r.poolId, r.workKey, cand) == 1) {
                    who = cand;
                    break;
                }
            }
        }
        bool expected = _voteOpen(r) && time < r.voteEnd && ledger.jurorState(r.poolId, r.workKey, who) == 1;
        uint256 half = uint256(r.size) / 2;
        bool decides = expected && (uphold ? r.up + 1 > half : r.down + 1 > half);
        Slash memory sl = _before(r);
        bool removed = gSince[r.poolId][who] == 0;
        vm.prank(who);
        try ledger.vote(r.poolId, r.workKey, uphold) {
            _check(expected, true, "vote");
            if (removed) _hit("voteByRemovedJuror");
            if (uphold) r.up++;
            else r.down++;
            if (decides) _settle(r, uphold ? WorkLedger.Verdict.Upheld : WorkLedger.Verdict.Overturned, sl);
        } catch {
            _check(expected, false, "vote");
        }
    }

    /// @dev Anyone closes an appeal or a challenge whose vote period ended without a majority of its
    /// committee: it lapses, whatever minority of votes was cast.
    function resolveLapsed(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        bool expected = _voteOpen(r) && time >= r.voteEnd;
        Slash memory sl = _before(r);
        vm.prank(outsider);
        try ledger.resolveLapsed(r.poolId, r.workKey) {
            _check(expected, true, "resolveLapsed");
            if (r.dkind == WorkLedger.DisputeKind.Challenge) _hit("lapsedChallenge");
            if (r.dkind == WorkLedger.DisputeKind.Appeal) _hit("lapsedAppeal");
            if (r.up + r.down != 0) _hit("lapsedWithVotes");
            _settle(r, WorkLedger.Verdict.Lapsed, sl);
        } catch {
            _check(expected, false, "resolveLapsed");
        }
    }

    /// @dev A record with an open dispute when guided, else any record.
    function _pickDisputed(uint256 seed) internal view returns (bytes32 id, bool found) {
        if (recIds.length == 0) return (bytes32(0), false);
        uint256 start = seed % recIds.length;
        if (_guided(seed)) {
            for (uint256 j; j < recIds.length; ++j) {
                bytes32 cand = recIds[(start + j) % recIds.length];
                if (recs[cand].dkind != WorkLedger.DisputeKind.None && recs[cand].verdict == WorkLedger.Verdict.Open) {
                    return (cand, true);
                }
            }
        }
        return (recIds[start], true);
    }

    function _voteOpen(Rec storage r) internal view returns (bool) {
        return r.verdict == WorkLedger.Verdict.Open
            && (r.dkind == WorkLedger.DisputeKind.Appeal || r.dkind == WorkLedger.DisputeKind.Challenge);
    }

    /// @dev The model's slash of `r`'s provider should its dispute stand (unbonding first, then staked;
    /// a bounty only for a verdict reached by a vote), and the balances a verdict moves.
    function _before(Rec storage r) internal view returns (Slash memory sl) {
        address p = r.provider;
        uint256 amount = pools.poolTerms(r.poolId).slashAmount;
        sl.fromUnbonding = amount < gUnbonding[p] ? amount : gUnbonding[p];
        uint256 rest = amount - sl.fromUnbonding;
        sl.fromStaked = rest < gStaked[p] ? rest : gStaked[p];
        if (r.dkind != WorkLedger.DisputeKind.Accusation) {
            sl.bounty = (sl.fromUnbonding + sl.fromStaked) * bountyBps / 10_000;
            if (sl.bounty > maxBounty) sl.bounty = maxBounty;
        }
        sl.treasuryBefore = token.balanceOf(treasury);
        sl.accBefore = token.balanceOf(r.accuser);
        sl.provBefore = token.balanceOf(p);
    }

    /// @dev Applies a verdict the ledger reached to the model, and checks who was paid what: bonds to
    /// the winner (to the treasury when a soft dispute stood; each back on a lapse, less the lapse fee
    /// of a challenge), the revoked reward to the treasury, a slash only for a hard dispute that stood.
    function _settle(Rec storage r, WorkLedger.Verdict v, Slash memory sl) internal {
        r.verdict = v;
        gOpenDisputes[r.provider]--;
        uint256 bond = pools.disputeTerms(r.poolId).bond;
        uint256 accBond = r.hard ? bond : 0;
        uint256 held = accBond + (r.dkind == WorkLedger.DisputeKind.Appeal ? bond : 0);
        uint256 accGets;
        uint256 provGets;
        uint256 toTreasury;
        if (v == WorkLedger.Verdict.Upheld) {
            toTreasury = _revoke(r);
            if (r.hard) {
                accGets = held;
                toTreasury += _slash(r, sl);
                accGets += sl.bounty;
            } else {
                toTreasury += held;
                gBondsToTreasury += held;
                if (held != 0) _hit("softUpheldToTreasury");
            }
        } else if (v == WorkLedger.Verdict.Overturned) {
            provGets = held;
            _reopen(r);
        } else if (r.dkind == WorkLedger.DisputeKind.Appeal) {
            accGets = accBond;
            provGets = bond;
            toTreasury = _revoke(r);
        } else {
            uint256 fee = held * ledger.LAPSE_FEE_BPS() / 10_000;
            accGets = held - fee;
            toTreasury = fee;
            gLapseFees += fee;
            _reopen(r);
        }
        gBondsPaid += held;
        if (token.balanceOf(r.accuser) - sl.accBefore != accGets) paymentMismatches++;
        if (token.balanceOf(r.provider) - sl.provBefore != provGets) paymentMismatches++;
        if (token.balanceOf(treasury) - sl.treasuryBefore != toTreasury) paymentMismatches++;
    }

    /// @dev A revoked record: its units leave the pending total and its reserved reward the budget, to
    /// the treasury.
    function _revoke(Rec storage r) internal returns (uint256 reward) {
        r.invalidations++;
        r.status = WorkLedger.RecordStatus.Invalidated;
        gPendingUnits[r.poolId] -= r.units;
        gInvalidatedUnits[r.poolId] += r.units;
        reward = uint256(r.units) * _rate(r.poolId);
        gForfeited[r.poolId] += reward;
        gTotalForfeited += reward;
    }

    /// @dev Returns what of the slash goes to the treasury.
    function _slash(Rec storage r, Slash memory sl) internal returns (uint256) {
        address p = r.provider;
        uint256 slashed = sl.fromUnbonding + sl.fromStaked;
        gUnbonding[p] -= sl.fromUnbonding;
        gStaked[p] -= sl.fromStaked;
        gSlashed[p] += slashed;
        gTotalSlashed += slashed;
        gTotalBounty += sl.bounty;
        return slashed - sl.bounty;
    }

    /// @dev A dispute that did not stand: the record is pending again. After a challenge it gets the
    /// time its window had left when the challenge opened, and the stake stays until then; after an
    /// accusation the deadline stays, and an overturned soft one clears the record of soft accusations.
    function _reopen(Rec storage r) internal {
        r.status = WorkLedger.RecordStatus.Pending;
        if (r.dkind != WorkLedger.DisputeKind.Challenge) {
            if (!r.hard && !r.softCleared) {
                r.softCleared = true;
                _hit("softCleared");
            }
            return;
        }
        uint256 left = r.deadline > r.openedAt ? r.deadline - r.openedAt : 0;
        uint256 end = time + left;
        if (end > r.deadline) {
            r.deadline = end;
            _lockUntil(r.provider, end);
            _hit("reopenedLater");
        }
    }

    function claim(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (found) _claimRec(id);
    }

    function _claimRec(bytes32 id) internal {
        Rec storage r = recs[id];
        uint256 reward = uint256(r.units) * _rate(r.poolId);
        bool expected =
            r.status == WorkLedger.RecordStatus.Pending && time >= r.deadline && reward <= _budget(r.poolId);
        bool disputed = r.dkind != WorkLedger.DisputeKind.None && r.verdict == WorkLedger.Verdict.Open;
        uint256 before = token.balanceOf(r.provider);
        bytes32[] memory ks = new bytes32[](1);
        ks[0] = r.workKey;
        vm.prank(r.provider);
        try ledger.claim(r.poolId, ks) returns (uint256 paid) {
            _check(expected, true, "claim");
            if (time < r.deadline) claimsBeforeDeadline++;
            if (disputed) claimsWhileDisputed++;
            r.claims++;
            r.status = WorkLedger.RecordStatus.Claimed;
            gPendingUnits[r.poolId] -= r.units;
            gClaimedUnits[r.poolId] += r.units;
            gClaimedTokens[r.poolId] += reward;
            if (paid != reward || token.balanceOf(r.provider) - before != reward) paymentMismatches++;
        } catch {
            _check(expected, false, "claim");
        }
    }

    function fundPool(uint256 poolSeed, uint256 amount) external synced {
        uint256 poolId = poolIds[poolSeed % 2];
        amount = bound(amount, 0, 1e21);
        vm.prank(funder);
        try ledger.fundPool(poolId, amount) {
            _check(amount != 0, true, "fundPool");
            gFunded[poolId] += amount;
        } catch {
            _check(amount != 0, false, "fundPool");
        }
    }

    function withdrawSurplus(uint256 poolSeed, uint256 amount) external synced {
        uint256 poolId = poolIds[poolSeed % 2];
        uint256 owed = gPendingUnits[poolId] * _rate(poolId);
        uint256 budget = _budget(poolId);
        uint256 surplus = budget > owed ? budget - owed : 0;
        amount = bound(amount, 0, surplus + 1e18);
        bool expected = amount != 0 && amount <= surplus;
        vm.prank(poolOwner);
        try ledger.withdrawSurplus(poolId, amount, poolOwner) {
            _check(expected, true, "withdrawSurplus");
            gSurplusWithdrawn[poolId] += amount;
        } catch {
            _check(expected, false, "withdrawSurplus");
        }
    }

    // ------------------------------------------------------------------ governance and time

    function setBounty(uint16 bps, uint256 cap) external synced {
        bps = uint16(bound(bps, 0, 5_000));
        cap = cap % 3 == 0 ? type(uint256).max : bound(cap, 0, 10e18);
        uint64 period = registry.unbondingPeriod();
        uint256 perUnit = registry.stakePerComputeUnit();
        uint256 minStake = registry.minProviderStake();
        vm.prank(admin);
        try registry.setParameters(period, perUnit, minStake, bps, cap) {
            _check(true, true, "setBounty");
            bountyBps = bps;
            maxBounty = cap;
        } catch {
            _check(true, false, "setBounty");
        }
    }

    /// @dev Moves the clock: usually by minutes (so records stay open to disputes for a while), one
    /// time in four by up to three days.
    function warp(uint256 secs) external {
        time += secs % 4 == 0 ? bound(secs, 0, 3 days) : bound(secs, 0, 30 minutes);
        vm.warp(time);
    }

    /// @dev Moves the clock to one second before, at, or one second after a record's deadline.
    function warpToDeadline(uint256 recSeed, uint256 delta) external {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (!found) return;
        uint256 target = recs[id].deadline + (delta % 3) - 1;
        if (target > time) time = target;
        vm.warp(time);
    }

    // ------------------------------------------------------------------ wrong callers

    /// @dev Calls a restricted function from an account that lacks the right; none may succeed, and
    /// each must fail on its access check (not on something else).
    function tryUnauthorized(uint256 which, uint256 actorSeed, uint256 seed) external synced {
        address[11] memory cands = [
            providers[0], providers[1], providers[2], providers[3], outsider, validator, poolOwner, funder,
            coords[0], coords[1], treasury
        ];
        address who = cands[actorSeed % cands.length];
        uint256 i = seed % 2;
        uint256 poolId = poolIds[i];
        address node = vm.addr(_nodePk(seed));
        which = which % 15;
        bytes4 want;
        bool ok;
        bytes memory err;

        if (which == 0) {
            if (who == coords[i]) return;
            WorkLedger.WorkInput[] memory b = new WorkLedger.WorkInput[](1);
            b[0] = WorkLedger.WorkInput(node, keccak256(abi.encode("forged", seed)), 1, 0, bytes32(0));
            want = WorkLedger.NotCoordinator.selector;
            vm.prank(who);
            try ledger.recordWork(poolId, b) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 1) {
            bool skip;
            (skip, ok, err) = _invalidateAsOutsider(who, seed);
            if (skip) return;
            want = WorkLedger.NotValidator.selector;
        } else if (which == 2) {
            (bytes32 id, bool found) = _pickRec(seed);
            if (!found || who == recs[id].provider) return;
            bytes32[] memory ks = new bytes32[](1);
            ks[0] = recs[id].workKey;
            want = WorkLedger.NothingToClaim.selector;
            uint256 pid = recs[id].poolId;
            vm.prank(who);
            try ledger.claim(pid, ks) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 3) {
            want = IAccessControl.AccessControlUnauthorizedAccount.selector;
            vm.prank(who);
            try registry.slash(providers[seed % providers.length], 1e18, who, bytes32(0)) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 4) {
            want = IAccessControl.AccessControlUnauthorizedAccount.selector;
            vm.prank(who);
            try registry.setParameters(0, 0, 0, 5_000, type(uint256).max) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 5) {
            want = IAccessControl.AccessControlUnauthorizedAccount.selector;
            bytes32 role = seed % 2 == 0 ? registry.DEFAULT_ADMIN_ROLE() : registry.SLASHER_ROLE();
            vm.prank(who);
            try registry.grantRole(role, who) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 6) {
            want = IAccessControl.AccessControlUnauthorizedAccount.selector;
            vm.prank(who);
            try registry.setTreasury(who) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 7) {
            if (who == poolOwner) return;
            want = WorkLedger.NotPoolOwner.selector;
            vm.prank(who);
            try ledger.withdrawSurplus(poolId, 1, who) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 8) {
            if (who == poolOwner) return;
            want = PoolManager.NotPoolOwner.selector;
            vm.prank(who);
            try pools.endPool(poolId) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 9) {
            if (who == poolOwner || who == coords[i]) return;
            want = PoolManager.NotPoolAdmin.selector;
            vm.prank(who);
            try pools.ejectNode(poolId, node) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 10) {
            if (who == poolOwner || who == coords[i]) return;
            want = PoolManager.NotPoolAdmin.selector;
            vm.prank(who);
            try pools.blacklistNode(poolId, node) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 11) {
            if (who == gNodeProvider[node]) return;
            want = PoolManager.NotNodeProvider.selector;
            uint256 pid = gPoolOf[node] != 0 ? gPoolOf[node] : poolId;
            vm.prank(who);
            try pools.leavePool(pid, node) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 12) {
            if (gNodeProvider[node] == address(0) || who == gNodeProvider[node]) return;
            want = ProviderRegistry.NotNodeProvider.selector;
            vm.prank(who);
            try registry.removeNode(node) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else if (which == 13) {
            want = Ownable.OwnableUnauthorizedAccount.selector;
            vm.prank(who);
            try token.mint(who, 1e18) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        } else {
            if (who == poolOwner) return;
            want = PoolManager.NotPoolOwner.selector;
            vm.prank(who);
            try pools.setBootstrap(poolId, "/ip4/6.6.6.6/tcp/1") {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
        }
        unauthorizedAttempts++;
        if (ok) {
            unauthorizedSuccesses++;
        } else if (err.length < 4 || bytes4(err) != want) {
            unexpectedRoleReverts++;
        }
    }

    /// @dev `who` (a validator of neither pool) accuses a record open to accusation (else it would fail
    /// on that first), signed by its node.
    function _invalidateAsOutsider(address who, uint256 seed) internal returns (bool skip, bool ok, bytes memory err) {
        (bytes32 id, bool found) = _pickRec(seed);
        if (!found || _isValidatorAnywhere(who)) return (true, false, err);
        Rec storage r = recs[id];
        bool hard = seed % 4 != 0;
        if (r.status != WorkLedger.RecordStatus.Pending || time >= r.deadline) return (true, false, err);
        if (!hard && r.softCleared) return (true, false, err); // refused first for that (SoftAccusedBefore)
        (bytes memory sig,) = _rolloutSig(r, 4);
        vm.prank(who);
        try ledger.invalidateWork(r.poolId, r.workKey, bytes32(0), hard, sig) {
            ok = true;
        } catch (bytes memory e) {
            err = e;
        }
    }

    function _isValidatorAnywhere(address who) internal view returns (bool) {
        return gSince[poolIds[0]][who] != 0 || gSince[poolIds[1]][who] != 0;
    }

    // ------------------------------------------------------------------ views for the invariants

    function recCount() external view returns (uint256) {
        return recIds.length;
    }

    function recAt(uint256 i) external view returns (Rec memory) {
        return recs[recIds[i]];
    }

    function providerCount() external view returns (uint256) {
        return providers.length;
    }

    function validatorCount() external view returns (uint256) {
        return validators.length;
    }

    /// @dev Whether the model holds a dispute of the i-th record open.
    function disputeOpenAt(uint256 i) external view returns (bool) {
        Rec storage r = recs[recIds[i]];
        return r.dkind != WorkLedger.DisputeKind.None && r.verdict == WorkLedger.Verdict.Open;
    }

    function successCount(string calldata what) external view returns (uint256) {
        return successes[keccak256(bytes(what))];
    }
}
