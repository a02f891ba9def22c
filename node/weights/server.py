"""Weight store, HTTP server and relay of the Shardcast-style weight broadcast.

- ``WeightStore(root, keep=3)``: versions on disk, ``<root>/<version>/manifest.json`` + ``shard-NNNNNN``.
  The origin (coordinator) calls ``publish(path, version)``; relays and clients add verified shards.
- ``serve_weights(store, host, port, ...)``: a trio + h11 HTTP/1.1 server with ``GET /versions``,
  ``GET /v/<version>/manifest.json`` and ``GET /v/<version>/shard/<i>``. Bounded: request head size,
  concurrent connections, requests per connection, idle time between requests and stall time per
  sent chunk. ``rate_limit_bytes_per_s`` caps the node's upload with one token bucket shared by all
  its connections.
- ``Relay(store, upstreams)``: told about ``(version, manifest_hash)`` with ``announce``, fetches the
  manifest (hash checked) and then the shards from its upstreams, verifying each; a shard is served
  downstream as soon as it is verified. A downstream request for a shard not yet there moves it to
  the front of the relay's queue and waits (bounded) for it; a 503 when it does not come in time.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import h11
import httpx
import trio

from node import httpd
from node.fsio import atomic_dir
from node.weights.client import DownloadError, SourceError, fetch_manifest, fetch_shard, make_http_client
from node.weights.manifest import (
    DEFAULT_SHARD_SIZE,
    MANIFEST_FILE,
    Manifest,
    missing_shards,
    shard_file,
    split,
    write_manifest,
    write_shard,
)

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8 * 1024
MAX_CONNECTIONS = 256
MAX_REQUESTS_PER_CONNECTION = 10_000
IDLE_TIMEOUT = 30.0  # waiting for (the rest of) a request head
HEAD_TIMEOUT = 10.0  # for a whole request head, once its first byte may come (slowloris)
RELAY_RESERVED = 32  # connection slots only known relays may take
MEMBER_RESERVED = 64  # connection slots kept for the addresses the pool's members connect from
SEND_STALL_TIMEOUT = 30.0  # one chunk not accepted by the peer for this long: drop the connection
SHARD_WAIT = 60.0  # a relay waits this long for a shard still being fetched before answering 503
SEND_CHUNK = 128 * 1024
RELAY_HEADER = b"x-weights-relay"  # "1" on a relay's upstream requests: served first under the cap
_SHARD_PATH = re.compile(rb"^/v/(\d{1,19})/shard/(\d{1,6})$")
_MANIFEST_PATH = re.compile(rb"^/v/(\d{1,19})/manifest\.json$")


# ---------------------------------------------------------------------- store


class WeightStore:
    """Checkpoint versions on disk; keeps the newest ``keep`` after ``prune()``.

    Not thread-safe; meant for one trio process. ``on_demand(version, index)`` is set by a ``Relay``
    so the server can ask for a shard it lacks.
    """

    def __init__(self, root: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)
        self._manifests: dict[int, Manifest] = {}
        self._manifest_bytes: dict[int, bytes] = {}
        self._present: dict[int, set[int]] = {}
        self._waiters: dict[tuple[int, int], trio.Event] = {}
        self._manifest_waiters: dict[int, trio.Event] = {}
        self.expected: set[int] = set()  # versions announced to a relay whose manifest is on its way
        self.on_demand: Callable[[int, int], None] | None = None
        for d in sorted(self.root.iterdir()):
            if d.is_dir() and d.name.isdigit() and (d / MANIFEST_FILE).is_file():
                try:
                    m = Manifest.from_json((d / MANIFEST_FILE).read_bytes())
                except ValueError as exc:
                    log.warning("ignoring %s: %s", d, exc)
                    continue
                if m.version != int(d.name):
                    log.warning("ignoring %s: manifest is for version %d", d, m.version)
                    continue
                missing = set(missing_shards(m, d))
                self._add(m, {i for i in range(len(m.shards)) if i not in missing})

    def _dir(self, version: int) -> Path:
        return self.root / str(version)

    def _add(self, manifest: Manifest, present: set[int]) -> None:
        self._manifests[manifest.version] = manifest
        self._manifest_bytes[manifest.version] = manifest.to_json()
        self._present[manifest.version] = present
        self.expected.discard(manifest.version)
        ev = self._manifest_waiters.pop(manifest.version, None)
        if ev is not None:
            ev.set()

    # -- reading
    def versions(self) -> list[int]:
        return sorted(self._manifests)

    def manifest(self, version: int) -> Manifest | None:
        return self._manifests.get(version)

    def manifest_bytes(self, version: int) -> bytes | None:
        return self._manifest_bytes.get(version)

    def has_shard(self, version: int, index: int) -> bool:
        return index in self._present.get(version, ())

    def shard_path(self, version: int, index: int) -> Path | None:
        return shard_file(self._dir(version), index) if self.has_shard(version, index) else None

    def complete(self, version: int) -> bool:
        m = self._manifests.get(version)
        return m is not None and len(self._present[version]) == len(m.shards)

    def missing(self, version: int) -> list[int]:
        m = self._manifests.get(version)
        if m is None:
            return []
        have = self._present[version]
        return [i for i in range(len(m.shards)) if i not in have]

    def info(self) -> list[dict[str, Any]]:
        return [
            {
                "version": v,
                "manifest_hash": hashlib.sha256(self._manifest_bytes[v]).hexdigest(),
                "shards": len(m.shards),
                "have": len(self._present[v]),
                "complete": self.complete(v),
            }
            for v, m in sorted(self._manifests.items())
        ]

    # -- writing
    def publish(
        self, path: Path, version: int, shard_size: int = DEFAULT_SHARD_SIZE, protect: Collection[int] = ()
    ) -> Manifest:
        """Origin: split the checkpoint file into shards as ``version``, then prune (sparing the versions
        in ``protect``). Returns the manifest. (A trio daemon runs the two halves apart: `split_version`
        in a worker thread, `adopt` in trio's.)"""
        manifest = self.split_version(path, version, shard_size)
        for folder in self.adopt(manifest, protect):
            shutil.rmtree(folder, ignore_errors=True)
        return manifest

    def split_version(self, path: Path, version: int, shard_size: int = DEFAULT_SHARD_SIZE) -> Manifest:
        """The blocking half of `publish`: the checkpoint split into shards in version ``version``'s
        folder. It touches only the disk, never the store's maps or events, so it may run in a worker
        thread while trio's thread serves the store; nothing is served until `adopt`."""
        if version in self._manifests:
            raise ValueError(f"version {version} already published")
        with atomic_dir(self._dir(version)) as tmp:
            manifest = split(Path(path), tmp, version, shard_size)
        return manifest

    def adopt(self, manifest: Manifest, protect: Collection[int] = ()) -> list[Path]:
        """The other half of `publish`, in the store's own thread: serve the version `split_version`
        wrote (waking whoever waits for it), then stop serving all but the newest ``keep`` and those in
        ``protect``. Returns the folders of the versions dropped, for the caller to delete (gigabytes
        each: a trio caller does it in a worker thread)."""
        self._add(manifest, set(range(len(manifest.shards))))
        return [self._forget(v) for v in self._prunable(protect)]

    def add_manifest(self, manifest: Manifest) -> None:
        """Relay: start holding ``manifest``'s version (already checked against the announced hash)."""
        if manifest.version in self._manifests:
            if self._manifest_bytes[manifest.version] != manifest.to_json():
                raise ValueError(f"a different manifest for version {manifest.version} is already held")
            return
        d = self._dir(manifest.version)
        d.mkdir(parents=True, exist_ok=True)
        write_manifest(d, manifest)
        self._add(manifest, set())

    def put_shard(self, version: int, index: int, data: bytes) -> bool:
        """Store a shard if it matches the manifest (True); wrong bytes are refused (False)."""
        m = self._manifests.get(version)
        if m is None or not m.verify_shard(index, data):
            return False
        if index not in self._present[version]:
            write_shard(self._dir(version), index, data)
            self._present[version].add(index)
        self._wake(version, index)
        return True

    def fail_shard(self, version: int, index: int) -> None:
        """A relay gave up on a shard: wake its waiters (they answer 503)."""
        self._wake(version, index)

    def _wake(self, version: int, index: int) -> None:
        ev = self._waiters.pop((version, index), None)
        if ev is not None:
            ev.set()

    async def wait_shard(self, version: int, index: int, timeout: float) -> Path | None:
        """The shard's path once present; None after ``timeout``, or when the fetch failed."""
        if self.has_shard(version, index):
            return self.shard_path(version, index)
        if version not in self._manifests or self.on_demand is None:
            return None
        ev = self._waiters.setdefault((version, index), trio.Event())
        self.on_demand(version, index)
        with trio.move_on_after(timeout):
            await ev.wait()
        return self.shard_path(version, index)

    async def wait_manifest(self, version: int, timeout: float) -> bytes | None:
        if version not in self._manifests and version in self.expected:
            ev = self._manifest_waiters.setdefault(version, trio.Event())
            with trio.move_on_after(timeout):
                await ev.wait()
        return self._manifest_bytes.get(version)

    def prune(self, protect: Collection[int] = ()) -> list[int]:
        """Drop all but the newest ``keep`` versions and those in ``protect``; returns the versions removed."""
        old = self._prunable(protect)
        for v in old:
            self.remove(v)
        return old

    def _prunable(self, protect: Collection[int]) -> list[int]:
        return [v for v in sorted(self._manifests)[: -self.keep] if v not in protect]

    def remove(self, version: int) -> None:
        """Stop holding ``version`` (its files go; anyone waiting for its shards is answered)."""
        shutil.rmtree(self._forget(version), ignore_errors=True)

    def _forget(self, version: int) -> Path:
        """Stop serving ``version`` and answer anyone waiting for its shards; returns its folder."""
        if self._manifests.pop(version, None) is not None:
            del self._manifest_bytes[version], self._present[version]
        for key in [k for k in self._waiters if k[0] == version]:
            self._waiters.pop(key).set()
        return self._dir(version)


# ---------------------------------------------------------------------- rate limit


class RateLimiter:
    """A token bucket shared by every connection of one server: ``rate`` bytes/s, ``burst`` bytes deep.

    ``take(n, high=True)`` is for relay traffic (each byte a relay gets is fanned out again): while any
    high-priority transfer is under way, ordinary ones wait for it (strict priority, work-conserving).
    """

    def __init__(self, rate: float, burst: int = 256 * 1024) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst = burst
        self._t = 0.0  # the (virtual) time at which all reserved bytes have been paid for
        self.high_active = 0
        self._high_idle = trio.Event()
        self._high_idle.set()

    def begin_high(self) -> None:
        self.high_active += 1
        if self.high_active == 1:
            self._high_idle = trio.Event()

    def end_high(self) -> None:
        self.high_active -= 1
        if self.high_active == 0:
            self._high_idle.set()

    async def take(self, n: int, high: bool = False) -> None:
        if not high:
            await self._high_idle.wait()
        now = trio.current_time()
        self._t = max(self._t, now - self.burst / self.rate) + n / self.rate
        delay = self._t - now
        if delay > 0:
            await trio.sleep(delay)


# ---------------------------------------------------------------------- HTTP server


async def _send(stream: trio.SocketStream, conn: h11.Connection, ev: h11.Event) -> None:
    data = conn.send(ev)
    if data:
        with trio.fail_after(SEND_STALL_TIMEOUT):
            await stream.send_all(data)


async def _send_body(
    stream: trio.SocketStream,
    conn: h11.Connection,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[str, str]] | None = None,
) -> None:
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
    await _send(stream, conn, h11.Response(status_code=status, headers=headers + (extra or [])))
    await _send(stream, conn, h11.Data(data=body))
    await _send(stream, conn, h11.EndOfMessage())


async def _send_json(stream: trio.SocketStream, conn: h11.Connection, status: int, data: Any) -> None:
    await _send_body(stream, conn, status, json.dumps(data, sort_keys=True).encode())


async def _send_file(
    stream: trio.SocketStream, conn: h11.Connection, path: Path, limiter: RateLimiter | None, high: bool
) -> None:
    data = path.read_bytes()  # at most one shard (bounded by the manifest's shard size)
    headers = [
        ("Content-Type", "application/octet-stream"),
        ("Content-Length", str(len(data))),
        ("Cache-Control", "no-store"),
    ]
    await _send(stream, conn, h11.Response(status_code=200, headers=headers))
    view = memoryview(data)
    if limiter is not None and high:
        limiter.begin_high()
    try:
        for off in range(0, len(data), SEND_CHUNK):
            piece = view[off : off + SEND_CHUNK]
            if limiter is not None:
                await limiter.take(len(piece), high)
            with trio.fail_after(SEND_STALL_TIMEOUT):
                for out in conn.send_with_data_passthrough(h11.Data(data=piece)) or ():
                    await stream.send_all(out)
    finally:
        if limiter is not None and high:
            limiter.end_high()
    await _send(stream, conn, h11.EndOfMessage())


async def _respond(
    stream: trio.SocketStream,
    conn: h11.Connection,
    store: WeightStore,
    limiter: RateLimiter | None,
    method: bytes,
    target: bytes,
    shard_wait: float,
    high: bool = False,
) -> None:
    path = target.split(b"?", 1)[0]
    if method != b"GET":
        await _send_json(stream, conn, 405, {"error": "method not allowed", "allow": "GET"})
        return
    if path == b"/versions":
        await _send_json(stream, conn, 200, {"versions": store.info()})
        return
    m = _MANIFEST_PATH.match(path)
    if m:
        body = await store.wait_manifest(int(m.group(1)), shard_wait)
        if body is None:
            await _send_json(stream, conn, 404, {"error": "unknown version"})
        else:
            await _send_body(stream, conn, 200, body)
        return
    m = _SHARD_PATH.match(path)
    if m:
        version, index = int(m.group(1)), int(m.group(2))
        manifest = store.manifest(version)
        if manifest is None:
            await _send_json(stream, conn, 404, {"error": "unknown version"})
            return
        if index >= len(manifest.shards):
            await _send_json(stream, conn, 404, {"error": "no such shard"})
            return
        shard = await store.wait_shard(version, index, shard_wait)
        if shard is None:
            await _send_body(
                stream,
                conn,
                503,
                b'{"error": "shard not available yet"}',
                extra=[("Retry-After", "1")],
            )
            return
        await _send_file(stream, conn, shard, limiter, high)
        return
    await _send_json(stream, conn, 404, {"error": "not found"})


async def _serve_connection(
    stream: trio.SocketStream,
    store: WeightStore,
    limiter: RateLimiter | None,
    shard_wait: float,
    relay_hosts: Callable[[], Collection[str]] | None = None,
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    peer = httpd.peer_ip(stream) if relay_hosts is not None else ""
    try:
        for _ in range(MAX_REQUESTS_PER_CONNECTION):
            try:
                ev = await httpd.read_request(stream, conn, HEAD_TIMEOUT, IDLE_TIMEOUT)
                if not isinstance(ev, h11.Request):
                    return
                while True:  # GET requests: any body is read and discarded, bounded
                    part = await httpd.next_event(stream, conn, IDLE_TIMEOUT)
                    if isinstance(part, h11.EndOfMessage):
                        break
                    if not isinstance(part, h11.Data) or len(part.data) > 0:
                        await _send_json(stream, conn, 413, {"error": "no request body expected"})
                        return
                high = any(k == RELAY_HEADER and v == b"1" for k, v in ev.headers) and (
                    relay_hosts is None or peer in relay_hosts()
                )
                await _respond(stream, conn, store, limiter, ev.method, ev.target, shard_wait, high)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _send_json(stream, conn, exc.error_status_hint, {"error": "bad request"})
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, h11.LocalProtocolError, OSError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def serve_weights(
    store: WeightStore,
    host: str,
    port: int,
    *,
    rate_limit_bytes_per_s: float | None = None,
    max_connections: int = MAX_CONNECTIONS,
    shard_wait: float = SHARD_WAIT,
    relay_hosts: Callable[[], Collection[str]] | None = None,
    member_hosts: Callable[[], Collection[str]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``store`` on ``host:port`` until cancelled; reports the bound port via ``task_status``.

    ``port = await nursery.start(serve_weights, store, "127.0.0.1", 0)``. Connections over
    ``max_connections`` get a 503 and are closed; ``rate_limit_bytes_per_s`` caps the whole node's upload.
    Requests with the relay header are served first under the cap (strict priority). With
    ``relay_hosts`` (the IP addresses of the known relays, asked per request) only connections from
    those addresses get that priority, so an ordinary client cannot claim it and starve the others.
    With ``member_hosts`` (where the pool's members connect from) `MEMBER_RESERVED` connections are kept
    for them: outsiders that take every other slot do not lock the members out of their weights.
    """
    limiter = RateLimiter(rate_limit_bytes_per_s) if rate_limit_bytes_per_s else None

    async def handle(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, store, limiter, shard_wait, relay_hosts)

    await httpd.serve(
        host, port, handle, max_connections=max_connections, what="weights server",
        trusted=relay_hosts, reserved=RELAY_RESERVED if relay_hosts is not None else 0,
        members=member_hosts, member_reserved=MEMBER_RESERVED, task_status=task_status,
    )  # fmt: skip


# ---------------------------------------------------------------------- relay


class Relay:
    """Fetches announced versions from ``upstreams`` (base URLs) into ``store``, shard by shard.

    Start the workers with ``await nursery.start(relay.run)``, serve the store with ``serve_weights``,
    then ``relay.announce(version, manifest_hash)`` (non-blocking) or ``await relay.sync(...)``.
    With ``prefetch`` (default) every shard is fetched; without it only the shards asked for
    downstream are (an on-demand cache). Downstream requests jump the queue either way.
    """

    def __init__(
        self,
        store: WeightStore,
        upstreams: list[str],
        *,
        parallel: int = 4,
        prefetch: bool = True,
        manifest_timeout: float = 60.0,
        shard_timeout: float = 120.0,
        attempts: int = 3,
    ) -> None:
        if not upstreams:
            raise ValueError("a relay needs at least one upstream")
        self.store = store
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.parallel = max(1, parallel)
        self.prefetch = prefetch
        self.manifest_timeout = manifest_timeout
        self.shard_timeout = shard_timeout
        self.attempts = max(1, attempts)
        self._queue: collections.deque[tuple[int, int]] = collections.deque()
        self._queued: set[tuple[int, int]] = set()
        self._inflight: set[tuple[int, int]] = set()
        self._lot = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None
        self._client: httpx.AsyncClient | None = None
        self._done: dict[int, trio.Event] = {}
        self.errors: dict[int, str] = {}
        self._shard_failed: dict[int, str] = {}  # version -> why a shard could not be had (while syncing)
        self.bytes_fetched = 0
        store.on_demand = self._demand

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        client = make_http_client(max_connections=max(8, 2 * self.parallel))
        client.headers[RELAY_HEADER.decode()] = "1"
        async with client, trio.open_nursery() as nursery:
            self._client, self._nursery = client, nursery
            for _ in range(self.parallel):
                nursery.start_soon(self._worker)
            task_status.started()

    def announce(self, version: int, manifest_hash: str) -> None:
        if self._nursery is None:
            raise RuntimeError("Relay.run is not running")
        if version in self._done:
            return
        self._done[version] = trio.Event()
        self.store.expected.add(version)
        self._nursery.start_soon(self._sync_version, version, manifest_hash)

    async def wait(self, version: int, timeout: float) -> bool:
        """True once ``version`` is complete (all shards when prefetching, else the manifest)."""
        ev = self._done.get(version)
        if ev is None:
            return self.store.complete(version)
        with trio.move_on_after(timeout):
            await ev.wait()
        return version not in self.errors and version in self.store.versions()

    async def sync(self, version: int, manifest_hash: str, timeout: float = 3600.0) -> Manifest:
        self.announce(version, manifest_hash)
        if not await self.wait(version, timeout):
            raise SourceError(f"relay could not fetch version {version}: {self.errors.get(version, 'timed out')}")
        m = self.store.manifest(version)
        assert m is not None
        return m

    async def _sync_version(self, version: int, manifest_hash: str) -> None:
        assert self._client is not None
        done = self._done[version]
        try:
            manifest = await fetch_manifest(self._client, self.upstreams, version, manifest_hash, self.manifest_timeout)
            self.store.add_manifest(manifest)
            self.store.prune()
            if not self.prefetch:
                return
            self._shard_failed.pop(version, None)
            for i in self.store.missing(version):
                self._enqueue(version, i, front=False)
            while not self.store.complete(version) and version in self.store.versions():
                if (failed := self._shard_failed.pop(version, None)) is not None:
                    raise SourceError(failed)  # downstream falls back to other sources at once
                ev = trio.Event()
                self._progress = ev
                with trio.move_on_after(1.0):
                    await ev.wait()
        except (SourceError, DownloadError, ValueError, OSError) as exc:  # OSError: the relay's own disk
            why = f"cannot store it: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
            self.errors[version] = why
            self.store.expected.discard(version)
            log.warning("relay: version %d failed: %s", version, why)
        finally:
            done.set()

    _progress: trio.Event | None = None

    def _demand(self, version: int, index: int) -> None:
        self._enqueue(version, index, front=True)

    def _enqueue(self, version: int, index: int, front: bool) -> None:
        key = (version, index)
        if key in self._inflight or self.store.has_shard(version, index):
            return
        if key in self._queued:
            if not front:
                return
            self._queue.remove(key)  # bounded by the store's shard count
        self._queued.add(key)
        if front:
            self._queue.appendleft(key)
        else:
            self._queue.append(key)
        self._lot.unpark()

    async def _worker(self) -> None:
        while True:
            while not self._queue:
                await self._lot.park()
            key = self._queue.popleft()
            self._queued.discard(key)
            if self.store.has_shard(*key) or self.store.manifest(key[0]) is None:
                continue
            self._inflight.add(key)
            try:
                failed = await self._fetch(*key)
            finally:
                self._inflight.discard(key)
            if failed is not None:
                self.store.fail_shard(*key)
                syncing = self._done.get(key[0])
                if syncing is not None and not syncing.is_set():
                    self._shard_failed.setdefault(key[0], failed)
            if self._progress is not None:
                self._progress.set()

    async def _fetch(self, version: int, index: int) -> str | None:
        """Fetch and store one shard: None when stored, else why not."""
        assert self._client is not None
        manifest = self.store.manifest(version)
        if manifest is None:
            return "pruned"
        n = len(self.upstreams)
        last = "no upstream"
        for attempt in range(self.attempts):
            for k in range(n):
                base = self.upstreams[(index + k) % n]
                try:
                    data = await fetch_shard(self._client, base, manifest, index, self.shard_timeout)
                except SourceError as exc:
                    log.info("relay: shard %d/%d from %s: %s", version, index, base, exc)
                    last = str(exc)
                    continue
                if self.store.manifest(version) is None:
                    return "pruned"  # meanwhile
                self.bytes_fetched += len(data)
                try:
                    stored = self.store.put_shard(version, index, data)
                except OSError as exc:  # a full disk: refetching would not help
                    log.warning("relay: cannot store shard %d of version %d: %s", index, version, exc)
                    return f"cannot store shard {index}: {exc.strerror or exc}"
                return None if stored else f"shard {index} does not match the manifest"
            with contextlib.suppress(Exception):
                await trio.sleep(min(0.5 * 2**attempt, 5.0))
        return f"no upstream supplied shard {index} after {self.attempts} rounds (last: {last})"
