"""RPC endpoints that lie, lag, drip or flood, in front of a real anvil: no answer crashes a role with
anything but a chain error, a healthy second endpoint takes over, and no endpoint's word makes the
sender sign an intent again under another nonce (which would pay twice)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from node.chain import ChainClient, ChainError, RpcClient, RpcUnavailable, TxTimeout
from node.chain.tx import TxSender
from node.p2p.membership import ChainMembership
from node.validator.state import ValidatorState
from node.worker.state import WorkerState
from tests.adversarial.test_chain_reads import RpcProxy
from tests.conftest import World, rpc_sync
from tests.integration.test_status import _setup

GARBAGE = [None, 123, "0xzz", "", [], {"x": 1}, "0x" + "f" * 100]


def error(req: dict, message: str, code: int = -32000) -> dict:
    return {"jsonrpc": "2.0", "id": req.get("id"), "error": {"code": code, "message": message}}


def result(req: dict, value: Any) -> dict:
    return {"jsonrpc": "2.0", "id": req.get("id"), "result": value}


def balance(chain: World, who: str) -> int:
    return int(str(rpc_sync(chain.url, "eth_getBalance", [who, "latest"])), 16)


def nonce(chain: World, who: str) -> int:
    return int(str(rpc_sync(chain.url, "eth_getTransactionCount", [who, "latest"])), 16)


@pytest.mark.parametrize("garbage", GARBAGE)
def test_malformed_answers_are_chain_errors_and_fail_over(chain: World, garbage: Any):
    bad = RpcProxy(chain.url, hook=lambda m, req: result(req, garbage) if m != "eth_chainId" else None)

    async def go() -> tuple[int, list[dict[str, Any]]]:
        async with RpcClient(bad.url, retries=0) as alone:
            ledger = chain.deployment.address("WorkLedger")
            for call in (alone.block_number(), alone.get_block("latest"), alone.get_logs([ledger], 0, 1),
                         alone.receipt("0x" + "11" * 32)):  # fmt: skip
                with contextlib.suppress(ChainError):  # an error of the chain layer, never a TypeError deeper in
                    await call
        async with RpcClient(f"{bad.url},{chain.url}", retries=0) as both:
            return await both.block_number(), both.health()

    try:
        number, health = trio.run(go)
    finally:
        bad.kill()
    assert number >= 0 and health[0]["failures"] >= 1 and health[1]["ok"]


def test_http_errors_and_rate_limits_fail_over(chain: World):
    html = RpcProxy(chain.url, hook=lambda m, req: (403, b"<html>forbidden</html>"))
    limited = RpcProxy(chain.url, hook=lambda m, req: error(req, "rate limit exceeded", -32005))

    async def go() -> list[int]:
        out = []
        for first in (html, limited):
            async with RpcClient(f"{first.url},{chain.url}", retries=0) as rpc:
                out.append(await rpc.block_number())
        return out

    try:
        assert all(n >= 0 for n in trio.run(go))
    finally:
        html.kill()
        limited.kill()


def test_a_dripping_or_flooding_endpoint_is_cut_off(chain: World):
    """One endpoint sends its answer a byte every half second; another sends an endless answer: each
    call ends within its timeout (the whole call, not each read) or its size cap."""
    drip_srv = socket.socket()
    drip_srv.bind(("127.0.0.1", 0))
    drip_srv.listen()
    flood_srv = socket.socket()
    flood_srv.bind(("127.0.0.1", 0))
    flood_srv.listen()
    stop = threading.Event()

    def serve(srv: socket.socket, flood: bool) -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
                    while not stop.is_set():
                        if flood:
                            conn.sendall(b" " * 1_000_000)
                        else:
                            conn.sendall(b" ")
                            time.sleep(0.5)
                except OSError:
                    pass

    threads = [
        threading.Thread(target=serve, args=(s, f), daemon=True) for s, f in ((drip_srv, False), (flood_srv, True))
    ]
    for t in threads:
        t.start()

    async def go() -> tuple[float, float]:
        took = []
        for srv in (drip_srv, flood_srv):
            url = f"http://127.0.0.1:{srv.getsockname()[1]}"
            async with RpcClient(url, timeout=2.0, retries=0) as rpc:
                t0 = trio.current_time()
                with pytest.raises(RpcUnavailable):
                    await rpc.block_number()
                took.append(trio.current_time() - t0)
        return took[0], took[1]

    try:
        drip, flood = trio.run(go)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        drip_srv.close()
        flood_srv.close()
    assert drip < 4 and flood < 4, (drip, flood)


def _sender_through(proxy: RpcProxy, chain: World, **kw: Any) -> tuple[RpcClient, TxSender]:
    rpc = RpcClient(proxy.url)
    return rpc, TxSender(rpc, chain.admin, chain.deployment.chain_id, **kw)


def test_a_lagging_endpoint_never_makes_the_sender_pay_twice(chain: World):
    """Receipts never arrive through this endpoint (a lagging backend), though the transaction is
    mined: the sender keeps waiting for its own signatures and times out; it never signs again."""
    lag = RpcProxy(chain.url, hook=lambda m, req: result(req, None) if m in (
        "eth_getTransactionReceipt", "eth_getTransactionByHash") else None)  # fmt: skip
    b0 = balance(chain, chain.outsider.address)
    n0 = nonce(chain, chain.admin.address)

    async def go() -> None:
        rpc, sender = _sender_through(lag, chain, bump_after=0.3, receipt_timeout=4)
        async with rpc:
            with pytest.raises(TxTimeout):
                await sender.send(chain.outsider.address, "0x", value=10**18, gas=21_000, what="pay")

    try:
        trio.run(go)
    finally:
        lag.kill()
    assert nonce(chain, chain.admin.address) == n0 + 1
    assert balance(chain, chain.outsider.address) == b0 + 10**18  # once


def test_a_lying_nonce_too_low_never_makes_the_sender_pay_twice(chain: World):
    """The endpoint forwards the transaction, then says "nonce too low" and that it knows no such
    transaction: the chain shows the nonce used by our own signature, so nothing is signed again."""
    import httpx

    def lie(method: str, req: dict) -> Any:
        if method == "eth_sendRawTransaction":
            httpx.post(chain.url, json=req, timeout=10)
            return error(req, "nonce too low")
        if method == "eth_getTransactionByHash":
            return result(req, None)
        return None

    liar = RpcProxy(chain.url, hook=lie)
    b0 = balance(chain, chain.outsider.address)
    n0 = nonce(chain, chain.admin.address)

    async def go() -> None:
        rpc, sender = _sender_through(liar, chain, bump_after=0.3, receipt_timeout=10)
        async with rpc:
            r = await sender.send(chain.outsider.address, "0x", value=10**18, gas=21_000, what="pay")
            assert r.status == 1

    try:
        trio.run(go)
    finally:
        liar.kill()
    assert nonce(chain, chain.admin.address) == n0 + 1
    assert balance(chain, chain.outsider.address) == b0 + 10**18


def test_a_lying_tip_does_not_make_us_pay_the_cap(chain: World):
    liar = RpcProxy(
        chain.url, hook=lambda m, req: result(req, hex(10**21)) if m == "eth_maxPriorityFeePerGas" else None
    )

    async def go() -> int:
        rpc, sender = _sender_through(liar, chain)
        async with rpc:
            r = await sender.send(chain.outsider.address, "0x", value=1, gas=21_000, what="pay")
            tx = await rpc.request("eth_getTransactionByHash", [r.tx_hash])
            return int(tx["maxPriorityFeePerGas"], 16)

    try:
        tip = trio.run(go)
    finally:
        liar.kill()
    assert tip <= 2 * 10**9


def test_membership_keeps_its_view_when_an_endpoint_does_not_serve_a_block(chain: World):
    """A lagging endpoint answers `null` for the block the view was read up to: that is not a
    reorganisation; the view stays whole (and the poll is retried)."""
    pid = _setup(chain, ["0x" + "9a" * 32])
    lagging = {"on": False}
    proxy = RpcProxy(chain.url, hook=lambda m, req: result(req, None) if lagging["on"] and m == "eth_getBlockByNumber"
                     and req["params"][0] != "latest" else None)  # fmt: skip

    async def go() -> tuple[set[str], int]:
        async with await ChainClient.connect(proxy.url, chain.deployment, None) as c:
            cm = ChainMembership(c, pid, interval=0.1)
            before = await cm.refresh()
            rpc_sync(chain.url, "evm_mine")
            lagging["on"] = True
            with pytest.raises(ChainError):
                await cm.refresh()
            return set(cm.snapshot().members) ^ set(before.members), cm.reorgs

    try:
        changed, reorgs = trio.run(go)
    finally:
        proxy.kill()
    assert changed == set() and reorgs == 0


def test_a_transient_log_error_does_not_shrink_the_range(chain: World):
    hiccups = {"left": 3}

    def hiccup(method: str, req: dict) -> Any:
        if method == "eth_getLogs" and hiccups["left"]:
            hiccups["left"] -= 1
            return error(req, "internal error")
        return None

    proxy = RpcProxy(chain.url, hook=hiccup)

    async def go() -> int:
        async with await ChainClient.connect(proxy.url, chain.deployment, None) as c:
            for _ in range(3):
                with pytest.raises(ChainError):
                    await c.events(["WorkLedger"])
            await c.events(["WorkLedger"])
            return c.log_range

    try:
        assert trio.run(go) == 2_000
    finally:
        proxy.kill()


def test_records_a_reorganisation_brings_back_are_checked_again(tmp_path: Path):
    """State rules of the followers: a validator's record settled as gone from the chain is reopened
    when its `WorkRecorded` is read again; a worker's claimed record is reopened by the undo of a
    reorganisation after its claim."""
    from node.chain.abi import DecodedEvent

    v = ValidatorState(tmp_path / "v.db")
    ev = DecodedEvent("WorkLedger", "WorkRecorded", {"workKey": "0x" + "ab" * 32, "node": "0x" + "01" * 20,
                      "provider": "0x" + "02" * 20, "units": 5, "policyVersion": 0}, "0x" + "03" * 20, 10,
                      "0x" + "04" * 32, 0)  # fmt: skip
    v.add_records([ev], [])
    v.set_status(ev.args["workKey"], "settled", "gone")
    v.add_records([ev], [])
    assert [r["work_key"] for r in v.open_checks(("pending",))] == [ev.args["workKey"]]
    v.set_status(ev.args["workKey"], "settled", "deadline too close")
    v.add_records([ev], [])
    assert v.open_checks(("pending",)) == []  # any other outcome stays
    v.store.close()

    w = WorkerState(tmp_path / "w.db")
    w.track_recorded([("0xk", 100, 5)], [])
    w.done_recorded(["0xk"], 50)
    assert w.due_recorded(10**9, 10) == []
    w.store.execute_many(w.reopen_recorded_after(40))
    assert w.due_recorded(0, 10) == [("0xk", 100)]
    w.store.close()


def test_abi_answer_that_is_no_return_value_is_a_chain_error(chain: World):
    liar = RpcProxy(chain.url, hook=lambda m, req: result(req, "0x") if m == "eth_call" else None)

    async def go() -> None:
        async with await ChainClient.connect(liar.url, chain.deployment, None, check_code=False) as c:
            with pytest.raises(ChainError):
                await c.call("PoolManager", "getPool", 1)

    try:
        trio.run(go)
    finally:
        liar.kill()
