"""Where a node finds its first peers: the pool's on-chain bootstrap list.

The PoolManager pool record carries a free-form ``bootstrap`` string set by the pool owner. It holds
libp2p multiaddrs, separated by commas and/or whitespace, each ending in ``/p2p/<peer id>`` so that
the dialler knows whose key to expect in the Noise handshake (an address without it could be anyone).

`parse_bootstrap` is pure; `pool_bootstrap` reads the record through `node.ops.pool_info`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import multiaddr
from libp2p.peer.id import ID

if TYPE_CHECKING:
    from node.chain.client import ChainClient

MAX_BOOTSTRAP_ENTRIES = 64
"""More entries than this is refused: a node dials all of them, and the record is owner-controlled."""
MAX_BOOTSTRAP_CHARS = 16 * 1024
_SEPARATORS = re.compile(r"[\s,]+")


def _entry_error(index: int, entry: str, why: str) -> ValueError:
    shown = entry if len(entry) <= 120 else entry[:117] + "..."
    return ValueError(f"bootstrap entry {index + 1} {shown!r}: {why}")


def parse_bootstrap(text: str) -> list[str]:
    """Multiaddrs from a bootstrap string: comma and/or whitespace separated, empty entries ignored,
    duplicates dropped (first kept), order preserved. Each must parse as a multiaddr with a transport
    part followed by ``/p2p/<peer id>`` (a valid peer id); otherwise ValueError naming the entry."""
    if type(text) is not str:
        raise ValueError(f"bootstrap must be a string, got {type(text).__name__}")
    if len(text) > MAX_BOOTSTRAP_CHARS:
        raise ValueError(f"bootstrap string is {len(text)} characters, limit {MAX_BOOTSTRAP_CHARS}")
    entries = [e for e in _SEPARATORS.split(text) if e]
    if len(entries) > MAX_BOOTSTRAP_ENTRIES:
        raise ValueError(f"bootstrap lists {len(entries)} addresses, limit {MAX_BOOTSTRAP_ENTRIES}")
    out: list[str] = []
    for i, entry in enumerate(entries):
        if not entry.startswith("/"):
            raise _entry_error(i, entry, "not a multiaddr (must start with '/')")
        try:
            addr = multiaddr.Multiaddr(entry)
        except Exception as exc:
            raise _entry_error(i, entry, f"not a valid multiaddr ({exc})") from None
        protocols = [p.name for p in addr.protocols()]
        if protocols.count("p2p") != 1 or protocols[-1] != "p2p":
            raise _entry_error(i, entry, "must end with exactly one /p2p/<peer id>")
        if len(protocols) < 2:
            raise _entry_error(i, entry, "has no transport address before /p2p/<peer id>")
        try:
            peer_id = ID.from_base58(addr.value_for_protocol("p2p"))
            peer_id.to_bytes()
        except Exception as exc:
            raise _entry_error(i, entry, f"bad peer id ({exc})") from None
        canonical = str(addr)
        if canonical not in out:
            out.append(canonical)
    return out


async def pool_bootstrap(client: ChainClient, pool_id: int) -> list[str]:
    """The validated bootstrap multiaddrs of `pool_id` from its on-chain record (may be empty).

    Raises ChainError if the pool does not exist, ValueError if the record holds a bad entry."""
    from node.ops import pool_info

    record = await pool_info(client, pool_id)
    text = record.get("bootstrap", "")
    try:
        return parse_bootstrap(text if isinstance(text, str) else "")
    except ValueError as exc:
        raise ValueError(f"pool {pool_id}: {exc}") from None


__all__ = ["MAX_BOOTSTRAP_ENTRIES", "parse_bootstrap", "pool_bootstrap"]
