// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {IPoolMembership} from "./interfaces/IPoolMembership.sol";
import {ProviderRegistry} from "./ProviderRegistry.sol";

/// @title PoolManager
/// @notice Training pools: their terms, their lifecycle and their members.
/// @dev Anyone may create a pool. Its coordinator admits nodes with single-use, expiring EIP-712
/// invites; the provider of an invited node sends the join. A node is in at most one pool at a time.
/// Nothing here loops over members, so every call costs the same with 10 or 10,000 nodes.
contract PoolManager is IPoolMembership, EIP712 {
    /// @notice EIP-712 type of an invite, signed by the pool's coordinator.
    bytes32 public constant INVITE_TYPEHASH =
        keccak256("Invite(uint256 poolId,address node,uint256 nonce,uint64 expiry)");
    /// @notice Validation window used when a pool is created with window 0.
    uint64 public constant DEFAULT_VALIDATION_WINDOW = 24 hours;
    /// @notice Most validators a pool may name (bounds the committee draw).
    uint256 public constant MAX_POOL_VALIDATORS = 32;
    /// @notice Dispute terms a new pool starts with (the owner may change them until it starts).
    uint64 public constant DEFAULT_APPEAL_PERIOD = 24 hours;
    uint64 public constant DEFAULT_VOTE_PERIOD = 24 hours;
    uint8 public constant DEFAULT_COMMITTEE_SIZE = 3;

    enum Status {
        None,
        Created,
        Active,
        Ended
    }

    struct Pool {
        address owner;
        Status status;
        uint64 validationWindow;
        address coordinator;
        uint32 members;
        uint64 createdAt;
        uint128 rewardRate;
        uint128 slashAmount;
        uint256 minStake;
        bytes32 specHash;
        string specURI;
        string bootstrap;
    }

    /// @notice Parameters of `createPool`.
    struct PoolParams {
        address coordinator;
        string specURI;
        bytes32 specHash;
        uint128 rewardRate;
        uint64 validationWindow;
        uint128 slashAmount;
        uint256 minStake;
        string bootstrap;
    }

    /// @notice The terms the work ledger needs, without the strings.
    struct PoolTerms {
        address coordinator;
        Status status;
        uint64 validationWindow;
        uint128 rewardRate;
        uint128 slashAmount;
        uint256 minStake;
    }

    /// @notice How a pool settles disputed work (fixed once the pool starts).
    /// @param appealPeriod Seconds a provider has to appeal a hard invalidation before it is final.
    /// @param votePeriod Seconds a committee (or the arbiter) has to decide an appeal or a challenge.
    /// @param committeeSize Validators drawn per dispute (k of the pool's n; majority decides).
    /// @param bond Tokens an accuser, an appellant and a challenger each put up; the loser's goes to the winner.
    /// @param arbiter When set, this address alone decides disputes instead of a committee.
    struct DisputeTerms {
        uint64 appealPeriod;
        uint64 votePeriod;
        uint8 committeeSize;
        uint128 bond;
        address arbiter;
    }

    /// @notice A provider's memberships and the stake they require (see `stakeFloor`): the sum of the
    /// minimum stakes of the distinct pools its nodes are in.
    struct Floor {
        uint32 memberships;
        uint224 stake;
    }

    /// @notice A node's pool and its provider at join time (nodes cannot change provider while in a pool).
    struct Membership {
        uint48 poolId;
        uint48 joinedAt;
        address provider;
    }

    /// @notice The provider registry (node ownership and stake).
    ProviderRegistry public immutable registry;
    /// @notice Number of pools created; pool ids run from 1 to `poolCount`.
    uint256 public poolCount;

    mapping(uint256 => Pool) private _pools;
    mapping(address => Membership) private _membership;
    mapping(uint256 => mapping(uint256 => bool)) private _inviteUsed;
    mapping(uint256 => mapping(address => bool)) private _blacklisted;
    mapping(address => Floor) private _floors;
    mapping(uint256 => DisputeTerms) private _disputeTerms;
    mapping(uint256 => address[]) private _validators;
    mapping(uint256 => mapping(address => uint256)) private _validatorSlot; // index + 1
    /// @dev When each validator was named (parallel to `_validators`).
    mapping(uint256 => uint64[]) private _validatorSince;
    /// @dev Nodes of a provider in a pool (the pool's minimum counts once in the provider's floor).
    mapping(address => mapping(uint256 => uint256)) private _nodesIn;
    /// @notice keccak256(abi.encode(validators, since)) of each pool's current validator set and when
    /// each was named (`validatorEntries`). A dispute keeps the hash of the set it opened under and its
    /// committee is drawn from exactly that set, so the owner cannot pick a committee by editing the
    /// set afterwards.
    mapping(uint256 => bytes32) public validatorSetHash;
    /// @notice Longest appeal or vote period a pool may set (a period locks its providers' stake).
    uint64 public constant MAX_DISPUTE_PERIOD = 90 days;

    event PoolCreated(
        uint256 indexed poolId,
        address indexed owner,
        address indexed coordinator,
        string specURI,
        bytes32 specHash,
        uint128 rewardRate,
        uint64 validationWindow,
        uint128 slashAmount,
        uint256 minStake
    );
    event PoolStarted(uint256 indexed poolId);
    event PoolEnded(uint256 indexed poolId);
    event BootstrapUpdated(uint256 indexed poolId, string bootstrap);
    event NodeJoined(uint256 indexed poolId, address indexed node, address indexed provider, uint256 inviteNonce);
    event NodeLeft(uint256 indexed poolId, address indexed node, address indexed provider);
    event NodeEjected(uint256 indexed poolId, address indexed node, address indexed by);
    event NodeBlacklisted(uint256 indexed poolId, address indexed node, address indexed by);
    event ValidatorAdded(uint256 indexed poolId, address indexed validator);
    event ValidatorRemoved(uint256 indexed poolId, address indexed validator);
    event DisputeTermsSet(
        uint256 indexed poolId, uint64 appealPeriod, uint64 votePeriod, uint8 committeeSize, uint128 bond, address arbiter
    );
    event CoordinatorRotated(uint256 indexed poolId, address indexed previous, address indexed coordinator);

    error ZeroAddress();
    error UnknownPool(uint256 poolId);
    error NotPoolOwner(uint256 poolId, address caller);
    error NotPoolAdmin(uint256 poolId, address caller);
    error WrongPoolStatus(uint256 poolId, Status have, Status need);
    error InviteExpired(uint64 expiry, uint64 nowTime);
    error InviteAlreadyUsed(uint256 poolId, uint256 nonce);
    error BadInviteSignature(address signer, address coordinator);
    error UnknownNode(address node);
    error NotNodeProvider(address node, address caller);
    error AlreadyInPool(address node, uint256 poolId);
    error NotInPool(address node, uint256 poolId);
    error Blacklisted(uint256 poolId, address node);
    error StakeTooLow(uint256 have, uint256 need);
    error AlreadyValidator(uint256 poolId, address validator);
    error NotPoolValidator(uint256 poolId, address validator);
    error TooManyValidators(uint256 poolId, uint256 max);
    error BadDisputeTerms();

    /// @param registry_ The provider registry.
    constructor(ProviderRegistry registry_) EIP712("IntellectPoolManager", "1") {
        if (address(registry_) == address(0)) revert ZeroAddress();
        registry = registry_;
    }

    // ------------------------------------------------------------------ lifecycle

    /// @notice Creates a pool owned by the caller, in status Created.
    /// @param params Terms: coordinator, task spec URI + content hash, reward per work unit,
    /// validation window (0 means 24 h), slash per invalidated record, minimum provider stake to join,
    /// and bootstrap peer addresses for the p2p network (may be empty).
    /// @return poolId The new pool's id.
    function createPool(PoolParams calldata params) external returns (uint256 poolId) {
        if (params.coordinator == address(0)) revert ZeroAddress();
        poolId = ++poolCount;
        uint64 window = params.validationWindow == 0 ? DEFAULT_VALIDATION_WINDOW : params.validationWindow;
        Pool storage p = _pools[poolId];
        p.owner = msg.sender;
        p.status = Status.Created;
        p.validationWindow = window;
        p.coordinator = params.coordinator;
        p.createdAt = uint64(block.timestamp);
        p.rewardRate = params.rewardRate;
        p.slashAmount = params.slashAmount;
        p.minStake = params.minStake;
        p.specHash = params.specHash;
        p.specURI = params.specURI;
        p.bootstrap = params.bootstrap;
        DisputeTerms memory d = DisputeTerms({
            appealPeriod: DEFAULT_APPEAL_PERIOD,
            votePeriod: DEFAULT_VOTE_PERIOD,
            committeeSize: DEFAULT_COMMITTEE_SIZE,
            bond: params.slashAmount,
            arbiter: address(0)
        });
        _disputeTerms[poolId] = d;
        validatorSetHash[poolId] = keccak256(abi.encode(new address[](0), new uint64[](0)));
        emit PoolCreated(
            poolId,
            msg.sender,
            params.coordinator,
            params.specURI,
            params.specHash,
            params.rewardRate,
            window,
            params.slashAmount,
            params.minStake
        );
        if (bytes(params.bootstrap).length != 0) emit BootstrapUpdated(poolId, params.bootstrap);
        emit DisputeTermsSet(poolId, d.appealPeriod, d.votePeriod, d.committeeSize, d.bond, d.arbiter);
    }

    /// @notice Sets how disputes are settled. Only the owner, only before the pool starts: members join
    /// under terms that cannot change under them.
    function setDisputeTerms(uint256 poolId, DisputeTerms calldata d) external {
        Pool storage p = _owned(poolId);
        if (p.status != Status.Created) revert WrongPoolStatus(poolId, p.status, Status.Created);
        if (d.appealPeriod == 0 || d.votePeriod == 0 || d.committeeSize == 0) revert BadDisputeTerms();
        if (d.committeeSize > MAX_POOL_VALIDATORS) revert BadDisputeTerms();
        if (d.appealPeriod > MAX_DISPUTE_PERIOD || d.votePeriod > MAX_DISPUTE_PERIOD) revert BadDisputeTerms();
        _disputeTerms[poolId] = d;
        emit DisputeTermsSet(poolId, d.appealPeriod, d.votePeriod, d.committeeSize, d.bond, d.arbiter);
    }

    /// @notice Names `validator` as one of the pool's validators: it may invalidate the pool's work
    /// recorded from now on and sit on the committees of that work's disputes (`validatorSince`: work
    /// recorded before a validator was named is judged by the validators its members joined under).
    /// Only the owner.
    function addValidator(uint256 poolId, address validator) external {
        _owned(poolId);
        if (validator == address(0)) revert ZeroAddress();
        if (_validatorSlot[poolId][validator] != 0) revert AlreadyValidator(poolId, validator);
        address[] storage vs = _validators[poolId];
        if (vs.length >= MAX_POOL_VALIDATORS) revert TooManyValidators(poolId, MAX_POOL_VALIDATORS);
        vs.push(validator);
        _validatorSince[poolId].push(uint64(block.timestamp));
        _validatorSlot[poolId][validator] = vs.length;
        _rehash(poolId);
        emit ValidatorAdded(poolId, validator);
    }

    /// @notice Removes one of the pool's validators. Only the owner.
    function removeValidator(uint256 poolId, address validator) external {
        _owned(poolId);
        uint256 slot = _validatorSlot[poolId][validator];
        if (slot == 0) revert NotPoolValidator(poolId, validator);
        address[] storage vs = _validators[poolId];
        uint64[] storage since = _validatorSince[poolId];
        uint256 lastIndex = vs.length - 1;
        address last = vs[lastIndex];
        vs[slot - 1] = last;
        since[slot - 1] = since[lastIndex];
        _validatorSlot[poolId][last] = slot;
        vs.pop();
        since.pop();
        delete _validatorSlot[poolId][validator];
        _rehash(poolId);
        emit ValidatorRemoved(poolId, validator);
    }

    /// @notice The owner replaces the pool's coordinator key (a leaked or lost key must not end the
    /// pool). Invites signed by the old key stop working at once.
    function rotateCoordinator(uint256 poolId, address coordinator) external {
        Pool storage p = _owned(poolId);
        if (coordinator == address(0)) revert ZeroAddress();
        address previous = p.coordinator;
        p.coordinator = coordinator;
        emit CoordinatorRotated(poolId, previous, coordinator);
    }

    /// @notice Opens a created pool for joins and work.
    function startPool(uint256 poolId) external {
        Pool storage p = _owned(poolId);
        if (p.status != Status.Created) revert WrongPoolStatus(poolId, p.status, Status.Created);
        p.status = Status.Active;
        emit PoolStarted(poolId);
    }

    /// @notice Ends a created or active pool. Recorded work keeps its deadlines: it can still be
    /// invalidated before them and claimed after them.
    function endPool(uint256 poolId) external {
        Pool storage p = _owned(poolId);
        if (p.status != Status.Active && p.status != Status.Created) {
            revert WrongPoolStatus(poolId, p.status, Status.Active);
        }
        p.status = Status.Ended;
        emit PoolEnded(poolId);
    }

    /// @notice Replaces the pool's bootstrap peer list (comma-separated multiaddrs).
    function setBootstrap(uint256 poolId, string calldata bootstrap) external {
        Pool storage p = _owned(poolId);
        p.bootstrap = bootstrap;
        emit BootstrapUpdated(poolId, bootstrap);
    }

    // ------------------------------------------------------------------ membership

    /// @notice Joins `node` to an active pool with an invite from the pool's coordinator.
    /// The caller must be the node's provider and hold at least the pool's minimum stake.
    /// @param poolId The pool.
    /// @param node The invited node.
    /// @param nonce The invite's nonce (single use per pool).
    /// @param expiry The invite's expiry (unix seconds; the join must happen strictly before).
    /// @param signature The coordinator's EIP-712 signature over the invite.
    function joinPool(uint256 poolId, address node, uint256 nonce, uint64 expiry, bytes calldata signature)
        external
    {
        Pool storage p = _existing(poolId);
        if (p.status != Status.Active) revert WrongPoolStatus(poolId, p.status, Status.Active);
        if (block.timestamp >= expiry) revert InviteExpired(expiry, uint64(block.timestamp));
        if (_inviteUsed[poolId][nonce]) revert InviteAlreadyUsed(poolId, nonce);
        address signer = ECDSA.recover(inviteDigest(poolId, node, nonce, expiry), signature);
        if (signer != p.coordinator) revert BadInviteSignature(signer, p.coordinator);
        address provider = registry.providerOf(node);
        if (provider == address(0)) revert UnknownNode(node);
        if (provider != msg.sender) revert NotNodeProvider(node, msg.sender);
        if (_blacklisted[poolId][node]) revert Blacklisted(poolId, node);
        uint256 current = _membership[node].poolId;
        if (current != 0) revert AlreadyInPool(node, current);
        // The stake must cover this pool's minimum on top of every other pool the provider is in: each
        // pool's minimum is stake that pool alone can slash (registry.unstake keeps it; recording checks it).
        Floor storage f = _floors[provider];
        uint256 need = _nodesIn[provider][poolId] == 0 ? uint256(f.stake) + p.minStake : f.stake;
        uint256 have = registry.stakeOf(provider);
        if (have < need) revert StakeTooLow(have, need);
        _inviteUsed[poolId][nonce] = true;
        _membership[node] = Membership({poolId: uint48(poolId), joinedAt: uint48(block.timestamp), provider: provider});
        p.members += 1;
        f.memberships += 1;
        if (_nodesIn[provider][poolId]++ == 0) f.stake = uint224(need); // need <= stake, which fits
        emit NodeJoined(poolId, node, provider, nonce);
    }

    /// @notice The node's provider takes it out of its pool. Its recorded work stays on the ledger.
    function leavePool(uint256 poolId, address node) external {
        _existing(poolId);
        address provider = registry.providerOf(node);
        if (provider != msg.sender) revert NotNodeProvider(node, msg.sender);
        _remove(poolId, node);
        emit NodeLeft(poolId, node, provider);
    }

    /// @notice The pool's owner or coordinator removes a node from the pool.
    function ejectNode(uint256 poolId, address node) external {
        _administered(poolId);
        _remove(poolId, node);
        emit NodeEjected(poolId, node, msg.sender);
    }

    /// @notice The pool's owner or coordinator bars a node from the pool for good (ejecting it if present).
    function blacklistNode(uint256 poolId, address node) external {
        _administered(poolId);
        _blacklisted[poolId][node] = true;
        if (_membership[node].poolId == poolId) {
            _remove(poolId, node);
            emit NodeEjected(poolId, node, msg.sender);
        }
        emit NodeBlacklisted(poolId, node, msg.sender);
    }

    // ------------------------------------------------------------------ views

    /// @inheritdoc IPoolMembership
    function poolOf(address node) external view returns (uint256) {
        return _membership[node].poolId;
    }

    /// @inheritdoc IPoolMembership
    /// @dev The sum of the minimum stakes of the distinct pools the provider's nodes are in.
    function stakeFloor(address provider) external view returns (uint256) {
        return _floors[provider].stake;
    }

    /// @notice Whether `validator` is one of the pool's validators.
    function isPoolValidator(uint256 poolId, address validator) external view returns (bool) {
        return _validatorSlot[poolId][validator] != 0;
    }

    /// @notice When `validator` was named one of the pool's validators (0: it is not one). It may act
    /// on work recorded at or after that time only.
    function validatorSince(uint256 poolId, address validator) external view returns (uint64) {
        uint256 slot = _validatorSlot[poolId][validator];
        return slot == 0 ? 0 : _validatorSince[poolId][slot - 1];
    }

    /// @notice The pool's validators (at most `MAX_POOL_VALIDATORS`).
    function validatorsOf(uint256 poolId) external view returns (address[] memory) {
        return _validators[poolId];
    }

    /// @notice The pool's validators and when each was named: what `validatorSetHash` hashes, and what
    /// a committee draw is given.
    function validatorEntries(uint256 poolId) external view returns (address[] memory, uint64[] memory) {
        return (_validators[poolId], _validatorSince[poolId]);
    }

    /// @notice How the pool settles disputes.
    function disputeTerms(uint256 poolId) external view returns (DisputeTerms memory) {
        return _disputeTerms[poolId];
    }

    /// @notice A node's membership (pool id 0 when none) and when it joined.
    function membershipOf(address node) external view returns (Membership memory) {
        return _membership[node];
    }

    /// @notice Whether `node` is an active member of `poolId`.
    function isMember(uint256 poolId, address node) external view returns (bool) {
        return poolId != 0 && _membership[node].poolId == poolId;
    }

    /// @notice Whether `node` is barred from `poolId`.
    function isBlacklisted(uint256 poolId, address node) external view returns (bool) {
        return _blacklisted[poolId][node];
    }

    /// @notice Whether an invite nonce of `poolId` has been used.
    function isInviteUsed(uint256 poolId, uint256 nonce) external view returns (bool) {
        return _inviteUsed[poolId][nonce];
    }

    /// @notice Everything about a pool.
    function getPool(uint256 poolId) external view returns (Pool memory) {
        return _pools[poolId];
    }

    /// @notice The terms the work ledger checks, in one call.
    function poolTerms(uint256 poolId) external view returns (PoolTerms memory t) {
        Pool storage p = _pools[poolId];
        t = PoolTerms({
            coordinator: p.coordinator,
            status: p.status,
            validationWindow: p.validationWindow,
            rewardRate: p.rewardRate,
            slashAmount: p.slashAmount,
            minStake: p.minStake
        });
    }

    /// @notice For each node, its provider if it is a member of `poolId`, else the zero address.
    /// @dev One call per work batch instead of two per record.
    function membersProviders(uint256 poolId, address[] calldata nodes)
        external
        view
        returns (address[] memory providers)
    {
        providers = new address[](nodes.length);
        for (uint256 i; i < nodes.length; ++i) {
            Membership storage m = _membership[nodes[i]];
            if (m.poolId == poolId) providers[i] = m.provider;
        }
    }

    /// @notice The EIP-712 digest the coordinator signs for an invite.
    function inviteDigest(uint256 poolId, address node, uint256 nonce, uint64 expiry) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(INVITE_TYPEHASH, poolId, node, nonce, expiry)));
    }

    /// @notice The EIP-712 domain separator of this contract.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // ------------------------------------------------------------------ internals

    function _existing(uint256 poolId) private view returns (Pool storage p) {
        p = _pools[poolId];
        if (p.status == Status.None) revert UnknownPool(poolId);
    }

    function _owned(uint256 poolId) private view returns (Pool storage p) {
        p = _existing(poolId);
        if (p.owner != msg.sender) revert NotPoolOwner(poolId, msg.sender);
    }

    function _administered(uint256 poolId) private view returns (Pool storage p) {
        p = _existing(poolId);
        if (p.owner != msg.sender && p.coordinator != msg.sender) revert NotPoolAdmin(poolId, msg.sender);
    }

    function _remove(uint256 poolId, address node) private {
        Membership memory m = _membership[node];
        if (m.poolId != poolId) revert NotInPool(node, poolId);
        delete _membership[node];
        Pool storage p = _pools[poolId];
        p.members -= 1;
        Floor storage f = _floors[m.provider];
        f.memberships -= 1;
        if (--_nodesIn[m.provider][poolId] == 0) {
            uint256 min = p.minStake;
            f.stake = min >= f.stake ? 0 : f.stake - uint224(min);
        }
    }

    function _rehash(uint256 poolId) private {
        validatorSetHash[poolId] = keccak256(abi.encode(_validators[poolId], _validatorSince[poolId]));
    }
}
