"""`intellect-node explorer`: a read-only web UI of a deployment's pools, from chain events (the audit's
own read) and, where given, daemons' `/status` pages.

The pages answer from memory: a refresh task re-reads the chain every `refresh` seconds (or, for a pool
whose read takes longer, twice as long as the read took) and swaps in the new views whole; a second task
polls the status pages (each answer bounded in time and size, and cleaned: `pool.explorer.status`). No
visitor can make the explorer read the chain beyond asking for a pool that exists, which the refresh task
then reads in its turn.

Every pool is reachable by its id, however many were created after it: the index lists them all (its rows
read `INDEX_READS` a round, new pools first), and the refresh task reads the newest `MAX_POOLS` pools and
the last `MAX_ASKED` that visitors asked for (or only those named). Every list is paged (`view`), so a
page costs the same in any pool; pages are drawn in a worker thread (one at a time), never on the event
loop the explorer shares with its host (the coordinator), and a drawn page is kept until the state it
shows changes. Served by the same trio HTTP core as the other servers (`node.httpd`), which ends idle
connections to make room for new ones (`evict_idle`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import h11
import httpx
import trio

from node import httpd
from node.audit_read import audit_snapshot
from node.chain.abi import load
from node.chain.client import ChainClient
from node.chain.errors import ChainError

from . import view
from .status import MAX_STATUS_BYTES, STATUS_TIMEOUT, clean, fetch_status

log = logging.getLogger("intellect.explorer")

MAX_POOLS = 64  # pools read in full when none are named: the newest ...
MAX_ASKED = 64  # ... and the last this many that visitors asked for
INDEX_READS = 64  # index rows (two calls each) read per round: new pools first, then the oldest rows
API_ROWS = 500  # nodes, providers and mismatches per page of /api/pool/N; pools per page of /api/pools
CACHE_BYTES = 16 << 20  # drawn answers kept, in all
_POOL_CREATED = load("PoolManager").event_topics["PoolCreated"]

__all__ = ["MAX_POOLS", "MAX_STATUS_BYTES", "STATUS_TIMEOUT", "Explorer", "fetch_status", "serve_explorer"]


@dataclass
class Explorer:
    """The explorer's state: the chain client, what to follow, and the latest views. Whatever a page
    reads is replaced whole, never changed in place (pages are drawn in a worker thread)."""

    chain: ChainClient
    pools: Sequence[int] = ()  # empty: every pool of the deployment
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
    generation: int = 0  # changes whenever anything a page shows does
    _created: frozenset[int] = frozenset()
    _created_from: int = -1
    _rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    _row_read: dict[int, float] = field(default_factory=dict)
    _asked: OrderedDict[int, None] = field(default_factory=OrderedDict)
    _cache: OrderedDict[str, tuple[int, list[h11.Event], int]] = field(default_factory=OrderedDict)
    _cached_bytes: int = 0
    _drawing: trio.CapacityLimiter | None = None

    def __post_init__(self) -> None:
        self._created_from = self.chain.deployment.block

    # ------------------------------------------------------------------ reading

    def _changed(self) -> None:
        self.generation += 1

    def _error(self, key: str, message: str | None) -> None:
        if self.errors.get(key) != message:
            self.errors = {k: v for k, v in self.errors.items() if k != key} | ({key: message} if message else {})
            self._changed()

    def known(self, pid: int) -> bool:
        """Whether `pid` is a pool this explorer shows (created, and named where pools are named)."""
        return pid in self._created and (not self.pools or pid in self.pools)

    def followed(self) -> list[int]:
        """The pools read in full: the named ones, else the newest `MAX_POOLS` and those visitors asked
        for; those not read yet first."""
        if self.pools:
            wanted = [p for p in sorted(self._created) if p in set(self.pools)]
        else:
            wanted = sorted(set(sorted(self._created)[-MAX_POOLS:]) | {p for p in self._asked if p in self._created})
        return sorted(wanted, key=lambda p: p in self.views)

    def ask(self, pid: int) -> None:
        """A visitor asked for pool `pid`: if it exists and is not read, the refresh task reads it."""
        if self.pools or not self.known(pid):
            return
        self._asked[pid] = None
        self._asked.move_to_end(pid)
        while len(self._asked) > MAX_ASKED:
            self._asked.popitem(last=False)

    async def read_index(self) -> list[int]:
        """The pools (PoolCreated events read from a cursor, never from the deployment again), their index
        rows (`INDEX_READS` a round), and the pools to read in full."""
        head = await self.chain.rpc.block_number() - self.chain.confirmations
        if head >= self._created_from:
            created = await self.chain.events(
                ["PoolManager"], from_block=self._created_from, to_block=head, topics=[_POOL_CREATED]
            )
            self._created = self._created | {int(ev.args["poolId"]) for ev in created}
            self._created_from = head + 1
        ids = [p for p in sorted(self._created) if self.known(p)]
        new = [p for p in reversed(ids) if p not in self._rows]
        stale = sorted((p for p in ids if p in self._rows), key=lambda p: self._row_read.get(p, 0.0))
        rows = dict(self._rows)
        for pid in (new + stale)[:INDEX_READS]:
            p = await self.chain.call("PoolManager", "getPool", pid)
            acct = await self.chain.call("WorkLedger", "poolAccount", pid)
            rows[pid] = {
                "pool_id": pid,
                "status": view.POOL_STATUS.get(int(p["status"]), str(p["status"])),
                "members": int(p["members"]),
                "budget": int(acct["budget"]),
                "owner": p["owner"],
                "spec_uri": str(p["specURI"]),
            }
            self._row_read[pid] = time.monotonic()
        index = [rows.get(pid) or {"pool_id": pid, "status": "not read yet"} for pid in ids]
        if index != self.index:
            self._rows, self.index = rows, index
            self._changed()
        wanted = self.followed()
        if any(p not in wanted for p in self.views):  # a pool no longer followed: its view goes
            keep = set(wanted)
            self.views = {p: v for p, v in self.views.items() if p in keep}
            self.reports = {p: r for p, r in self.reports.items() if p in keep}
            self._changed()
        return wanted

    async def read_pool(self, pid: int) -> None:
        started = time.monotonic()
        snap = await audit_snapshot(self.chain, pid)
        # building the view walks every record: off the event loop, like the pages
        v, report = await trio.to_thread.run_sync(lambda: (view.pool_view(snap), snap.report.to_dict()))
        self.views = self.views | {pid: v}
        self.reports = self.reports | {pid: report}
        self.read_at = self.read_at | {pid: time.time()}
        self._changed()
        log.info("pool %d read at block %d in %.1f s", pid, snap.report.block, time.monotonic() - started)

    async def refresh_loop(self) -> None:
        due: dict[int, float] = {}
        while True:
            try:
                wanted = await self.read_index()
                self._error("index", None)
            except ChainError as exc:
                self._error("index", str(exc))
                log.warning("cannot read the pools: %s", exc)
                wanted = []
            except Exception as exc:  # never the death of the daemon it may run in (the coordinator)
                self._error("index", f"internal error: {type(exc).__name__}")
                log.exception("reading the pools failed")
                wanted = []
            for pid in wanted:
                if trio.current_time() < due.get(pid, 0.0):
                    continue
                t0 = trio.current_time()
                try:
                    await self.read_pool(pid)
                    self._error(f"pool {pid}", None)
                except ChainError as exc:
                    self._error(f"pool {pid}", str(exc))
                    log.warning("cannot read pool %d: %s", pid, exc)
                except Exception as exc:  # as above: shown on the page, logged, retried next round
                    self._error(f"pool {pid}", f"internal error: {type(exc).__name__}")
                    log.exception("reading pool %d failed", pid)
                took = trio.current_time() - t0
                due[pid] = trio.current_time() + max(self.refresh, 2 * took) - self.refresh
            if not self.ready.is_set():
                self.ready.set()
                self._changed()
            await trio.sleep(self.refresh)

    async def live_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            found: list[dict[str, Any]] = []
            for fn in self.status_fns:
                try:
                    found.append({"url": "(this process)"} | clean(fn()))
                except Exception as exc:  # a daemon's own callable: shown, never fatal
                    found.append({"url": "(this process)", "error": f"{type(exc).__name__}: {exc}"[:200]})
            for url in self.status_urls:
                try:
                    found.append({"url": url} | await fetch_status(client, url))
                except Exception as exc:  # fetch_status never raises; if it did, that page's row says so
                    found.append({"url": url, "error": f"internal error: {type(exc).__name__}"})
            if found != self.live:
                self.live = found
                self._changed()
            await trio.sleep(min(self.refresh, 5.0))

    # ------------------------------------------------------------------ answering

    def updated(self, pid: int | None = None) -> str:
        at = self.read_at.get(pid) if pid is not None else max(self.read_at.values(), default=None)
        problems = "; ".join(f"{k}: {v}" for k, v in list(self.errors.items())[:20])
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "not read yet"
        return f"chain read {when}; refreshes every {self.refresh:g} s" + (f"; {problems}" if problems else "")

    def reward_curve(self) -> list[float]:
        for s in self.live:
            if s.get("role") == "coordinator" and isinstance(s.get("reward_curve"), list):
                return [x for x in s["reward_curve"] if isinstance(x, (int, float)) and not isinstance(x, bool)]
        return []

    async def answer(self, method: bytes, target: bytes) -> list[h11.Event]:
        """A request's answer (`httpd.serve_routes`' route): from the cache while the state it showed
        holds, else drawn by `route` in a worker thread, one at a time."""
        canonical = _canonical(target) if method == b"GET" else None
        if canonical is None:
            return self.route(method, target)  # 405 or 400: nothing to draw
        pid = _pool_of(canonical)
        if pid is not None:
            self.ask(pid)
        hit = self._cache.get(canonical)
        if hit is not None and hit[0] == self.generation:
            self._cache.move_to_end(canonical)
            return hit[1]
        if self._drawing is None:
            self._drawing = trio.CapacityLimiter(1)
        generation = self.generation
        async with self._drawing:
            events = await trio.to_thread.run_sync(self.route, method, canonical.encode())
        self._keep(canonical, generation, events)
        return events

    def _keep(self, key: str, generation: int, events: list[h11.Event]) -> None:
        size = sum(len(ev.data) for ev in events if isinstance(ev, h11.Data)) + len(key)
        if size > CACHE_BYTES // 8:
            return
        old = self._cache.pop(key, None)
        self._cached_bytes += size - (old[2] if old else 0)
        self._cache[key] = (generation, events, size)
        while self._cached_bytes > CACHE_BYTES or len(self._cache) > 4096:
            self._cached_bytes -= self._cache.popitem(last=False)[1][2]

    def route(self, method: bytes, target: bytes) -> list[h11.Event]:
        """The answer to a request, drawn from the current state (pure: safe in a worker thread)."""
        if method != b"GET":
            return httpd.json_response(405, {"error": "method not allowed", "allow": "GET"})
        try:
            url = target.decode("ascii")
        except UnicodeDecodeError:
            return httpd.json_response(400, {"error": "bad request target"})
        try:
            return self._route(url)
        except Exception as exc:  # a page that cannot be drawn is that page's failure, never the server's
            log.exception("explorer page %r failed", target[:200])
            return httpd.json_response(500, {"error": f"page failed: {type(exc).__name__}"})

    def _route(self, target: str) -> list[h11.Event]:
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.split("/") if p]
        page_no = _int(parse_qs(url.query).get("page", ["1"])[0], 1)
        if parts in ([], ["pools"]):
            if not self.ready.is_set():
                return _html(200, view.loading_page("the pools"))
            return _html(200, view.pools_page(self.index, page_no=page_no, updated=self.updated()))
        if parts == ["api", "pools"]:
            return httpd.json_response(
                200, _api_page(self.index, page_no, "/api/pools?", "pools") | {"errors": self.errors}
            )
        if parts == ["api", "status"]:
            return httpd.json_response(
                200, {"ready": self.ready.is_set(), "pools": sorted(self.views), "live": self.live}
            )
        if len(parts) >= 2 and parts[0] in ("pool", "api") and (parts[0] == "pool" or parts[1] == "pool"):
            rest = parts[1:] if parts[0] == "pool" else parts[2:]
            pid = _int(rest[0] if rest else "", -1)
            v = self.views.get(pid)
            if v is None:
                if not self.ready.is_set() or self.known(pid):
                    return _html(200, view.loading_page(f"pool {pid}"))
                return _html(404, view.page("not found", f"<p>no pool {view.e(pid)} here</p>", refresh=0))
            if parts[0] == "api":
                return httpd.json_response(200, self._api_pool(pid, page_no) | {"live": self.live})
            live, curve, updated = self.live, self.reward_curve(), self.updated(pid)
            if len(rest) == 1:
                return _html(200, view.pool_page(v, page_no=page_no, live=live, reward_curve=curve, updated=updated))
            if len(rest) == 2 and rest[1] in view.SECTIONS:
                return _html(200, view.section_page(v, rest[1], page_no=page_no, updated=updated))
            if len(rest) == 3 and rest[1] == "node":
                return _html(200, view.node_page(v, rest[2], page_no=page_no, updated=updated))
        return _html(404, view.page("not found", "<p>no such page</p>", refresh=0))

    def _api_pool(self, pid: int, page_no: int) -> dict[str, Any]:
        """The audit of pool `pid` as JSON: its lists (nodes, providers, mismatches) `API_ROWS` a page."""
        report = self.reports.get(pid)
        if report is None:
            return {"audit": None}
        lists = {k: report.get(k) or {} for k in ("nodes", "providers")} | {
            "mismatches": report.get("mismatches") or []
        }
        n = max(view.page_count(len(x), API_ROWS) for x in lists.values())
        cur = min(max(1, page_no), n)
        lo, hi = (cur - 1) * API_ROWS, cur * API_ROWS
        paged: dict[str, Any] = {}
        for k, x in lists.items():
            paged[k] = {key: x[key] for key in sorted(x)[lo:hi]} if isinstance(x, dict) else list(x)[lo:hi]
        nxt = f"/api/pool/{pid}?page={cur + 1}" if cur < n else None
        return {"audit": report | paged, "page": cur, "pages": n, "next": nxt}


def _api_page(rows: list[dict[str, Any]], page_no: int, base: str, key: str) -> dict[str, Any]:
    n = view.page_count(len(rows), API_ROWS)
    cur = min(max(1, page_no), n)
    nxt = f"{base}page={cur + 1}" if cur < n else None
    return {key: rows[(cur - 1) * API_ROWS : cur * API_ROWS], "page": cur, "pages": n, "next": nxt}


def _int(s: str, default: int) -> int:
    return int(s) if s.isdigit() and len(s) < 12 else default


def _canonical(target: bytes) -> str | None:
    """The request target as the pages read it (its path, and its page number if any): what the cache
    is keyed on, so queries the pages ignore cannot make every request a new drawing. None: not ASCII."""
    try:
        url = urlsplit(target.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    page_no = parse_qs(url.query).get("page", [""])[0]
    path = "/" + "/".join(quote(unquote(p), safe="") for p in url.path.split("/") if p)
    return path + (f"?page={int(page_no)}" if page_no.isdigit() and len(page_no) < 12 else "")


def _pool_of(path: str) -> int | None:
    parts = urlsplit(path).path.split("/")
    if len(parts) >= 3 and parts[1] == "pool":
        return _int(parts[2], -1)
    if len(parts) >= 4 and parts[1:3] == ["api", "pool"]:
        return _int(parts[3], -1)
    return None


def _html(status: int, body: str) -> list[h11.Event]:
    return httpd.response(status, body.encode(), "text/html; charset=utf-8")


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
        await httpd.serve_routes(stream, explorer.answer, timeout=30.0)

    async with httpx.AsyncClient(timeout=STATUS_TIMEOUT, follow_redirects=False) as client, trio.open_nursery() as n:
        n.start_soon(explorer.refresh_loop)
        n.start_soon(explorer.live_loop, client)
        bound = await n.start(
            lambda task_status: httpd.serve(
                host, port, handle, max_connections=max_connections, what="explorer", evict_idle=True,
                task_status=task_status,
            )
        )  # fmt: skip
        log.info("explorer serving on http://%s:%d/", host, bound)
        task_status.started(bound)
