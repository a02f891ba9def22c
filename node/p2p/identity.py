"""A node's libp2p identity is its Ethereum key: the peer id embeds the secp256k1 public key, so any
receiver derives the sender's Ethereum address from it without an extra handshake."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from eth_keys import keys as eth_keys_mod
from eth_utils import to_checksum_address
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.secp256k1 import Secp256k1PublicKey, create_new_key_pair
from libp2p.peer.id import ID

from .errors import P2PError


def identity_from_eth_key(private_key: bytes) -> KeyPair:
    """libp2p secp256k1 key pair from the 32-byte Ethereum private key: one key, one identity."""
    if len(private_key) != 32:
        raise ValueError("expected a 32-byte secp256k1 private key")
    return create_new_key_pair(private_key)


@lru_cache(maxsize=4096)
def address_from_id_bytes(id_bytes: bytes) -> str:
    pub = ID(id_bytes).extract_public_key()
    if not isinstance(pub, Secp256k1PublicKey):
        raise P2PError("peer id does not embed a secp256k1 public key")
    return eth_keys_mod.PublicKey.from_compressed_bytes(pub.to_bytes()).to_checksum_address()


def eth_address_from_peer_id(peer_id: ID | str) -> str:
    """Checksummed Ethereum address of the key embedded in a peer id (cached: called per message)."""
    pid = ID.from_base58(peer_id) if isinstance(peer_id, str) else peer_id
    return address_from_id_bytes(pid.to_bytes())


def safe_address(peer_id: ID) -> str:
    try:
        return eth_address_from_peer_id(peer_id)
    except Exception:
        return f"peer:{peer_id}"


def ban_key(peer: ID | str) -> str:
    """One key for a peer whether named by peer id or Ethereum address: the id embeds the key, so
    it maps to the address; a non-secp256k1 id (never one of ours) is keyed by the id itself."""
    if isinstance(peer, ID):
        return safe_address(peer)
    if peer.startswith(("0x", "0X")) and len(peer) == 42:
        try:
            return to_checksum_address(peer.lower())
        except Exception as exc:
            raise ValueError(f"not an Ethereum address: {peer!r}") from exc
    try:
        return safe_address(ID.from_base58(peer))
    except Exception as exc:
        raise ValueError(f"not a peer id or an Ethereum address: {peer!r}") from exc


def address_set(peers: Sequence[ID]) -> set[str]:
    """Ethereum addresses of a list of peer ids (convenience for membership checks and tests)."""
    return {safe_address(p) for p in peers}
