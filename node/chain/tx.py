"""Sending transactions: preflight, nonces, fees, signing, broadcast, receipts.

The rule that keeps retries safe: a transaction is signed exactly once per nonce, and only those
bytes are ever re-broadcast. A re-broadcast of the same bytes has the same hash, so it cannot become a
second transaction. A fresh signature for a nonce is made only when the chain proves the earlier bytes
can never be mined (their nonce was taken by another transaction that is not ours).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from eth_account.signers.local import LocalAccount

from . import abi
from .errors import ChainError, ContractRevert, InsufficientFunds, NonceTaken, RpcError, RpcUnavailable, TxTimeout
from .fees import DEFAULT_BUMP_AFTER, DEFAULT_MAX_FEE, MAX_TIP_FLOOR, bumped_fees, env_number
from .messages import explain
from .pending import Pending, nonce_user
from .rpc import RpcClient, quantity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Receipt:
    tx_hash: str
    block_number: int
    gas_used: int
    status: int
    logs: list[dict[str, Any]] = field(default_factory=list)
    events: list[abi.DecodedEvent] = field(default_factory=list)

    def event(self, name: str) -> abi.DecodedEvent:
        for e in self.events:
            if e.name == name:
                return e
        raise LookupError(f"transaction {self.tx_hash} emitted no {name} event")

    def all(self, name: str) -> list[abi.DecodedEvent]:
        return [e for e in self.events if e.name == name]


class TxJournal(Protocol):
    """Durable record of signed transactions, written before broadcast, so that a restarted process
    waits for what it already sent instead of sending it again."""

    def signed(self, tx_hash: str, nonce: int, raw: str, label: str) -> None: ...

    def mined(self, tx_hash: str, block_number: int, status: int) -> None: ...


def revert_from_rpc(err: RpcError, what: str) -> ChainError:
    """Turn a node's error for a reverted call into a readable `ContractRevert` (or pass it through)."""
    data = err.data
    if isinstance(data, dict):  # some nodes nest the revert bytes
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        decoded = abi.decode_error(data)
        if decoded is not None:
            message, hint = explain(decoded)
            return ContractRevert(f"{what} rejected: {message}", decoded.name, decoded.args, data, hint)
        if data != "0x":
            return ContractRevert(f"{what} rejected with unknown error data {data[:74]}", None, {}, data)
    text = str(err)
    if "insufficient funds" in text.lower():
        return InsufficientFunds(f"{what}: the sending account cannot pay for gas", "fund it with ETH")
    if "execution reverted" in text.lower():
        return ContractRevert(f"{what} rejected: {text}", None, {}, "0x")
    return err


class TxSender:
    """Sends transactions from one account. One instance per account per process; it serialises
    nonce assignment with a lock so concurrent trio tasks can share it.

    A transaction not mined within `bump_after` seconds is replaced: same nonce, fees raised by an
    eighth or to the chain's current suggestion, `maxFeePerGas` never above `max_fee`. Every
    replacement is journaled before it is broadcast, so a restarted process waits for whichever of
    the signatures is mined, and never signs the intent again under another nonce."""

    def __init__(
        self,
        rpc: RpcClient,
        account: LocalAccount,
        chain_id: int,
        *,
        receipt_timeout: float = 120.0,
        poll_interval: float = 0.05,
        max_poll_interval: float = 2.0,
        rebroadcast_every: float = 10.0,
        bump_after: float | None = None,
        max_fee: int | None = None,
        gas_multiplier: float = 1.25,
        journal: TxJournal | None = None,
        decode_logs: Callable[[list[dict[str, Any]]], list[abi.DecodedEvent]] | None = None,
        confirmations: int = 0,
    ) -> None:
        self.rpc = rpc
        self.account = account
        self.address: str = account.address
        self.chain_id = chain_id
        self.receipt_timeout = receipt_timeout
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.rebroadcast_every = rebroadcast_every
        self.bump_after = bump_after or env_number("INTELLECT_BUMP_AFTER", DEFAULT_BUMP_AFTER)
        self.max_fee = max_fee or int(env_number("INTELLECT_MAX_FEE_GWEI", DEFAULT_MAX_FEE / 10**9) * 10**9)
        self.gas_multiplier = gas_multiplier
        self.journal = journal
        self.decode_logs = decode_logs
        self.confirmations = confirmations
        self.bumps = 0  # replacements signed by this sender (for status and tests)
        self.head = 0  # the latest block seen when fees were read
        self._nonce: int | None = None
        self._inflight: dict[int, Pending] = {}  # nonce -> intent signed and not yet seen mined
        self._lock = trio.Lock()

    async def _fees(self) -> tuple[int, int]:
        """(max fee, tip) for a transaction now: twice the base fee plus the node's suggested tip, the tip
        never above the base fee or 2 gwei (whichever is more: an endpoint cannot talk us into paying
        the cap), both at most `max_fee`. Also sets `head` (the block they were read at)."""
        block = await self.rpc.get_block("latest")
        self.head = quantity(block["number"])
        base = quantity(block.get("baseFeePerGas") or "0x0")
        try:
            tip = int(await self.rpc.request("eth_maxPriorityFeePerGas", expect=quantity))
        except RpcError:
            tip = 1_000_000_000
        tip = min(tip, max(base, MAX_TIP_FLOOR))
        return min(2 * base + tip, self.max_fee), min(tip, self.max_fee)

    async def estimate(self, to: str | None, data: str, value: int, what: str) -> int:
        """Gas estimate; a revert here is raised as a decoded `ContractRevert` and nothing is sent."""
        tx: dict[str, Any] = {"from": self.address, "data": data, "value": hex(value)}
        if to:
            tx["to"] = to
        try:
            gas = int(await self.rpc.request("eth_estimateGas", [tx], expect=quantity))
        except RpcError as err:
            raise revert_from_rpc(err, what) from None
        return int(gas * self.gas_multiplier) + 10_000

    async def _pending_nonce(self) -> int:
        return await self.rpc.nonce(self.address, "pending")

    async def _next_nonce(self) -> int:
        """The nonce for a new intent (call with the lock held). Our own transactions missing from the
        node's pool (dropped, or the node restarted) are re-broadcast, so they stop blocking the ones
        after them; a gap nobody of ours fills is filled by this intent."""
        pending = await self._pending_nonce()
        if self._nonce is None or pending > self._nonce:
            self._nonce = pending  # first use, or the key sent from elsewhere
        for n in range(pending, self._nonce):
            p = self._inflight.get(n)
            if p is None:
                return n
            with contextlib.suppress(RpcError, RpcUnavailable):
                await self.rpc.request("eth_sendRawTransaction", [p.raw], retry=False)
        return self._nonce

    async def send(
        self,
        to: str | None,
        data: str,
        *,
        value: int = 0,
        gas: int | None = None,
        min_gas: int = 0,
        what: str = "transaction",
    ) -> Receipt:
        """Preflight, sign, broadcast, wait for the receipt (replacing the transaction with higher fees
        while it is not mined). Raises `ContractRevert` if the call would revert (nothing is sent),
        `InsufficientFunds`, `TxTimeout` (the hash is in the error), or `ContractRevert` if it
        reverted on chain. The gas limit is `gas`, or the estimate but at least `min_gas` (for a call
        another party's transaction can put on a dearer path between the estimate and the block)."""
        gas_limit = gas if gas is not None else max(min_gas, await self.estimate(to, data, value, what))
        async with self._lock:
            max_fee, tip = await self._fees()
            need = gas_limit * max_fee + value
            have = await self.rpc.balance(self.address, "pending")
            if have < need:
                raise InsufficientFunds(
                    f"{what}: account {self.address} has {have / 1e18:.6f} ETH, needs up to {need / 1e18:.6f} for gas",
                    "fund it with ETH (on anvil: any of the prefunded accounts)",
                )
            nonce = await self._next_nonce()
            tx: dict[str, Any] = {
                "chainId": self.chain_id,
                "nonce": nonce,
                "gas": gas_limit,
                "maxFeePerGas": max_fee,
                "maxPriorityFeePerGas": tip,
                "value": value,
                "data": data,
                "type": 2,
            }
            if to:
                tx["to"] = to
            p = Pending(nonce, what, tx, [], sent_block=self.head)
            self._sign_into(p, tx)
            await self._broadcast(p)
            self._nonce = max(self._nonce or 0, p.nonce + 1)
        receipt = await self.wait_pending(p)
        if receipt.status != 1:
            raise await self._explain_failure(p.tx or tx, receipt, what)
        return receipt

    def _sign_into(self, p: Pending, tx: dict[str, Any]) -> None:
        """Sign `tx` as `p`'s newest signature, journaled before anything is broadcast."""
        signed = self.account.sign_transaction(tx)
        raw, tx_hash = "0x" + bytes(signed.raw_transaction).hex(), "0x" + bytes(signed.hash).hex()
        if self.journal is not None:
            self.journal.signed(tx_hash, int(tx["nonce"]), raw, p.what)
        p.tx, p.nonce = tx, int(tx["nonce"])
        p.signed.append((tx_hash, raw))
        self._inflight[p.nonce] = p

    async def _broadcast(self, p: Pending) -> None:
        """Broadcast `p`'s newest bytes (with the lock held). If the node says the nonce is used and
        none of our signatures for it is known, another transaction of this key took it: ours can
        never be mined, so the intent is signed again with a fresh nonce (it cannot run twice)."""
        try:
            await self.rpc.request("eth_sendRawTransaction", [p.raw])
        except RpcUnavailable:
            # The bytes may or may not have arrived; `wait_pending` re-broadcasts the same bytes.
            log.warning("%s: broadcast of %s not confirmed, will re-broadcast the same bytes", p.what, p.tx_hash)
        except RpcError as err:
            text = str(err).lower()
            if "already known" in text or "already imported" in text:
                return
            if any(w in text for w in ("base fee", "underpriced", "fee cap", "feecap")):
                # Priced under what the node accepts now (the base fee rose since we read it): it is
                # journaled, and `wait_pending` replaces it with higher fees after `bump_after`.
                log.warning("%s: %s refused as underpriced (%s); it will be re-priced", p.what, p.tx_hash, err)
                return
            if "nonce too low" in text or "nonce has already been used" in text:
                # Ours mined already, or another transaction of this key took the nonce: only the chain
                # can tell which. Until it shows another's, the intent waits (`wait_pending` asks again).
                with contextlib.suppress(RpcError, RpcUnavailable):
                    user = await nonce_user(self.rpc, self.address, p.nonce, p.sent_block)
                    if user and not p.ours(user):
                        await self._resign_fresh(p)
                return
            self._inflight.pop(p.nonce, None)
            raise revert_from_rpc(err, p.what) from None

    async def _resign_fresh(self, p: Pending) -> None:
        """Sign `p` again under a fresh nonce: the chain showed another transaction with its nonce. Once
        per intent; its earlier signatures stay watched."""
        assert p.tx is not None and not p.resigned
        self._inflight.pop(p.nonce, None)
        fresh = max(await self._pending_nonce(), self._nonce or 0)
        log.warning("%s: nonce %d was taken by another transaction; re-signing with %d", p.what, p.nonce, fresh)
        p.resigned = True
        self._sign_into(p, dict(p.tx, nonce=fresh))
        self._nonce = fresh + 1
        with contextlib.suppress(RpcUnavailable, RpcError):  # refused: re-broadcast while it is waited for
            await self.rpc.request("eth_sendRawTransaction", [p.raw])

    async def _bump(self, p: Pending) -> None:
        """Replace `p` with higher fees (journaled first); at the fee cap, re-broadcast it as it is."""
        assert p.tx is not None
        new = bumped_fees(p.tx["maxFeePerGas"], p.tx["maxPriorityFeePerGas"], await self._fees(), self.max_fee)
        if new is None:
            log.warning(
                "%s: %s is not mined and its fee is at the cap (%d wei); waiting", p.what, p.tx_hash, self.max_fee
            )
            with contextlib.suppress(RpcError, RpcUnavailable):
                await self.rpc.request("eth_sendRawTransaction", [p.raw], retry=False)
            return
        old, old_tx = p.tx_hash, p.tx
        self._sign_into(p, dict(p.tx, maxFeePerGas=new[0], maxPriorityFeePerGas=new[1]))
        self.bumps += 1
        log.info("%s: %s not mined; replaced by %s (max fee %d, tip %d wei)", p.what, old, p.tx_hash, *new)
        try:
            await self.rpc.request("eth_sendRawTransaction", [p.raw], retry=False)
        except RpcUnavailable:
            pass  # re-broadcast later
        except RpcError as err:
            if "already known" not in str(err).lower():
                # Refused (under the base fee, underpriced, out of funds, mined meanwhile): the earlier
                # bytes stay the ones re-broadcast; the journaled row is harmless (same nonce).
                log.warning("%s: replacement %s refused: %s", p.what, p.tx_hash, err)
                p.signed.pop()
                p.tx = old_tx

    async def wait(self, tx_hash: str, raw: str | None = None, what: str = "transaction") -> Receipt:
        """Wait for the receipt of `tx_hash`, re-broadcasting `raw` now and then in case a node dropped
        it (it is never re-signed)."""
        return await self.wait_pending(Pending(-1, what, None, [(tx_hash, raw or "")]))

    async def wait_pending(self, p: Pending, *, resign: bool = True) -> Receipt:
        """Wait until one of `p`'s signatures is mined, re-broadcasting the newest now and then and
        replacing it with higher fees every `bump_after` s. If another transaction took the nonce,
        the intent is signed again with a fresh nonce (`resign`) or `NonceTaken` is raised."""
        start = trio.current_time()
        deadline = start + self.receipt_timeout
        next_rebroadcast = start + self.rebroadcast_every
        next_bump = start + self.bump_after
        poll = self.poll_interval
        if p.tx is not None:
            self._inflight.setdefault(p.nonce, p)
        while True:
            mined = False
            for h, _ in reversed(p.signed):
                try:
                    rc = await self.rpc.receipt(h)
                except (RpcError, RpcUnavailable):
                    rc = None  # ask again next round: the transaction may be mined whatever this said
                if rc is None:
                    continue
                receipt = self._receipt(rc)
                late = trio.current_time() >= deadline + self.receipt_timeout
                if not late and not await self._buried(receipt):
                    mined = True  # in a block, not yet deep enough: a reorg may still take it out
                    break
                if late:
                    log.warning(
                        "%s: %s is in block %d, not yet buried; taken as mined", p.what, h, receipt.block_number
                    )
                if self.journal is not None:
                    self.journal.mined(h, receipt.block_number, receipt.status)
                self._settled(p)
                return receipt
            now = trio.current_time()
            if mined:
                pass  # waiting for confirmations (at most another `receipt_timeout`)
            elif now >= deadline:
                raise TxTimeout(
                    f"{p.what}: transaction {p.tx_hash} was not mined within {self.receipt_timeout:.0f} s",
                    p.tx_hash,
                    "it may still be mined; check it before retrying",
                )
            elif p.nonce >= 0 and now >= next_bump:
                next_bump = now + self.bump_after
                next_rebroadcast = now + self.rebroadcast_every
                try:
                    taken = await self._nonce_taken(p)
                except (RpcError, RpcUnavailable):
                    taken = None  # cannot tell now: ask again at the next round
                if taken:
                    if not resign or p.tx is None or p.resigned:
                        self._settled(p)
                        raise NonceTaken(
                            f"{p.what}: nonce {p.nonce} was used by another transaction", p.tx_hash, p.nonce
                        )
                    async with self._lock:
                        await self._resign_fresh(p)
                    deadline = now + self.receipt_timeout  # once: `resigned` forbids a second time
                elif taken is False and p.tx is not None:
                    async with self._lock:
                        with contextlib.suppress(RpcError, RpcUnavailable):
                            await self._bump(p)
            elif p.raw and now >= next_rebroadcast:
                next_rebroadcast = now + self.rebroadcast_every
                # Known, mined meanwhile, or the node is still down: keep polling either way.
                with contextlib.suppress(RpcError, RpcUnavailable):
                    await self.rpc.request("eth_sendRawTransaction", [p.raw], retry=False)
            await trio.sleep(poll)
            poll = min(poll * 1.5, self.max_poll_interval)

    def _settled(self, p: Pending) -> None:
        """`p` is mined or dead: its nonce no longer needs re-broadcasting by `_next_nonce`."""
        if self._inflight.get(p.nonce) is p:
            del self._inflight[p.nonce]

    async def _buried(self, receipt: Receipt) -> bool:
        """Whether `receipt` (just read, so in the node's canonical chain now) has `confirmations`
        blocks on top. Until then the wait goes on; if a reorganisation removes the transaction its
        receipt disappears and it is waited for (re-broadcast, bumped) like any unmined one."""
        if self.confirmations <= 0:
            return True
        try:
            head = await self.rpc.block_number()
        except (RpcError, RpcUnavailable):
            return False
        return head >= receipt.block_number + self.confirmations

    async def _nonce_taken(self, p: Pending) -> bool | None:
        """True when the chain shows another transaction (none of `p`'s signatures) with `p`'s nonce in a
        block; False when it shows none there or ours; None when it cannot tell (not mined yet either)."""
        user = await nonce_user(self.rpc, self.address, p.nonce, p.sent_block)
        return None if user is None else bool(user) and not p.ours(user)

    def _receipt(self, rc: dict[str, Any]) -> Receipt:
        logs = list(rc.get("logs", []))
        return Receipt(
            tx_hash=rc["transactionHash"],
            block_number=quantity(rc["blockNumber"]),
            gas_used=quantity(rc["gasUsed"]),
            status=quantity(rc["status"]),
            logs=logs,
            events=self.decode_logs(logs) if self.decode_logs else [],
        )

    async def _explain_failure(self, tx: dict[str, Any], receipt: Receipt, what: str) -> ChainError:
        """Replay a failed transaction as a call at its block to recover the revert reason."""
        call: dict[str, Any] = {
            "from": self.address,
            "data": tx["data"],
            "value": hex(tx["value"]),
            "gas": hex(tx["gas"]),
        }
        if "to" in tx:
            call["to"] = tx["to"]
        try:
            await self.rpc.request("eth_call", [call, hex(receipt.block_number - 1)])
        except RpcError as err:
            out = revert_from_rpc(err, what)
            if isinstance(out, ContractRevert):
                out.message += f" (transaction {receipt.tx_hash} reverted on chain)"
                return out
        if receipt.gas_used >= tx["gas"]:
            return ChainError(f"{what}: transaction {receipt.tx_hash} ran out of gas ({tx['gas']})")
        return ChainError(f"{what}: transaction {receipt.tx_hash} reverted on chain")
