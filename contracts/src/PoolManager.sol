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

    /// @notice A provider's memberships and the stake they require (see `stakeFloor`).
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
        uint256 have = registry.stakeOf(provider);
        if (have < p.minStake) revert StakeTooLow(have, p.minStake);
        _inviteUsed[poolId][nonce] = true;
        _membership[node] = Membership({poolId: uint48(poolId), joinedAt: uint48(block.timestamp), provider: provider});
        p.members += 1;
        // The provider may not unstake below the highest minimum among its pools (registry.unstake asks).
        // O(1): the floor only falls when the provider's last membership ends.
        Floor storage f = _floors[provider];
        f.memberships += 1;
        uint224 min = p.minStake > type(uint224).max ? type(uint224).max : uint224(p.minStake);
        if (min > f.stake) f.stake = min;
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
    function stakeFloor(address provider) external view returns (uint256) {
        return _floors[provider].stake;
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
        _pools[poolId].members -= 1;
        Floor storage f = _floors[m.provider];
        f.memberships -= 1;
        if (f.memberships == 0) f.stake = 0;
    }
}
