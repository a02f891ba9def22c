"""Checked arguments of the protocol's calls: addresses, 32-byte values, a token balance."""

from __future__ import annotations

from eth_utils import to_checksum_address

from .client import ChainClient
from .errors import ChainError
from .messages import tokens


def checksum(addr: str, what: str = "address") -> str:
    try:
        return to_checksum_address(addr)
    except ValueError:
        raise ChainError(
            f"{what} {addr!r} is not an Ethereum address", "use a 0x-prefixed 40-hex-digit address"
        ) from None


def fixed_bytes(value: str, size: int, what: str = "value") -> bytes:
    """`value` as exactly `size` bytes of (0x-prefixed or bare) hex, else a ChainError naming `what`."""
    try:
        raw = bytes.fromhex(value.removeprefix("0x"))
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise ChainError(f"{what} {value!r} is not {size} bytes of hex", f"use 0x followed by {2 * size} hex digits")
    return raw


def bytes32(value: str, what: str = "value") -> str:
    return "0x" + fixed_bytes(value, 32, what).hex()


async def check_balance(c: ChainClient, amount: int, what: str) -> None:
    have = await c.token_balance(c.address)
    if have < amount:
        raise ChainError(
            f"{what}: {c.address} holds {tokens(have)}, needs {tokens(amount)}",
            "get tokens first (on the devnet: `intellect-node token mint`)",
        )
