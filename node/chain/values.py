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


def bytes32(value: str, what: str = "value") -> str:
    text = value.removeprefix("0x")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ChainError(f"{what} {value!r} is not 32 bytes of hex", "use 0x followed by 64 hex digits")
    return "0x" + raw.hex()


async def check_balance(c: ChainClient, amount: int, what: str) -> None:
    have = await c.token_balance(c.address)
    if have < amount:
        raise ChainError(
            f"{what}: {c.address} holds {tokens(have)}, needs {tokens(amount)}",
            "get tokens first (on the devnet: `intellect-node token mint`)",
        )
