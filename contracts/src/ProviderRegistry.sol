// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {IPoolMembership} from "./interfaces/IPoolMembership.sol";
import {IStakeLock} from "./interfaces/IStakeLock.sol";

/// @title ProviderRegistry
/// @notice Compute providers, their nodes and their stake.
/// @dev A provider stakes tokens; the stake it must keep grows with the compute units of its nodes.
/// Unstaked tokens wait out an unbonding period before they can be withdrawn, and slashing takes
/// unbonding tokens first, so leaving does not escape a pending penalty. For every provider
/// `deposited == staked + unbonding + withdrawn + slashed` holds at all times.
/// The work ledger holds `SLASHER_ROLE`. (Validators are named per pool, by its owner, in the pool manager.)
contract ProviderRegistry is AccessControl, EIP712 {
    using SafeERC20 for IERC20;

    /// @notice May slash stake (granted to the work ledger).
    bytes32 public constant SLASHER_ROLE = keccak256("SLASHER_ROLE");
    /// @notice EIP-712 type signed by a node key to bind the node to a provider on one chain and registry.
    /// The nonce (`bindingNonce`, bumped by every binding) makes each signature good for one binding:
    /// a provider that once held a node cannot bind it again with the old signature.
    bytes32 public constant NODE_BINDING_TYPEHASH =
        keccak256("NodeBinding(address provider,address node,uint256 nonce,uint256 chainId,address registry)");
    /// @notice Upper bound for the validator bounty share, in basis points.
    uint16 public constant MAX_BOUNTY_BPS = 5_000;

    struct Provider {
        bool registered;
        uint32 nodeCount;
        uint64 computeUnits;
        uint64 unbondingEnd;
        uint256 staked;
        uint256 unbonding;
        uint256 deposited;
        uint256 withdrawn;
        uint256 slashed;
    }

    struct Node {
        address provider;
        uint64 computeUnits;
        uint64 addedAt;
    }

    /// @notice The stake and reward token.
    IERC20 public immutable token;
    /// @notice Receives slashed stake minus the validator bounty.
    address public treasury;
    /// @notice Consulted before a node is removed; set once by the admin.
    IPoolMembership public poolManager;
    /// @notice Consulted before a withdrawal (the work ledger: stake stays until the provider's recorded
    /// work can no longer be slashed); set once by the admin.
    IStakeLock public stakeLock;
    /// @notice Seconds between unstaking and withdrawing.
    uint64 public unbondingPeriod;
    /// @notice Stake a provider must keep per compute unit of its nodes.
    uint256 public stakePerComputeUnit;
    /// @notice Smallest stake accepted at registration.
    uint256 public minProviderStake;
    /// @notice Share of a slash paid to the reporting validator, in basis points.
    uint16 public bountyBps;
    /// @notice Absolute cap on one validator bounty.
    uint256 public maxBounty;

    /// @notice Sum of `staked` over all providers.
    uint256 public totalStaked;
    /// @notice Sum of `unbonding` over all providers.
    uint256 public totalUnbonding;

    mapping(address => Provider) private _providers;
    mapping(address => Node) private _nodes;
    /// @notice Bindings made so far per node key: the nonce its next binding signature must carry.
    mapping(address => uint256) public bindingNonce;

    event ProviderRegistered(address indexed provider, uint256 stake);
    event Staked(address indexed provider, uint256 amount, uint256 staked);
    event UnstakeRequested(address indexed provider, uint256 amount, uint256 unbonding, uint64 unbondingEnd);
    event Withdrawn(address indexed provider, uint256 amount);
    event NodeAdded(address indexed provider, address indexed node, uint64 computeUnits);
    event NodeRemoved(address indexed provider, address indexed node, uint64 computeUnits);
    event Slashed(
        address indexed provider,
        address indexed validator,
        bytes32 indexed reason,
        uint256 amount,
        uint256 fromUnbonding,
        uint256 fromStaked,
        uint256 bounty
    );
    event TreasuryUpdated(address treasury);
    event PoolManagerSet(address poolManager);
    event StakeLockSet(address stakeLock);
    event ParametersUpdated(
        uint64 unbondingPeriod, uint256 stakePerComputeUnit, uint256 minProviderStake, uint16 bountyBps, uint256 maxBounty
    );

    error ZeroAddress();
    error ZeroAmount();
    error AlreadyRegistered(address provider);
    error NotRegistered(address provider);
    error StakeTooLow(uint256 have, uint256 need);
    error InsufficientStake(uint256 staked, uint256 requested);
    error NothingUnbonding(address provider);
    error StillUnbonding(uint64 unbondingEnd, uint64 nowTime);
    error StakeLocked(uint64 lockedUntil, uint64 nowTime);
    error StakeLockAlreadySet(address stakeLock);
    error NodeAlreadyRegistered(address node, address provider);
    error UnknownNode(address node);
    error NotNodeProvider(address node, address caller);
    error NodeInPool(address node, uint256 poolId);
    error BadNodeSignature(address node, address recovered);
    error ZeroComputeUnits();
    error BountyTooHigh(uint16 bountyBps);
    error PoolManagerAlreadySet(address poolManager);

    /// @param token_ Stake token.
    /// @param admin Governance: may grant roles and change parameters.
    /// @param treasury_ Receives slashed stake.
    /// @param unbondingPeriod_ Seconds before unstaked tokens can be withdrawn.
    /// @param stakePerComputeUnit_ Stake needed per compute unit.
    /// @param minProviderStake_ Minimum stake at registration.
    constructor(
        IERC20 token_,
        address admin,
        address treasury_,
        uint64 unbondingPeriod_,
        uint256 stakePerComputeUnit_,
        uint256 minProviderStake_
    ) EIP712("IntellectProviderRegistry", "1") {
        if (address(token_) == address(0) || admin == address(0) || treasury_ == address(0)) revert ZeroAddress();
        token = token_;
        treasury = treasury_;
        unbondingPeriod = unbondingPeriod_;
        stakePerComputeUnit = stakePerComputeUnit_;
        minProviderStake = minProviderStake_;
        bountyBps = 1_000;
        maxBounty = type(uint256).max;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        emit TreasuryUpdated(treasury_);
        emit ParametersUpdated(unbondingPeriod_, stakePerComputeUnit_, minProviderStake_, 1_000, type(uint256).max);
    }

    // ------------------------------------------------------------------ providers

    /// @notice Registers the caller as a provider with an initial stake (needs a prior token approval).
    /// @param amount Initial stake; at least `minProviderStake`.
    function registerProvider(uint256 amount) external {
        Provider storage p = _providers[msg.sender];
        if (p.registered) revert AlreadyRegistered(msg.sender);
        if (amount < minProviderStake || amount == 0) revert StakeTooLow(amount, _max(minProviderStake, 1));
        p.registered = true;
        p.staked = amount;
        p.deposited = amount;
        totalStaked += amount;
        emit ProviderRegistered(msg.sender, amount);
        emit Staked(msg.sender, amount, amount);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @notice Adds stake to the caller's provider account (needs a prior token approval).
    /// @param amount Tokens to add.
    function stake(uint256 amount) external {
        Provider storage p = _registered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        p.staked += amount;
        p.deposited += amount;
        totalStaked += amount;
        emit Staked(msg.sender, amount, p.staked);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @notice Moves stake into unbonding; the unbonding timer restarts with every request.
    /// @param amount Tokens to unstake; what stays staked must cover the provider's compute units and
    /// the minimum stake of the pools its nodes are in (`requiredStake`).
    function unstake(uint256 amount) external {
        Provider storage p = _registered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        if (amount > p.staked) revert InsufficientStake(p.staked, amount);
        uint256 need = requiredStake(msg.sender);
        if (p.staked - amount < need) revert StakeTooLow(p.staked - amount, need);
        p.staked -= amount;
        p.unbonding += amount;
        totalStaked -= amount;
        totalUnbonding += amount;
        uint64 end = uint64(block.timestamp) + unbondingPeriod;
        p.unbondingEnd = end;
        emit UnstakeRequested(msg.sender, amount, p.unbonding, end);
    }

    /// @notice Withdraws all unbonding tokens once the unbonding period is over and no recorded work of
    /// the provider can still be invalidated (the stake lock), so leaving never escapes a slash.
    function withdraw() external {
        Provider storage p = _registered(msg.sender);
        uint256 amount = p.unbonding;
        if (amount == 0) revert NothingUnbonding(msg.sender);
        if (block.timestamp < p.unbondingEnd) revert StillUnbonding(p.unbondingEnd, uint64(block.timestamp));
        if (address(stakeLock) != address(0)) {
            uint64 until = stakeLock.lockedUntil(msg.sender);
            if (block.timestamp < until) revert StakeLocked(until, uint64(block.timestamp));
        }
        p.unbonding = 0;
        p.withdrawn += amount;
        totalUnbonding -= amount;
        emit Withdrawn(msg.sender, amount);
        token.safeTransfer(msg.sender, amount);
    }

    // ------------------------------------------------------------------ nodes

    /// @notice Binds `node` to the caller. The node key signs the EIP-712 `NodeBinding`
    /// (provider, node, chain id, this registry), so nobody can claim another's node.
    /// @param node The node's address (its key signs gossip messages).
    /// @param computeUnits The node's declared compute units; the provider's stake must cover them.
    /// @param signature The node key's signature over the binding.
    function addNode(address node, uint64 computeUnits, bytes calldata signature) external {
        Provider storage p = _registered(msg.sender);
        if (node == address(0)) revert ZeroAddress();
        if (computeUnits == 0) revert ZeroComputeUnits();
        address current = _nodes[node].provider;
        if (current != address(0)) revert NodeAlreadyRegistered(node, current);
        address signer = ECDSA.recover(nodeBindingDigest(msg.sender, node), signature);
        if (signer != node) revert BadNodeSignature(node, signer);
        bindingNonce[node] += 1;
        uint256 need = (uint256(p.computeUnits) + computeUnits) * stakePerComputeUnit;
        if (p.staked < need) revert StakeTooLow(p.staked, need);
        p.computeUnits += computeUnits;
        p.nodeCount += 1;
        _nodes[node] = Node({provider: msg.sender, computeUnits: computeUnits, addedAt: uint64(block.timestamp)});
        emit NodeAdded(msg.sender, node, computeUnits);
    }

    /// @notice Unbinds a node that is in no pool, freeing the stake its compute units required. Not
    /// while the provider's stake is locked (`stakeLock`): a slash needs the node's signature over the
    /// work and checks the node is still the provider's, so the binding lasts as long as any of the
    /// provider's work can still be disputed.
    /// @param node The node to remove.
    function removeNode(address node) external {
        Node memory n = _nodes[node];
        if (n.provider == address(0)) revert UnknownNode(node);
        if (n.provider != msg.sender) revert NotNodeProvider(node, msg.sender);
        if (address(poolManager) != address(0)) {
            uint256 poolId = poolManager.poolOf(node);
            if (poolId != 0) revert NodeInPool(node, poolId);
        }
        if (address(stakeLock) != address(0)) {
            uint64 until = stakeLock.lockedUntil(msg.sender);
            if (block.timestamp < until) revert StakeLocked(until, uint64(block.timestamp));
        }
        Provider storage p = _providers[msg.sender];
        p.computeUnits -= n.computeUnits;
        p.nodeCount -= 1;
        delete _nodes[node];
        emit NodeRemoved(msg.sender, node, n.computeUnits);
    }

    // ------------------------------------------------------------------ slashing

    /// @notice Slashes up to `amount` of `provider`'s stake, unbonding tokens first. The validator gets
    /// `min(slashed * bountyBps / 10000, maxBounty)`, the treasury the rest; with no validator (the zero
    /// address: a slash no vote decided) the treasury gets it all.
    /// @param provider Provider to slash.
    /// @param amount Requested amount; less is taken if the provider holds less.
    /// @param validator Reporting validator (bounty recipient), or the zero address for no bounty.
    /// @param reason An identifier of the offence (the work key).
    /// @return slashed The amount actually taken.
    /// @return bounty The part of it paid to the validator.
    function slash(address provider, uint256 amount, address validator, bytes32 reason)
        external
        onlyRole(SLASHER_ROLE)
        returns (uint256 slashed, uint256 bounty)
    {
        Provider storage p = _providers[provider];
        uint256 fromUnbonding = amount < p.unbonding ? amount : p.unbonding;
        uint256 rest = amount - fromUnbonding;
        uint256 fromStaked = rest < p.staked ? rest : p.staked;
        slashed = fromUnbonding + fromStaked;
        if (slashed != 0) {
            p.unbonding -= fromUnbonding;
            p.staked -= fromStaked;
            p.slashed += slashed;
            totalUnbonding -= fromUnbonding;
            totalStaked -= fromStaked;
            if (validator != address(0)) {
                bounty = slashed * bountyBps / 10_000;
                if (bounty > maxBounty) bounty = maxBounty;
            }
        }
        emit Slashed(provider, validator, reason, slashed, fromUnbonding, fromStaked, bounty);
        if (bounty != 0) token.safeTransfer(validator, bounty);
        if (slashed - bounty != 0) token.safeTransfer(treasury, slashed - bounty);
    }

    // ------------------------------------------------------------------ governance

    /// @notice Sets the pool manager consulted by `removeNode`. Once only.
    /// @param pm The pool manager.
    function setPoolManager(IPoolMembership pm) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (address(pm) == address(0)) revert ZeroAddress();
        if (address(poolManager) != address(0)) revert PoolManagerAlreadySet(address(poolManager));
        poolManager = pm;
        emit PoolManagerSet(address(pm));
    }

    /// @notice Sets the stake lock consulted by `withdraw` (the work ledger). Once only.
    /// @param lock The stake lock.
    function setStakeLock(IStakeLock lock) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (address(lock) == address(0)) revert ZeroAddress();
        if (address(stakeLock) != address(0)) revert StakeLockAlreadySet(address(stakeLock));
        stakeLock = lock;
        emit StakeLockSet(address(lock));
    }

    /// @notice Changes the treasury.
    /// @param treasury_ The new treasury.
    function setTreasury(address treasury_) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (treasury_ == address(0)) revert ZeroAddress();
        treasury = treasury_;
        emit TreasuryUpdated(treasury_);
    }

    /// @notice Changes the staking parameters.
    /// @param unbondingPeriod_ Seconds between unstake and withdraw.
    /// @param stakePerComputeUnit_ Stake needed per compute unit.
    /// @param minProviderStake_ Minimum stake at registration.
    /// @param bountyBps_ Validator share of a slash (at most `MAX_BOUNTY_BPS`).
    /// @param maxBounty_ Cap on one bounty.
    function setParameters(
        uint64 unbondingPeriod_,
        uint256 stakePerComputeUnit_,
        uint256 minProviderStake_,
        uint16 bountyBps_,
        uint256 maxBounty_
    ) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (bountyBps_ > MAX_BOUNTY_BPS) revert BountyTooHigh(bountyBps_);
        unbondingPeriod = unbondingPeriod_;
        stakePerComputeUnit = stakePerComputeUnit_;
        minProviderStake = minProviderStake_;
        bountyBps = bountyBps_;
        maxBounty = maxBounty_;
        emit ParametersUpdated(unbondingPeriod_, stakePerComputeUnit_, minProviderStake_, bountyBps_, maxBounty_);
    }

    // ------------------------------------------------------------------ views

    /// @notice The EIP-712 digest a node key signs to bind itself to `provider` (with its current nonce).
    function nodeBindingDigest(address provider, address node) public view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(abi.encode(NODE_BINDING_TYPEHASH, provider, node, bindingNonce[node], block.chainid, address(this)))
        );
    }

    /// @notice A provider's full account.
    function getProvider(address provider) external view returns (Provider memory) {
        return _providers[provider];
    }

    /// @notice A node's binding.
    function getNode(address node) external view returns (Node memory) {
        return _nodes[node];
    }

    /// @notice The provider a node is bound to, or the zero address.
    function providerOf(address node) external view returns (address) {
        return _nodes[node].provider;
    }

    /// @notice A provider's current stake (not counting unbonding tokens).
    function stakeOf(address provider) external view returns (uint256) {
        return _providers[provider].staked;
    }

    /// @notice Stake a provider must keep: enough for the compute units of its nodes, and at least the
    /// minimum stake of the pools its nodes are in.
    function requiredStake(address provider) public view returns (uint256 need) {
        need = uint256(_providers[provider].computeUnits) * stakePerComputeUnit;
        if (address(poolManager) != address(0)) need = _max(need, poolManager.stakeFloor(provider));
    }

    /// @notice The EIP-712 domain separator of this registry.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // ------------------------------------------------------------------ internals

    function _registered(address provider) private view returns (Provider storage p) {
        p = _providers[provider];
        if (!p.registered) revert NotRegistered(provider);
    }

    function _max(uint256 a, uint256 b) private pure returns (uint256) {
        return a > b ? a : b;
    }
}
