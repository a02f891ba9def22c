"""The HTTP/1.1 server core shared by the metrics endpoint (`node.metrics`) and the weight server
(`node.weights.serve`): trio listeners, h11 event reading, and an accept loop with a cap on concurrent
connections. Each server brings its own per-connection handler (routing, limits, bodies).

Over the cap (or over the per-address cap), a connection gets a short 503 and is closed; the refusals
themselves are bounded (at most as many in flight as the cap), so a flood of connections costs a bounded
amount of work. A server that asks for it (`evict_idle`, the explorer) instead ends an idle connection to
make room: the oldest of the new connection's own address when that address is at its cap, else of the
address that holds the most slots. Idle and slow sockets then cost their address its own share, never
the whole server: a connection is idle unless its answer is being drawn (`answering`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import trio

log = logging.getLogger(__name__)

RECV_BYTES = 16 * 1024
_BUSY_BODY = b'{"error": "too many connections"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)

Handler = Callable[[trio.SocketStream], Awaitable[None]]
#: (method, target) -> the response's h11 events; plain and synchronous (it answers from memory)
Route = Callable[[bytes, bytes], list[h11.Event]]
#: the same, for a server that draws its answers elsewhere (e.g. in a worker thread)
AsyncRoute = Callable[[bytes, bytes], Awaitable[list[h11.Event]]]

MAX_HEAD_BYTES = 8 * 1024
MAX_BODY_BYTES = 16 * 1024
CONNECTION_TIMEOUT = 10.0
MAX_REQUESTS_PER_CONNECTION = 100


async def _open_listeners(host: str, port: int) -> tuple[list[trio.SocketListener], int]:
    """Listeners on `host:port` and the bound port. With port 0 each address family would get a
    different free port, so only the first listener is kept."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    if port == 0:
        for extra in listeners[1:]:
            await trio.aclose_forcefully(extra)
        listeners = listeners[:1]
    return listeners, int(listeners[0].socket.getsockname()[1])


async def read_request(
    stream: trio.SocketStream, conn: h11.Connection, head_timeout: float, idle_timeout: float | None = None
) -> Any:
    """The next request head (an `h11.Request`, or whatever else comes instead): its first bytes within
    `idle_timeout` (a keep-alive connection may idle that long between requests), the rest within
    `head_timeout` seconds *in all* (`trio.TooSlowError` after that): a client that trickles one byte at
    a time cannot hold a connection for longer, whatever the per-read timeout."""
    ev = conn.next_event()
    if ev is not h11.NEED_DATA:
        return ev
    with trio.fail_after(idle_timeout) if idle_timeout is not None else contextlib.nullcontext():
        conn.receive_data(await stream.receive_some(RECV_BYTES))
    with trio.fail_after(head_timeout):
        return await next_event(stream, conn, idle_timeout)


async def next_event(
    stream: trio.SocketStream, conn: h11.Connection, idle_timeout: float | None = None, recv_bytes: int = RECV_BYTES
) -> Any:
    """The next h11 event, reading from `stream` as needed (each read bounded by `idle_timeout`:
    `trio.TooSlowError` when the peer goes quiet)."""
    while True:
        ev = conn.next_event()
        if ev is not h11.NEED_DATA:
            return ev
        if idle_timeout is None:
            conn.receive_data(await stream.receive_some(recv_bytes))
        else:
            with trio.fail_after(idle_timeout):
                conn.receive_data(await stream.receive_some(recv_bytes))


async def _refuse(stream: trio.SocketStream) -> None:
    try:
        with trio.move_on_after(1.0):
            await stream.send_all(_BUSY)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


@dataclass(eq=False)
class Slot:
    """One accepted connection: its address, whether it may be evicted, and the scope that ends it."""

    ip: str
    protected: bool = False  # a trusted address's: never evicted
    busy: bool = False  # its answer is being drawn (`answering`)
    gone: bool = False  # no longer counted (finished or evicted)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


_SLOT: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("httpd_slot", default=None)


@contextlib.contextmanager
def answering() -> Iterator[None]:
    """Marks the current connection busy while its answer is drawn: an evicting server (`serve`'s
    `evict_idle`) ends only connections that wait for a request or for their client to read."""
    slot = _SLOT.get()
    if slot is None:
        yield
        return
    slot.busy = True
    try:
        yield
    finally:
        slot.busy = False


def peer_ip(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError):
        return ""


async def serve(
    host: str,
    port: int,
    handle: Handler,
    *,
    max_connections: int,
    what: str,
    max_per_ip: int | None = None,
    trusted: Callable[[], Any] | None = None,
    reserved: int = 0,
    members: Callable[[], Any] | None = None,
    member_reserved: int = 0,
    evict_idle: bool = False,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on `host:port` (port 0: a free one) and accept until cancelled; each connection runs
    `handle(stream)` (which closes the stream) in its own task, at most `max_connections` at once and at
    most `max_per_ip` from one address (default: a quarter of them), so one host cannot take every slot.
    Addresses in `trusted()` (known relays) have no per-address cap and `reserved` slots beyond
    `max_connections` that nobody else can take. Addresses in `members()` (where the pool's members
    connect from) keep the per-address cap and have `member_reserved` slots of their own beyond
    `max_connections`, so outsiders that fill every other slot do not lock members out. With `evict_idle`,
    a connection that would be refused ends an idle one instead (see the module's docstring). The bound
    port is reported with `task_status.started(port)` once accepting. The listeners are closed on exit."""
    listeners, bound = await _open_listeners(host, port)
    per_ip_cap = max_per_ip if max_per_ip is not None else max(1, max_connections // 4)
    used = 0
    refusing = 0
    per_ip: dict[str, int] = {}
    slots: dict[str, list[Slot]] = {}  # per address, oldest first

    def release(slot: Slot) -> None:
        nonlocal used
        if slot.gone:
            return
        slot.gone = True
        used -= 1
        per_ip[slot.ip] -= 1
        if per_ip[slot.ip] <= 0:
            del per_ip[slot.ip]
        slots[slot.ip].remove(slot)
        if not slots[slot.ip]:
            del slots[slot.ip]

    def evict(ip: str | None) -> bool:
        """End the oldest idle connection of `ip` (None: of the address holding the most slots that has
        one); whether one was."""
        for k in [ip] if ip is not None else sorted(slots, key=lambda a: len(slots[a]), reverse=True):
            victim = next((s for s in slots.get(k, ()) if not s.busy and not s.protected), None)
            if victim is not None:
                victim.scope.cancel()
                release(victim)
                return True
        return False

    async def run(stream: trio.SocketStream, slot: Slot) -> None:
        _SLOT.set(slot)
        try:
            with slot.scope:
                await handle(stream)
        finally:
            if slot.scope.cancelled_caught:  # evicted before the handler could close it
                await trio.aclose_forcefully(stream)
            release(slot)

    async def refuse(stream: trio.SocketStream) -> None:
        nonlocal refusing
        try:
            await _refuse(stream)
        finally:
            refusing -= 1

    async def accept_loop(listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        nonlocal used, refusing
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. out of file descriptors: back off instead of spinning
                log.warning("%s accept failed: %s", what, exc)
                await trio.sleep(0.1)
                continue
            ip = peer_ip(stream)
            known = trusted is not None and ip in trusted()
            extra = reserved if known else 0
            if not known and used >= max_connections and members is not None and ip in members():
                extra = member_reserved
            over_ip = not known and per_ip.get(ip, 0) >= per_ip_cap
            if evict_idle and over_ip:
                over_ip = not evict(ip)
            full = used >= max_connections + extra
            if evict_idle and full and not over_ip:
                full = not evict(None)
            if full or over_ip:
                if refusing >= max_connections:  # even the refusals are bounded
                    await trio.aclose_forcefully(stream)
                    continue
                refusing += 1
                nursery.start_soon(refuse, stream)
                continue
            used += 1
            per_ip[ip] = per_ip.get(ip, 0) + 1
            slot = Slot(ip, protected=known)
            slots.setdefault(ip, []).append(slot)
            nursery.start_soon(run, stream, slot)

    try:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(accept_loop, listener, nursery)
            task_status.started(bound)
    finally:
        for listener in listeners:
            await trio.aclose_forcefully(listener)


def response(
    status: int, body: bytes, content_type: str, close: bool = False, headers: list[tuple[str, str]] | None = None
) -> list[h11.Event]:
    """A whole response (no caching: every answer is the server's state now)."""
    hs = [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
    hs += headers or []
    if close:
        hs.append(("Connection", "close"))
    return [h11.Response(status_code=status, headers=hs), h11.Data(data=body), h11.EndOfMessage()]


def json_response(status: int, data: Any, close: bool = False) -> list[h11.Event]:
    return response(status, json.dumps(data, sort_keys=True, default=str).encode(), "application/json", close)


async def _send(stream: trio.SocketStream, conn: h11.Connection, events: list[h11.Event]) -> None:
    for ev in events:
        data = conn.send(ev)
        if data:
            await stream.send_all(data)


async def serve_routes(
    stream: trio.SocketStream,
    route: Route | AsyncRoute,
    *,
    max_head_bytes: int = MAX_HEAD_BYTES,
    max_body_bytes: int = MAX_BODY_BYTES,
    timeout: float = CONNECTION_TIMEOUT,
) -> None:
    """One connection of a small read-only server: up to `MAX_REQUESTS_PER_CONNECTION` keep-alive requests,
    each answered by `route` (plain or async), the whole connection at most `timeout` seconds, heads over `max_head_bytes`
    and bodies over `max_body_bytes` refused. Closes the stream."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head_bytes)
    try:
        with trio.move_on_after(timeout):
            for _ in range(MAX_REQUESTS_PER_CONNECTION):
                try:
                    ev = await next_event(stream, conn)
                    if not isinstance(ev, h11.Request):
                        return  # ConnectionClosed, or a peer that went quiet between requests
                    body = 0
                    while True:
                        part = await next_event(stream, conn)
                        if isinstance(part, h11.Data):
                            body += len(part.data)
                            if body > max_body_bytes:
                                await _send(stream, conn, json_response(413, {"error": "request body too large"}, True))
                                return
                        elif isinstance(part, h11.EndOfMessage):
                            break
                        else:
                            return
                    with answering():
                        answer = route(ev.method, ev.target)
                        events = answer if isinstance(answer, list) else await answer
                    await _send(stream, conn, events)
                except h11.RemoteProtocolError as exc:
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        await _send(stream, conn, json_response(exc.error_status_hint, {"error": "bad request"}, True))
                    return
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError, OSError):
        pass
    finally:
        await trio.aclose_forcefully(stream)
