"""Slowloris against the HTTP servers (the weight origin, a relay and the metrics endpoint, real sockets on the
loopback): 256 connections from one address that send a request head one byte at a time. One address
gets at most a share of the slots (a sixteenth of the weight server's, a quarter of the metrics
endpoint's), and a head that is not complete within its deadline loses its connection; an honest
client from another address is served all along."""

from __future__ import annotations

import functools
import socket
import time
from pathlib import Path

import httpx
import pytest
import trio

from node.metrics import Metrics, serve_http
from node.weights import serve
from node.weights.serve import MAX_CONNECTIONS, serve_weights
from node.weights.store import WeightStore

ATTACKER_IP = "127.0.0.2"  # the whole 127/8 is loopback on Linux: a second address to attack from


async def _slow_sockets(port: int, n: int) -> list[trio.SocketStream]:
    out = []
    for _ in range(n):
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        await sock.bind((ATTACKER_IP, 0))
        await sock.connect(("127.0.0.1", port))
        out.append(trio.SocketStream(sock))
    return out


async def _trickle(streams: list[trio.SocketStream], seconds: float) -> int:
    """One byte of a request head per socket every second; returns how many sockets still took bytes."""
    head = b"GET /versions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200
    alive = set(range(len(streams)))
    for i in range(int(seconds)):
        for k in list(alive):
            try:
                await streams[k].send_all(head[i : i + 1])
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                alive.discard(k)
        await trio.sleep(1.0)
    return len(alive)


def _honest_get(url: str) -> int:
    with httpx.Client(timeout=5.0) as c:
        return c.get(url).status_code


# The servers' head deadline in these tests (10 s in a daemon: `HEAD_TIMEOUT`, metrics' `CONNECTION_TIMEOUT`),
# shorter so that the attack's whole course takes 11 s, not 16; the honest requests come within it.
DEADLINE = 5.0


@pytest.mark.parametrize("server", ["origin", "relay", "metrics"])
async def test_slowloris_leaves_honest_clients_served(
    tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same server code runs the coordinator's weight origin (with its known relays' addresses, which
    get reserved slots) and a worker's relay (without)."""
    monkeypatch.setattr(serve, "HEAD_TIMEOUT", DEADLINE)
    async with trio.open_nursery() as nursery:
        if server in ("origin", "relay"):
            relays = (lambda: {"127.0.0.3"}) if server == "origin" else None
            port = await nursery.start(
                functools.partial(serve_weights, WeightStore(tmp_path / "w"), "127.0.0.1", 0, relay_hosts=relays)
            )
            url, cap = f"http://127.0.0.1:{port}/versions", MAX_CONNECTIONS
        else:
            port = await nursery.start(
                functools.partial(serve_http, Metrics("worker"), "127.0.0.1", 0, timeout=DEADLINE)
            )
            url, cap = f"http://127.0.0.1:{port}/metrics", 64
        streams = await _slow_sockets(port, 256)
        t0 = time.monotonic()
        async with trio.open_nursery() as attack:
            result: list[int] = []

            async def run() -> None:
                result.append(await _trickle(streams, DEADLINE + 6))

            attack.start_soon(run)
            await trio.sleep(1.0)
            for _ in range(3):  # an honest client on 127.0.0.1 is served while the attack holds its slots
                assert await trio.to_thread.run_sync(_honest_get, url) == 200
                await trio.sleep(1.0)
        took = time.monotonic() - t0
        print(f"\n[slowloris/{server}] {result[0]} of 256 slow sockets still open after {took:.0f} s")
        assert result[0] == 0  # every one was cut off: over the per-address cap at once, the rest at the deadline
        assert await trio.to_thread.run_sync(_honest_get, url) == 200
        for s in streams:
            await trio.aclose_forcefully(s)
        nursery.cancel_scope.cancel()
    assert cap // 4 < 256


def _get_from(url: str, source_ip: str) -> int:
    transport = httpx.HTTPTransport(local_address=source_ip)
    with httpx.Client(timeout=5.0, transport=transport) as c:
        return c.get(url).status_code


async def test_outsiders_that_fill_the_origin_do_not_lock_members_out(tmp_path: Path) -> None:
    """Enough addresses each take their share of the origin's connections with shard downloads they do
    not read (busy connections: the server evicts only idle ones): every ordinary slot is held. A client
    from an outsider's address gets 503; a member (an address its libp2p connection comes from,
    `member_hosts`) is served from the slots kept for members."""
    import os

    from node.weights.serve import ADDRESS_SHARE, MEMBER_RESERVED

    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(os.urandom(4 << 20))
    store = WeightStore(tmp_path / "w")
    store.publish(checkpoint, 1, shard_size=4 << 20)
    cap, share = 32, 32 // ADDRESS_SHARE
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            functools.partial(
                serve_weights, store, "127.0.0.1", 0, max_connections=cap,
                relay_hosts=lambda: set(), member_hosts=lambda: {"127.0.0.9"},
            )
        )  # fmt: skip
        held = []
        for ip in (f"127.0.0.{10 + k}" for k in range(cap // share)):
            for _ in range(share):
                sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await sock.bind((ip, 0))
                await sock.connect(("127.0.0.1", port))
                stream = trio.SocketStream(sock)
                await stream.send_all(b"GET /v/1/shard/0 HTTP/1.1\r\nHost: x\r\n\r\n")  # and reads nothing
                held.append(stream)
        await trio.sleep(0.5)
        url = f"http://127.0.0.1:{port}/versions"
        assert await trio.to_thread.run_sync(_get_from, url, "127.0.0.6") == 503
        assert await trio.to_thread.run_sync(_get_from, url, "127.0.0.9") == 200
        assert MEMBER_RESERVED > 0
        for s in held:
            await trio.aclose_forcefully(s)
        nursery.cancel_scope.cancel()


async def _read_until_closed(stream: trio.SocketStream, seconds: float) -> bytes:
    """What the server sends until it closes the connection; marked "...still open" if `seconds` pass first."""
    got = b""
    with trio.move_on_after(seconds):
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return got
            if not data:
                return got
            got += data
    return got + b"...still open"


@pytest.mark.parametrize("body", [b"Transfer-Encoding: chunked\r\n\r\n0;", b"Content-Length: 100\r\n\r\nx"])
async def test_a_request_body_cannot_hold_a_weight_server_slot(tmp_path: Path, body: bytes) -> None:
    """After a complete head, a chunked body whose chunk header trickles one byte at a time (each read
    under the idle timeout, and past the head deadline) held its connection for days. A GET announcing
    any body is answered 413 at once and the connection closed."""
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_weights, WeightStore(tmp_path / "w"), "127.0.0.1", 0))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /versions HTTP/1.1\r\nHost: x\r\n" + body)
        answer = await _read_until_closed(stream, 3.0)
        assert answer.startswith(b"HTTP/1.1 413") and not answer.endswith(b"still open"), answer
        await trio.aclose_forcefully(stream)
        nursery.cancel_scope.cancel()


async def test_a_keep_alive_connection_is_not_held_for_ever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client sending one small request just under the idle timeout kept its slot for up to 10,000
    requests: past `KEEPALIVE_LIFETIME` the connection is closed after its current answer."""
    from node.weights import serve

    monkeypatch.setattr(serve, "KEEPALIVE_LIFETIME", 1.0)
    request = b"GET /versions HTTP/1.1\r\nHost: x\r\n\r\n"
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_weights, WeightStore(tmp_path / "w"), "127.0.0.1", 0))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(request)
        first = b""
        with trio.fail_after(3):
            while not first.endswith(b"}"):  # the whole first answer, its JSON body last
                first += await stream.receive_some(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        await trio.sleep(1.2)
        await stream.send_all(request)  # still answered, then closed
        answer = await _read_until_closed(stream, 3.0)
        assert answer.startswith(b"HTTP/1.1 200") and not answer.endswith(b"still open"), answer
        await trio.aclose_forcefully(stream)
        nursery.cancel_scope.cancel()


async def test_a_relay_that_reads_slowly_does_not_freeze_the_origin(tmp_path: Path) -> None:
    """A listed relay's transfer has priority under the origin's upload cap. One that asked for a shard
    and then read nothing (or a little every 20 s, under the send-stall timeout) kept that priority for
    its whole transfer, and every ordinary download waited: an honest client got 0 bytes in 45 s. A
    relay's send that stalls loses priority until its next piece."""
    import os

    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(os.urandom(8 << 20))
    store = WeightStore(tmp_path / "w")
    store.publish(checkpoint, 1, shard_size=4 << 20)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            functools.partial(serve_weights, store, "127.0.0.1", 0, rate_limit_bytes_per_s=4e6,
                              relay_hosts=lambda: {"127.0.0.3"})
        )  # fmt: skip
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.bind(("127.0.0.3", 0))
        await sock.connect(("127.0.0.1", port))
        relay = trio.SocketStream(sock)
        await relay.send_all(b"GET /v/1/shard/0 HTTP/1.1\r\nHost: x\r\nx-weights-relay: 1\r\n\r\n")  # never read
        await trio.sleep(1.0)

        def honest() -> int:
            with httpx.Client(timeout=10.0) as c:
                return len(c.get(f"http://127.0.0.1:{port}/v/1/shard/1").content)

        t0 = time.monotonic()
        assert await trio.to_thread.run_sync(honest) == 4 << 20
        print(f"\n[slow relay] an honest 4 MiB download took {time.monotonic() - t0:.1f} s")
        await trio.aclose_forcefully(relay)
        nursery.cancel_scope.cancel()
