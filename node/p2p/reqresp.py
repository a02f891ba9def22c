"""Request-response over libp2p streams: one length-prefixed request in, one status byte and a
length-prefixed reply out. Requests are refused from their length prefix when over size or over the
sender's budget, and every read, handler and reply is bounded in time. A mixin of `P2PNode`."""

from __future__ import annotations

import logging
import struct
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from contextvars import ContextVar

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from .errors import P2PError, Refused
from .gate import allowed
from .identity import safe_address
from .patches import drop_unread, prefix_of

logger = logging.getLogger(__name__)

Handler = Callable[[bytes, str], Awaitable[bytes]]
"""``handler(request, sender_address) -> response`` for a request-response protocol."""

DEFAULT_MAX_REQUEST = 4 << 20
SMALL_REQUEST = 64 << 10  # what invite, task, submit and signature requests may weigh (they are a few hundred bytes)
REQUEST_READ_TIMEOUT = 10.0  # seconds for a whole request to arrive
MAX_STREAMS_PER_PEER = 16  # requests in progress per peer, all protocols together
# Bytes of request frames being received or handled, reserved from their length prefix before the body is
# read. A pool's members (staked, known on chain: `P2PNode(is_member=...)`) draw on a budget of their own;
# everyone else on one per remote IP address (sybil identities from one host share it), one per /24 (or
# IPv6 /56) and one for all of them. A request over its budget is refused at once ("busy", retryable), so
# stalled frames pin a bounded amount of memory and outsiders cannot crowd members out.
MAX_REQUEST_BYTES_PER_IP = 16 << 20
MAX_REQUEST_BYTES_PER_NETWORK = 32 << 20
MAX_REQUEST_BYTES = 64 << 20  # non-members, all together
MAX_MEMBER_REQUEST_BYTES = 256 << 20
DEFAULT_MAX_RESPONSE = 16 << 20
_STATUS_OK = 0
_STATUS_ERR = 1
_LEN = struct.Struct(">I")


async def _read_exactly(stream: INetStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.read(n - len(buf))
        if not chunk:
            raise P2PError("stream closed early")
        buf += chunk
    return bytes(buf)


async def _read_frame(stream: INetStream, max_size: int) -> bytes:
    (size,) = _LEN.unpack(await _read_exactly(stream, _LEN.size))
    if size > max_size:
        raise P2PError(f"frame of {size} bytes exceeds limit {max_size}")
    return await _read_exactly(stream, size)


#: The IP address the request being handled came from ("" if unknown), for handlers that budget work per
#: address or network (a sender's address is free to make; its IP is not).
PEER_IP: ContextVar[str] = ContextVar("PEER_IP", default="")


def _stream_ip(stream: INetStream) -> str:
    """The remote IP address of a stream's connection ("?" when the transport does not say)."""
    with suppress(Exception):
        remote = stream.get_remote_address()
        if remote:
            return str(remote[0])
    return "?"


def _frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


class RequestsMixin:
    """Serving and sending requests on a `P2PNode` (state set up by `P2PNode.__init__`)."""

    max_request_size: int
    requests_refused: Counter[str]
    _is_member: Callable[[str], bool] | None
    _handlers: dict[str, Handler]
    _streams_in_progress: defaultdict[str, int]
    _request_bytes: defaultdict[str, int]

    _require_host: Callable[[], IHost]  # P2PNode's
    connect: Callable[[str], Awaitable[ID]]  # P2PNode's

    def _request_budgets(self, sender: str, ip: str) -> list[tuple[str, int]]:
        """The budgets (bookkeeping key, bytes) a request of `sender` from `ip` draws on."""
        if self._is_member is not None and allowed(self._is_member, sender):
            return [("members", MAX_MEMBER_REQUEST_BYTES)]
        return [
            ("ip:" + ip, MAX_REQUEST_BYTES_PER_IP),
            ("net:" + prefix_of(ip), MAX_REQUEST_BYTES_PER_NETWORK),
            ("outsiders", MAX_REQUEST_BYTES),
        ]

    def set_handler(
        self,
        protocol_id: str,
        handler: Handler,
        *,
        timeout: float = 30.0,
        max_request: int = SMALL_REQUEST,
        read_timeout: float = REQUEST_READ_TIMEOUT,
        allow: Callable[[str], bool] | None = None,
    ) -> None:
        """Serve ``protocol_id``: one length-prefixed request in, one status byte + frame out.

        A request larger than ``max_request`` is refused from its length prefix, before its body is read
        (nothing is buffered for it); the whole request must arrive within ``read_timeout`` (a slow
        sender holds no stream for long); ``timeout`` bounds request, handler and reply together. One
        peer may have at most ``MAX_STREAMS_PER_PEER`` requests in progress on this node at once, and
        their bytes are reserved from the length prefix against the budgets of `_request_budgets` (the
        members', or an outsider's address, network and all outsiders'). ``allow(sender)``, when given,
        is asked before anything is read: a sender it refuses gets a one-line refusal."""
        self._handlers[protocol_id] = handler
        limit = min(max_request, self.max_request_size)

        async def on_stream(stream: INetStream) -> None:
            sender = safe_address(stream.muxed_conn.peer_id)
            if self._streams_in_progress[sender] >= MAX_STREAMS_PER_PEER:
                self.requests_refused["streams"] += 1
                await _reset(stream)
                return
            self._streams_in_progress[sender] += 1
            try:
                if allow is not None and not allowed(allow, sender):
                    self.requests_refused["not-allowed"] += 1
                    await _refuse(stream, f"{protocol_id} is not served to {sender}")
                else:
                    await serve(stream, sender)
            finally:
                self._streams_in_progress[sender] -= 1
                if self._streams_in_progress[sender] <= 0:
                    del self._streams_in_progress[sender]

        async def serve(stream: INetStream, sender: str) -> None:
            ip = _stream_ip(stream)
            reserved = 0
            keys: list[str] = []
            try:
                with trio.fail_after(timeout):
                    try:
                        with trio.fail_after(read_timeout):
                            (size,) = _LEN.unpack(await _read_exactly(stream, _LEN.size))
                            if size > limit:
                                raise P2PError(f"frame of {size} bytes exceeds limit {limit}")
                            budgets = self._request_budgets(sender, ip)
                            if any(self._request_bytes.get(k, 0) + size > cap for k, cap in budgets):
                                self.requests_refused["busy"] += 1
                                raise P2PError("busy: too many requests in progress from your address, retry")
                            keys = [k for k, _ in budgets]
                            for k in keys:
                                self._request_bytes[k] += size
                            reserved = size
                            request = await _read_exactly(stream, size)
                    except P2PError as exc:
                        # Refused from its prefix: say why, then reset, which also drops whatever of the
                        # body the muxer has buffered (up to its window) instead of holding it till close.
                        await _refuse(stream, str(exc))
                        return
                    except trio.TooSlowError:
                        # The request did not arrive in time: counted, never logged (anyone may open
                        # streams that stall, and a log line each would let them fill the disk).
                        self.requests_refused["slow"] += 1
                        await _reset(stream)
                        return
                    try:
                        PEER_IP.set(ip)  # this task's context: seen by the handler alone
                        response = await handler(request, sender)
                        reply = bytes([_STATUS_OK]) + _frame(response)
                    except Exception as exc:  # an OSError is ours (a full disk, say), not the peer's fault
                        level = (
                            logging.DEBUG  # an outsider turned away: not worth a log line each
                            if isinstance(exc, Refused)
                            else logging.ERROR
                            if isinstance(exc, OSError)
                            else logging.INFO
                        )
                        logger.log(level, "handler %s failed for %s: %r", protocol_id, sender, exc)
                        # a refusal says why (its text is ours); any other error only its type
                        why = f": {str(exc)[:300]}" if isinstance(exc, Refused) else ""
                        reply = bytes([_STATUS_ERR]) + _frame(f"handler error: {type(exc).__name__}{why}".encode())
                    await stream.write(reply)
                await stream.close()
                drop_unread(stream)  # whatever the peer sent past its request
            except trio.TooSlowError:
                logger.info("handler %s timed out for %s", protocol_id, sender)
                await _reset(stream)
            except Exception as exc:
                logger.debug("stream %s from %s failed: %r", protocol_id, sender, exc)
                await _reset(stream)
            finally:
                if reserved:
                    for key in keys:
                        self._request_bytes[key] -= reserved
                        if self._request_bytes[key] <= 0:
                            del self._request_bytes[key]

        self._require_host().set_stream_handler(TProtocol(protocol_id), on_stream)

    async def request(
        self,
        peer: str | ID,
        protocol_id: str,
        payload: bytes,
        *,
        timeout: float = 10.0,
        max_response: int = DEFAULT_MAX_RESPONSE,
    ) -> bytes:
        """Send one request and wait for its response; any failure is a ``P2PError``."""
        if len(payload) > self.max_request_size:
            raise P2PError(f"request of {len(payload)} bytes exceeds {self.max_request_size}")
        host = self._require_host()
        stream: INetStream | None = None
        try:
            with trio.fail_after(timeout):
                if isinstance(peer, ID):
                    peer_id = peer
                elif "/" in peer:
                    peer_id = await self.connect(peer)
                else:
                    peer_id = ID.from_base58(peer)
                try:
                    stream = await host.new_stream(peer_id, [TProtocol(protocol_id)])
                except Exception as exc:
                    raise P2PError(f"open {protocol_id} to {peer_id} failed: {exc}") from exc
                await stream.write(_frame(payload))
                status = (await _read_exactly(stream, 1))[0]
                body = await _read_frame(stream, max_response)
        except trio.TooSlowError as exc:
            if stream is not None:
                await _reset(stream)
            raise P2PError(f"request {protocol_id} timed out after {timeout} s") from exc
        except P2PError:
            if stream is not None:
                await _reset(stream)
            raise
        except Exception as exc:
            if stream is not None:
                await _reset(stream)
            raise P2PError(f"request {protocol_id} failed: {exc!r}") from exc
        except BaseException:  # cancelled from outside (a caller's deadline): the stream goes too (shielded)
            if stream is not None:
                await _reset(stream)
            raise
        with trio.move_on_after(1.0):
            with suppress(Exception):
                await stream.close()
        if status != _STATUS_OK:
            raise P2PError(f"remote refused {protocol_id}: {body.decode(errors='replace')}")
        return body


async def _refuse(stream: INetStream, why: str) -> None:
    """Answer a request we will not read with `why`, then let the stream go: our clients close theirs
    once they have read the answer; one that does not is reset after a second. What the peer sent
    meanwhile is dropped, not buffered (at most a muxer window, for at most that second)."""
    with suppress(Exception), trio.move_on_after(2.0):
        await stream.write(bytes([_STATUS_ERR]) + _frame(why.encode()))
        await stream.close()
    drop_unread(stream)  # and whatever still comes
    muxed = getattr(stream, "muxed_stream", None)
    for _ in range(4):  # a few wake-ups at most, whatever the peer does
        if muxed is None or getattr(muxed, "recv_closed", True):
            break
        await trio.sleep(0.25)
    await _reset(stream)


async def _reset(stream: INetStream) -> None:
    drop_unread(stream)
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        with suppress(Exception):
            await stream.reset()
