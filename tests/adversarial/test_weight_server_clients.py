"""Clients that misbehave against the weight server (real sockets on the loopback, the real server): one
that reads 64 bytes of a shard and resets, one that stops reading, one that sends garbage, idle
sockets, slow request heads and slow readers. Each ends its own connection, never the server (the
coordinator runs it in its main nursery); idle and slow sockets cost their address a share of the
connections, not all of them; a request streams its shard from disk in small pieces, so slow readers
do not hold a shard each in memory. Meanwhile an honest client downloads the version in time."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from node.weights import serve
from node.weights.client import DownloadError, download
from node.weights.serve import MAX_CONNECTIONS, serve_weights
from node.weights.store import WeightStore

MB = 1024 * 1024
HONEST_IP = "127.0.0.1"
ATTACKER_IPS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")  # the whole 127/8 is loopback on Linux


def _publish(tmp_path: Path, size: int, shard_size: int) -> tuple[WeightStore, str]:
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(os.urandom(size))
    store = WeightStore(tmp_path / "origin")
    manifest = store.publish(checkpoint, 1, shard_size=shard_size)
    checkpoint.unlink()
    return store, manifest.manifest_hash()


@contextlib.asynccontextmanager
async def _server(store: WeightStore, **kw: object) -> AsyncIterator[tuple[int, list[BaseException]]]:
    """The weight server on a free port; an exception that ends it is kept in the list (instead of
    ending the test with it) so a test can say that the server died."""
    died: list[BaseException] = []

    async def run(task_status: trio.TaskStatus[int]) -> None:
        try:
            await serve_weights(store, "127.0.0.1", 0, task_status=task_status, **kw)  # type: ignore[arg-type]
        except Exception as exc:
            died.append(exc)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(run)
        yield port, died
        nursery.cancel_scope.cancel()


async def _connect(port: int, ip: str, rcvbuf: int | None = None) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # a small window: the server's sends stall as soon as this client stops reading
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.bind((ip, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


def _get(index: int, relay: bool = False) -> bytes:
    extra = "X-Weights-Relay: 1\r\n" if relay else ""
    return f"GET /v/1/shard/{index} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


async def _receive(stream: trio.SocketStream, n: int, seconds: float = 10.0) -> bytes:
    got = b""
    with trio.move_on_after(seconds):
        while len(got) < n:
            try:
                data = await stream.receive_some(n - len(got))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                break
            if not data:
                break
            got += data
    return got


def _reset(stream: trio.SocketStream) -> None:
    """Close with a TCP reset (linger 0) instead of a FIN."""
    with contextlib.suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def _reset_after_64_bytes(port: int, ip: str, index: int, relay: bool = False) -> None:
    with contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        stream = await _connect(port, ip, rcvbuf=4096)
        await stream.send_all(_get(index, relay))
        await _receive(stream, 64)
        _reset(stream)


async def _stall(port: int, ip: str, index: int, held: list[trio.SocketStream], relay: bool = False) -> None:
    """Ask for a shard and read nothing more than the first bytes of the answer."""
    with contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        stream = await _connect(port, ip, rcvbuf=4096)
        held.append(stream)
        await stream.send_all(_get(index, relay))
        await _receive(stream, 1)


async def _garbage(port: int, ip: str) -> None:
    with contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        stream = await _connect(port, ip)
        await stream.send_all(os.urandom(4096) + b"\r\n\r\n")
        await _receive(stream, 1 << 20, 5.0)
        _reset(stream)


async def _idle(port: int, ip: str, held: list[trio.SocketStream], head: bytes = b"") -> None:
    with contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        stream = await _connect(port, ip)
        held.append(stream)
        if head:
            await stream.send_all(head)


async def _honest_download(port: int, manifest_hash: str, dest: Path, deadline: float) -> int:
    """The whole version, verified, from the honest address; returns its size."""
    with trio.fail_after(deadline):
        path = await download(1, manifest_hash, [f"http://127.0.0.1:{port}"], dest, parallel=4, timeout=deadline)
    return path.stat().st_size


async def _honest_versions(port: int, ip: str = HONEST_IP) -> int:
    transport = httpx.AsyncHTTPTransport(local_address=ip)
    async with httpx.AsyncClient(timeout=5.0, transport=transport) as c:
        return (await c.get(f"http://127.0.0.1:{port}/versions")).status_code


def _close_all(streams: list[trio.SocketStream]) -> None:
    for s in streams:
        with contextlib.suppress(OSError):
            s.socket.close()


@pytest.mark.parametrize("attack", ["reset", "stall", "garbage", "relay-reset", "relay-stall"])
async def test_one_misbehaving_client_ends_only_its_own_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attack: str
) -> None:
    """Old code: a reset after 64 bytes of a shard, or a reader that stalls past the send-stall timeout,
    raised an exception group out of the per-piece nursery that nothing caught: the whole server died
    (connection refused for everyone after). A listed relay's transfer under the upload cap (its pieces
    sent in a nursery that takes its priority away when a send stalls) ends the same way."""
    monkeypatch.setattr(serve, "SEND_STALL_TIMEOUT", 2.0)  # the stall, without waiting 30 s
    store, mhash = _publish(tmp_path, 16 * MB, 4 * MB)
    held: list[trio.SocketStream] = []
    relay = attack.startswith("relay-")
    kw = {"rate_limit_bytes_per_s": 200e6, "relay_hosts": lambda: {ATTACKER_IPS[0]}} if relay else {}
    with trio.fail_after(60):
        async with _server(store, **kw) as (port, died):
            if attack.endswith("reset"):
                await _reset_after_64_bytes(port, ATTACKER_IPS[0], 0, relay)
            elif attack.endswith("stall"):
                await _stall(port, ATTACKER_IPS[0], 0, held, relay)
            else:
                await _garbage(port, ATTACKER_IPS[0])
            await trio.sleep(serve.SEND_STALL_TIMEOUT + 1.0)  # past the stalled send's deadline
            assert not died, f"the weight server died of one client ({attack}): {died[0]!r}"
            assert await _honest_download(port, mhash, tmp_path / "honest", 30.0) == 16 * MB
            assert not died
            _close_all(held)


async def test_many_misbehaving_clients_at_once_an_honest_client_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four addresses at once: each resets mid-shard, stalls its reads, sends garbage, holds idle
    sockets and unfinished request heads (more than its share of the server). An honest client from
    another address downloads the whole version within its deadline, and the server lives on."""
    monkeypatch.setattr(serve, "SEND_STALL_TIMEOUT", 3.0)
    store, mhash = _publish(tmp_path, 16 * MB, 4 * MB)
    held: list[trio.SocketStream] = []
    with trio.fail_after(120):
        async with _server(store) as (port, died):
            async with trio.open_nursery() as attack:
                for ip in ATTACKER_IPS:
                    for k in range(8):
                        attack.start_soon(_reset_after_64_bytes, port, ip, k % 4)
                        attack.start_soon(_stall, port, ip, k % 4, held)
                        attack.start_soon(_garbage, port, ip)
                    for _ in range(24):
                        attack.start_soon(_idle, port, ip, held)
                        attack.start_soon(_idle, port, ip, held, b"GET /versions HTTP/1.1\r\nHost")
                await trio.sleep(0.5)
                try:
                    size = await _honest_download(port, mhash, tmp_path / "honest", 30.0)
                except (trio.TooSlowError, DownloadError) as exc:
                    why = f"the server died: {died[0]!r}" if died else "the server lives"
                    pytest.fail(f"the honest client was not served in time ({exc!r}); {why}")
            assert not died, f"the weight server died: {died[0]!r}"
            assert size == 16 * MB
            await trio.sleep(serve.SEND_STALL_TIMEOUT + 1.0)  # the stalled sends time out: still alive
            assert not died, f"the weight server died: {died[0]!r}"
            assert await _honest_versions(port) == 200
            _close_all(held)


async def test_idle_sockets_from_a_few_addresses_do_not_lock_an_outsider_out(tmp_path: Path) -> None:
    """Old code: one address could hold a quarter of the connections, so 64 idle sockets from each of 4
    addresses took all 256 and a client from a fifth address (no member, no relay) got 503. An address
    now gets a share (`serve.MAX_PER_ADDRESS`) of the connections."""
    store, _ = _publish(tmp_path, 1 * MB, 256 * 1024)
    held: list[trio.SocketStream] = []
    with trio.fail_after(60):
        async with _server(store, relay_hosts=lambda: {"127.0.0.8"}, member_hosts=lambda: {"127.0.0.9"}) as (
            port,
            died,
        ):
            for ip in ATTACKER_IPS:
                for _ in range(MAX_CONNECTIONS // 4):
                    await _idle(port, ip, held)
            await trio.sleep(0.5)
            assert await _honest_versions(port, "127.0.0.6") == 200
            assert await _honest_versions(port, "127.0.0.9") == 200  # a member
            assert await _honest_versions(port, "127.0.0.8") == 200  # a relay
            assert not died
            _close_all(held)


async def test_idle_sockets_from_many_addresses_are_evicted_for_an_outsider(tmp_path: Path) -> None:
    """Twenty addresses each open 16 idle sockets (320, more than all the connections there are, and no
    more than an address's share): a client from another address is still served (an idle connection of
    the address holding the most is ended to make room; old code: 503), and so is a download."""
    store, mhash = _publish(tmp_path, 4 * MB, 1 * MB)
    held: list[trio.SocketStream] = []
    share = MAX_CONNECTIONS // 16
    with trio.fail_after(90):
        async with _server(store) as (port, died):
            for k in range(20):
                for _ in range(share):
                    await _idle(port, f"127.0.0.{20 + k}", held)
            await trio.sleep(0.5)
            assert await _honest_versions(port, "127.0.0.6") == 200
            assert await _honest_download(port, mhash, tmp_path / "honest", 30.0) == 4 * MB
            assert not died
            _close_all(held)


async def test_slow_readers_do_not_hold_a_shard_each_in_memory(tmp_path: Path) -> None:
    """Old code: every shard request read the whole shard into memory before sending it; 16 readers
    that stop reading held 16 x 16 MiB (128 such readers of 16 MiB shards: 2.1 GB). The shard is now
    streamed from disk in small pieces."""
    store, _ = _publish(tmp_path, 16 * MB, 16 * MB)
    held: list[trio.SocketStream] = []
    readers = 16
    with trio.fail_after(60):
        async with _server(store) as (port, died):
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                async with trio.open_nursery() as nursery:
                    for k in range(readers):
                        nursery.start_soon(_stall, port, ATTACKER_IPS[k % len(ATTACKER_IPS)], 0, held)
                await trio.sleep(1.0)  # every answer under way, each reader's window full
                grown = tracemalloc.get_traced_memory()[0] - base
            finally:
                tracemalloc.stop()
            print(f"\n[slow readers] {readers} readers of a 16 MiB shard: server memory +{grown / MB:.1f} MiB")
            assert grown < readers * 4 * MB, f"{grown / MB:.0f} MiB held for {readers} slow readers"
            assert not died
            _close_all(held)
