"""EIP-712 messages the contracts check: node bindings and pool invites. Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

REGISTRY_DOMAIN = ("IntellectProviderRegistry", "1")
POOLS_DOMAIN = ("IntellectPoolManager", "1")


def _domain(name_version: tuple[str, str], chain_id: int, contract: str) -> dict[str, Any]:
    return {
        "name": name_version[0],
        "version": name_version[1],
        "chainId": chain_id,
        "verifyingContract": to_checksum_address(contract),
    }


def node_binding_message(provider: str, node: str, nonce: int, chain_id: int, registry: str) -> dict[str, Any]:
    return {
        "types": {
            "NodeBinding": [
                {"name": "provider", "type": "address"},
                {"name": "node", "type": "address"},
                {"name": "nonce", "type": "uint256"},
                {"name": "chainId", "type": "uint256"},
                {"name": "registry", "type": "address"},
            ]
        },
        "primaryType": "NodeBinding",
        "domain": _domain(REGISTRY_DOMAIN, chain_id, registry),
        "message": {
            "provider": to_checksum_address(provider),
            "node": to_checksum_address(node),
            "nonce": nonce,
            "chainId": chain_id,
            "registry": to_checksum_address(registry),
        },
    }


def sign_node_binding(node_key: LocalAccount, provider: str, nonce: int, chain_id: int, registry: str) -> str:
    """The node key's signature binding it to `provider` on this chain and registry, for its `nonce`-th
    binding (the registry's `bindingNonce`: a signature is good for one binding only)."""
    msg = encode_typed_data(full_message=node_binding_message(provider, node_key.address, nonce, chain_id, registry))
    return "0x" + bytes(node_key.sign_message(msg).signature).hex()


@dataclass(frozen=True)
class Invite:
    """A single-use, expiring invite for one node to one pool, signed by the pool's coordinator."""

    pool_id: int
    node: str
    nonce: int
    expiry: int
    chain_id: int
    pool_manager: str
    signature: str = ""

    def message(self) -> dict[str, Any]:
        return {
            "types": {
                "Invite": [
                    {"name": "poolId", "type": "uint256"},
                    {"name": "node", "type": "address"},
                    {"name": "nonce", "type": "uint256"},
                    {"name": "expiry", "type": "uint64"},
                ]
            },
            "primaryType": "Invite",
            "domain": _domain(POOLS_DOMAIN, self.chain_id, self.pool_manager),
            "message": {
                "poolId": self.pool_id,
                "node": to_checksum_address(self.node),
                "nonce": self.nonce,
                "expiry": self.expiry,
            },
        }

    def signed_by(self, coordinator: LocalAccount) -> Invite:
        sig = coordinator.sign_message(encode_typed_data(full_message=self.message())).signature
        return Invite(**{**asdict(self), "signature": "0x" + bytes(sig).hex()})

    def signer(self) -> str:
        """The address that signed this invite (checked locally before spending gas on a join)."""
        return str(Account.recover_message(encode_typed_data(full_message=self.message()), signature=self.signature))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Invite:
        try:
            return cls(
                pool_id=int(data["pool_id"]),
                node=to_checksum_address(data["node"]),
                nonce=int(data["nonce"]),
                expiry=int(data["expiry"]),
                chain_id=int(data["chain_id"]),
                pool_manager=to_checksum_address(data["pool_manager"]),
                signature=str(data["signature"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed invite: {exc}") from None


LEDGER_DOMAIN = ("IntellectWorkLedger", "1")


@dataclass(frozen=True)
class RolloutClaim:
    """A node's statement "I made the rollout file with this work key for this pool", bound to one chain
    and one work ledger. The node signs it when it builds the file; the coordinator checks it before it
    accepts the file, and a validator checks it before it invalidates: a file without it was never
    shown to be the node's, so nobody is slashed for it."""

    work_key: str
    pool_id: int
    chain_id: int
    ledger: str

    def message(self) -> dict[str, Any]:
        return {
            "types": {
                "Rollout": [
                    {"name": "workKey", "type": "bytes32"},
                    {"name": "poolId", "type": "uint256"},
                ]
            },
            "primaryType": "Rollout",
            "domain": _domain(LEDGER_DOMAIN, self.chain_id, self.ledger),
            "message": {"workKey": bytes.fromhex(self.work_key.removeprefix("0x")), "poolId": self.pool_id},
        }

    def sign(self, node_key: LocalAccount) -> str:
        sig = node_key.sign_message(encode_typed_data(full_message=self.message())).signature
        return "0x" + bytes(sig).hex()

    def signer(self, signature: Any) -> str | None:
        """The address that signed, or None for anything that is not a well-formed signature."""
        if not isinstance(signature, str) or len(signature) != 132 or not signature.startswith("0x"):
            return None
        try:
            msg = encode_typed_data(full_message=self.message())
            return str(Account.recover_message(msg, signature=signature))
        except Exception:  # malformed bytes, s out of range, bad v: not a signature
            return None

    def signed_by(self, signature: Any, node: str) -> bool:
        who = self.signer(signature)
        return who is not None and who.lower() == node.lower()
