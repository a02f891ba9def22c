"""An intent on its way to the chain, and the one proof that may let it be signed again.

A transaction is signed again under a fresh nonce only when the chain shows, in a block, another
transaction of the same account with its nonce. One endpoint's word ("nonce too low", a receipt that is
not there, a nonce count that moved) is never enough: a lagging or lying endpoint would otherwise make
one intent run twice."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from .rpc import RpcClient, block_or_none, hex_data, quantity

#: How far back (blocks) the proof looks for the block where the account's nonce passed ours, when the
#: block the intent was sent at is not known (after a restart). Each step is one call (a bisection).
NONCE_SEARCH_BLOCKS = 10_000


@dataclass
class Pending:
    """One intent on its way to the chain: its nonce, the fields last signed, and every signature made
    for it, oldest first (a fee bump adds one; at most one of them can ever be mined)."""

    nonce: int
    what: str
    tx: dict[str, Any] | None  # None: only the bytes are known (a wait on a bare hash)
    signed: list[tuple[str, str]]  # (hash, raw), every signature ever made for this intent
    sent_block: int = -1  # the head when it was first signed (-1: unknown): where a proof search starts
    resigned: bool = False  # signed again under a fresh nonce once (never twice)

    def ours(self, tx_hash: str) -> bool:
        return any(h.lower() == tx_hash.lower() for h, _ in self.signed)

    @property
    def tx_hash(self) -> str:
        return self.signed[-1][0]

    @property
    def raw(self) -> str:
        return self.signed[-1][1]

    @classmethod
    def from_journal(cls, nonce: int, what: str, signed: list[tuple[str, str]]) -> Pending:
        """A pending intent rebuilt from journaled bytes (after a restart): the fields come from the
        last signature, so it can be bumped again."""
        from eth_account.typed_transactions import TypedTransaction
        from hexbytes import HexBytes

        tx: dict[str, Any] | None = None
        with contextlib.suppress(Exception):  # not a type-2 transaction we made: wait, never re-sign
            d = TypedTransaction.from_bytes(HexBytes(signed[-1][1])).as_dict()
            tx = {k: d[k] for k in ("chainId", "nonce", "gas", "maxFeePerGas", "maxPriorityFeePerGas", "value")}
            tx["data"] = "0x" + bytes(d["data"]).hex()
            tx["type"] = 2
            if d.get("to"):
                tx["to"] = "0x" + bytes(d["to"]).hex()
        return cls(nonce, what, tx, list(signed))


def _full_block(v: Any) -> dict[str, Any] | None:
    block = block_or_none(v)
    if block is None:
        return None
    txs = block.get("transactions")
    if not isinstance(txs, list) or not all(isinstance(t, dict) for t in txs):
        raise ValueError("a block's transactions are not objects")
    for t in txs:
        hex_data(t.get("hash"), 32)
        hex_data(t.get("from"), 20)
        quantity(t.get("nonce"))
    return block


async def nonce_user(rpc: RpcClient, address: str, nonce: int, since_block: int) -> str | None:
    """The hash of the transaction of `address` with `nonce` in the chain, found in the block where the
    account's count passed `nonce` (a bisection over blocks from `since_block`, or NONCE_SEARCH_BLOCKS
    back); "" when the nonce is not used yet; None when the search cannot tell."""
    head = await rpc.block_number()
    if await rpc.nonce(address, head) <= nonce:
        return ""
    lo = max(0, since_block if since_block >= 0 else head - NONCE_SEARCH_BLOCKS)
    if await rpc.nonce(address, lo) > nonce:
        return None  # used before the search window: not something this intent raced with
    hi = head  # invariant: count(lo) <= nonce < count(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await rpc.nonce(address, mid) > nonce:
            hi = mid
        else:
            lo = mid
    block = await rpc.request("eth_getBlockByNumber", [hex(hi), True], expect=_full_block)
    for t in (block or {}).get("transactions", []):
        if str(t["from"]).lower() == address.lower() and quantity(t["nonce"]) == nonce:
            return str(t["hash"])
    return None
