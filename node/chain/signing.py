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


def node_binding_message(provider: str, node: str, chain_id: int, registry: str) -> dict[str, Any]:
    return {
        "types": {
            "NodeBinding": [
                {"name": "provider", "type": "address"},
                {"name": "node", "type": "address"},
                {"name": "chainId", "type": "uint256"},
                {"name": "registry", "type": "address"},
            ]
        },
        "primaryType": "NodeBinding",
        "domain": _domain(REGISTRY_DOMAIN, chain_id, registry),
        "message": {
            "provider": to_checksum_address(provider),
            "node": to_checksum_address(node),
            "chainId": chain_id,
            "registry": to_checksum_address(registry),
        },
    }


def sign_node_binding(node_key: LocalAccount, provider: str, chain_id: int, registry: str) -> str:
    """The node key's signature binding it to `provider` on this chain and registry."""
    msg = encode_typed_data(full_message=node_binding_message(provider, node_key.address, chain_id, registry))
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
