"""A relay of the weight broadcast: told about ``(version, manifest_hash)`` with ``announce``, it fetches
the manifest (hash checked) and then the shards from its upstreams, verifying each; a shard is served
downstream as soon as it is verified. A downstream request for a shard not yet there moves it to the
front of the relay's queue and waits (bounded) for it."""

from __future__ import annotations

import collections
import contextlib
import logging

import httpx
import trio

from node.weights.client import DownloadError, SourceError, fetch_manifest, fetch_shard, make_http_client
from node.weights.manifest import (
    Manifest,
)

from .serve import RELAY_HEADER
from .store import WeightStore

log = logging.getLogger(__name__)


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
