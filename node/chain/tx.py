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
from .errors import ChainError, ContractRevert, InsufficientFunds, RpcError, RpcUnavailable, TxTimeout
from .messages import explain
from .rpc import RpcClient

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
    nonce assignment with a lock so concurrent trio tasks can share it."""

    def __init__(
        self,
        rpc: RpcClient,
        account: LocalAccount,
        chain_id: int,
        *,
        receipt_timeout: float = 120.0,
        poll_interval: float = 0.05,
        rebroadcast_every: float = 10.0,
        gas_multiplier: float = 1.25,
        journal: TxJournal | None = None,
        decode_logs: Callable[[list[dict[str, Any]]], list[abi.DecodedEvent]] | None = None,
    ) -> None:
        self.rpc = rpc
        self.account = account
        self.address: str = account.address
        self.chain_id = chain_id
        self.receipt_timeout = receipt_timeout
        self.poll_interval = poll_interval
        self.rebroadcast_every = rebroadcast_every
        self.gas_multiplier = gas_multiplier
        self.journal = journal
        self.decode_logs = decode_logs
        self._nonce: int | None = None
        self._lock = trio.Lock()

    async def _fees(self) -> tuple[int, int]:
        block = await self.rpc.get_block("latest")
        base = int(block.get("baseFeePerGas", "0x0"), 16)
        try:
            tip = int(await self.rpc.request("eth_maxPriorityFeePerGas"), 16)
        except RpcError:
            tip = 1_000_000_000
        return 2 * base + tip, tip

    async def estimate(self, to: str | None, data: str, value: int, what: str) -> int:
        """Gas estimate; a revert here is raised as a decoded `ContractRevert` and nothing is sent."""
        tx: dict[str, Any] = {"from": self.address, "data": data, "value": hex(value)}
        if to:
            tx["to"] = to
        try:
            gas = int(await self.rpc.request("eth_estimateGas", [tx]), 16)
        except RpcError as err:
            raise revert_from_rpc(err, what) from None
        return int(gas * self.gas_multiplier) + 10_000

    async def send(
        self, to: str | None, data: str, *, value: int = 0, gas: int | None = None, what: str = "transaction"
    ) -> Receipt:
        """Preflight, sign once, broadcast, wait for the receipt. Raises `ContractRevert` if the call
        would revert (nothing is sent), `InsufficientFunds`, `TxTimeout` (the hash is in the error), or
        `ContractRevert` if it reverted on chain."""
        gas_limit = gas if gas is not None else await self.estimate(to, data, value, what)
        async with self._lock:
            max_fee, tip = await self._fees()
            need = gas_limit * max_fee + value
            have = await self.rpc.balance(self.address, "pending")
            if have < need:
                raise InsufficientFunds(
                    f"{what}: account {self.address} has {have / 1e18:.6f} ETH, needs up to {need / 1e18:.6f} for gas",
                    "fund it with ETH (on anvil: any of the prefunded accounts)",
                )
            if self._nonce is None:
                self._nonce = int(await self.rpc.request("eth_getTransactionCount", [self.address, "pending"]), 16)
            nonce = self._nonce
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
            raw, tx_hash = self._sign(tx)
            if self.journal is not None:
                self.journal.signed(tx_hash, nonce, raw, what)
            tx_hash = await self._broadcast(raw, tx_hash, tx, what)
            self._nonce = nonce + 1
        receipt = await self.wait(tx_hash, raw, what)
        if receipt.status != 1:
            raise await self._explain_failure(tx, receipt, what)
        return receipt

    def _sign(self, tx: dict[str, Any]) -> tuple[str, str]:
        signed = self.account.sign_transaction(tx)
        return "0x" + bytes(signed.raw_transaction).hex(), "0x" + bytes(signed.hash).hex()

    async def _broadcast(self, raw: str, tx_hash: str, tx: dict[str, Any], what: str) -> str:
        """Broadcast `raw`. Returns the hash that will be mined (normally `tx_hash`)."""
        try:
            await self.rpc.request("eth_sendRawTransaction", [raw])
            return tx_hash
        except RpcUnavailable:
            # The bytes may or may not have arrived; `wait` re-broadcasts the same bytes.
            log.warning("%s: broadcast of %s not confirmed, will re-broadcast the same bytes", what, tx_hash)
            return tx_hash
        except RpcError as err:
            text = str(err).lower()
            if "already known" in text or "already imported" in text:
                return tx_hash
            if "nonce too low" in text or "nonce has already been used" in text:
                if await self.rpc.request("eth_getTransactionByHash", [tx_hash]) is not None:
                    return tx_hash
                # Another transaction of this account took the nonce: ours can never be mined,
                # so signing again with a fresh nonce cannot duplicate it.
                fresh = int(await self.rpc.request("eth_getTransactionCount", [self.address, "pending"]), 16)
                log.warning(
                    "%s: nonce %d was taken by another transaction; re-signing with %d", what, tx["nonce"], fresh
                )
                tx = dict(tx, nonce=fresh)
                raw2, hash2 = self._sign(tx)
                if self.journal is not None:
                    self.journal.signed(hash2, fresh, raw2, what)
                await self.rpc.request("eth_sendRawTransaction", [raw2])
                return hash2
            raise revert_from_rpc(err, what) from None

    async def wait(self, tx_hash: str, raw: str | None = None, what: str = "transaction") -> Receipt:
        """Wait for the receipt of `tx_hash`, re-broadcasting `raw` now and then in case a node dropped it."""
        deadline = trio.current_time() + self.receipt_timeout
        next_rebroadcast = trio.current_time() + self.rebroadcast_every
        while True:
            try:
                rc = await self.rpc.request("eth_getTransactionReceipt", [tx_hash])
            except RpcUnavailable:
                rc = None
            if rc is not None:
                receipt = self._receipt(rc)
                if self.journal is not None:
                    self.journal.mined(tx_hash, receipt.block_number, receipt.status)
                return receipt
            now = trio.current_time()
            if now >= deadline:
                raise TxTimeout(
                    f"{what}: transaction {tx_hash} was not mined within {self.receipt_timeout:.0f} s",
                    tx_hash,
                    "it may still be mined; check it before retrying",
                )
            if raw is not None and now >= next_rebroadcast:
                next_rebroadcast = now + self.rebroadcast_every
                # Known, mined meanwhile, or the node is still down: keep polling either way.
                with contextlib.suppress(RpcError, RpcUnavailable):
                    await self.rpc.request("eth_sendRawTransaction", [raw], retry=False)
            await trio.sleep(self.poll_interval)

    def _receipt(self, rc: dict[str, Any]) -> Receipt:
        logs = list(rc.get("logs", []))
        return Receipt(
            tx_hash=rc["transactionHash"],
            block_number=int(rc["blockNumber"], 16),
            gas_used=int(rc["gasUsed"], 16),
            status=int(rc["status"], 16),
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
