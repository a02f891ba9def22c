"""A public chain does not mine every transaction at once: fees spike, a node drops a transaction, a
process dies in the middle of replacing one. Against a real anvil with automine off and the base fee
held above the transaction's fee cap: the sender replaces it with higher fees (each replacement
journaled first) and the intent is executed exactly once, also across a kill -9 during a bump."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from node.chain import NonceTaken, TxTimeout, abi
from node.chain.fees import bumped_fees
from node.chain.pending import Pending
from node.chain.rpc import RpcClient
from node.chain.tx import TxSender
from node.store import Store, settle_journal
from pool.deploy import TOKEN
from tests.conftest import World

HIGH_BASE_FEE = 50 * 10**9  # far above what the first signature offers (2 x ~1 gwei + tip)


def mint_data(to: str, amount: int) -> str:
    return abi.load("IntellectToken").fn("mint").encode([to, amount])


async def nonce(rpc: RpcClient, addr: str, tag: str = "latest") -> int:
    return int(await rpc.request("eth_getTransactionCount", [addr, tag]), 16)


@asynccontextmanager
async def fee_spike(rpc: RpcClient, *, every: float = 0.1):
    """Automine off; once a transaction is in the node's pool (signed at the fee of a calm chain),
    blocks are mined every `every` s with the base fee held at HIGH_BASE_FEE, so it cannot be
    included until it is replaced with higher fees. `spike["on"] = False` ends the spike (the next
    block's base fee is 1 gwei). Automine is restored after."""
    spike = {"on": True}
    await rpc.request("evm_setAutomine", [False])
    try:
        async with trio.open_nursery() as n:

            async def miner() -> None:
                while not any((await rpc.request("txpool_content"))["pending"].values()):
                    await trio.sleep(0.02)
                while True:
                    fee = HIGH_BASE_FEE if spike["on"] else 10**9
                    await rpc.request("anvil_setNextBlockBaseFeePerGas", [hex(fee)])
                    await rpc.request("evm_mine", [])
                    await trio.sleep(every)

            n.start_soon(miner)
            yield spike
            n.cancel_scope.cancel()
    finally:
        await rpc.request("anvil_setNextBlockBaseFeePerGas", [hex(10**9)])  # not left for the next test
        await rpc.request("evm_setAutomine", [True])
        await rpc.request("evm_mine", [])


def pool_txs(content: dict) -> list[dict]:
    return [tx for by_nonce in content["pending"].values() for tx in by_nonce.values()]


def test_replacement_fees_rise_by_an_eighth_and_stop_at_the_cap():
    assert bumped_fees(1000, 100, (0, 0), cap=10**9) == (1126, 113)
    assert bumped_fees(1000, 100, (5000, 7), cap=10**9) == (5000, 113)  # today's suggestion when higher
    assert bumped_fees(1000, 100, (5000, 7), cap=3000) == (3000, 113)  # capped
    assert bumped_fees(1000, 100, (5000, 7), cap=1050) is None  # under +10 %: no valid replacement
    assert bumped_fees(1000, 1000, (0, 0), cap=1126)[1] <= 1126  # the tip never exceeds the fee cap


async def test_stuck_transaction_is_bumped_and_mined_once(chain: World, tmp_path: Path):
    token = chain.deployment.address("IntellectToken")
    store = Store(tmp_path / "state.db")
    async with RpcClient(chain.url) as rpc, await chain.client(None) as reader:
        b0 = await reader.token_balance(chain.outsider.address)
        n0 = await nonce(rpc, chain.admin.address)
        sender = TxSender(
            rpc, chain.admin, chain.deployment.chain_id, journal=store.journal, bump_after=0.3, receipt_timeout=30
        )
        async with fee_spike(rpc):
            r = await sender.send(token, mint_data(chain.outsider.address, 7 * TOKEN), what="mint")
        assert r.status == 1 and sender.bumps >= 1
        assert await nonce(rpc, chain.admin.address) == n0 + 1
        assert await reader.token_balance(chain.outsider.address) == b0 + 7 * TOKEN
        rows = store.journal.all()
        assert len(rows) == 1 + sender.bumps and {t.nonce for t in rows} == {n0}
        assert sorted(t.status for t in rows) == ["mined"] + ["replaced"] * sender.bumps
        assert next(t.hash for t in rows if t.status == "mined") == r.tx_hash
    store.close()


async def test_the_fee_cap_is_never_passed(chain: World, tmp_path: Path):
    """With the base fee above the cap, no signature offers more than the cap; the intent waits (and is
    refused by the node meanwhile), and goes through once fees fall, still once."""
    token = chain.deployment.address("IntellectToken")
    store = Store(tmp_path / "state.db")
    async with RpcClient(chain.url) as rpc:
        cap = 10 * 10**9
        sender = TxSender(
            rpc, chain.admin, chain.deployment.chain_id, journal=store.journal, bump_after=0.2, receipt_timeout=2,
            rebroadcast_every=0.1, max_fee=cap,
        )  # fmt: skip
        n0 = await nonce(rpc, chain.admin.address)
        async with fee_spike(rpc) as spike:
            with pytest.raises(TxTimeout):
                await sender.send(token, mint_data(chain.outsider.address, 1), what="mint")
            assert await nonce(rpc, chain.admin.address) == n0 and sender.bumps >= 1
            spike["on"] = False  # the fee falls back: the capped intent goes through
            sender.receipt_timeout = 20
            r = await sender.wait_pending(sender._inflight[n0])
        assert r.status == 1 and await nonce(rpc, chain.admin.address) == n0 + 1
        fees = [Pending.from_journal(n0, "mint", [(t.hash, t.raw)]).tx["maxFeePerGas"] for t in store.journal.all()]
        assert len(fees) >= 2 and max(fees) <= cap
    store.close()


async def test_dropped_transaction_is_sent_again_and_mined_once(chain: World):
    token = chain.deployment.address("IntellectToken")
    async with RpcClient(chain.url) as rpc, await chain.client(None) as reader:
        b0 = await reader.token_balance(chain.outsider.address)
        n0 = await nonce(rpc, chain.admin.address)
        sender = TxSender(rpc, chain.admin, chain.deployment.chain_id, rebroadcast_every=0.5, receipt_timeout=20)
        await rpc.request("evm_setAutomine", [False])
        try:
            async with trio.open_nursery() as n:
                out = {}

                async def send() -> None:
                    out["r"] = await sender.send(token, mint_data(chain.outsider.address, 3), what="mint")

                n.start_soon(send)
                with trio.fail_after(10):
                    while not pool_txs(await rpc.request("txpool_content")):
                        await trio.sleep(0.02)
                (dropped,) = [tx["hash"] for tx in pool_txs(await rpc.request("txpool_content"))]
                await rpc.request("anvil_dropTransaction", [dropped])
                assert await rpc.request("eth_getTransactionByHash", [dropped]) is None  # gone from the node
                with trio.fail_after(10):
                    while "r" not in out:
                        await rpc.request("evm_mine", [])
                        await trio.sleep(0.1)
        finally:
            await rpc.request("evm_setAutomine", [True])
        assert out["r"].status == 1
        assert await nonce(rpc, chain.admin.address) == n0 + 1
        assert await reader.token_balance(chain.outsider.address) == b0 + 3


async def test_a_nonce_gap_left_by_a_dropped_transaction_is_filled(chain: World):
    """A transaction whose wait timed out and which the node then dropped would block every later one
    of the account: the next send broadcasts it again first, and both run once."""
    token = chain.deployment.address("IntellectToken")
    async with RpcClient(chain.url) as rpc, await chain.client(None) as reader:
        b0 = await reader.token_balance(chain.outsider.address)
        n0 = await nonce(rpc, chain.admin.address)
        sender = TxSender(rpc, chain.admin, chain.deployment.chain_id, receipt_timeout=0.3)
        await rpc.request("evm_setAutomine", [False])
        try:
            with pytest.raises(TxTimeout) as e:
                await sender.send(token, mint_data(chain.outsider.address, 5), what="first")
            await rpc.request("anvil_dropTransaction", [e.value.tx_hash])
        finally:
            await rpc.request("evm_setAutomine", [True])
        assert await nonce(rpc, chain.admin.address, "pending") == n0  # the gap
        sender.receipt_timeout = 20
        r = await sender.send(token, mint_data(chain.outsider.address, 11), what="second")
        assert r.status == 1
        assert await nonce(rpc, chain.admin.address) == n0 + 2
        assert await reader.token_balance(chain.outsider.address) == b0 + 16


async def test_settling_a_nonce_someone_else_took_marks_it_failed(chain: World, tmp_path: Path):
    token = chain.deployment.address("IntellectToken")
    store = Store(tmp_path / "state.db")
    async with RpcClient(chain.url) as rpc:
        n0 = await nonce(rpc, chain.admin.address)
        # signed and journaled by a process that died before broadcasting it
        ghost = TxSender(rpc, chain.admin, chain.deployment.chain_id, journal=store.journal)
        tx = {"chainId": chain.deployment.chain_id, "nonce": n0, "gas": 100_000, "maxFeePerGas": 10**10,
              "maxPriorityFeePerGas": 10**9, "value": 0, "data": mint_data(chain.outsider.address, 1),
              "type": 2, "to": token}  # fmt: skip
        signed = chain.admin.sign_transaction(tx)
        store.journal.signed("0x" + bytes(signed.hash).hex(), n0, "0x" + bytes(signed.raw_transaction).hex(), "ghost")
        other = TxSender(rpc, chain.admin, chain.deployment.chain_id)  # the same key, elsewhere
        await other.send(token, mint_data(chain.outsider.address, 2), what="other")
        ghost.bump_after = 0.1
        assert await settle_journal(store.journal, ghost) == []
        assert [t.status for t in store.journal.all()] == ["failed"]
        with pytest.raises(NonceTaken):  # the raw form of the same
            await ghost.wait_pending(Pending(n0, "ghost", tx, [("0x" + bytes(signed.hash).hex(), "")]), resign=False)
    store.close()


CHILD = r"""
import sys, trio
from eth_account import Account
from node.chain.rpc import RpcClient
from node.chain.tx import TxSender
from node.store import Store
url, key, db, to, data = sys.argv[1:6]
async def main():
    store = Store(db)
    async with RpcClient(url) as rpc:
        chain_id = int(await rpc.request("eth_chainId"), 16)
        s = TxSender(rpc, Account.from_key(key), chain_id, journal=store.journal, bump_after=0.2, receipt_timeout=600)
        await s.send(to, data, what="mint", gas=200_000)
trio.run(main)
"""


async def test_kill_during_a_bump_sends_no_duplicate(chain: World, tmp_path: Path):
    token = chain.deployment.address("IntellectToken")
    db = tmp_path / "state.db"
    async with RpcClient(chain.url) as rpc, await chain.client(None) as reader:
        b0 = await reader.token_balance(chain.outsider.address)
        n0 = await nonce(rpc, chain.admin.address)
        key = "0x" + bytes(chain.admin.key).hex()
        async with fee_spike(rpc, every=1.0) as spike:
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, chain.url, key, str(db), token, mint_data(chain.outsider.address, 9)],
                cwd=Path(__file__).resolve().parents[2],
                env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
            )
            try:
                deadline = time.monotonic() + 60
                while True:  # until the child has journaled at least two replacements
                    await trio.sleep(0.05)
                    if db.exists():
                        probe = Store(db)
                        signed = len(probe.journal.all())
                        probe.close()
                        if signed >= 3:
                            break
                    assert child.poll() is None, "the child exited before it bumped"
                    assert time.monotonic() < deadline, "no fee bump within 60 s"
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait()
            spike["on"] = False  # fees fall back; whichever signature is priced right may be mined now
        store = Store(db)
        rows = store.journal.all()
        assert {t.nonce for t in rows} == {n0} and len(rows) >= 3
        restarted = TxSender(rpc, chain.admin, chain.deployment.chain_id, journal=store.journal, bump_after=0.2)
        (receipt,) = await settle_journal(store.journal, restarted)
        assert receipt.status == 1
        for _ in range(5):  # whatever else was in the node's pool has had its chance to be mined
            await rpc.request("evm_mine", [])
        assert await nonce(rpc, chain.admin.address) == n0 + 1
        assert await reader.token_balance(chain.outsider.address) == b0 + 9
        statuses = sorted(t.status for t in store.journal.all())
        assert statuses.count("mined") == 1 and set(statuses) <= {"mined", "replaced"}, json.dumps(statuses)
        store.close()
