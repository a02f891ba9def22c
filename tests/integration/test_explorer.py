"""The explorer against a real anvil chain with the compiled contracts: a pool with work recorded for two
nodes, one record slashed, a coordinator's status page serving a reward curve. Its pages (over real HTTP)
show the audit's numbers, the slash with its transaction and evidence, each node's records, and the chart;
hostile text from the chain is escaped. With Debian's Chromium installed, the same pages are loaded in
real headless Chromium (`tests/integration/test_explorer_browser.py`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import httpx
import trio

from node import ops
from node.audit_read import audit
from node.metrics import Metrics, serve_http
from pool.explorer.server import Explorer, serve_explorer
from pool.explorer.view import tokens
from tests.conftest import World, slash_now
from tests.integration.test_coordinator import _pool_with_two_members

CURVE = [-0.42, -0.31, -0.12, 0.05]


def work_keys(n: int, salt: str = "") -> list[str]:
    return ["0x" + hashlib.sha256(f"explorer {salt}{i}".encode()).hexdigest() for i in range(n)]


async def pool_with_work(chain: World, tmp_path: Path, n: int = 5) -> tuple[int, list[str]]:
    """A pool with `n` records (alternating between its two nodes), the first of them slashed."""
    pid = await _pool_with_two_members(chain, tmp_path)
    keys = work_keys(n, str(pid))
    items = [
        ops.WorkItem((chain.node, chain.node2)[i % 2].address, k, 100 * (i + 1), i % 3, "0x" + "cd" * 32)
        for i, k in enumerate(keys)
    ]
    async with await chain.client(chain.coordinator) as c:
        await ops.record_work(c, pid, items)
    await slash_now(chain, pid, keys[0], "0x" + "ee" * 32)
    return pid, keys


async def explorer_running(chain: World, nursery: trio.Nursery, status_urls: list[str]) -> tuple[Explorer, str]:
    reader = await chain.client(None)
    ex = Explorer(reader, status_urls=status_urls, refresh=1.0)
    port = await nursery.start(serve_explorer, ex, "127.0.0.1", 0)
    with trio.fail_after(60):
        await ex.ready.wait()
        while not ex.live and status_urls:
            await trio.sleep(0.1)
    return ex, f"http://127.0.0.1:{port}"


def card(page: str, name: str) -> str:
    m = re.search(r'data-k="' + re.escape(name) + r'">[^<]*<b>([^<]*)</b>', page)
    assert m is not None, f"no card {name!r}"
    return m.group(1)


async def test_the_explorer_shows_what_the_audit_finds(chain: World, tmp_path: Path) -> None:
    pid, keys = await pool_with_work(chain, tmp_path)
    async with await chain.client(None) as reader:
        report = await audit(reader, pid)
    assert report.consistent
    coord_status = {"role": "coordinator", "address": chain.coordinator.address, "peers": 3, "reward_curve": CURVE}
    async with trio.open_nursery() as nursery:
        status_port = await nursery.start(serve_http, Metrics(), "127.0.0.1", 0, lambda: coord_status)
        ex, base = await explorer_running(chain, nursery, [f"http://127.0.0.1:{status_port}/status"])
        async with httpx.AsyncClient() as http:

            async def get(path: str) -> httpx.Response:
                return await http.get(base + path, timeout=10)

            index = (await get("/")).text
            assert f'href="/pool/{pid}"' in index
            r = await get(f"/pool/{pid}")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            page = r.text
            t = report.totals
            assert "audit consistent" in page
            assert card(page, "recorded units") == f"{t['recorded_units']:,}"
            assert card(page, "invalidated units") == f"{t['invalidated_units']:,}"
            assert card(page, "pending units") == f"{t['pending_units']:,}"
            slashed = sum(n["slashed_tokens"] for n in report.nodes.values())
            assert slashed > 0 and card(page, "slashed") == f"{tokens(slashed)} INTL"
            assert card(page, "records") == str(len(keys))
            # the slash: its work key, evidence and the transaction that settled it
            tx = report.nodes[chain.node.address]["slashes"][0]["tx"]
            assert keys[0] in page and ("0x" + "ee" * 32) in page and tx in page
            # members with their provider's stake, validators, the reward chart and the live coordinator
            assert chain.node2.address in page and chain.validator.address in page
            assert tokens(report.providers[chain.provider.address]["staked"]) in page
            assert page.count("<circle") == len(CURVE) and "-0.420" in page and "0.050" in page
            assert "coordinator" in page and "/status</td>" in page
            # a node's page: its own records only
            node_page = (await get(f"/pool/{pid}/node/{chain.node2.address}")).text
            assert all((k in node_page) == (i % 2 == 1) for i, k in enumerate(keys))
            led = report.nodes[chain.node2.address]
            assert card(node_page, "recorded units") == f"{led['recorded_units']:,}"
            # the JSON mirror is the audit itself
            api: dict[str, Any] = (await get(f"/api/pool/{pid}")).json()
            assert api["audit"]["totals"] == t and api["audit"]["nodes"] == report.nodes
            # unknown pages and pools, other methods
            assert (await get("/pool/999")).status_code == 404
            assert (await get("/nowhere")).status_code == 404
            assert (await http.post(base + f"/pool/{pid}", content=b"x")).status_code == 405
        nursery.cancel_scope.cancel()
    await ex.chain.aclose()


async def test_text_from_the_chain_and_from_status_pages_is_escaped(chain: World, tmp_path: Path) -> None:
    """A pool owner writes the spec URI and the bootstrap address; a status page is anybody's. Neither can
    put markup into the explorer's pages."""
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    async with await chain.client(chain.admin) as admin:
        spec = ops.PoolSpec(
            chain.coordinator.address, "file:///s" + evil, "0x" + "11" * 32, 10**15, 3600, 10**18, 10**18,
            bootstrap="/ip4/1.2.3.4/tcp/1" + evil,
        )  # fmt: skip
        pid, _ = await ops.create_pool(admin, spec)

    async with trio.open_nursery() as nursery:
        status_port = await nursery.start(serve_http, Metrics(), "127.0.0.1", 0, lambda: {"role": evil, "phase": evil})
        ex, base = await explorer_running(chain, nursery, [f"http://127.0.0.1:{status_port}/status"])
        async with httpx.AsyncClient() as http:
            for path in ("/", f"/pool/{pid}"):
                page = (await http.get(base + path, timeout=10)).text
                assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page
        nursery.cancel_scope.cancel()
    await ex.chain.aclose()
