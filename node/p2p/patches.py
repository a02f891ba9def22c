"""py-libp2p 0.8.1, patched where it breaks under load or attack (see shared/TOOLCHAIN.md). Importing this
module applies the patches, process-wide and idempotently; `INTELLECT_LIBP2P_UNPATCHED=1` keeps the
library's own code where a patch replaces a whole function (tests show the difference).

- the outbound per-peer RPC queue (32) drops silently: raised to `OUTBOUND_QUEUE_SIZE`;
- yamux answers every read with a window update, and buffers whatever a peer sends past its window;
- the swarm holds an inbound slot per connection until the swarm stops (250 connections, ever), and
  has no per-address cap or rate;
- signed peer records are rebuilt per RPC sent and re-verified per RPC received;
- gossip signatures are checked by the library again after the node checked them;
- pubsub reads each RPC's length prefix a byte at a time, one muxer read (and its locks) per byte;
- the service manager finds a new task's parent by walking every task it runs, for every task started.
"""

from __future__ import annotations

import importlib.metadata
import ipaddress
import logging
import os
import time
import weakref
from collections import Counter, OrderedDict
from contextlib import suppress
from typing import Any

import trio
from libp2p.abc import IHost, IMuxedConn, INetStream
from libp2p.network import swarm as _swarm_module
from libp2p.peer import peerstore as _peerstore_module
from libp2p.peer.id import ID
from libp2p.pubsub import gossipsub as _gossipsub_module
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.pubsub import utils as _pubsub_utils_module
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.stream_muxer.yamux import yamux as _yamux_module

from .rules import SenderBudget

logger = logging.getLogger(__name__)

# Outbound per-peer queue size.  The library default (32) drops publishes under any burst; 4096
# RPCs per peer is a few MiB at our message sizes, bounded, and the drops that remain are counted.
OUTBOUND_QUEUE_SIZE = 4096
DEFAULT_MAX_MESSAGE = 1 << 20

# Modules that log ERROR/WARNING for ordinary churn (a peer that went away, a refused dial).
_NOISY_LOGGERS = (
    "libp2p.network.swarm",
    "libp2p.network.connection",
    "libp2p.transport.tcp.tcp",
    "libp2p.transport.upgrader",
    "libp2p.host.basic_host",
    "libp2p.pubsub.pubsub",
    "libp2p.pubsub.gossipsub",
    "libp2p.stream_muxer.yamux.yamux",
    "libp2p.identity.identify.identify",
    "libp2p.identity.identify_push.identify_push",
    "libp2p.host.ping",
    "libp2p.security.noise",
    "libp2p.kad_dht.kad_dht",
    "libp2p.kad_dht.peer_routing",
    "libp2p.kad_dht.routing_table",
)


class _BigRpcQueue(RpcQueue):
    """RpcQueue with a larger default bound, so bursts are not dropped at 32 queued RPCs."""

    def __init__(self, max_size: int = OUTBOUND_QUEUE_SIZE, max_message_size: int = DEFAULT_MAX_MESSAGE) -> None:
        super().__init__(max_size=max_size, max_message_size=max_message_size)


# Pubsub creates its per-peer queues as ``RpcQueue()`` from its module namespace; the size is a
# default argument, so the only hook is the module attribute.  Idempotent and process-wide.
_pubsub_module.RpcQueue = _BigRpcQueue  # type: ignore[misc]


def _no_release_on_read() -> bool:
    return False


# Yamux credit: by default ("release on read") py-libp2p answers *every* read with a WINDOW_UPDATE frame,
# and pubsub reads each message as a varint byte by byte and then the body, so every gossip message
# received costs several extra outbound frames (a Noise encryption and a send() each; measured: more
# window updates than data frames).  Off, credit goes back in go-yamux's batches of half a window.
# An operator's explicit PY_YAMUX_RELEASE_ON_READ still wins.  Process-wide, like the patch above.
if "PY_YAMUX_RELEASE_ON_READ" not in os.environ:
    _yamux_module._yamux_release_on_read = _no_release_on_read


async def _batched_window_update(self: Any, *, bytes_read: int = 0) -> None:
    """go-yamux's sendWindowUpdate: give credit back once at least half the window was consumed.

    py-libp2p adds a "partial slack" branch that answers every read with a WINDOW_UPDATE whenever any
    credit at all is outstanding, which for a pubsub stream (a small message per read) is every read:
    one extra Noise frame and send() per message received, about a third of a busy node's writes.
    Flow control is unchanged: credit is withheld only while more than half the window is still
    granted or unread, so a sender blocked at zero credit is released as soon as the reader catches up.
    """
    total = 0
    async with self.window_lock:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        delta = self.target_recv_window - (self.recv_window + buffered)
        if delta > 0 and delta >= self._grow_threshold():
            total = self._grow_to_delta(buffered) + self._apply_autotune_epoch(buffered)
            self._pending_recv_release = 0
    if total > 0:
        await self.send_window_update(total, skip_lock=True)


if "PY_YAMUX_PARTIAL_SLACK" not in os.environ:  # an explicit setting keeps the library's behaviour
    _yamux_module.YamuxStream._auto_tune_and_send_window_update = _batched_window_update  # type: ignore[method-assign]

# The library version the patches below were written for (a newer one may fix these differently);
# INTELLECT_LIBP2P_UNPATCHED=1 keeps the library's own code (tests show the difference).
_PATCHED_LIBP2P = "0.8.1"
_PATCH_LIBP2P = importlib.metadata.version("libp2p") == _PATCHED_LIBP2P and not os.environ.get(
    "INTELLECT_LIBP2P_UNPATCHED"
)

# Yamux receive buffers. py-libp2p 0.8.1 appends every DATA frame to its stream's buffer and only logs a
# warning when a peer sends past the window it was granted, so one stream nobody reads (a request we have
# answered, one we refused, one still in protocol negotiation) could be fed gigabytes. Each connection's
# buffers are wrapped: a stream whose peer overruns its window (beyond a small slack for frames in flight)
# is closed for receiving and its data dropped, and a stream this node has finished with
# (`_drop_unread`) drops whatever still arrives. The backlog of open streams per connection is cut from
# 256 to 64 (each may buffer up to its window before anyone reads it).
YAMUX_WINDOW_SLACK = 64 << 10
YAMUX_STREAM_BACKLOG = 64
_original_yamux_init = _yamux_module.Yamux.__init__


class _StreamBuffer(bytearray):
    """One yamux stream's receive buffer that keeps the peer to its window."""

    def __init__(self, conn: Any, stream_id: int) -> None:
        super().__init__()
        self.conn = conn
        self.stream_id = stream_id
        self.discard = False

    def extend(self, data: Any) -> None:  # type: ignore[override]
        if self.discard:
            return
        stream = self.conn.streams.get(self.stream_id)
        window = getattr(stream, "recv_window", None)
        if isinstance(window, int) and len(data) > window + YAMUX_WINDOW_SLACK:
            logger.debug("yamux: peer %s overran the window of stream %d", self.conn.peer_id, self.stream_id)
            self.discard = True
            self.clear()
            if stream is not None:  # the reader sees the end of the stream instead of waiting on it
                stream.recv_closed = True
                event = self.conn.stream_events.get(self.stream_id)
                if event is not None:
                    event.set()
            return
        super().extend(data)


class _StreamBuffers(dict[int, bytearray]):
    def __init__(self, conn: Any) -> None:
        super().__init__()
        self.conn = conn

    def __setitem__(self, stream_id: int, value: bytearray) -> None:
        if not isinstance(value, _StreamBuffer):
            buf = _StreamBuffer(self.conn, stream_id)
            bytearray.extend(buf, value)
            value = buf
        super().__setitem__(stream_id, value)


def _yamux_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _original_yamux_init(self, *args, **kwargs)
    self.stream_buffers = _StreamBuffers(self)
    self.stream_backlog_limit = YAMUX_STREAM_BACKLOG
    self.stream_backlog_semaphore = trio.Semaphore(YAMUX_STREAM_BACKLOG)


if _PATCH_LIBP2P:
    _yamux_module.Yamux.__init__ = _yamux_init  # type: ignore[method-assign]

# Inbound connection slots. py-libp2p 0.8.1's swarm takes a slot of its inbound limiter (max_connections -
# min_connections = 250) for every accepted connection and holds it, together with the handler task and the
# raw socket object, until the whole swarm stops (`await self.manager.wait_finished()` after the upgrade),
# not until the connection closes: after 250 connections in total, over any time, every new peer is
# refused until a restart. Here the handler ends when its connection does. Patched for this version only
# (a newer one may fix it differently); INTELLECT_LIBP2P_UNPATCHED=1 keeps the library's code (tests show
# the difference). The same handler caps the inbound connections from one IP address.
_original_inbound = _swarm_module.Swarm._do_handle_inbound_connection
# Inbound connections (in their handshake or open) from one IP address (an IPv6 /64: one host's
# addresses), and from one /24 (IPv4) or /56 (IPv6) network: one host, NAT or rented subnet cannot take
# every inbound slot. The caps are these, or an 8th / a quarter of the host's inbound slots where that is
# less (`inbound_caps`): with a fixed 64 / 256, one /24 took all 250 of a worker's or validator's slots.
# New inbound connections from one address are also rate-limited (each costs a Noise handshake): a token
# bucket per address (and one four times larger per network), generous enough for a NAT full of workers
# reconnecting after a coordinator restart.
MAX_INBOUND_PER_IP = 64
MAX_INBOUND_PER_PREFIX = 256
NEW_INBOUND_PER_SECOND = 100.0
NEW_INBOUND_BURST = 500.0
_inbound_per_ip: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
_inbound_rate: weakref.WeakKeyDictionary[Any, SenderBudget] = weakref.WeakKeyDictionary()
inbound_refused_counts: weakref.WeakKeyDictionary[Any, Counter[str]] = weakref.WeakKeyDictionary()


def prefix_of(ip: str) -> str:
    """The /24 of an IPv4 address (IPv4-mapped IPv6 included), the /56 of an IPv6 one ("" for none)."""
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(ip)
    except ValueError:
        return ""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # an IPv4 peer of a dual-stack listener
    bits = 24 if addr.version == 4 else 56
    return str(ipaddress.ip_network(f"{addr}/{bits}", strict=False))


def host_of(ip: str) -> str:
    """The key one host's connections are counted under: its IPv4 address, or its IPv6 /64 (a single
    host is commonly given a whole /64, so counting single IPv6 addresses would cap nothing)."""
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr)


def inbound_caps(slots: int) -> tuple[int, int]:
    """The most inbound connections one host and one network may hold on a swarm with `slots` inbound
    slots: `MAX_INBOUND_PER_IP` and `MAX_INBOUND_PER_PREFIX`, or an 8th and a quarter of the slots where
    that is less (never under 4), so it takes four networks, not one, to fill them."""
    per_ip = max(4, min(MAX_INBOUND_PER_IP, slots // 8))
    return per_ip, max(per_ip, min(MAX_INBOUND_PER_PREFIX, slots // 4))


def _admit_inbound(swarm: Any, ip: str) -> str | None:
    """Why a new inbound connection from `ip` is refused, or None (then counted in until
    `_release_inbound`)."""
    counts = _inbound_per_ip.setdefault(swarm, {})
    prefix = "net:" + prefix_of(ip)
    ip = host_of(ip)
    limiter = getattr(swarm, "_inbound_limiter", None)
    per_ip_cap, per_prefix_cap = inbound_caps(int(limiter.total_tokens) if limiter is not None else 250)
    rate = _inbound_rate.get(swarm)
    if rate is None:
        rate = _inbound_rate[swarm] = SenderBudget(
            {
                "connect": (NEW_INBOUND_PER_SECOND, NEW_INBOUND_BURST),
                "connect-net": (4 * NEW_INBOUND_PER_SECOND, 4 * NEW_INBOUND_BURST),
            },
            max_buckets=16_384,
        )
    now = time.monotonic()
    if not rate.take(ip, "connect", now) or not rate.take(prefix, "connect-net", now):
        reason = "rate"
    elif counts.get(ip, 0) >= per_ip_cap:
        reason = "per-ip"
    elif counts.get(prefix, 0) >= per_prefix_cap:
        reason = "per-network"
    else:
        counts[ip] = counts.get(ip, 0) + 1
        counts[prefix] = counts.get(prefix, 0) + 1
        return None
    inbound_refused_counts.setdefault(swarm, Counter())[reason] += 1
    return reason


def _release_inbound(swarm: Any, ip: str) -> None:
    counts = _inbound_per_ip.setdefault(swarm, {})
    for key in (host_of(ip), "net:" + prefix_of(ip)):
        counts[key] = counts.get(key, 0) - 1
        if counts[key] <= 0:
            del counts[key]


async def _inbound_until_closed(self: Any, read_write_closer: Any, maddr: Any, failure_event: Any) -> None:
    """`Swarm._do_handle_inbound_connection` of 0.8.1 for stream transports (TCP), returning once the
    upgraded connection has closed, so `_handle_inbound_connection` gives its slot back."""
    if isinstance(read_write_closer, IMuxedConn):  # already multiplexed (QUIC): the library's own path
        await _original_inbound(self, read_write_closer, maddr, failure_event)
        return
    remote = self._build_remote_multiaddr(read_write_closer)
    if remote is not None and not await self.connection_gate.is_allowed(remote):
        with suppress(Exception):
            await read_write_closer.close()
        return
    ip = _ip_of(remote)
    refused = _admit_inbound(self, ip)
    if refused is not None:
        logger.debug("inbound connection from %s refused (%s)", remote, refused)
        with suppress(Exception):
            await read_write_closer.close()
        return
    try:
        raw_conn = _swarm_module.RawConnection(read_write_closer, False)
        try:
            muxed = await self.upgrade_inbound_raw_conn(raw_conn, maddr)
        except Exception as exc:
            logger.debug("inbound connection from %s failed its upgrade: %r", remote, exc)
            with suppress(Exception):
                await raw_conn.close()
            return
        closed = getattr(muxed, "event_closed", None)
        if isinstance(closed, trio.Event):
            await closed.wait()
        else:  # another muxer: poll its state
            while not muxed.is_closed:
                await trio.sleep(1.0)
    finally:
        _release_inbound(self, ip)


if _PATCH_LIBP2P:
    _swarm_module.Swarm._do_handle_inbound_connection = _inbound_until_closed  # type: ignore[method-assign]

# Signed peer records ride on every pubsub RPC.  py-libp2p rebuilds ours per RPC *sent* (re-parsing our
# listen multiaddrs from strings: ~0.3 ms a message) and re-verifies the sender's per RPC *received*,
# though both change only when a host's addresses do.  Cache the outgoing record for a second and skip
# re-consuming the very same record bytes from the same peer for a minute (bounded memory).
_SPR_REUSE_S = 1.0
_SPR_RECHECK_S = 60.0
_SPR_SEEN_MAX = 4096
_original_env_to_send = _peerstore_module.env_to_send_in_RPC
_original_consume_record = _pubsub_utils_module.maybe_consume_signed_record
_spr_out: weakref.WeakKeyDictionary[IHost, tuple[float, bytes]] = weakref.WeakKeyDictionary()
_spr_seen: OrderedDict[tuple[bytes, bytes, bytes], float] = OrderedDict()


def _cached_env_to_send_in_rpc(host: IHost) -> tuple[bytes, bool]:
    now = time.monotonic()
    hit = _spr_out.get(host)
    if hit is not None and now < hit[0]:
        return hit[1], False
    envelope, fresh = _original_env_to_send(host)
    _spr_out[host] = (now + _SPR_REUSE_S, envelope)
    return envelope, fresh


def _cached_consume_signed_record(msg: rpc_pb2.RPC, host: IHost, peer_id: ID) -> bool:
    if not msg.HasField("senderRecord"):
        return True
    key = (host.get_id().to_bytes(), peer_id.to_bytes(), msg.senderRecord)
    now = time.monotonic()
    until = _spr_seen.get(key)
    if until is not None and now < until:
        return True  # these exact bytes from this peer were verified and stored moments ago
    ok = _original_consume_record(msg, host, peer_id)
    if ok:
        _spr_seen[key] = now + _SPR_RECHECK_S
        _spr_seen.move_to_end(key)
        while len(_spr_seen) > _SPR_SEEN_MAX:
            _spr_seen.popitem(last=False)
    return ok


for _module in (_pubsub_module, _gossipsub_module):
    _module.env_to_send_in_RPC = _cached_env_to_send_in_rpc  # type: ignore[attr-defined]
    _module.maybe_consume_signed_record = _cached_consume_signed_record  # type: ignore[attr-defined]


def quiet_libp2p_logs(level: int = logging.CRITICAL) -> None:
    """Silence the libp2p modules that log ERROR lines for dead peers (pitfall 5); ours still log."""
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(level)


def _ip_of(remote: Any) -> str:
    for proto in ("ip4", "ip6"):
        with suppress(Exception):
            value = remote.value_for_protocol(proto)
            if value:
                return str(value)
    return ""


def drop_unread(stream: INetStream) -> None:
    """Free what the muxer holds unread for a stream we will not read again, and drop what still comes
    (yamux keeps a closed or reset stream's buffered bytes for a grace period)."""
    muxed = getattr(stream, "muxed_stream", None)
    buffers = getattr(getattr(muxed, "conn", None), "stream_buffers", None)
    if isinstance(buffers, dict):
        buf = buffers.get(getattr(muxed, "stream_id", None))
        if isinstance(buf, bytearray):
            buf.clear()
        if isinstance(buf, _StreamBuffer):
            buf.discard = True


# The pubsub reader and the service manager's tasks (applied on import, re-exported for the tests).
from .patches_io import TCP_READ_AHEAD, read_ahead  # noqa: E402
from .patches_pubsub import (  # noqa: E402
    PUBSUB_READ_CHUNK,
    _find_parent_task_cached,
    _schedule_task_while_open,
    read_varint_prefixed_buffered,
)
from .patches_signatures import _check_gossip_signature, verify_gossip_signature  # noqa: E402

__all__ = [
    "PUBSUB_READ_CHUNK",
    "TCP_READ_AHEAD",
    "_check_gossip_signature",
    "_find_parent_task_cached",
    "_schedule_task_while_open",
    "read_ahead",
    "read_varint_prefixed_buffered",
    "verify_gossip_signature",
]
