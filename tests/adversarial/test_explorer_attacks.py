"""Attacks on the pool explorer (`pool.explorer`), against a real anvil chain with the compiled contracts
and over real HTTP on the loopback, each from what one outsider can do:

- a status page (anybody's: `--status URL`) that answers NaN, Infinity, a 400-digit integer or JSON
  nested 100,000 deep: the explorer's pages and its JSON stay whole (the page is shown cleaned or as
  its error), and the explorer (and the process that hosts it) lives on;
- idle sockets: 16 from each of 4 addresses held every connection slot, and visitors got 503 for 30 s;
  many clients misbehaving at once (idle, trickling, garbage, resets, huge heads, slow readers) leave an
  honest visitor served within its deadline;
- `createPool` is open to anyone: 64 pools created after a pool pushed it out of a fresh explorer's
  index and its page answered 404;
- a pool with 50,000 records and 5,000 members: every list is paged (a page is bounded, every member and
  record reachable by the page links), and pages are drawn off the event loop the explorer shares with
  its host (the coordinator), which keeps running while visitors load pages.

Client sockets bind 127.0.0.2, 127.0.0.3, ... (the whole 127/8 is loopback on Linux) to come from distinct
addresses. How fast pages are is `bench/explorer.py`'s business; the deadlines here are generous."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio

from node import httpd, ops
from node.audit import Rec
from node.metrics import Metrics, serve_http
from pool.explorer import server as explorer_server
from pool.explorer import view
from pool.explorer.server import MAX_POOLS, Explorer
from tests.conftest import World
from tests.integration.test_explorer import explorer_running, pool_with_work

HONEST_DEADLINE = 5.0


def _strict_json(text: str) -> Any:
    """JSON as every other parser reads it: no NaN, no Infinity."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


async def _serve_bytes(nursery: trio.Nursery, body: bytes) -> str:
    """A status page that answers `body` (as JSON) to every GET; its URL."""

    def route(method: bytes, target: bytes) -> list[h11.Event]:
        return httpd.response(200, body, "application/json")

    async def handle(stream: trio.SocketStream) -> None:
        await httpd.serve_routes(stream, route)

    port = await nursery.start(
        functools.partial(httpd.serve, "127.0.0.1", 0, handle, max_connections=16, what="hostile status")
    )
    return f"http://127.0.0.1:{port}/status"


_BIG = "1" + "0" * 400
HOSTILE_STATUS = {
    "nan": b'{"role": "coordinator", "peers": NaN, "phase": NaN, "reward_curve": [0.1, NaN, 0.2],'
    b' "gossip_rejected": {"blocks": NaN}}',
    "infinity": b'{"role": "coordinator", "peers": -Infinity, "reward_curve": [0.1, Infinity, -Infinity, 0.3],'
    b' "gossip_rejected": {"blocks": Infinity}}',
    "400 digits": (
        f'{{"role": "coordinator", "peers": {_BIG}, "reward_curve": [0.1, {_BIG}, -{_BIG}],'
        f' "gossip_rejected": {{"blocks": {_BIG}, "votes": 1e999}}}}'
    ).encode(),
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("body", HOSTILE_STATUS.values(), ids=HOSTILE_STATUS.keys())
async def test_a_hostile_status_page_breaks_nothing_but_its_own_row(chain: World, tmp_path: Path, body: bytes) -> None:
    """Old code: NaN in `gossip_rejected` made every pool page 400 (int(nan) raised ValueError, taken for a
    bad request target), Infinity and a 400-digit integer made it 500 (int(inf), float(10**400)), NaN went
    out as `NaN` in `/api/status` (JSON no strict parser reads), and JSON nested 100,000 deep was a
    segmentation fault of the whole process in the status poller's `json.loads` (py_ecc raises the
    recursion limit to 100,000 at import, so the C parser overflows its stack before any RecursionError):
    the explorer and the coordinator hosting it died."""
    pid, _ = await pool_with_work(chain, tmp_path)
    honest = {"role": "validator", "address": chain.validator.address, "peers": 2, "phase": "voting"}
    async with trio.open_nursery() as nursery:
        hostile_url = await _serve_bytes(nursery, body)
        honest_port = await nursery.start(serve_http, Metrics(), "127.0.0.1", 0, lambda: honest)
        ex, base = await explorer_running(chain, nursery, [hostile_url, f"http://127.0.0.1:{honest_port}/status"])
        with trio.fail_after(30):
            while pid not in ex.views:
                await trio.sleep(0.1)
        await trio.sleep(1.5)  # a few rounds of the status poller
        async with httpx.AsyncClient(timeout=10) as http:
            for path in ("/", f"/pool/{pid}", f"/pool/{pid}/node/{chain.node.address}"):
                r = await http.get(base + path)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
            page = (await http.get(base + f"/pool/{pid}")).text
            assert "audit consistent" in page and "voting" in page  # the honest daemon's row is still there
            for path in ("/api/status", f"/api/pool/{pid}", "/api/pools"):
                r = await http.get(base + path)
                assert r.status_code == 200, (path, r.status_code)
                _strict_json(r.text)
        nursery.cancel_scope.cancel()
    await ex.chain.aclose()


# ---------------------------------------------------------------------- sockets


async def _connect_from(ip: str, port: int, rcvbuf: int | None = None) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.bind((ip, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


def _honest_get(url: str) -> tuple[int, float]:
    t0 = time.monotonic()
    with httpx.Client(timeout=HONEST_DEADLINE) as c:
        status = c.get(url).status_code
    return status, time.monotonic() - t0


async def _explorer_with_a_pool(chain: World, tmp_path: Path, nursery: trio.Nursery) -> tuple[Explorer, str, int]:
    pid, _ = await pool_with_work(chain, tmp_path)
    ex, base = await explorer_running(chain, nursery, [])
    with trio.fail_after(30):
        while pid not in ex.views:
            await trio.sleep(0.1)
    return ex, base, pid


async def test_idle_sockets_from_four_addresses_do_not_lock_visitors_out(chain: World, tmp_path: Path) -> None:
    """Old code: 64 connections, a quarter per address: 16 idle sockets from each of 4 addresses took every
    slot for the 30 s a connection may last, and every visitor got 503. Now a new connection, when every
    slot is taken, evicts an idle one of the address that holds the most."""
    async with trio.open_nursery() as nursery:
        ex, base, pid = await _explorer_with_a_pool(chain, tmp_path, nursery)
        port = int(base.rsplit(":", 1)[1])
        held = [await _connect_from(f"127.0.0.{2 + a}", port) for a in range(4) for _ in range(16)]
        await held[-1].send_all(b"GET / HTTP/1.1\r\n")  # one of them with half a head, the others with nothing
        await trio.sleep(0.5)
        for path in ("/", f"/pool/{pid}"):
            status, took = await trio.to_thread.run_sync(_honest_get, base + path)
            assert status == 200, (path, status)
            print(f"\n[idle sockets] {path}: {status} in {took:.2f} s with 64 idle sockets from 4 addresses")
        for s in held:
            await trio.aclose_forcefully(s)
        nursery.cancel_scope.cancel()
    await ex.chain.aclose()


async def _misbehave(kind: str, ip: str, port: int, path: str, until: float) -> int:
    """One misbehaving client from `ip`, again and again until `until`; how many connections it made."""
    made = 0
    held: list[trio.SocketStream] = []
    try:
        while trio.current_time() < until:
            try:
                s = await _connect_from(ip, port, rcvbuf=4096 if kind == "slow reader" else None)
            except OSError:
                await trio.sleep(0.05)
                continue
            made += 1
            try:
                if kind == "idle":
                    held.append(s)
                    await trio.sleep(0.2)
                elif kind == "trickle":
                    held.append(s)
                    for b in b"GET / HTTP/1.1\r\nX: " + b"a" * 50:
                        if trio.current_time() >= until:
                            break
                        await s.send_all(bytes([b]))
                        await trio.sleep(0.5)
                elif kind == "garbage":
                    await s.send_all(bytes(range(256)) * 8 + b"\r\n\r\n")
                    await trio.aclose_forcefully(s)
                elif kind == "reset":
                    await s.send_all(b"GET /pool/1 HTTP/1.1\r\nHost: x\r\n")
                    s.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    await trio.aclose_forcefully(s)  # an RST, mid-head
                elif kind == "huge head":
                    await s.send_all(b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n")
                    await trio.aclose_forcefully(s)
                elif kind == "slow reader":  # asks for pages and never reads them
                    held.append(s)
                    await s.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * 20)
                    await trio.sleep(0.2)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await trio.aclose_forcefully(s)
            if len(held) > 40:
                await trio.aclose_forcefully(held.pop(0))
    finally:
        for s in held:
            await trio.aclose_forcefully(s)
    return made


async def test_many_misbehaving_clients_at_once_leave_an_honest_visitor_served(chain: World, tmp_path: Path) -> None:
    """Twelve addresses misbehave at once for 12 s (idle sockets, heads trickled a byte at a time,
    garbage, resets mid-head, 20 KB heads, pipelined page requests never read); a visitor from another
    address is served every page within its deadline all along, and the explorer still serves after."""
    kinds = ["idle", "trickle", "garbage", "reset", "huge head", "slow reader"] * 2
    async with trio.open_nursery() as nursery:
        ex, base, pid = await _explorer_with_a_pool(chain, tmp_path, nursery)
        port = int(base.rsplit(":", 1)[1])
        made: list[int] = []
        async with trio.open_nursery() as attack:
            until = trio.current_time() + 12.0

            async def one(kind: str, ip: str) -> None:
                made.append(await _misbehave(kind, ip, port, f"/pool/{pid}", until))

            for i, kind in enumerate(kinds):
                attack.start_soon(one, kind, f"127.0.0.{2 + i}")
            await trio.sleep(2.0)
            worst = 0.0
            for _ in range(4):
                for path in ("/", f"/pool/{pid}", f"/pool/{pid}/node/{chain.node.address}"):
                    status, took = await trio.to_thread.run_sync(_honest_get, base + path)
                    assert status == 200, (path, status)
                    worst = max(worst, took)
                await trio.sleep(1.0)
        print(
            f"\n[misbehaving clients] {sum(made)} connections from {len(kinds)} addresses; slowest honest page {worst:.2f} s"
        )
        status, _ = await trio.to_thread.run_sync(_honest_get, base + f"/pool/{pid}")
        assert status == 200
        nursery.cancel_scope.cancel()
    await ex.chain.aclose()


# ---------------------------------------------------------------------- many pools


async def test_a_pool_stays_reachable_whatever_the_number_of_pools_created_after_it(chain: World) -> None:
    """Old code: the explorer followed the newest `MAX_POOLS` pools; 64 `createPool` calls (open to
    anyone) after pool P took P off the index, and a fresh explorer answered 404 for /pool/P. Every pool
    is in the (paged) index, and a pool's page is there by its id."""
    async with await chain.client(chain.outsider) as spammer:
        spec = ops.PoolSpec(chain.coordinator.address, "file:///spec.json", "0x" + "11" * 32, 10**15, 3600)
        pid, _ = await ops.create_pool(spammer, spec)
        for _ in range(MAX_POOLS):
            await spammer.transact("PoolManager", "createPool", spec.as_params(), what="pool creation")
    async with trio.open_nursery() as nursery:
        ex, base = await explorer_running(chain, nursery, [])
        async with httpx.AsyncClient(timeout=10) as http:
            with trio.fail_after(60):
                while True:
                    r = await http.get(base + f"/pool/{pid}")
                    assert r.status_code == 200, r.status_code
                    if f"Pool {pid} " in r.text:
                        break
                    await trio.sleep(0.5)  # the loading page, while its pool is read
            api = (await http.get(base + f"/api/pool/{pid}")).json()
            assert api["audit"]["pool_id"] == pid
            # the index, page after page, lists every pool
            listed: set[int] = set()
            path: str | None = "/"
            for _ in range(100):
                if path is None:
                    break
                page = (await http.get(base + path)).text
                listed |= {int(x) for x in re.findall(r'href="/pool/(\d+)"', page)}
                nxt = re.search(r'<a href="([^"]+)" rel="next"', page)
                path = nxt.group(1).replace("&amp;", "&") if nxt else None
            assert set(range(pid, pid + MAX_POOLS + 1)) <= listed
        nursery.cancel_scope.cancel()
    await ex.chain.aclose()


# ---------------------------------------------------------------------- a big pool


N_RECORDS, N_MEMBERS = 50_000, 5_000


def _addr(i: int, salt: int) -> str:
    return "0x" + f"{salt:02x}{i:038x}"


def _inflate(v: view.PoolView) -> view.PoolView:
    """The pool as it would be with 50,000 records (one in ten slashed) of 5,000 members, 1,000 more
    gone: the view the explorer builds from the chain, grown (recording that many on anvil takes minutes)."""
    nodes = [_addr(i, 1) for i in range(N_MEMBERS)]
    recs = []
    for i in range(N_RECORDS):
        r = Rec(
            "0x" + f"{i:064x}", nodes[i % N_MEMBERS], _addr(i % N_MEMBERS, 2), 10, i % 4, "0x", 10**12, "0x" + "ab" * 32
        )
        if i % 10 == 0:
            r.status, r.slashed, r.validator, r.evidence, r.settled_tx = (
                "invalidated",
                10**18,
                nodes[0],
                "0xee",
                "0x" + "cd" * 32,
            )
        recs.append(r)
    ledger = dict(next(iter(v.nodes.values())))
    return dataclasses.replace(
        v,
        records=recs[::-1],
        members={n: _addr(i, 2) for i, n in enumerate(nodes)},
        nodes={n: ledger | {"node": n} for n in nodes},
        providers={_addr(i, 2): {"staked": 10**20, "unbonding": 0, "slashed": 0} for i in range(N_MEMBERS)},
        left={_addr(i, 3): "left" for i in range(1000)},
        validators=v.validators + [_addr(i, 4) for i in range(300)],
    )


async def _links(http: httpx.AsyncClient, base: str, path: str) -> str:
    r = await http.get(base + path)
    assert r.status_code == 200, (path, r.status_code)
    return r.text


def _last_link(page: str, prefix: str) -> str:
    """The link to the highest page number among the links starting with `prefix`."""
    found = [
        (int(n), h.replace("&amp;", "&"))
        for h, n in re.findall(r'href="(' + re.escape(prefix) + r'[^"]*?page=(\d+)[^"]*)"', page)
    ]
    assert found, f"no page links {prefix!r}"
    return max(found)[1]


async def test_a_big_pool_is_paged_everywhere_and_drawn_off_the_event_loop(
    chain: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old code: with 50,000 records and 5,000 members the pool page held every member, every node's work
    and every slash (seconds and tens of MB per page), drawn on the event loop it shares with the
    coordinator, which stalled for as long. Now every list is paged with links to each page, a page is
    bounded, and pages are drawn in a worker thread while the event loop keeps its beat."""
    pid, _ = await pool_with_work(chain, tmp_path)
    real_view, real_snapshot = view.pool_view, explorer_server.audit_snapshot

    def inflated_view(snap: Any) -> view.PoolView:
        v = real_view(snap)
        return _inflate(v) if v.pool_id == pid else v

    async def inflated_snapshot(c: Any, pool_id: int, *a: Any, **kw: Any) -> Any:
        snap = await real_snapshot(c, pool_id, *a, **kw)
        if pool_id != pid:
            return snap
        led = next(iter(snap.report.nodes.values()))
        nodes = {_addr(i, 1): led | {"node": _addr(i, 1)} for i in range(N_MEMBERS)}
        provs = {_addr(i, 2): next(iter(snap.report.providers.values())) for i in range(N_MEMBERS)}
        return dataclasses.replace(snap, report=dataclasses.replace(snap.report, nodes=nodes, providers=provs))

    monkeypatch.setattr(view, "pool_view", inflated_view)
    monkeypatch.setattr(explorer_server, "audit_snapshot", inflated_snapshot)
    loop_thread = threading.get_ident()
    drawn_on: set[int] = set()

    def spy(fn: Callable[..., str]) -> Callable[..., str]:
        def wrapped(*a: Any, **kw: Any) -> str:
            drawn_on.add(threading.get_ident())
            return fn(*a, **kw)

        return wrapped

    for name in ("pool_page", "node_page", "pools_page"):
        monkeypatch.setattr(view, name, spy(getattr(view, name)))

    async with trio.open_nursery() as nursery:
        ex, base = await explorer_running(chain, nursery, [])
        with trio.fail_after(60):
            while pid not in ex.views:
                await trio.sleep(0.1)
        v = ex.views[pid]
        assert len(v.records) == N_RECORDS
        gaps: list[float] = []

        async def heartbeat(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            last = time.monotonic()
            while True:
                await trio.sleep(0.02)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async with httpx.AsyncClient(timeout=30) as http:
            page = await _links(http, base, f"/pool/{pid}")
            print(f"\n[big pool] the pool page: {len(page):,} bytes")
            assert len(page) < 1_000_000 and page.count("<tr>") < 800
            # every member, node and slash reachable through the page links
            last_member = sorted(v.members)[-1]
            last_node = sorted(v.nodes)[-1]
            for prefix, wanted in (
                (f"/pool/{pid}/members?", last_member),
                (f"/pool/{pid}/work?", last_node),
                (f"/pool/{pid}/disputes?", v.records[-1].work_key),
                (f"/pool/{pid}?", v.records[-1].work_key),
                (f"/pool/{pid}/left?", sorted(v.left)[-1]),
                (f"/pool/{pid}/validators?", v.validators[-1]),
            ):
                last = await _links(http, base, _last_link(page, prefix))
                assert wanted in last, prefix
                rows = last.count("<tr>")
                assert len(last) < 1_000_000  # the pool page holds a page of each list, a list's page one
                assert rows < 800 if prefix == f"/pool/{pid}?" else rows <= view.PAGE_ROWS + 1
            node = await _links(http, base, f"/pool/{pid}/node/{v.records[0].node}")
            assert len(node) < 1_000_000
            api = await _links(http, base, f"/api/pool/{pid}")
            print(f"[big pool] /api/pool/{pid}: {len(api):,} bytes")
            assert len(api) < 2_000_000
            audit = _strict_json(api)
            assert audit["pages"] > 1 and audit["next"]
            last_api = _strict_json(await _links(http, base, f"/api/pool/{pid}?page={audit['pages']}"))
            assert last_node in last_api["audit"]["nodes"]
            # visitors load pages while the event loop (the coordinator's, when it hosts the explorer) beats
            drawn_on.clear()
            await nursery.start(heartbeat)
            paths = [f"/pool/{pid}", f"/pool/{pid}?page={N_RECORDS // view.PAGE_ROWS}", f"/pool/{pid}/node/{v.records[0].node}",
                     f"/pool/{pid}/members?page=7", "/"]  # fmt: skip

            async def visitor(i: int) -> None:
                for k in range(10):
                    await _links(
                        http,
                        base,
                        paths[(i + k) % len(paths)]
                        + ("&" if "?" in paths[(i + k) % len(paths)] else "?")
                        + f"x={i}{k}",
                    )

            with trio.fail_after(120):
                async with trio.open_nursery() as visitors:
                    for i in range(4):
                        visitors.start_soon(visitor, i)
        print(f"[big pool] the event loop's longest gap while 4 visitors loaded 40 pages: {max(gaps):.3f} s")
        assert drawn_on and loop_thread not in drawn_on, "pages were drawn on the event loop"
        assert max(gaps) < 1.0
        nursery.cancel_scope.cancel()
    await ex.chain.aclose()
