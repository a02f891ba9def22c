"""`intellect-node explorer`: a read-only web UI of a deployment's pools, from chain events (the audit's
own read) and, where given, daemons' `/status` pages.

The pages answer from memory: a refresh task re-reads the chain every `refresh` seconds (or, for a pool
whose read takes longer, twice as long as the read took) and swaps in the new views whole; a second task
polls the status pages (each answer bounded in time and size). So a page of a pool with many thousand
records costs one render of `PAGE_ROWS` rows, however slow the chain is, and no visitor can make the
explorer read the chain. Served by the same trio HTTP core as the other servers (`node.httpd`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import h11
import httpx
import trio

from node import httpd
from node.audit_read import audit_snapshot
from node.chain.abi import load
from node.chain.client import ChainClient
from node.chain.errors import ChainError

from . import view

log = logging.getLogger("intellect.explorer")

MAX_STATUS_BYTES = 256 * 1024
STATUS_TIMEOUT = 3.0
MAX_POOLS = 64  # pools followed when none are named (the newest)
_POOL_CREATED = load("PoolManager").event_topics["PoolCreated"]


@dataclass
class Explorer:
    """The explorer's state: the chain client, what to follow, and the latest views."""

    chain: ChainClient
    pools: Sequence[int] = ()  # empty: every pool of the deployment (the newest MAX_POOLS)
    status_urls: Sequence[str] = ()
    status_fns: Sequence[Callable[[], dict[str, Any]]] = ()  # status of daemons in this process
    refresh: float = 10.0
    index: list[dict[str, Any]] = field(default_factory=list)
    views: dict[int, view.PoolView] = field(default_factory=dict)
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    read_at: dict[int, float] = field(default_factory=dict)
    live: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    ready: trio.Event = field(default_factory=trio.Event)
    _created: set[int] = field(default_factory=set)
    _created_from: int = -1

    def __post_init__(self) -> None:
        self._created_from = self.chain.deployment.block

    # ------------------------------------------------------------------ reading

    async def read_index(self) -> list[int]:
        """The pools followed (PoolCreated events read from a cursor, never from the deployment again)
        and their index rows."""
        head = await self.chain.rpc.block_number() - self.chain.confirmations
        if head >= self._created_from:
            created = await self.chain.events(
                ["PoolManager"], from_block=self._created_from, to_block=head, topics=[_POOL_CREATED]
            )
            self._created |= {int(ev.args["poolId"]) for ev in created}
            self._created_from = head + 1
        ids = sorted(self._created)
        wanted = [p for p in ids if p in set(self.pools)] if self.pools else ids[-MAX_POOLS:]
        index = []
        for pid in wanted:
            p = await self.chain.call("PoolManager", "getPool", pid)
            acct = await self.chain.call("WorkLedger", "poolAccount", pid)
            index.append(
                {
                    "pool_id": pid,
                    "status": view.POOL_STATUS.get(int(p["status"]), str(p["status"])),
                    "members": int(p["members"]),
                    "budget": int(acct["budget"]),
                    "owner": p["owner"],
                    "spec_uri": str(p["specURI"]),
                }
            )
        self.index = index
        return wanted

    async def read_pool(self, pid: int) -> None:
        started = time.monotonic()
        snap = await audit_snapshot(self.chain, pid)
        self.views[pid] = view.pool_view(snap)
        self.reports[pid] = snap.report.to_dict()
        self.read_at[pid] = time.time()
        log.info("pool %d read at block %d in %.1f s", pid, snap.report.block, time.monotonic() - started)

    async def refresh_loop(self) -> None:
        due: dict[int, float] = {}
        while True:
            try:
                wanted = await self.read_index()
                self.errors.pop("index", None)
            except ChainError as exc:
                self.errors["index"] = str(exc)
                log.warning("cannot read the pools: %s", exc)
                wanted = []
            except Exception as exc:  # never the death of the daemon it may run in (the coordinator)
                self.errors["index"] = f"internal error: {type(exc).__name__}"
                log.exception("reading the pools failed")
                wanted = []
            for pid in wanted:
                if trio.current_time() < due.get(pid, 0.0):
                    continue
                t0 = trio.current_time()
                try:
                    await self.read_pool(pid)
                    self.errors.pop(f"pool {pid}", None)
                except ChainError as exc:
                    self.errors[f"pool {pid}"] = str(exc)
                    log.warning("cannot read pool %d: %s", pid, exc)
                except Exception as exc:  # as above: shown on the page, logged, retried next round
                    self.errors[f"pool {pid}"] = f"internal error: {type(exc).__name__}"
                    log.exception("reading pool %d failed", pid)
                took = trio.current_time() - t0
                due[pid] = trio.current_time() + max(self.refresh, 2 * took) - self.refresh
            self.ready.set()
            await trio.sleep(self.refresh)

    async def live_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            found = []
            for fn in self.status_fns:
                try:
                    found.append({"url": "(this process)"} | fn())
                except Exception as exc:  # a daemon's own callable: shown, never fatal
                    found.append({"url": "(this process)", "error": f"{type(exc).__name__}: {exc}"[:200]})
            for url in self.status_urls:
                found.append({"url": url} | await fetch_status(client, url))
            self.live = found
            await trio.sleep(min(self.refresh, 5.0))

    # ------------------------------------------------------------------ answering

    def updated(self, pid: int | None = None) -> str:
        at = self.read_at.get(pid) if pid is not None else max(self.read_at.values(), default=None)
        problems = "; ".join(f"{k}: {v}" for k, v in self.errors.items())
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "not read yet"
        return f"chain read {when}; refreshes every {self.refresh:g} s" + (f"; {problems}" if problems else "")

    def reward_curve(self) -> list[float]:
        for s in self.live:
            if s.get("role") == "coordinator" and isinstance(s.get("reward_curve"), list):
                return [float(x) for x in s["reward_curve"] if isinstance(x, (int, float))]
        return []

    def route(self, method: bytes, target: bytes) -> list[h11.Event]:
        if method != b"GET":
            return httpd.json_response(405, {"error": "method not allowed", "allow": "GET"})
        try:
            return self._route(target.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return httpd.json_response(400, {"error": "bad request target"})
        except Exception as exc:  # a page that cannot be drawn is that page's failure, never the server's
            log.exception("explorer page %r failed", target[:200])
            return httpd.json_response(500, {"error": f"page failed: {type(exc).__name__}"})

    def _route(self, target: str) -> list[h11.Event]:
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.split("/") if p]
        query = parse_qs(url.query)
        page_no = _int(query.get("page", ["1"])[0], 1)
        if parts in ([], ["pools"]):
            if not self.ready.is_set():
                return _html(200, view.loading_page("the pools"))
            return _html(200, view.pools_page(self.index, updated=self.updated()))
        if parts == ["api", "pools"]:
            return httpd.json_response(200, {"pools": self.index, "errors": self.errors})
        if parts == ["api", "status"]:
            return httpd.json_response(
                200, {"ready": self.ready.is_set(), "pools": sorted(self.views), "live": self.live}
            )
        if len(parts) >= 2 and parts[0] in ("pool", "api") and (parts[0] == "pool" or parts[1] == "pool"):
            rest = parts[1:] if parts[0] == "pool" else parts[2:]
            pid = _int(rest[0] if rest else "", -1)
            v = self.views.get(pid)
            if v is None:
                if not self.ready.is_set() or pid in {p["pool_id"] for p in self.index}:
                    return _html(200, view.loading_page(f"pool {pid}"))
                return _html(404, view.page("not found", f"<p>no pool {view.e(pid)} here</p>", refresh=0))
            if parts[0] == "api":
                return httpd.json_response(200, {"audit": self.reports.get(pid), "live": self.live})
            if len(rest) == 1:
                body = view.pool_page(
                    v, page_no=page_no, live=self.live, reward_curve=self.reward_curve(), updated=self.updated(pid)
                )
                return _html(200, body)
            if len(rest) == 3 and rest[1] == "node":
                return _html(200, view.node_page(v, rest[2], page_no=page_no, updated=self.updated(pid)))
        return _html(404, view.page("not found", "<p>no such page</p>", refresh=0))


def _int(s: str, default: int) -> int:
    return int(s) if s.isdigit() and len(s) < 12 else default


def _html(status: int, body: str) -> list[h11.Event]:
    return httpd.response(status, body.encode(), "text/html; charset=utf-8")


async def fetch_status(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """A daemon's `/status` (a JSON object), read under a time and size bound; its failure as `error`."""
    try:
        with trio.fail_after(STATUS_TIMEOUT):
            async with client.stream("GET", url) as r:
                if r.status_code != 200:
                    return {"error": f"HTTP {r.status_code}"}
                body = b""
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_STATUS_BYTES:
                        return {"error": f"answer over {MAX_STATUS_BYTES} bytes"}
        data = json.loads(body)
    except trio.TooSlowError:
        return {"error": f"no answer within {STATUS_TIMEOUT:g} s"}
    except (httpx.HTTPError, ValueError, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return data if isinstance(data, dict) else {"error": "not a JSON object"}


async def serve_explorer(
    explorer: Explorer,
    host: str,
    port: int,
    *,
    max_connections: int = 64,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Read the chain and the status pages and serve the explorer on `host:port` until cancelled; the
    bound port is reported with `task_status.started(port)`."""

    async def handle(stream: trio.SocketStream) -> None:
        await httpd.serve_routes(stream, explorer.route, timeout=30.0)

    async with httpx.AsyncClient(timeout=STATUS_TIMEOUT, follow_redirects=False) as client, trio.open_nursery() as n:
        n.start_soon(explorer.refresh_loop)
        n.start_soon(explorer.live_loop, client)
        bound = await n.start(
            lambda task_status: httpd.serve(
                host, port, handle, max_connections=max_connections, what="explorer", task_status=task_status
            )
        )
        log.info("explorer serving on http://%s:%d/", host, bound)
        task_status.started(bound)
