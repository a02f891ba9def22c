"""The broadcast's HTTP side: a trio + h11 HTTP/1.1 server with ``GET /versions``,
``GET /v/<version>/manifest.json`` and ``GET /v/<version>/shard/<i>`` over a `WeightStore`. Bounded:
request head size, concurrent connections (a share of them per address, idle ones evicted to make room,
slots reserved for relays and members), requests per connection, idle time between requests and stall time per sent chunk; a shard
is streamed from disk in `READ_CHUNK` pieces (memory per connection, not per shard);
``rate_limit_bytes_per_s`` caps the node's upload with one token bucket shared by all its connections.
A client's reset, stall or garbage ends that client's connection, never the server."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import h11
import trio

from node import httpd

from .store import WeightStore

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8 * 1024
MAX_CONNECTIONS = 256
ADDRESS_SHARE = 16  # an address (a relay's aside) holds at most 1/16 of the connections: a few cannot fill them
MAX_REQUESTS_PER_CONNECTION = 10_000
IDLE_TIMEOUT = 30.0  # waiting for (the rest of) a request head
HEAD_TIMEOUT = 10.0  # for a whole request head, once its first byte may come (slowloris)
RELAY_RESERVED = 32  # connection slots only known relays may take
MEMBER_RESERVED = 64  # connection slots kept for the addresses the pool's members connect from
KEEPALIVE_LIFETIME = 300.0  # no new request on a connection older than this: a client asks again
SEND_STALL_TIMEOUT = 30.0  # one chunk not accepted by the peer for this long: drop the connection
SLOW_SEND = 1.0  # a relay's piece not sent within this: its transfer loses priority until its next piece
SHARD_WAIT = 60.0  # a relay waits this long for a shard still being fetched before answering 503
SEND_CHUNK = 128 * 1024
READ_CHUNK = 1024 * 1024  # a shard is read from disk this much at a time (in a worker thread)
RELAY_HEADER = b"x-weights-relay"  # "1" on a relay's upstream requests: served first under the cap
_SHARD_PATH = re.compile(rb"^/v/(\d{1,19})/shard/(\d{1,6})$")
_MANIFEST_PATH = re.compile(rb"^/v/(\d{1,19})/manifest\.json$")


# ---------------------------------------------------------------------- store


class RateLimiter:
    """A token bucket shared by every connection of one server: ``rate`` bytes/s, ``burst`` bytes deep.

    ``take(n, high=True)`` is for relay traffic (each byte a relay gets is fanned out again): while any
    high-priority transfer is under way (see `_send_file`: one whose sends stall loses that), ordinary
    ones wait for it (strict priority, work-conserving).
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
    """A shard, streamed from disk (`_pieces`: a connection holds one read's bytes, never the whole
    shard) in `SEND_CHUNK` pieces under the rate cap. A relay's transfer (`high`) has priority from
    each piece's tokens until that piece is sent, but loses it while a send stalls past
    `SLOW_SEND` (a relay that reads slowly, or not at all, takes no bandwidth: it must not hold back
    everyone else's) and takes it again with its next piece."""
    try:
        fh = await trio.open_file(path, "rb")
    except FileNotFoundError:  # pruned since it was looked up
        await _send_json(stream, conn, 404, {"error": "unknown version"})
        return
    marked = False

    def unmark() -> None:
        nonlocal marked
        if marked and limiter is not None:
            limiter.end_high()
            marked = False

    async with fh:
        size = os.fstat(fh.fileno()).st_size
        headers = [
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(size)),
            ("Cache-Control", "no-store"),
        ]
        await _send(stream, conn, h11.Response(status_code=200, headers=headers))
        try:
            async for piece in _pieces(fh.read, size):
                if limiter is not None:
                    if high and not marked:
                        limiter.begin_high()
                        marked = True
                    await limiter.take(len(piece), high)
                if not marked:
                    await _send_piece(stream, conn, piece)
                    continue
                async with trio.open_nursery() as nursery:  # a relay's piece: unmarked if its send stalls
                    nursery.start_soon(_call_after, SLOW_SEND, unmark)
                    await _send_piece(stream, conn, piece)
                    nursery.cancel_scope.cancel()
        finally:
            unmark()
    await _send(stream, conn, h11.EndOfMessage())


async def _pieces(read: Callable[[int], Awaitable[bytes]], size: int) -> AsyncIterator[memoryview]:
    """``size`` bytes of an open file (its ``read``) in `SEND_CHUNK` pieces, read `READ_CHUNK` at a time in a worker
    thread (`trio.open_file`); OSError if the file ends early (it changed under us: the answer ends)."""
    left = size
    while left > 0:
        data = await read(min(READ_CHUNK, left))
        if not data:
            raise OSError(f"shard file ended {left} bytes early")
        left -= len(data)
        view = memoryview(data)
        for off in range(0, len(data), SEND_CHUNK):
            yield view[off : off + SEND_CHUNK]


async def _send_piece(stream: trio.SocketStream, conn: h11.Connection, piece: memoryview) -> None:
    with trio.fail_after(SEND_STALL_TIMEOUT):
        for out in conn.send_with_data_passthrough(h11.Data(data=piece)) or ():
            await stream.send_all(out)


async def _call_after(seconds: float, fn: Callable[[], None]) -> None:
    await trio.sleep(seconds)
    fn()


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


def _announces_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request head announces a body (GET and HEAD take none): any transfer coding, or a
    length other than 0."""
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


#: how a connection ends when its client resets, stalls, or makes us break the protocol
_CLIENT_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, h11.LocalProtocolError, OSError)


async def _serve_connection(
    stream: trio.SocketStream,
    store: WeightStore,
    limiter: RateLimiter | None,
    shard_wait: float,
    relay_hosts: Callable[[], Collection[str]] | None = None,
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    peer = httpd.peer_ip(stream) if relay_hosts is not None else ""
    opened = trio.current_time()
    try:
        for _ in range(MAX_REQUESTS_PER_CONNECTION):
            try:
                ev = await httpd.read_request(stream, conn, HEAD_TIMEOUT, IDLE_TIMEOUT)
                if not isinstance(ev, h11.Request):
                    return
                if _announces_body(ev.headers):  # a chunked body could trickle its chunk headers for days
                    await _send_json(stream, conn, 413, {"error": "no request body expected"})
                    return
                with trio.fail_after(HEAD_TIMEOUT):  # the end of a body-less request: at once
                    part = await httpd.next_event(stream, conn, IDLE_TIMEOUT)
                if not isinstance(part, h11.EndOfMessage):
                    await _send_json(stream, conn, 413, {"error": "no request body expected"})
                    return
                high = any(k == RELAY_HEADER and v == b"1" for k, v in ev.headers) and (
                    relay_hosts is None or peer in relay_hosts()
                )
                with httpd.answering():  # not idle: the server evicts idle connections only
                    await _respond(stream, conn, store, limiter, ev.method, ev.target, shard_wait, high)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _send_json(stream, conn, exc.error_status_hint, {"error": "bad request"})
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return
            if trio.current_time() > opened + KEEPALIVE_LIFETIME:  # its slot goes back to the accept loop
                return
            conn.start_next_cycle()
    except* _CLIENT_GONE:  # a client's reset, stall or garbage ends its connection (also via a relay piece's nursery)
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
    ``max_connections``, or over an address's share of them (1/`ADDRESS_SHARE`; a known relay's aside), get a
    503 and are closed, unless an idle connection (one waiting for a request) can be ended to make room:
    of the same address when it is at its share, else of the address holding the most (`httpd.serve`'s
    ``evict_idle``; a relay's never). ``rate_limit_bytes_per_s`` caps the whole node's upload.
    Requests with the relay header are served first under the cap (strict priority). With
    ``relay_hosts`` (the IP addresses of the known relays, asked per request) only connections from
    those addresses get that priority, so an ordinary client cannot claim it and starve the others.
    With ``member_hosts`` (where the pool's members connect from) `MEMBER_RESERVED` connections are kept
    for them: outsiders that take every other slot do not lock the members out of their weights.
    """
    limiter = RateLimiter(rate_limit_bytes_per_s) if rate_limit_bytes_per_s else None

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await _serve_connection(stream, store, limiter, shard_wait, relay_hosts)
        except Exception:  # a bug met by one connection ends that connection, never the whole server
            log.exception("weights server: a connection failed")

    await httpd.serve(
        host, port, handle, max_connections=max_connections, what="weights server",
        max_per_ip=max(1, max_connections // ADDRESS_SHARE), evict_idle=True,
        trusted=relay_hosts, reserved=RELAY_RESERVED if relay_hosts is not None else 0,
        members=member_hosts, member_reserved=MEMBER_RESERVED, task_status=task_status,
    )  # fmt: skip


# ---------------------------------------------------------------------- relay
