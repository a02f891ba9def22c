"""Weight broadcast over real HTTP servers on 127.0.0.1: origin -> relay -> client, faults included."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from node.weights.client import DownloadError, DownloadStats, SourceError, download
from node.weights.manifest import Manifest, shard_file
from node.weights.relay import Relay
from node.weights.serve import serve_weights
from node.weights.store import WeightStore
from tests.conftest import file_size_limit

ROOT = Path(__file__).resolve().parents[2]
SHARD = 128 * 1024


def _checkpoint(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "src" / "model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


async def _serve(
    nursery: trio.Nursery, store: WeightStore, rate: float | None = None, relay_hosts: Any = None
) -> tuple[str, trio.CancelScope]:
    """Start a server in its own cancel scope (cancel it to kill the node); returns (url, scope)."""
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve_weights(
                store, "127.0.0.1", 0, rate_limit_bytes_per_s=rate, relay_hosts=relay_hosts, task_status=task_status
            )

    port = await nursery.start(run)
    return f"http://127.0.0.1:{port}", scope


async def _relay(nursery: trio.Nursery, root: Path, upstream: str, prefetch: bool = True) -> tuple[Relay, str]:
    """Start a relay pulling from `upstream` and a server for its store; returns (relay, its url)."""
    relay = Relay(WeightStore(root), [upstream], prefetch=prefetch)
    await nursery.start(relay.run)
    url, _ = await _serve(nursery, relay.store)
    return relay, url


async def test_origin_relay_client_byte_exact(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path, 3 * 1024 * 1024 + 17)
    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(src, 1, shard_size=SHARD)
    async with trio.open_nursery() as nursery:
        origin_url, _ = await _serve(nursery, origin)
        relay, relay_url = await _relay(nursery, tmp_path / "relay", origin_url)
        relay.announce(1, m.manifest_hash())
        stats = DownloadStats()
        out = await download(1, m.manifest_hash(), [relay_url], tmp_path / "worker", stats=stats, timeout=30)
        assert out == tmp_path / "worker" / "1" / "model.safetensors"
        assert out.read_bytes() == src.read_bytes()
        assert sorted(stats.fetched) == list(range(len(m.shards)))
        assert not (tmp_path / "worker" / "1" / "shards").exists()
        assert await relay.wait(1, 10) and relay.store.complete(1)
        async with httpx.AsyncClient() as http:
            info = (await http.get(f"{relay_url}/versions")).json()["versions"]
            assert info == [
                {"version": 1, "manifest_hash": m.manifest_hash(), "shards": 25, "have": 25, "complete": True}
            ]
            assert (await http.get(f"{relay_url}/v/1/manifest.json")).content == m.to_json()
            assert (await http.get(f"{relay_url}/v/2/manifest.json")).status_code == 404
            assert (await http.get(f"{relay_url}/v/1/shard/99")).status_code == 404
            assert (await http.get(f"{relay_url}/nope")).status_code == 404
            assert (await http.post(f"{relay_url}/versions")).status_code == 405
            big = await http.get(f"{relay_url}/versions", headers={"X-Big": "a" * 20_000})
            assert big.status_code in (400, 431)
        # a second download of the same version is served from disk
        again = DownloadStats()
        await download(1, m.manifest_hash(), [relay_url], tmp_path / "worker", stats=again, timeout=10)
        assert again.fetched == []
        nursery.cancel_scope.cancel()


async def test_on_demand_relay_pipelines(tmp_path: Path) -> None:
    """A relay without prefetch fetches what is asked for; a relay that is still fetching makes clients wait."""
    src = _checkpoint(tmp_path, 1024 * 1024)
    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(src, 5, shard_size=SHARD)
    async with trio.open_nursery() as nursery:
        origin_url, _ = await _serve(nursery, origin, rate=2_000_000)
        relay, relay_url = await _relay(nursery, tmp_path / "relay", origin_url, prefetch=False)
        relay.announce(5, m.manifest_hash())
        out = await download(5, m.manifest_hash(), [relay_url], tmp_path / "w", timeout=30)
        assert out.read_bytes() == src.read_bytes()
        assert relay.store.complete(5)
        nursery.cancel_scope.cancel()


async def test_corrupt_source_detected_and_refetched(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path, 2 * 1024 * 1024)
    good = WeightStore(tmp_path / "good")
    m = good.publish(src, 3, shard_size=SHARD)
    bad = WeightStore(tmp_path / "bad")
    assert bad.publish(src, 3, shard_size=SHARD).manifest_hash() == m.manifest_hash()
    for i in range(len(m.shards)):  # same sizes, wrong bytes, served as if fine
        p = shard_file(tmp_path / "bad" / "3", i)
        data = bytearray(p.read_bytes())
        data[0] ^= 0xFF
        p.write_bytes(bytes(data))
    async with trio.open_nursery() as nursery:
        bad_url, _ = await _serve(nursery, bad)
        good_url, _ = await _serve(nursery, good)
        stats = DownloadStats()
        out = await download(3, m.manifest_hash(), [bad_url, good_url], tmp_path / "w", parallel=2, stats=stats)
        assert out.read_bytes() == src.read_bytes()
        assert stats.corrupt >= 1 and stats.sources[bad_url].corrupt >= 1
        assert stats.sources[bad_url].shards == 0  # nothing from the bad source was kept
        # with only the bad source, nothing is ever assembled
        with pytest.raises(DownloadError, match=r"supply|failed"):
            await download(3, m.manifest_hash(), [bad_url], tmp_path / "w2", timeout=20)
        assert not (tmp_path / "w2" / "3" / "model.safetensors").exists()
        assert not list((tmp_path / "w2" / "3" / "shards").iterdir())
        nursery.cancel_scope.cancel()


async def test_relay_dies_client_finishes_from_origin(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path, 4 * 1024 * 1024)
    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(src, 1, shard_size=SHARD)
    async with trio.open_nursery() as nursery:
        origin_url, _ = await _serve(nursery, origin, rate=3_000_000)
        relay_store = WeightStore(tmp_path / "relay")
        relay = Relay(relay_store, [origin_url])
        relay_scope = trio.CancelScope()

        async def run_relay(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with relay_scope:
                await relay.run(task_status=task_status)

        await nursery.start(run_relay)
        relay_url, relay_server = await _serve(nursery, relay_store, rate=3_000_000)
        relay.announce(1, m.manifest_hash())

        async def kill_relay() -> None:
            await trio.sleep(0.6)
            relay_server.cancel()
            relay_scope.cancel()

        nursery.start_soon(kill_relay)
        stats = DownloadStats()
        out = await download(1, m.manifest_hash(), [relay_url, origin_url], tmp_path / "w", stats=stats, timeout=30)
        assert out.read_bytes() == src.read_bytes()
        assert stats.failures >= 1 and stats.sources[origin_url].shards > 0
        assert not relay_store.complete(1)
        nursery.cancel_scope.cancel()


async def test_wrong_manifest_hash_refused(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path, 300_000)
    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(src, 2, shard_size=SHARD)
    async with trio.open_nursery() as nursery:
        url, _ = await _serve(nursery, origin)
        with pytest.raises(DownloadError, match="hash differs"):
            await download(2, "ab" * 32, [url], tmp_path / "w", timeout=10)
        assert not (tmp_path / "w" / "2").exists()
        relay_store = WeightStore(tmp_path / "relay")
        relay = Relay(relay_store, [url])
        await nursery.start(relay.run)
        relay.announce(2, "cd" * 32)
        assert not await relay.wait(2, 10)
        assert relay_store.versions() == [] and "hash differs" in relay.errors[2]
        nursery.cancel_scope.cancel()
    assert Manifest.from_json(origin.manifest_bytes(2) or b"") == m


async def test_interrupted_download_resumes(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path, 2 * 1024 * 1024)
    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(src, 4, shard_size=SHARD)
    async with trio.open_nursery() as nursery:
        url, _ = await _serve(nursery, origin, rate=2_000_000)
        first = DownloadStats()
        with trio.move_on_after(0.5) as cancelled:
            await download(4, m.manifest_hash(), [url], tmp_path / "w", stats=first)
        assert cancelled.cancelled_caught
        shard_dir = tmp_path / "w" / "4" / "shards"
        have = {int(p.name.split("-")[1]) for p in shard_dir.glob("shard-*")}
        assert 0 < len(have) < len(m.shards)
        second = DownloadStats()
        out = await download(4, m.manifest_hash(), [url], tmp_path / "w", stats=second, timeout=30)
        assert out.read_bytes() == src.read_bytes()
        assert second.resumed == len(have)
        assert sorted(second.fetched) == sorted(set(range(len(m.shards))) - have)
        nursery.cancel_scope.cancel()


async def test_failed_writes_are_download_errors_and_keep_verified_shards(tmp_path: Path) -> None:
    """A full disk is a `DownloadError` naming the folder (a worker logs it and tries again later, it does
    not crash); no partial file is left behind, and the shards already verified are kept for the next try."""
    src = _checkpoint(tmp_path, 4 * SHARD)
    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(src, 2, shard_size=SHARD)
    dest = tmp_path / "w"
    shard_dir = dest / "2" / "shards"
    async with trio.open_nursery() as nursery:
        url, _ = await _serve(nursery, origin)
        with file_size_limit(SHARD // 2), pytest.raises(DownloadError, match=f"cannot write version 2 under {dest}"):
            await download(2, m.manifest_hash(), [url], dest, timeout=30)  # no shard fits
        assert not list(shard_dir.glob("*.tmp")) and not list(shard_dir.glob(".*"))
        with file_size_limit(2 * SHARD), pytest.raises(DownloadError, match="File too large"):
            await download(2, m.manifest_hash(), [url], dest, timeout=30)  # shards fit, the whole file not
        assert len(list(shard_dir.glob("shard-*"))) == len(m.shards)
        assert not (dest / "2" / m.name).exists() and not list((dest / "2").glob(".*"))
        again = DownloadStats()
        out = await download(2, m.manifest_hash(), [url], dest, stats=again, timeout=30)
        assert out.read_bytes() == src.read_bytes()
        assert again.resumed == len(m.shards) and again.fetched == []
        nursery.cancel_scope.cancel()


async def test_relay_on_a_full_disk_fails_the_version_at_once_and_keeps_running(tmp_path: Path) -> None:
    """A relay that cannot store shards reports the version failed within seconds (its worker falls back
    to other sources instead of waiting minutes) and stays up: with room again it serves on demand."""
    src = _checkpoint(tmp_path, 4 * SHARD)
    want = src.read_bytes()
    origin = WeightStore(tmp_path / "origin")
    m3 = origin.publish(src, 3, shard_size=SHARD)
    m4 = origin.publish(_checkpoint(tmp_path, SHARD), 4, shard_size=SHARD)
    async with trio.open_nursery() as nursery:
        url, _ = await _serve(nursery, origin)
        relay, relay_url = await _relay(nursery, tmp_path / "relay", url)
        with file_size_limit(SHARD // 2), trio.fail_after(20), pytest.raises(SourceError, match="cannot store shard"):
            await relay.sync(3, m3.manifest_hash())
        (tmp_path / "relay" / "4").write_bytes(b"")  # the version's folder cannot be made
        with trio.fail_after(20), pytest.raises(SourceError, match="cannot store it"):
            await relay.sync(4, m4.manifest_hash())
        out = await download(3, m3.manifest_hash(), [relay_url], tmp_path / "w", timeout=30)
        assert out.read_bytes() == want
        assert relay.store.complete(3)
        nursery.cancel_scope.cancel()


async def test_prune_keeps_last_versions(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "origin", keep=2)
    manifests = {}
    for v in range(1, 5):
        manifests[v] = store.publish(_checkpoint(tmp_path, 10_000 + v), v, shard_size=4096)
    assert store.versions() == [3, 4]
    assert sorted(p.name for p in (tmp_path / "origin").iterdir()) == ["3", "4"]
    assert WeightStore(tmp_path / "origin", keep=2).versions() == [3, 4]  # reloads from disk
    with pytest.raises(ValueError):
        store.publish(_checkpoint(tmp_path, 10), 4)
    async with trio.open_nursery() as nursery:
        url, _ = await _serve(nursery, store)
        for v in (3, 4):
            await download(v, manifests[v].manifest_hash(), [url], tmp_path / "w", keep=1, timeout=10)
        assert [p.name for p in (tmp_path / "w").iterdir()] == ["4"]
        nursery.cancel_scope.cancel()
    # versions a validator may still need are spared beyond `keep`
    store.publish(_checkpoint(tmp_path, 10_005), 5, shard_size=4096, protect={3})
    assert store.versions() == [3, 4, 5]
    store.publish(_checkpoint(tmp_path, 10_006), 6, shard_size=4096)
    assert store.versions() == [5, 6]


def test_bench_small_run() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "broadcast.py"), "--size-mb", "4", "--clients", "4", "--cap-mb-s", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["clients"] == 4 and result["size_mb"] == 4
    assert result["bytes_verified"] == 2 * 4 * 4 * 1024 * 1024
    assert result["speedup"] > 1


async def test_worker_fetches_the_version_an_older_task_allows(tmp_path: Path) -> None:
    """A task issued before a restart allows versions 1..2 while the newest announcement is version 3
    (a worker only fetches the newest version as announcements arrive): the worker downloads version 2
    from the origin, loads it and generates with it, instead of waiting for a version it never fetches."""
    from eth_account import Account

    from node import protocol
    from node.chain.deployment import Deployment
    from node.policy import PolicyAnnouncement
    from node.worker import Worker, WorkerConfig

    origin = WeightStore(tmp_path / "origin", keep=4)
    manifests, sources = {}, {}
    for v in (1, 2, 3):
        src = _checkpoint(tmp_path, 5_000 + v)
        sources[v] = src.read_bytes()
        manifests[v] = origin.publish(src, v, shard_size=4096)
    cfg = WorkerConfig(
        pool_id=1,
        data_dir=tmp_path / "worker",
        rpc_url="http://127.0.0.1:1",
        deployment=Deployment(chain_id=31337, contracts={}, block=0),
        policy_wait=30.0,
        fresh_wait=1.0,
    )
    worker = Worker(cfg, Account.create(), Account.create())
    loaded: list[Path] = []

    class Engine:  # records what the worker hot-loads (vLLM's reload is tested in test_engine.py)
        def reload_weights(self, path: Path) -> None:
            loaded.append(path)

    worker.engine = Engine()
    task = protocol.Task("t-1", 1, "0x" + "11" * 20, "math", 7, 1, 1, {"temperature": 1.0, "max_tokens": 8},
                         policy_version=2, model="tiny", issued_at=0.0, expires_at=1e12, min_policy_version=1)  # fmt: skip
    async with trio.open_nursery() as nursery:
        url, _ = await _serve(nursery, origin)
        worker._nursery = nursery
        history = {v: m.manifest_hash() for v, m in manifests.items()}
        worker.book.update(PolicyAnnouncement(3, "tiny", history[3], [url], history))
        with trio.fail_after(20):
            version = await worker.ensure_policy(task)
        assert version == 2 and worker.loaded_version == 2
        assert loaded == [worker.downloaded[2]]
        assert loaded[0].read_bytes() == sources[2]
        # a task bound to an older version than the one loaded (resent from before the reload): back to it
        older = dataclasses.replace(task, task_id="t-2", policy_version=1, min_policy_version=1)
        with trio.fail_after(20):
            assert await worker.ensure_policy(older) == 1 and worker.loaded_version == 1
        assert loaded[-1].read_bytes() == sources[1]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("trusted", [True, False])
async def test_relay_priority_only_for_known_relay_hosts(tmp_path: Path, trusted: bool) -> None:
    """Under the upload cap a request with the relay header is served first (strict priority), but only
    from an address the origin knows as a relay's; from anywhere else the header buys nothing."""
    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(_checkpoint(tmp_path, 600_000), 1, shard_size=600_000)
    hosts = {"127.0.0.1"} if trusted else {"10.9.8.7"}
    finished: list[str] = []
    async with trio.open_nursery() as nursery:
        url, _ = await _serve(nursery, origin, rate=1_000_000, relay_hosts=lambda: hosts)

        async def fetch(name: str, headers: dict[str, str], delay: float) -> None:
            await trio.sleep(delay)
            async with httpx.AsyncClient() as http:
                r = await http.get(f"{url}/v/1/shard/0", headers=headers, timeout=30)
            assert r.status_code == 200 and len(r.content) == m.shards[0].size
            finished.append(name)

        with trio.fail_after(30):
            async with trio.open_nursery() as inner:
                inner.start_soon(fetch, "plain", {}, 0.0)
                inner.start_soon(fetch, "relay", {"x-weights-relay": "1"}, 0.15)
        nursery.cancel_scope.cancel()
    # the plain download started first; a trusted relay overtakes it, an untrusted one does not
    assert finished == (["relay", "plain"] if trusted else ["plain", "relay"])


async def test_connections_over_the_cap_get_503(tmp_path: Path) -> None:
    """A connection being answered fills the cap: the next one gets 503. An idle one (waiting for a
    request) is ended to make room instead."""
    import socket

    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(_checkpoint(tmp_path, 10_000), 1, shard_size=4096)
    origin.publish(_checkpoint(tmp_path, 4 << 20), 2, shard_size=4 << 20)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_weights(origin, "127.0.0.1", 0, max_connections=1, task_status=task_status)
        )
        url = f"http://127.0.0.1:{port}"
        idle = await trio.open_tcp_stream("127.0.0.1", port)
        await trio.sleep(0.05)
        async with httpx.AsyncClient() as http:
            r = await http.get(f"{url}/v/1/manifest.json", timeout=5)
            assert r.status_code == 200  # the idle connection was ended for it
            await idle.aclose()
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", port))
        held = trio.SocketStream(sock)  # asks for a 4 MiB shard and reads nothing: busy, it fills the cap
        await held.send_all(b"GET /v/2/shard/0 HTTP/1.1\r\nHost: x\r\n\r\n")
        await trio.sleep(0.2)
        async with httpx.AsyncClient() as http:
            r = await http.get(f"{url}/v/1/manifest.json", timeout=5)
            assert r.status_code == 503 and r.json() == {"error": "too many connections"}
            await held.aclose()
            await trio.sleep(0.05)
            r = await http.get(f"{url}/v/1/manifest.json", timeout=5)
            assert r.status_code == 200 and r.content == m.to_json()
        nursery.cancel_scope.cancel()


class _LyingStore(WeightStore):
    """A weight server that lists the pool's manifest hash for a version but holds another checkpoint."""

    def __init__(self, root: Path, claimed: str) -> None:
        super().__init__(root)
        self.claimed = claimed

    def info(self) -> list[dict[str, Any]]:
        return [dict(e, manifest_hash=self.claimed) for e in super().info()]


async def test_relay_probe_accepts_only_servers_of_the_pools_checkpoints(tmp_path: Path) -> None:
    """`probe_relay` (the coordinator's check before it lists a member's relay URL): a real relay that
    fetched the pool's version passes; an empty weight server, one holding another checkpoint, one that
    lies about what it holds, some other HTTP service, and a closed port are each refused with a reason."""
    from node.chain.anvil import free_port
    from node.metrics import Metrics, serve_http
    from node.weights.client import make_http_client, probe_relay

    origin = WeightStore(tmp_path / "origin")
    m = origin.publish(_checkpoint(tmp_path / "a", 300_000), 1, shard_size=SHARD)
    history = {1: "0x" + m.manifest_hash(), 0: ""}
    other = WeightStore(tmp_path / "other")
    other.publish(_checkpoint(tmp_path / "b", 300_000), 1, shard_size=SHARD)
    liar = _LyingStore(tmp_path / "liar", m.manifest_hash())
    liar.publish(_checkpoint(tmp_path / "c", 300_000), 1, shard_size=SHARD)
    async with trio.open_nursery() as nursery:
        origin_url, _ = await _serve(nursery, origin)
        relay, relay_url = await _relay(nursery, tmp_path / "relay", origin_url)
        empty_url, _ = await _serve(nursery, WeightStore(tmp_path / "empty"))
        other_url, _ = await _serve(nursery, other)
        liar_url, _ = await _serve(nursery, liar)
        metrics_port = await nursery.start(serve_http, Metrics(), "127.0.0.1", 0)
        async with make_http_client() as client:
            assert await probe_relay(client, relay_url, history) == "holds none of the pool's recent versions"
            with trio.fail_after(30):
                await relay.sync(1, m.manifest_hash())
            assert await probe_relay(client, relay_url, history) is None
            assert await probe_relay(client, origin_url, history) is None
            assert await probe_relay(client, empty_url, history) == "holds none of the pool's recent versions"
            assert await probe_relay(client, other_url, history) == "holds none of the pool's recent versions"
            assert (
                await probe_relay(client, liar_url, history)
                == f"{liar_url}: the manifest of version 1 differs from the pool's"
            )
            why = await probe_relay(client, f"http://127.0.0.1:{metrics_port}", history)
            assert why is not None and "HTTP 404" in why
            why = await probe_relay(client, f"http://127.0.0.1:{free_port()}", history, timeout=3)
            assert why is not None and "ConnectError" in why
            why = await probe_relay(client, "http://bad\x00host:1", history)  # refused, not raised
            assert why is not None and "InvalidURL" in why
        nursery.cancel_scope.cancel()


class _ThreadWatchingStore(WeightStore):
    """A weight store that notes the thread each change of its maps runs in (trio's own, or another)."""

    def __init__(self, root: Path) -> None:
        self.changed_in: list[int] = []
        super().__init__(root, keep=1)

    def _add(self, manifest: Manifest, present: set[int]) -> None:
        self.changed_in.append(threading.get_ident())
        super()._add(manifest, present)

    def _forget(self, version: int) -> Path:
        self.changed_in.append(threading.get_ident())
        return super()._forget(version)


async def test_the_coordinator_publishes_a_step_without_touching_the_store_from_a_thread(tmp_path: Path) -> None:
    """The coordinator splits a new checkpoint in a worker thread while trio's thread serves the store:
    the store's maps (which the server iterates) and its events change in trio's thread only."""
    from eth_account import Account

    from node.chain.deployment import Deployment
    from pool.coordinator import Coordinator, CoordinatorConfig

    c = Coordinator(
        CoordinatorConfig(1, tmp_path / "c", "http://127.0.0.1:1", Deployment(31337, {}, 0)), Account.create()
    )
    c.weights = store = _ThreadWatchingStore(tmp_path / "origin")

    class Trainer:  # what `_publish_step` asks of the GRPO trainer: its weights and optimizer state on disk
        def save(self, folder: Path) -> Path:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "model.safetensors").write_bytes(os.urandom(3 * SHARD))
            return folder

        def save_optimizer(self, folder: Path) -> None:
            (folder / "optimizer.pt").write_bytes(b"state")

    c.trainer = Trainer()
    for v in (1, 2):
        m = await c._publish_step(v, protect=set())
        assert m.version == v and store.complete(v)
    assert store.versions() == [2]  # version 1 pruned (keep=1), its folder deleted
    assert sorted(p.name for p in (tmp_path / "origin").iterdir()) == ["2"]
    assert store.changed_in and set(store.changed_in) == {threading.get_ident()}
