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
/// stay zero.
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
        address[4] jurors;
    }

    /// @dev Ghost of one work record, keyed by keccak256(poolId, workKey).
    struct Rec {
        uint256 poolId;
        bytes32 workKey;
        address provider;
        uint256 deadline;
        uint48 units;
        WorkLedger.RecordStatus status;
        uint8 recordings;
        uint8 claims;
        uint8 invalidations;
        WorkLedger.DisputeKind dkind;
        WorkLedger.Verdict verdict;
        address accuser;
        uint256 appealEnd;
        uint256 voteEnd;
    }

    uint256 internal constant N_NODES = 12;
    uint256 internal constant NODE_PK_BASE = 0xA000;

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
    mapping(address => uint256) public gFloor;
    mapping(address => uint256) public gLockedUntil;
    mapping(address => uint256) public gOpenDisputes;

    // ------------------------------------------------------------------ ghost: ledger
    bytes32[] internal recIds;
    mapping(bytes32 => Rec) internal recs;
    mapping(uint256 => uint256) public gFunded;
    mapping(uint256 => uint256) public gSurplusWithdrawn;
    mapping(uint256 => uint256) public gClaimedTokens;
    mapping(uint256 => uint256) public gRecordedUnits;
    mapping(uint256 => uint256) public gPendingUnits;
    mapping(uint256 => uint256) public gInvalidatedUnits;
    mapping(uint256 => uint256) public gClaimedUnits;

    // ------------------------------------------------------------------ violations (must stay 0)
    uint256 public claimsBeforeDeadline;
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

    // ------------------------------------------------------------------ ghost: disputes
    uint256 public gBondsIn;
    uint256 public gBondsPaid;
    address[4] public jurors;
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
        jurors = s.jurors;
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

    function _sign(uint256 pk, bytes32 digest) internal pure returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(pk, digest);
        return abi.encodePacked(r, s, v);
    }

    function _budget(uint256 poolId) internal view returns (uint256) {
        return gFunded[poolId] - gSurplusWithdrawn[poolId] - gClaimedTokens[poolId];
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

    function removeNode(uint256 nodeSeed) external synced {
        address node = vm.addr(_pickNode(nodeSeed, IDLE, 0));
        address p = gNodeProvider[node];
        address caller = p == address(0) ? _actor(nodeSeed) : p;
        bool expected = p != address(0) && gPoolOf[node] == 0;
        vm.prank(caller);
        try registry.removeNode(node) {
            _check(expected, true, "removeNode");
            gComputeUnits[p] -= gNodeUnits[node];
            gNodeProvider[node] = address(0);
            gNodeUnits[node] = 0;
        } catch {
            _check(expected, false, "removeNode");
        }
    }

    // ------------------------------------------------------------------ membership

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
        bool expected = p != address(0) && gPoolOf[node] == 0 && !gBlacklisted[poolId][node]
            && gStaked[p] >= pools.getPool(poolId).minStake;
        vm.prank(caller);
        try pools.joinPool(poolId, node, nonce, expiry, sig) {
            _check(expected, true, "joinPool");
            gPoolOf[node] = poolId;
            gMemberships[p]++;
            uint256 min = pools.getPool(poolId).minStake;
            if (min > gFloor[p]) gFloor[p] = min;
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

    /// @dev The model of a membership ending: the provider's stake floor drops only with its last one.
    function _left(address node) internal {
        gPoolOf[node] = 0;
        address p = gNodeProvider[node];
        if (--gMemberships[p] == 0) gFloor[p] = 0;
    }

    /// @dev Whether `p` has a record that can still be invalidated (its stake must not leave).
    function _hasOpenRecord(address p) internal view returns (bool) {
        for (uint256 i; i < recIds.length; ++i) {
            Rec storage r = recs[recIds[i]];
            if (r.provider == p && r.status == WorkLedger.RecordStatus.Pending && time < r.deadline) return true;
        }
        return false;
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
            bytes32 workKey = _freshKey(poolId, unitsSeed + j);
            uint48 units = uint48(bound(uint256(keccak256(abi.encode(unitsSeed, j))), 1, 1_000_000));
            tmp[n++] = WorkLedger.WorkInput(node, workKey, units, uint32(j), keccak256(abi.encode(workKey)));
        }
        if (n == 0) return;
        WorkLedger.WorkInput[] memory batch = new WorkLedger.WorkInput[](n);
        for (uint256 j; j < n; ++j) {
            batch[j] = tmp[j];
        }
        // Refused when a provider stakes less than the pool's minimum, or the budget cannot reserve it.
        PoolManager.PoolTerms memory t = pools.poolTerms(poolId);
        uint256 need = t.minStake == 0 ? 1 : t.minStake;
        bool expected = true;
        uint256 total;
        for (uint256 j; j < n; ++j) {
            if (gStaked[gNodeProvider[batch[j].node]] < need) expected = false;
            total += batch[j].units;
        }
        if ((gPendingUnits[poolId] + total) * t.rewardRate > _budget(poolId)) expected = false;
        vm.prank(coords[i]);
        try ledger.recordWork(poolId, batch) {
            _check(expected, true, "recordWork");
            uint256 deadline = time + t.validationWindow;
            for (uint256 j; j < n; ++j) {
                address prov = gNodeProvider[batch[j].node];
                if (registry.stakeOf(prov) < need) recordsUnderStaked++;
                if (deadline > gLockedUntil[prov]) gLockedUntil[prov] = deadline;
                bytes32 id = keccak256(abi.encode(poolId, batch[j].workKey));
                Rec storage r = recs[id];
                if (r.recordings == 0) recIds.push(id);
                r.recordings++;
                r.poolId = poolId;
                r.workKey = batch[j].workKey;
                r.provider = gNodeProvider[batch[j].node];
                r.deadline = deadline;
                r.units = batch[j].units;
                r.status = WorkLedger.RecordStatus.Pending;
                gRecordedUnits[poolId] += batch[j].units;
                gPendingUnits[poolId] += batch[j].units;
            }
        } catch {
            _check(expected, false, "recordWork");
        }
    }

    /// @dev A key not yet recorded in `poolId`: usually new, sometimes one already used in the other
    /// pool (keys are per pool, so that must be accepted).
    function _freshKey(uint256 poolId, uint256 seed) internal returns (bytes32) {
        if (seed % 3 == 0 && recIds.length != 0) {
            Rec storage other = recs[recIds[seed % recIds.length]];
            if (other.poolId != poolId && recs[keccak256(abi.encode(poolId, other.workKey))].recordings == 0) {
                return other.workKey;
            }
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

    struct Slash {
        uint256 fromUnbonding;
        uint256 fromStaked;
        uint256 bounty;
        uint256 validatorBefore;
        uint256 treasuryBefore;
    }

    function invalidateWork(uint256 recSeed, bytes32 evidence) external synced {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (found) _invalidate(id, evidence);
    }

    /// @dev Moves the clock to one second before, at, or one second after a record's deadline (if
    /// that is not in the past), then tries both to invalidate and to claim it, in either order.
    function settleAtDeadline(uint256 recSeed, uint256 delta, bool claimFirst) external {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (!found) return;
        uint256 target = recs[id].deadline + (delta % 3) - 1;
        if (target > time) time = target;
        vm.warp(time);
        if (claimFirst) {
            _claimRec(id);
            _invalidate(id, bytes32(delta));
        } else {
            _invalidate(id, bytes32(delta));
            _claimRec(id);
        }
    }

    function _invalidate(bytes32 id, bytes32 evidence) internal {
        _invalidateAs(id, evidence, uint256(evidence) % 4 != 0);
    }

    /// @dev A validator's invalidation: soft (revoked, no slash) or hard (an accusation with a bond). It
    /// may supersede an open challenge (the challenger's bond goes back).
    function _invalidateAs(bytes32 id, bytes32 evidence, bool hard) internal {
        Rec storage r = recs[id];
        bool challenged = r.status == WorkLedger.RecordStatus.Disputed && r.dkind == WorkLedger.DisputeKind.Challenge
            && r.verdict == WorkLedger.Verdict.Open;
        bool fresh = r.status == WorkLedger.RecordStatus.Pending && r.dkind == WorkLedger.DisputeKind.None;
        bool expected = (fresh || challenged) && time < r.deadline && r.provider != validator;
        PoolManager.DisputeTerms memory d = pools.disputeTerms(r.poolId);
        address challenger = r.accuser;
        uint256 challengerBefore = challenged ? token.balanceOf(challenger) : 0;
        vm.prank(validator);
        try ledger.invalidateWork(r.poolId, r.workKey, evidence, hard) {
            _check(expected, true, hard ? "accuse" : "softInvalidate");
            if (time >= r.deadline) invalidationsAtOrAfterDeadline++;
            if (challenged) {
                r.verdict = WorkLedger.Verdict.Lapsed;
                r.status = WorkLedger.RecordStatus.Pending;
                gBondsPaid += d.bond;
                gOpenDisputes[r.provider]--;
                if (token.balanceOf(challenger) - challengerBefore != d.bond) paymentMismatches++;
            }
            if (!hard) {
                r.invalidations++;
                r.status = WorkLedger.RecordStatus.Invalidated;
                gPendingUnits[r.poolId] -= r.units;
                gInvalidatedUnits[r.poolId] += r.units;
                return;
            }
            r.status = WorkLedger.RecordStatus.Disputed;
            r.dkind = WorkLedger.DisputeKind.Accusation;
            r.verdict = WorkLedger.Verdict.Open;
            r.accuser = validator;
            r.appealEnd = time + d.appealPeriod;
            r.voteEnd = 0;
            gBondsIn += d.bond;
            gOpenDisputes[r.provider]++;
            uint256 until = r.appealEnd + d.votePeriod;
            if (until > gLockedUntil[r.provider]) gLockedUntil[r.provider] = until;
        } catch {
            _check(expected, false, hard ? "accuse" : "softInvalidate");
        }
    }

    /// @dev The model's slash: unbonding first, then staked; bounty min(slashed * bps / 1e4, maxBounty).
    function _expectedSlash(address p, uint256 amount) internal view returns (Slash memory sl) {
        sl.fromUnbonding = amount < gUnbonding[p] ? amount : gUnbonding[p];
        uint256 rest = amount - sl.fromUnbonding;
        sl.fromStaked = rest < gStaked[p] ? rest : gStaked[p];
        sl.bounty = (sl.fromUnbonding + sl.fromStaked) * bountyBps / 10_000;
        if (sl.bounty > maxBounty) sl.bounty = maxBounty;
        sl.validatorBefore = 0;
        sl.treasuryBefore = token.balanceOf(treasury);
    }

    function _applySlash(Rec storage r, Slash memory sl) internal {
        if (r.dkind == WorkLedger.DisputeKind.Accusation && time < r.appealEnd) slashesBeforeAppealEnd++;
        r.invalidations++;
        r.status = WorkLedger.RecordStatus.Invalidated;
        gPendingUnits[r.poolId] -= r.units;
        gInvalidatedUnits[r.poolId] += r.units;
        address p = r.provider;
        uint256 slashed = sl.fromUnbonding + sl.fromStaked;
        gUnbonding[p] -= sl.fromUnbonding;
        gStaked[p] -= sl.fromStaked;
        gSlashed[p] += slashed;
        gTotalSlashed += slashed;
        gTotalBounty += sl.bounty;
        if (token.balanceOf(treasury) - sl.treasuryBefore != slashed - sl.bounty) paymentMismatches++;
    }

    /// @dev Bonds put up in a dispute: the accuser's, plus the provider's when it appealed.
    function _held(Rec storage r) internal view returns (uint256) {
        uint256 bond = pools.disputeTerms(r.poolId).bond;
        return r.dkind == WorkLedger.DisputeKind.Appeal ? 2 * bond : bond;
    }

    /// @dev Applies a verdict the ledger reached to the model, and checks who was paid what.
    function _settle(Rec storage r, WorkLedger.Verdict v, Slash memory sl, uint256 accBefore, uint256 provBefore)
        internal
    {
        r.verdict = v;
        gOpenDisputes[r.provider]--;
        uint256 held = _held(r);
        uint256 bond = pools.disputeTerms(r.poolId).bond;
        uint256 accGets;
        uint256 provGets;
        if (v == WorkLedger.Verdict.Upheld) {
            _applySlash(r, sl);
            accGets = held + sl.bounty;
        } else if (v == WorkLedger.Verdict.Overturned) {
            r.status = WorkLedger.RecordStatus.Pending;
            provGets = held;
        } else {
            if (r.dkind == WorkLedger.DisputeKind.Appeal) {
                // a lapsed appeal revokes the record (no slash)
                r.invalidations++;
                r.status = WorkLedger.RecordStatus.Invalidated;
                gPendingUnits[r.poolId] -= r.units;
                gInvalidatedUnits[r.poolId] += r.units;
            } else {
                r.status = WorkLedger.RecordStatus.Pending;
            }
            accGets = bond;
            provGets = held - bond;
        }
        gBondsPaid += held;
        if (token.balanceOf(r.accuser) - accBefore != accGets) paymentMismatches++;
        if (token.balanceOf(r.provider) - provBefore != provGets) paymentMismatches++;
    }

    function _open(Rec storage r) internal view returns (bool) {
        return r.verdict == WorkLedger.Verdict.Open
            && (r.dkind == WorkLedger.DisputeKind.Appeal || r.dkind == WorkLedger.DisputeKind.Challenge);
    }

    /// @dev Anyone makes an unappealed accusation final after its appeal period.
    function finalizeInvalidation(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        bool expected =
            r.dkind == WorkLedger.DisputeKind.Accusation && r.verdict == WorkLedger.Verdict.Open && time >= r.appealEnd;
        Slash memory sl = _expectedSlash(r.provider, pools.poolTerms(r.poolId).slashAmount);
        uint256 accBefore = token.balanceOf(r.accuser);
        uint256 provBefore = token.balanceOf(r.provider);
        vm.prank(outsider);
        try ledger.finalizeInvalidation(r.poolId, r.workKey) {
            _check(expected, true, "finalizeInvalidation");
            _settle(r, WorkLedger.Verdict.Upheld, sl, accBefore, provBefore);
        } catch {
            _check(expected, false, "finalizeInvalidation");
        }
    }

    /// @dev The record's provider appeals an accusation within the appeal period.
    function appeal(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        bool expected =
            r.dkind == WorkLedger.DisputeKind.Accusation && r.verdict == WorkLedger.Verdict.Open && time < r.appealEnd;
        PoolManager.DisputeTerms memory d = pools.disputeTerms(r.poolId);
        vm.prank(r.provider);
        try ledger.appeal(r.poolId, r.workKey) {
            _check(expected, true, "appeal");
            r.dkind = WorkLedger.DisputeKind.Appeal;
            r.voteEnd = time + d.votePeriod;
            gBondsIn += d.bond;
        } catch {
            _check(expected, false, "appeal");
        }
    }

    /// @dev A staked provider other than the record's own challenges it before its deadline.
    function challenge(uint256 recSeed, uint256 actorSeed, bytes32 evidence) external synced {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        address who = _actor(actorSeed);
        uint256 minStake = pools.poolTerms(r.poolId).minStake;
        bool expected = gStaked[who] >= (minStake == 0 ? 1 : minStake) && who != r.provider && r.status == WorkLedger.RecordStatus.Pending
            && time < r.deadline && r.dkind == WorkLedger.DisputeKind.None;
        PoolManager.DisputeTerms memory d = pools.disputeTerms(r.poolId);
        vm.prank(who);
        try ledger.challenge(r.poolId, r.workKey, evidence) {
            _check(expected, true, "challenge");
            r.status = WorkLedger.RecordStatus.Disputed;
            r.dkind = WorkLedger.DisputeKind.Challenge;
            r.accuser = who;
            r.voteEnd = time + d.votePeriod;
            gBondsIn += d.bond;
            gOpenDisputes[r.provider]++;
            if (r.voteEnd > gLockedUntil[r.provider]) gLockedUntil[r.provider] = r.voteEnd;
        } catch {
            _check(expected, false, "challenge");
        }
    }

    /// @dev A validator votes on an appeal or a challenge (a new block first, so the committee's seed
    /// block has a hash). Membership is read from the ledger after the draw; the model then decides
    /// whether the vote may count and whether it ends the dispute.
    function vote(uint256 recSeed, uint256 jurorSeed, bool uphold) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        vm.roll(block.number + 1);
        if (_open(r)) ledger.drawCommittee(r.poolId, r.workKey, pools.validatorsOf(r.poolId));
        address who = jurors[jurorSeed % 4];
        if (_guided(jurorSeed)) {
            for (uint256 j; j < 4; ++j) {
                address cand = jurors[(jurorSeed + j) % 4];
                if (ledger.jurorState(r.poolId, r.workKey, cand) == 1) {
                    who = cand;
                    break;
                }
            }
        }
        WorkLedger.Dispute memory x = ledger.getDispute(r.poolId, r.workKey);
        bool expected = _open(r) && time < r.voteEnd && ledger.jurorState(r.poolId, r.workKey, who) == 1;
        uint256 half = uint256(x.size) / 2;
        bool decides = expected && (uphold ? x.upheld + 1 > half : x.overturned + 1 > half);
        Slash memory sl = _expectedSlash(r.provider, pools.poolTerms(r.poolId).slashAmount);
        uint256 accBefore = token.balanceOf(r.accuser);
        uint256 provBefore = token.balanceOf(r.provider);
        for (uint256 j; j < 4; ++j) {
            address a = jurors[j];
            if ((a == r.accuser || a == r.provider) && ledger.jurorState(r.poolId, r.workKey, a) != 0) partiesOnCommittee++;
        }
        if (x.drawn && x.size != 3) committeeMismatches++;
        vm.prank(who);
        try ledger.vote(r.poolId, r.workKey, uphold) {
            _check(expected, true, "vote");
            if (decides) {
                _settle(r, uphold ? WorkLedger.Verdict.Upheld : WorkLedger.Verdict.Overturned, sl, accBefore, provBefore);
            }
        } catch {
            _check(expected, false, "vote");
        }
    }

    /// @dev Anyone closes an appeal or a challenge whose vote period ended undecided.
    function resolveLapsed(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickDisputed(recSeed);
        if (!found) return;
        Rec storage r = recs[id];
        bool expected = _open(r) && time >= r.voteEnd;
        uint256 accBefore = token.balanceOf(r.accuser);
        uint256 provBefore = token.balanceOf(r.provider);
        Slash memory sl;
        vm.prank(outsider);
        try ledger.resolveLapsed(r.poolId, r.workKey) {
            _check(expected, true, "resolveLapsed");
            _settle(r, WorkLedger.Verdict.Lapsed, sl, accBefore, provBefore);
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

    function claim(uint256 recSeed) external synced {
        (bytes32 id, bool found) = _pickRec(recSeed);
        if (found) _claimRec(id);
    }

    function _claimRec(bytes32 id) internal {
        Rec storage r = recs[id];
        uint256 reward = uint256(r.units) * _rate(r.poolId);
        bool expected = r.status == WorkLedger.RecordStatus.Pending && time >= r.deadline && reward <= _budget(r.poolId);
        uint256 before = token.balanceOf(r.provider);
        bytes32[] memory ks = new bytes32[](1);
        ks[0] = r.workKey;
        vm.prank(r.provider);
        try ledger.claim(r.poolId, ks) returns (uint256 paid) {
            _check(expected, true, "claim");
            if (time < r.deadline) claimsBeforeDeadline++;
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

    function warp(uint256 secs) external {
        time += bound(secs, 0, 3 days);
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
            if (who == validator) return;
            (bytes32 id,) = _pickRec(seed);
            want = WorkLedger.NotValidator.selector;
            vm.prank(who);
            try ledger.invalidateWork(poolId, recs[id].workKey, bytes32(0), true) {
                ok = true;
            } catch (bytes memory e) {
                err = e;
            }
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

    function successCount(string calldata what) external view returns (uint256) {
        return successes[keccak256(bytes(what))];
    }
}
