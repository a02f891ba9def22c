// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {Test} from "./Test.sol";
import {IntellectToken} from "../../src/IntellectToken.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {PoolManager} from "../../src/PoolManager.sol";
import {WorkLedger} from "../../src/WorkLedger.sol";

/// @notice Deploys the four contracts wired together, plus helpers to sign node bindings and invites,
/// register providers with nodes, join pools and record work.
abstract contract Fixture is Test {
    // ------------------------------------------------------------------ parameters
    uint64 internal constant UNBONDING = 7 days;
    uint256 internal constant STAKE_PER_CU = 10e18;
    uint256 internal constant MIN_STAKE = 100e18;

    uint64 internal constant WINDOW = 1 days;
    uint128 internal constant RATE = 1e12;
    uint128 internal constant SLASH = 50e18;
    uint256 internal constant POOL_MIN_STAKE = 100e18;
    string internal constant SPEC_URI = "ipfs://bafyspec";
    bytes32 internal constant SPEC_HASH = keccak256("spec");
    string internal constant BOOTSTRAP = "/ip4/127.0.0.1/tcp/4001/p2p/QmBoot";

    // ------------------------------------------------------------------ actors
    address internal constant ADMIN = address(0xAD);
    address internal constant TREASURY = address(0x7EA5);
    address internal constant VALIDATOR = address(0xBA11);
    address internal constant POOL_OWNER = address(0x0B0B);
    address internal constant FUNDER = address(0xF00D);
    address internal constant ALICE = address(0xA1);
    address internal constant BOB = address(0xB0);
    address internal constant CAROL = address(0xCA);
    address internal constant STRANGER = address(0x5757);
    /// @dev Validators of every fixture pool besides VALIDATOR: its committees are drawn from these.
    address internal constant JUROR1 = address(0x1A01);
    address internal constant JUROR2 = address(0x1A02);
    address internal constant JUROR3 = address(0x1A03);

    uint256 internal constant COORD_PK = 0xC0C0;
    uint256 internal constant OTHER_PK = 0xBADBAD;
    uint256 internal constant NODE1_PK = 0x1001;
    uint256 internal constant NODE2_PK = 0x1002;
    uint256 internal constant NODE3_PK = 0x1003;

    address internal COORD;

    // ------------------------------------------------------------------ contracts
    IntellectToken internal token;
    ProviderRegistry internal registry;
    PoolManager internal pools;
    WorkLedger internal ledger;

    bytes32 internal SLASHER_ROLE;

    uint256 internal _nextNonce = 1;
    uint256 internal _nextKey = 1;
    /// @dev Node keys by address (set by `_addNode`), and each recorded work key's node (by `_record`):
    /// what `_rolloutSig` signs with.
    mapping(address => uint256) internal _pkOf;
    mapping(uint256 => mapping(bytes32 => address)) internal _nodeOfWork;

    function setUp() public virtual {
        COORD = vm.addr(COORD_PK);
        token = new IntellectToken(address(this));
        registry = new ProviderRegistry(IERC20(address(token)), ADMIN, TREASURY, UNBONDING, STAKE_PER_CU, MIN_STAKE);
        pools = new PoolManager(registry);
        ledger = new WorkLedger(IERC20(address(token)), registry, pools);
        SLASHER_ROLE = registry.SLASHER_ROLE();
        vm.startPrank(ADMIN);
        registry.setPoolManager(pools);
        registry.setStakeLock(ledger);
        registry.grantRole(SLASHER_ROLE, address(ledger));
        vm.stopPrank();
        vm.label(address(token), "token");
        vm.label(address(registry), "registry");
        vm.label(address(pools), "pools");
        vm.label(address(ledger), "ledger");
    }

    // ------------------------------------------------------------------ signatures

    function _sign(uint256 pk, bytes32 digest) internal pure returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(pk, digest);
        return abi.encodePacked(r, s, v);
    }

    uint256 internal constant SECP256K1_N =
        115792089237316195423570985008687907852837564279074904382605163141518161494337;

    /// @dev The same signature in its malleable high-s form (s' = n - s, v flipped): it recovers the
    /// same signer through raw ecrecover, but OpenZeppelin's ECDSA must refuse it.
    function _highS(bytes memory sig) internal pure returns (bytes memory, bytes32 highS) {
        bytes32 r;
        bytes32 s;
        uint8 v;
        assembly {
            r := mload(add(sig, 0x20))
            s := mload(add(sig, 0x40))
            v := byte(0, mload(add(sig, 0x60)))
        }
        highS = bytes32(SECP256K1_N - uint256(s));
        return (abi.encodePacked(r, highS, v == 27 ? uint8(28) : uint8(27)), highS);
    }

    /// @dev ecrecover of a 65-byte (r, s, v) signature, to name the signer an error will report.
    function _recover(bytes32 digest, bytes memory sig) internal pure returns (address) {
        bytes32 r;
        bytes32 s;
        uint8 v;
        assembly {
            r := mload(add(sig, 0x20))
            s := mload(add(sig, 0x40))
            v := byte(0, mload(add(sig, 0x60)))
        }
        return ecrecover(digest, v, r, s);
    }

    /// @dev The node key's EIP-712 signature binding `vm.addr(nodePk)` to `provider`.
    function _nodeSig(uint256 nodePk, address provider) internal view returns (bytes memory) {
        return _sign(nodePk, registry.nodeBindingDigest(provider, vm.addr(nodePk)));
    }

    /// @dev The coordinator's EIP-712 invite signature (signed by `signerPk`).
    function _inviteSig(uint256 signerPk, uint256 poolId, address node, uint256 nonce, uint64 expiry)
        internal
        view
        returns (bytes memory)
    {
        return _sign(signerPk, pools.inviteDigest(poolId, node, nonce, expiry));
    }

    // ------------------------------------------------------------------ providers and nodes

    /// @dev Mints `amount` to `who` and approves the registry and the ledger for everything.
    function _give(address who, uint256 amount) internal {
        token.mint(who, amount);
        vm.startPrank(who);
        token.approve(address(registry), type(uint256).max);
        token.approve(address(ledger), type(uint256).max);
        vm.stopPrank();
    }

    function _registerProvider(address provider, uint256 amount) internal {
        _give(provider, amount);
        vm.prank(provider);
        registry.registerProvider(amount);
    }

    function _addNode(address provider, uint256 nodePk, uint64 computeUnits) internal returns (address node) {
        node = vm.addr(nodePk);
        _pkOf[node] = nodePk;
        bytes memory sig = _nodeSig(nodePk, provider);
        vm.prank(provider);
        registry.addNode(node, computeUnits, sig);
    }

    // ------------------------------------------------------------------ pools

    function _params() internal view returns (PoolManager.PoolParams memory) {
        return PoolManager.PoolParams({
            coordinator: COORD,
            specURI: SPEC_URI,
            specHash: SPEC_HASH,
            rewardRate: RATE,
            validationWindow: WINDOW,
            slashAmount: SLASH,
            minStake: POOL_MIN_STAKE,
            bootstrap: BOOTSTRAP
        });
    }

    /// @dev Creates a pool owned by POOL_OWNER with VALIDATOR and three jurors as its validators, an
    /// appeal and a vote period of one day, committees of three, and no bond (tests of bonds set one).
    function _createPool(PoolManager.PoolParams memory p) internal returns (uint256 poolId) {
        vm.startPrank(POOL_OWNER);
        poolId = pools.createPool(p);
        pools.setDisputeTerms(poolId, PoolManager.DisputeTerms(1 days, 1 days, 3, 0, address(0)));
        pools.addValidator(poolId, VALIDATOR);
        pools.addValidator(poolId, JUROR1);
        pools.addValidator(poolId, JUROR2);
        pools.addValidator(poolId, JUROR3);
        vm.stopPrank();
    }

    function _createActivePool(PoolManager.PoolParams memory p) internal returns (uint256 poolId) {
        poolId = _createPool(p);
        vm.prank(POOL_OWNER);
        pools.startPool(poolId);
    }

    function _createActivePool() internal returns (uint256 poolId) {
        return _createActivePool(_params());
    }

    /// @dev Joins the node of `nodePk` (already bound to `provider`) with a fresh invite from `coordPk`.
    function _join(uint256 poolId, address provider, uint256 nodePk, uint256 coordPk) internal returns (uint256 nonce) {
        address node = vm.addr(nodePk);
        nonce = _nextNonce++;
        uint64 expiry = uint64(block.timestamp + 1 hours);
        bytes memory sig = _inviteSig(coordPk, poolId, node, nonce, expiry);
        vm.prank(provider);
        pools.joinPool(poolId, node, nonce, expiry, sig);
    }

    function _join(uint256 poolId, address provider, uint256 nodePk) internal returns (uint256) {
        return _join(poolId, provider, nodePk, COORD_PK);
    }

    /// @dev Registers `provider` (if needed, with `stakeAmount`), binds the node of `nodePk` with one
    /// compute unit and joins it to `poolId`.
    function _member(uint256 poolId, address provider, uint256 nodePk, uint256 stakeAmount)
        internal
        returns (address node)
    {
        if (!registry.getProvider(provider).registered) _registerProvider(provider, stakeAmount);
        node = _addNode(provider, nodePk, 1);
        _join(poolId, provider, nodePk);
    }

    // ------------------------------------------------------------------ work

    function _newKey() internal returns (bytes32) {
        return keccak256(abi.encode("work", _nextKey++));
    }

    function _work(address node, bytes32 key, uint48 units) internal pure returns (WorkLedger.WorkInput memory) {
        return WorkLedger.WorkInput({
            node: node,
            workKey: key,
            units: units,
            policyVersion: 7,
            proofCommitment: keccak256(abi.encode("proof", key))
        });
    }

    function _batch1(address node, bytes32 key, uint48 units) internal pure returns (WorkLedger.WorkInput[] memory b) {
        b = new WorkLedger.WorkInput[](1);
        b[0] = _work(node, key, units);
    }

    function _record(uint256 poolId, WorkLedger.WorkInput[] memory batch) internal {
        for (uint256 i; i < batch.length; ++i) {
            _nodeOfWork[poolId][batch[i].workKey] = batch[i].node;
        }
        vm.prank(COORD);
        ledger.recordWork(poolId, batch);
    }

    /// @dev Records one record for `node` with a fresh key and returns the key.
    function _recordOne(uint256 poolId, address node, uint48 units) internal returns (bytes32 key) {
        key = _newKey();
        _record(poolId, _batch1(node, key, units));
    }

    function _fundPool(uint256 poolId, uint256 amount) internal {
        _give(FUNDER, amount);
        vm.prank(FUNDER);
        ledger.fundPool(poolId, amount);
    }

    function _keys1(bytes32 k) internal pure returns (bytes32[] memory ks) {
        ks = new bytes32[](1);
        ks[0] = k;
    }

    function _claim(uint256 poolId, address provider, bytes32 key) internal returns (uint256) {
        vm.prank(provider);
        return ledger.claim(poolId, _keys1(key));
    }

    function _invalidate(uint256 poolId, bytes32 key) internal {
        _slashNow(poolId, key, keccak256("evidence"));
    }

    /// @dev VALIDATOR hard-invalidates `key`, nobody appeals, and the invalidation is made final at the
    /// end of the appeal period; the clock then goes back to where it was.
    function _slashNow(uint256 poolId, bytes32 key, bytes32 evidence) internal {
        uint256 t = block.timestamp;
        // Signed first: the prank is for the next call, and `_rolloutSig` calls the ledger.
        bytes memory sig = _rolloutSig(poolId, key);
        vm.prank(VALIDATOR);
        ledger.invalidateWork(poolId, key, evidence, true, sig);
        vm.warp(ledger.getDispute(poolId, key).appealEnd);
        ledger.finalizeInvalidation(poolId, key);
        vm.warp(t);
    }

    /// @dev The recorded node's EIP-712 `Rollout` signature over `key` in `poolId` (what its file carries).
    function _rolloutSig(uint256 poolId, bytes32 key) internal view returns (bytes memory) {
        uint256 pk = _pkOf[_nodeOfWork[poolId][key]];
        require(pk != 0, "no node key for this work");
        return _sign(pk, ledger.rolloutDigest(poolId, key));
    }

    /// @dev Draws the committee of `key`'s open vote from the pool's current validator set (right when
    /// the set did not change since the dispute opened).
    function _draw(uint256 poolId, bytes32 key) internal {
        (address[] memory vs, uint64[] memory since) = pools.validatorEntries(poolId);
        ledger.drawCommittee(poolId, key, vs, since);
    }

    /// @dev Whether a record is final: pending and at or past its deadline, hence claimable.
    function _isClaimable(uint256 poolId, bytes32 key) internal view returns (bool) {
        WorkLedger.Record memory r = ledger.getRecord(poolId, key);
        return r.status == WorkLedger.RecordStatus.Pending && block.timestamp >= r.deadline;
    }
}
