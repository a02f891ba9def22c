"""The weight store of the Shardcast-style broadcast: versions on disk as ``<root>/<version>/manifest.json``
plus ``shard-NNNNNN`` files. The origin (coordinator) calls ``publish(path, version)``; relays and clients
add verified shards; waiters are woken when a shard or manifest arrives; old versions are pruned."""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import trio

from node.fsio import atomic_dir
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
