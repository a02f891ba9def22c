"""Chain reads against providers as they are, not as anvil is: one that refuses `eth_getLogs` ranges
over 1,000 blocks (a worker still claims everything, and its claim scan reads only new blocks), and
two RPC URLs of which the first dies mid-run (the roles carry on with the second; an endpoint that
serves another chain is never used). Real HTTP proxies in front of a real anvil."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from node.chain import ChainClient, RpcClient, RpcUnavailable
from node.chain.anvil import Anvil
from tests.conftest import World, advance_time_sync, rpc_sync
from tests.integration.test_status import _setup

WINDOW = 86_400


class RpcProxy:
    """A JSON-RPC proxy on 127.0.0.1 in front of `target`: it counts calls per method, records each
    `eth_getLogs` range it answers, refuses ranges over `max_log_range` the way hosted providers do,
    and can be killed (its port then refuses connections)."""

    def __init__(self, target: str, max_log_range: int | None = None, hook: Any = None) -> None:
        self.target = target
        self.max_log_range = max_log_range
        # hook(method, request) -> None (forward), a dict (answered as JSON), or (status, bytes) (sent as is)
        self.hook = hook
        self.calls: dict[str, int] = {}
        self.ranges: list[int] = []
        self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = json.loads(body)
                method = req.get("method", "")
                proxy.calls[method] = proxy.calls.get(method, 0) + 1
                if proxy.hook is not None:
                    answer = proxy.hook(method, req)
                    if isinstance(answer, tuple):
                        return self._raw(*answer)
                    if answer is not None:
                        return self._send(answer)
                if method == "eth_getLogs":
                    f = req["params"][0]
                    span = int(f["toBlock"], 16) - int(f["fromBlock"], 16) + 1
                    if proxy.max_log_range is not None and span > proxy.max_log_range:
                        proxy.refused += 1
                        err = {"code": -32005, "message": f"query exceeds max block range {proxy.max_log_range}"}
                        return self._send({"jsonrpc": "2.0", "id": req.get("id"), "error": err})
                    proxy.ranges.append(span)
                r = httpx.post(proxy.target, content=body, headers={"Content-Type": "application/json"}, timeout=30)
                self._send(r.json())

            def _send(self, obj: dict[str, Any]) -> None:
                self._raw(200, json.dumps(obj).encode())

            def _raw(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def kill(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def total(self) -> int:
        return sum(self.calls.values())


def _worker(chain: World, pid: int, url: str, data_dir: Path) -> Any:
    from node.worker import Worker, WorkerConfig

    cfg = WorkerConfig(pool_id=pid, data_dir=data_dir, rpc_url=url, deployment=chain.deployment)
    return Worker(cfg, chain.provider, chain.node)


def test_worker_claims_everything_through_a_provider_that_caps_log_ranges(chain: World, tmp_path: Path):
    rpc_sync(chain.url, "anvil_mine", [hex(1_200)], timeout=60)  # a history longer than the range cap
    keys = ["0x" + f"{i:02x}" * 32 for i in (1, 2, 3)]
    pid = _setup(chain, keys)
    advance_time_sync(chain.url, WINDOW + 1)
    proxy = RpcProxy(chain.url, max_log_range=1_000)

    async def go() -> tuple[int, int, int, dict[str, int]]:
        w = _worker(chain, pid, proxy.url, tmp_path / "w")
        w.chain = await ChainClient.connect(proxy.url, chain.deployment, chain.provider)
        try:
            reward = await w.claim_final()
            refused_first = proxy.refused
            rpc_sync(chain.url, "anvil_mine", [hex(10)])
            before = dict(proxy.calls)
            assert (
                await w.claim_final() == 0
            )  # nothing new: the next scan reads the new blocks only (10 and the claim's)
            after = {m: n - before.get(m, 0) for m, n in proxy.calls.items() if n > before.get(m, 0)}
            return reward, refused_first, w.state.tracked_count(), after
        finally:
            await w.chain.aclose()
            w.store.close()

    try:
        reward, refused, tracked, second = trio.run(go)
    finally:
        proxy.kill()
    assert reward == 600 * 10**16  # 100 + 200 + 300 units at the pool's rate: every record claimed
    assert refused >= 1 and max(proxy.ranges) <= 1_000
    assert tracked == 0  # claimed records are not tracked any more
    assert second.get("eth_getLogs", 0) == 1 and proxy.ranges[-1] <= 11, (second, proxy.ranges[-3:])
    assert sum(second.values()) <= 6, second  # a handful of calls, however long the history


def test_rpc_failover_when_the_first_url_dies(chain: World, tmp_path: Path):
    """Two URLs, the first a proxy that is killed mid-run: the worker's claim scan and a transaction
    go on through the second; the health report names the dead one."""
    keys = ["0x" + "a1" * 32]
    pid = _setup(chain, keys)
    advance_time_sync(chain.url, WINDOW + 1)
    first = RpcProxy(chain.url)
    urls = f"{first.url},{chain.url}"

    async def go() -> tuple[int, list[dict[str, Any]]]:
        w = _worker(chain, pid, urls, tmp_path / "w")
        w.chain = await ChainClient.connect(urls, chain.deployment, chain.provider)
        try:
            assert await w.chain.rpc.block_number() >= 0
            first.kill()
            with trio.fail_after(30):
                reward = await w.claim_final()
            return reward, w.chain.rpc.health()
        finally:
            await w.chain.aclose()
            w.store.close()

    reward, health = trio.run(go)
    assert reward == 100 * 10**16
    assert [h["url"] for h in health] == [first.url, chain.url]
    assert not health[0]["ok"] and health[0]["failures"] >= 1 and health[1]["ok"] and health[1]["calls"] > 0


def test_a_failover_endpoint_on_another_chain_is_never_used(chain: World):
    other = Anvil(chain_id=4242).start()
    first = RpcProxy(chain.url)

    async def go() -> list[dict[str, Any]]:
        async with RpcClient(f"{first.url},{other.url}", retries=0) as rpc:
            rpc.bind_chain(await rpc.chain_id())
            first.kill()
            with pytest.raises(RpcUnavailable):
                await rpc.block_number()  # the only live endpoint serves chain 4242: not an answer
            return rpc.health()

    try:
        health = trio.run(go)
    finally:
        other.stop()
    assert health[1]["wrong_chain"] and not health[1]["ok"]


def test_claims_follow_a_deep_reorganisation(own_chain: World, tmp_path: Path):
    """A record the worker has tracked is removed by a reorg past any confirmation depth: the claim
    scan reads it on chain when due, finds it gone, and forgets it without sending anything."""
    chain = own_chain  # an anvil of its own: reorganisations and the session chain's revert do not mix
    keys = ["0x" + "b2" * 32]
    pid = _setup(chain, keys)

    async def go() -> tuple[int, int, int]:
        w = _worker(chain, pid, chain.url, tmp_path / "w")
        w.chain = await ChainClient.connect(chain.url, chain.deployment, chain.provider)
        try:
            assert await w.claim_final() == 0 and w.state.tracked_count() == 1  # tracked, window open
            rpc_sync(chain.url, "anvil_reorg", [3, []])  # the recording block is replaced
            rpc_sync(chain.url, "evm_increaseTime", [WINDOW + 1])
            rpc_sync(chain.url, "evm_mine")
            n0 = int(str(rpc_sync(chain.url, "eth_getTransactionCount", [chain.provider.address, "latest"])), 16)
            got = await w.claim_final()
            n1 = int(str(rpc_sync(chain.url, "eth_getTransactionCount", [chain.provider.address, "latest"])), 16)
            return got, w.state.tracked_count(), n1 - n0
        finally:
            await w.chain.aclose()
            w.store.close()

    got, tracked, sent = trio.run(go)
    assert (got, tracked, sent) == (0, 0, 0)


def test_every_role_carries_on_when_the_first_of_two_urls_dies(chain: World, tmp_path: Path, monkeypatch, capsys):
    """Coordinator (recording work), validator (following and checking records), membership (every
    role's view) and a command (`chain info`), all given `dead-soon,anvil`: the first dies mid-run."""
    from cli.main import entry
    from node import ops
    from node.p2p.membership import ChainMembership
    from node.validator import Validator, ValidatorConfig

    keys = ["0x" + "f7" * 32]
    pid = _setup(chain, keys)
    first = RpcProxy(chain.url)
    urls = f"{first.url},{chain.url}"

    async def go() -> tuple[int, int, bool]:
        co = await ChainClient.connect(urls, chain.deployment, chain.coordinator)
        v = Validator(ValidatorConfig(pid, tmp_path / "v", urls, chain.deployment), chain.validator)
        v.chain = await ChainClient.connect(urls, chain.deployment, chain.validator)
        reader = await ChainClient.connect(urls, chain.deployment, None)
        try:
            cm = ChainMembership(reader, pid)
            await cm.refresh()
            assert await v.follow() == 1
            first.kill()  # mid-run
            item = ops.WorkItem(chain.node.address, "0x" + "f8" * 32, 10, 0, "0x" + "ab" * 32)
            with trio.fail_after(30):
                await ops.record_work(co, pid, [item])
                new = await v.follow()
                snap = await cm.refresh()
            return new, len(v.state.open_checks(("pending",))), chain.node.address in snap.members
        finally:
            for c in (co, v.chain, reader):
                await c.aclose()
            v.store.close()

    new, pending, member = trio.run(go)
    assert (new, pending, member) == (1, 2, True)
    monkeypatch.setenv("INTELLECT_DEPLOYMENT", str(chain.deployment_path))
    capsys.readouterr()
    assert entry(["chain", "info", "--rpc-url", urls, "--json"]) == 0  # the first URL is dead by now
    assert json.loads(capsys.readouterr().out)["chain_id"] == chain.deployment.chain_id
