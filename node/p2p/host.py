"""libp2p host layer: TCP + Noise + Yamux, GossipSub 1.1 and request-response streams under trio.

This module only moves bytes.  Message semantics (envelopes, membership, replay windows) live in the
pure core and plug in through the ``validator`` callback, which sees every gossip message received
from another peer before it is delivered or forwarded.

Identity: the libp2p key *is* the node's Ethereum secp256k1 key, so the peer id embeds the public
key and any receiver can derive the sender's Ethereum address from it without an extra handshake.

py-libp2p 0.8.1 facts this module works around (see shared/TOOLCHAIN.md):
- the outbound per-peer RPC queue (32) and the subscription channel (32) drop silently; we raise the
  queue size, count drops, and deliver into our own bounded, always-drained channels;
- spam protection defaults to 10 msg/s per peer and topic; we set a realistic limit;
- pubsub must run before the first dial, or it never sees those connections;
- queued publishes are lost on exit, so ``__aexit__`` waits (bounded) for the queues to drain.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import ipaddress
import logging
import os
import resource
import struct
import time
import weakref
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, suppress
from functools import lru_cache
from types import TracebackType
from typing import Any

import multiaddr
import trio
from eth_keys import keys as eth_keys_mod
from eth_utils import to_checksum_address
from libp2p import new_host
from libp2p.abc import IHost, IMuxedConn, INetStream
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.secp256k1 import Secp256k1PublicKey, create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.routing_table import gen_random_key_in_bucket
from libp2p.network import swarm as _swarm_module
from libp2p.network.config import ConnectionConfig
from libp2p.network.exceptions import SwarmException
from libp2p.peer import peerstore as _peerstore_module
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub import gossipsub as _gossipsub_module
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.pubsub import utils as _pubsub_utils_module
from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIPSUB_PROTOCOL_ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.stream_muxer.yamux import yamux as _yamux_module
from libp2p.tools.anyio_service import background_trio_service

from node.errors import PeerError

from .rules import SenderBudget

logger = logging.getLogger(__name__)

Validator = Callable[[str, bytes, str], bool]
"""``validator(topic, data, sender_address) -> accept``; sender is the message originator."""

Handler = Callable[[bytes, str], Awaitable[bytes]]
"""``handler(request, sender_address) -> response`` for a request-response protocol."""

# Outbound per-peer queue size.  The library default (32) drops publishes under any burst; 4096
# RPCs per peer is a few MiB at our message sizes, bounded, and the drops that remain are counted.
OUTBOUND_QUEUE_SIZE = 4096
DEFAULT_MAX_MESSAGE = 1 << 20
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
SUBSCRIPTION_BUFFER = 4096
# Realistic per-peer, per-topic spam limit (msg/s); the library default of 10 starves honest bursts.
SPAM_LIMIT_PER_SECOND = 5000.0

# Flush heuristics: a receiver's pubsub loop handles roughly 500-1000 signed msg/s in one process;
# 400/s keeps the linger on the safe side.
_RECEIVER_RATE = 200.0  # msg/s a busy receiver surely consumes; lower = safer, slower exit
_BACKLOG_WINDOW_S = 3.0

# DHT discovery: lookups are bounded by this, dials by the connect timeout, rounds by the interval.
DHT_LOOKUP_TIMEOUT = 5.0
DHT_DIAL_TIMEOUT = 5.0
DHT_MAX_DIALS_PER_ROUND = 8
DHT_MAX_QUERIES_PER_ROUND = 16

# Connections: the library's default of 300 (250 of them inbound) suits a worker; the coordinator, which
# every worker dials, takes COORDINATOR_MAX_CONNECTIONS.
DEFAULT_MAX_CONNECTIONS = 300
COORDINATOR_MAX_CONNECTIONS = 4096
RESERVED_OUTBOUND = 50

_STATUS_OK = 0
_STATUS_ERR = 1
_LEN = struct.Struct(">I")

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


class P2PError(PeerError):
    """Any failure of the p2p layer that a caller should handle: dial, timeout, size, remote error."""


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
# Inbound connections (in their handshake or open) from one IP address, and from one /24 (IPv4) or /56
# (IPv6) network: one host, NAT or rented subnet cannot take every inbound slot. New inbound connections
# from one address are also rate-limited (each costs a Noise handshake): a token bucket per address (and
# one four times larger per network), generous enough for a NAT full of workers reconnecting after a
# coordinator restart.
MAX_INBOUND_PER_IP = 64
MAX_INBOUND_PER_PREFIX = 256
NEW_INBOUND_PER_SECOND = 100.0
NEW_INBOUND_BURST = 500.0
_inbound_per_ip: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
_inbound_rate: weakref.WeakKeyDictionary[Any, SenderBudget] = weakref.WeakKeyDictionary()
_inbound_refused: weakref.WeakKeyDictionary[Any, Counter[str]] = weakref.WeakKeyDictionary()


def _prefix_of(ip: str) -> str:
    """The /24 of an IPv4 address (IPv4-mapped IPv6 included), the /56 of an IPv6 one ("" for none)."""
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(ip)
    except ValueError:
        return ""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # an IPv4 peer of a dual-stack listener
    bits = 24 if addr.version == 4 else 56
    return str(ipaddress.ip_network(f"{addr}/{bits}", strict=False))


def _admit_inbound(swarm: Any, ip: str) -> str | None:
    """Why a new inbound connection from `ip` is refused, or None (then counted in until
    `_release_inbound`)."""
    counts = _inbound_per_ip.setdefault(swarm, {})
    prefix = "net:" + _prefix_of(ip)
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
    elif counts.get(ip, 0) >= MAX_INBOUND_PER_IP:
        reason = "per-ip"
    elif counts.get(prefix, 0) >= MAX_INBOUND_PER_PREFIX:
        reason = "per-network"
    else:
        counts[ip] = counts.get(ip, 0) + 1
        counts[prefix] = counts.get(prefix, 0) + 1
        return None
    _inbound_refused.setdefault(swarm, Counter())[reason] += 1
    return reason


def _release_inbound(swarm: Any, ip: str) -> None:
    counts = _inbound_per_ip.setdefault(swarm, {})
    for key in (ip, "net:" + _prefix_of(ip)):
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


FD_HEADROOM = 256  # descriptors kept for files, databases and outbound HTTP besides the connections


def _raise_open_file_limit(want: int) -> int:
    """Lift the soft open-file limit towards `want` (one descriptor per connection), up to the hard one;
    returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-file limit to %d (%s)", target, exc)
    return want if soft == resource.RLIM_INFINITY else int(soft)


def _ip_of(remote: Any) -> str:
    for proto in ("ip4", "ip6"):
        with suppress(Exception):
            value = remote.value_for_protocol(proto)
            if value:
                return str(value)
    return ""


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

# Gossip signatures: the node checks each new message's libp2p signature itself (`_NodePubsub.push_msg`),
# so that a message that fails is charged to the peer that forwarded it (the library drops it silently,
# uncharged, and does the check again for every copy). The library's own check, which follows, is then
# answered from the digests of messages verified moments ago instead of verifying twice.
_SIG_OK_MAX = 4096
_original_signature_validator = _pubsub_module.signature_validator
_signature_ok: OrderedDict[bytes, None] = OrderedDict()


def _message_digest(msg: rpc_pb2.Message) -> bytes:
    return hashlib.sha256(msg.SerializeToString(deterministic=True)).digest()


def verify_gossip_signature(msg: rpc_pb2.Message) -> bool:
    """Whether `msg` carries a valid libp2p signature of its author (remembered for the library's check)."""
    digest = _message_digest(msg)
    if digest in _signature_ok:
        return True
    try:
        ok = bool(_original_signature_validator(msg))
    except Exception:  # a malformed key or author id
        ok = False
    if ok:
        _signature_ok[digest] = None
        while len(_signature_ok) > _SIG_OK_MAX:
            _signature_ok.popitem(last=False)
    return ok


_pubsub_module.signature_validator = verify_gossip_signature  # type: ignore[attr-defined]


def quiet_libp2p_logs(level: int = logging.CRITICAL) -> None:
    """Silence the libp2p modules that log ERROR lines for dead peers (pitfall 5); ours still log."""
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(level)


def identity_from_eth_key(private_key: bytes) -> KeyPair:
    """libp2p secp256k1 key pair from the 32-byte Ethereum private key: one key, one identity."""
    if len(private_key) != 32:
        raise ValueError("expected a 32-byte secp256k1 private key")
    return create_new_key_pair(private_key)


@lru_cache(maxsize=4096)
def _address_from_id_bytes(id_bytes: bytes) -> str:
    pub = ID(id_bytes).extract_public_key()
    if not isinstance(pub, Secp256k1PublicKey):
        raise P2PError("peer id does not embed a secp256k1 public key")
    return eth_keys_mod.PublicKey.from_compressed_bytes(pub.to_bytes()).to_checksum_address()


class Refused(PeerError):
    """Raised by a request handler to turn a sender away (not a member, say): answered with a refusal,
    logged at debug level only, so outsiders cannot fill the log."""


def eth_address_from_peer_id(peer_id: ID | str) -> str:
    """Checksummed Ethereum address of the key embedded in a peer id (cached: called per message)."""
    pid = ID.from_base58(peer_id) if isinstance(peer_id, str) else peer_id
    return _address_from_id_bytes(pid.to_bytes())


def _safe_address(peer_id: ID) -> str:
    try:
        return eth_address_from_peer_id(peer_id)
    except Exception:
        return f"peer:{peer_id}"


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


def _allowed(allow: Callable[[str], bool], sender: str) -> bool:
    try:
        return bool(allow(sender))
    except Exception as exc:  # a gate that fails refuses
        logger.debug("allow check raised for %s: %r", sender, exc)
        return False


def _stream_ip(stream: INetStream) -> str:
    """The remote IP address of a stream's connection ("?" when the transport does not say)."""
    with suppress(Exception):
        remote = stream.get_remote_address()
        if remote:
            return str(remote[0])
    return "?"


def _frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


class _NodePubsub(Pubsub):
    """Pubsub that hands messages to the node instead of its own 32-slot subscription channels, and
    drops messages forwarded or authored by a banned peer before any validation (no CPU spent on them).

    The library's own blacklist is keyed by peer id and never expires; ours takes ``is_banned`` from
    the node, which expires bans and also matches bans given by Ethereum address."""

    def __init__(
        self,
        host: IHost,
        router: GossipSub,
        deliver: Callable[[rpc_pb2.Message], None],
        is_banned: Callable[[ID], bool],
        on_banned_drop: Callable[[], None],
        on_bad_signature: Callable[[ID], None],
        **kw: Any,
    ) -> None:
        super().__init__(host, router, **kw)
        self._deliver = deliver
        self._is_banned = is_banned
        self._on_banned_drop = on_banned_drop
        self._on_bad_signature = on_bad_signature

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        self._deliver(publish_message)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        try:
            banned = self._is_banned(msg_forwarder) or self._is_banned(ID(msg.from_id))
        except Exception:
            banned = False  # a bad from_id is the signature check's business
        if banned:
            self._on_banned_drop()
            return
        if msg_forwarder != self.my_id and not self._is_msg_seen(msg) and not verify_gossip_signature(msg):
            # No honest peer forwards this (it checks signatures before forwarding): the peer that sent
            # it to us pays. Its author id cannot be trusted, so only the forwarder is charged.
            self._on_bad_signature(msg_forwarder)
            return
        await super().push_msg(msg_forwarder, msg)


MAX_TRACKED_PEERS = 10_000  # per-peer bookkeeping (rejection counts, bans) kept for at most this many peers


class BoundedCounts(OrderedDict[str, int]):
    """Counts per key (0 for an unknown one) for the `cap` most recently updated keys."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def __missing__(self, key: str) -> int:
        return 0

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.cap:
            self.popitem(last=False)


class _CountingGossipSub(GossipSub):
    """GossipSub that counts the RPCs it drops (full queue, oversize) instead of only debug-logging."""

    dropped_rpcs: int = 0

    def _handle_dropped_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        self.dropped_rpcs += 1
        if self.dropped_rpcs == 1 or self.dropped_rpcs % 1000 == 0:
            logger.warning("gossip: dropped %d outbound RPCs (last: %s to %s)", self.dropped_rpcs, reason, peer_id)
        super()._handle_dropped_rpc(peer_id, rpc, reason)


class _NodeDHT(KadDHT):
    """KadDHT without its own maintenance loop: that loop refreshes the routing table at start and every
    10 minutes, and a refresh dials every peer it queries, past any connection cap.  The node's
    discovery loop (`P2PNode.dht_round`) does the refreshing instead, capped and with timeouts.  Values
    and provider records are not used, so their republishing is not needed either."""

    async def _run_main_loop(self) -> None:
        await trio.sleep_forever()


class P2PNode:
    """One libp2p host with gossip and request-response, run as an async context manager."""

    def __init__(
        self,
        *,
        private_key: bytes,
        listen: str = "/ip4/127.0.0.1/tcp/0",
        topics: Iterable[str] = (),
        validator: Validator | None = None,
        bootstrap: Iterable[str] = (),
        degree: int = 6,
        degree_low: int = 4,
        degree_high: int = 12,
        heartbeat_interval: int = 1,
        spam_limit_per_second: float = SPAM_LIMIT_PER_SECOND,
        max_message_size: int = DEFAULT_MAX_MESSAGE,
        max_request_size: int = DEFAULT_MAX_REQUEST,
        subscription_buffer: int = SUBSCRIPTION_BUFFER,
        deliver_own: bool = False,
        bootstrap_max_failures: int = 30,
        flush_timeout: float = 5.0,
        quiet_logs: bool = True,
        dht: bool = False,
        dht_interval: float = 30.0,
        dht_max_peers: int = 32,
        on_bad_gossip: Callable[[str], None] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        is_member: Callable[[str], bool] | None = None,
    ) -> None:
        """``dht=True`` runs a Kademlia DHT server (py-libp2p's ``/ipfs/kad/1.0.0``) and a discovery loop
        that, every ``dht_interval`` seconds (sooner at start), offers the connected peers to the routing
        table, looks up peers close to this node and dials ones not yet connected, until the node has
        ``dht_max_peers`` connections.  Every lookup and dial has a timeout.

        ``on_bad_gossip(forwarder_address)`` is called for each gossip message whose libp2p signature
        fails, with the address of the peer that forwarded it (its author cannot be trusted).

        ``max_connections`` bounds the open connections (one per peer); all but `RESERVED_OUTBOUND` of
        them may be inbound. A node many peers dial (the coordinator) needs it above the pool's size; the
        open-file limit is raised to fit where the system allows.

        ``is_member(address)`` says whether a peer is one of the pool's members: their requests in
        progress draw on a budget of their own, and non-members hold at most ``max_connections // 8``
        inbound connections, both out of reach of outsiders."""
        if dht_interval <= 0 or dht_max_peers < 1:
            raise ValueError("dht_interval must be positive and dht_max_peers at least 1")
        if max_connections <= RESERVED_OUTBOUND:
            raise ValueError(f"max_connections must be above {RESERVED_OUTBOUND}, got {max_connections}")
        self.max_connections = max_connections
        self._key_pair = identity_from_eth_key(private_key)
        self._listen = multiaddr.Multiaddr(listen)
        self._initial_topics = list(dict.fromkeys(topics))
        self._validator = validator
        self._on_bad_gossip = on_bad_gossip
        self._is_member = is_member
        self.max_outsider_connections = max(16, max_connections // 8)
        """Inbound connections of non-members (a joining node asking for its invitation) held at once:
        outsiders that connect and idle cannot take the slots members need."""
        self.inbound_outsiders_refused = 0
        self._bootstrap = list(bootstrap)
        self._gossip_params = (degree, degree_low, degree_high, heartbeat_interval, spam_limit_per_second)
        self.max_message_size = max_message_size
        self.max_request_size = max_request_size
        self._subscription_buffer = subscription_buffer
        self._deliver_own = deliver_own
        self._bootstrap_max_failures = bootstrap_max_failures
        self._flush_timeout = flush_timeout
        self._dht_enabled = dht
        self._dht_interval = dht_interval
        self._dht_max_peers = dht_max_peers
        self._dht: KadDHT | None = None
        if quiet_logs:
            quiet_libp2p_logs()

        self.peer_id: ID = ID.from_pubkey(self._key_pair.public_key)
        self.address: str = eth_address_from_peer_id(self.peer_id)
        self.rejections: BoundedCounts = BoundedCounts(MAX_TRACKED_PEERS)
        """Gossip messages rejected by the validator, keyed by the forwarding peer's address (the most
        recently charged `MAX_TRACKED_PEERS`: fresh identities cannot grow it without bound)."""
        self.dropped: defaultdict[str, int] = defaultdict(int)
        """Messages dropped because a subscriber's buffer was full, per topic."""
        self.dropped_banned = 0
        """Gossip messages dropped unvalidated because their forwarder or author is banned."""
        self.bad_signatures = 0
        """Gossip messages dropped because their libp2p signature failed (charged to the forwarder)."""
        self._bans: dict[str, float] = {}  # ban key (address or "peer:<id>") -> time.monotonic() expiry

        self._subs: dict[str, list[trio.MemorySendChannel[tuple[bytes, str]]]] = {}
        self._joined: set[str] = set()
        self._handlers: dict[str, Handler] = {}
        self._streams_in_progress: defaultdict[str, int] = defaultdict(int)
        self._request_bytes: defaultdict[str, int] = defaultdict(int)  # per budget key (`_request_budgets`)
        self.requests_refused: Counter[str] = Counter()
        """Requests refused before their body was read, per reason (busy, not-allowed, streams)."""
        self._publish_times: deque[float] = deque(maxlen=10_000)
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._host: IHost | None = None
        self._pubsub: _NodePubsub | None = None
        self._gossipsub: _CountingGossipSub | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> P2PNode:
        degree, low, high, heartbeat, spam = self._gossip_params
        limit = _raise_open_file_limit(self.max_connections + FD_HEADROOM)
        if limit - FD_HEADROOM < self.max_connections:  # past the limit every accept and open would fail
            fits = max(RESERVED_OUTBOUND + 1, limit - FD_HEADROOM)
            logger.warning(
                "open-file limit %d: taking %d connections, not %d (raise `ulimit -n`)",
                limit,
                fits,
                self.max_connections,
            )
            self.max_connections = fits
        host = new_host(
            key_pair=self._key_pair,
            listen_addrs=[self._listen],
            muxer_preference="YAMUX",
            # One connection per peer: connect takes ~18 ms instead of ~250 ms.
            connection_config=ConnectionConfig(
                max_connections=self.max_connections,
                min_connections=RESERVED_OUTBOUND,  # the inbound slots are max - min
                low_watermark=RESERVED_OUTBOUND,
                high_watermark=self.max_connections,
                max_connections_per_peer=1,
            ),
        )

        # The swarm's auto-connector aims at (low+high watermark)/2 = 150 connections and re-dials
        # every peer in the peerstore, dead ones included, with an INFO/ERROR log line per cycle.
        # No config value turns it off (the target is a midpoint), so its step is disabled here;
        # reconnection to the peers we care about is the bootstrap loop's job.
        auto_connector = getattr(host.get_network(), "auto_connector", None)
        if auto_connector is not None:
            auto_connector.maybe_connect = _no_auto_connect
        gossipsub = _CountingGossipSub(
            protocols=[GOSSIPSUB_PROTOCOL_ID],
            degree=degree,
            degree_low=low,
            degree_high=high,
            heartbeat_interval=heartbeat,
            heartbeat_initial_delay=0.1,
            max_messages_per_topic_per_second=spam,
            max_pending_messages_per_peer=OUTBOUND_QUEUE_SIZE,
        )
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            # Order matters: host first (pubsub constructed before host.run crashes the swarm),
            # then pubsub, and only then any dial (pubsub ignores earlier connections).
            await stack.enter_async_context(host.run(listen_addrs=[self._listen]))
            # host.run's exit only cancels tasks: sockets stay open (peers keep us in their lists
            # until GC).  Closing the swarm explicitly sends FIN, so peers notice at once.
            stack.push_async_callback(self._close_network, host)
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(self._nursery.cancel_scope.cancel)
            self._gate_connections(host)
            pubsub = _NodePubsub(
                host,
                gossipsub,
                self._deliver,
                self.is_banned,
                self._count_banned_drop,
                self._count_bad_signature,
                strict_signing=True,
                max_inbound_rpc_size=self.max_message_size + 4096,
            )
            await stack.enter_async_context(background_trio_service(pubsub))
            await stack.enter_async_context(background_trio_service(gossipsub))
            await pubsub.wait_until_ready()
            self._host, self._pubsub, self._gossipsub = host, pubsub, gossipsub
            if self._dht_enabled:
                # Server mode: we answer FIND_NODE, so peers that only know us can find each other.
                # Random walk off: our own bounded loop below decides when to look up and whom to dial.
                dht = _NodeDHT(
                    host, DHTMode.SERVER, enable_random_walk=False, enable_values=False, enable_providers=False
                )
                await stack.enter_async_context(background_trio_service(dht))
                self._dht = dht
                self._nursery.start_soon(self._dht_loop, dht)
            for topic in self._initial_topics:
                await self._join(topic)
            for addr in self._bootstrap:
                self._nursery.start_soon(self._bootstrap_loop, addr)
        except BaseException:
            await stack.__aexit__(None, None, None)
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            if exc_type is None:
                await self.flush(self._flush_timeout)
        finally:
            for channels in self._subs.values():
                for ch in channels:
                    ch.close()
            await stack.__aexit__(exc_type, exc, tb)

    @staticmethod
    async def _close_network(host: IHost) -> None:
        with trio.move_on_after(2.0) as scope:
            scope.shield = True
            try:
                await host.get_network().close()
            except Exception as exc:
                logger.debug("closing swarm: %r", exc)

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait (bounded) until what we published has most likely been consumed; True if in time.

        Queued messages die with the host (pitfall 5).  An empty outbound queue is not enough: the
        bytes then sit in the receiver's Yamux buffer (up to a 256 KiB window), and a receiver that
        sees the connection close drops what its pubsub loop has not read yet (measured: 103 of
        200 arrived without this).  libp2p gossip has no acknowledgement, so after the queues drain
        we linger for the receivers' estimated backlog: publishes of the last few seconds divided
        by a conservative consumption rate.
        """
        pubsub = self._require_pubsub()
        with trio.move_on_after(timeout):
            while any(len(q) for q in pubsub.peer_queues.values()):
                await trio.sleep(0.01)
            now = trio.current_time()
            recent = sum(1 for t in self._publish_times if now - t < _BACKLOG_WINDOW_S)
            await trio.sleep(0.05 + recent / _RECEIVER_RATE)
            return True
        return False

    # ------------------------------------------------------------------ identity / peers

    @property
    def listen_addrs(self) -> list[str]:
        """Full multiaddrs including ``/p2p/<peer id>``, ready to hand to ``connect``."""
        host = self._require_host()
        suffix = f"/p2p/{self.peer_id}"
        out = []
        for addr in host.get_addrs():
            s = str(addr)
            out.append(s if "/p2p/" in s else s + suffix)
        return out

    @property
    def peers(self) -> list[ID]:
        """Peers with an open connection."""
        return list(self._require_host().get_connected_peers())

    def peer_ips(self, address_ok: Callable[[str], bool]) -> set[str]:
        """Remote IP addresses of the open connections of peers whose address `address_ok` accepts."""
        swarm = self._require_host().get_network()
        out: set[str] = set()
        for peer_id, conns in list(swarm.connections.items()):  # type: ignore[attr-defined]
            if not _allowed(address_ok, _safe_address(peer_id)):
                continue
            for conn in conns if isinstance(conns, list) else [conns]:
                with suppress(Exception):
                    remote = conn.muxed_conn.get_remote_address()
                    if remote:
                        out.add(str(remote[0]))
        return out

    @property
    def gossip_peers(self) -> list[ID]:
        """Peers with an open pubsub stream (what gossip can reach)."""
        return list(self._require_pubsub().peers)

    def topic_peers(self, topic: str) -> list[ID]:
        """Peers known to be subscribed to ``topic`` (learnt from their subscription announcements)."""
        return list(self._require_pubsub().peer_topics.get(topic, ()))

    async def wait_for_topic_peers(self, topic: str, count: int, timeout: float = 5.0) -> None:
        """Wait until ``count`` peers announced ``topic``: a publish before that reaches nobody."""
        with trio.move_on_after(timeout):
            while len(self.topic_peers(topic)) < count:
                await trio.sleep(0.02)
            return
        raise P2PError(f"only {len(self.topic_peers(topic))}/{count} peers on {topic} after {timeout} s")

    def mesh_peers(self, topic: str) -> set[str]:
        """Base58 ids of the peers in our GossipSub mesh for ``topic``.

        A subscribed node publishes to its mesh only (not to every peer that announced the topic), and
        announced peers are grafted at the next heartbeat: this, not ``topic_peers``, says who a
        publish reaches right now.  Empty when we have not joined ``topic``."""
        self._require_pubsub()
        gossipsub = self._gossipsub
        if gossipsub is None:
            return set()
        return {str(p) for p in gossipsub.mesh.get(topic, ())}

    async def wait_for_mesh(self, topic: str, n: int, timeout: float = 5.0) -> None:
        """Wait until ``n`` peers are in our mesh for ``topic``; raises ``P2PError`` after ``timeout``.

        Use after ``wait_for_topic_peers`` when a test or benchmark must not lose the first publishes
        to the window between a peer's subscription and its graft."""
        with trio.move_on_after(timeout):
            while len(self.mesh_peers(topic)) < n:
                await trio.sleep(0.02)
            return
        raise P2PError(f"only {len(self.mesh_peers(topic))}/{n} mesh peers on {topic} after {timeout} s")

    @property
    def dropped_outbound(self) -> int:
        """Outbound gossip RPCs dropped by the router (full queue or oversize)."""
        return self._gossipsub.dropped_rpcs if self._gossipsub else 0

    async def connect(self, addr: str) -> ID:
        """Dial ``addr`` (a multiaddr with ``/p2p/``); returns the remote peer id."""
        host = self._require_host()
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:
            raise P2PError(f"bad multiaddr {addr!r}: {exc}") from exc
        if info.peer_id == self.peer_id:
            raise P2PError("refusing to dial self")
        if self.is_banned(info.peer_id):
            raise P2PError(f"refusing to dial banned peer {info.peer_id}")
        # An explicit dial always tries: the swarm's negative cache would otherwise keep refusing a
        # peer that was down a moment ago (e.g. a restarted coordinator) for its whole back-off period.
        unblock = getattr(host.get_network(), "unblock_peer", None)
        if unblock is not None:
            unblock(info.peer_id)
        try:
            await host.connect(info)
        except Exception as exc:
            raise P2PError(f"dial {addr} failed: {exc}") from exc
        return info.peer_id

    async def _bootstrap_loop(self, addr: str) -> None:
        """Keep one bootstrap peer connected: exponential back-off, capped, giving up after N failures."""
        try:
            peer_id = info_from_p2p_addr(multiaddr.Multiaddr(addr)).peer_id
        except Exception:
            logger.warning("bootstrap: ignoring bad multiaddr %r", addr)
            return
        host = self._require_host()
        failures = 0
        delay = 0.25
        while failures < self._bootstrap_max_failures:
            ban_left = self.ban_remaining(peer_id)
            if ban_left > 0:  # not a failure of the peer's address: wait the ban out, then dial again
                await trio.sleep(ban_left)
                continue
            if peer_id in host.get_connected_peers():
                failures, delay = 0, 0.25
                await trio.sleep(1.0)
                continue
            try:
                with trio.fail_after(5.0):
                    await self.connect(addr)
                logger.info("bootstrap: connected to %s", addr)
                continue
            except (P2PError, trio.TooSlowError) as exc:
                failures += 1
                logger.debug("bootstrap: %s failed (%d): %s", addr, failures, exc)
            await trio.sleep(delay)
            delay = min(delay * 2, 10.0)
        logger.warning("bootstrap: giving up on %s after %d failures", addr, failures)

    # ------------------------------------------------------------------ DHT discovery

    @property
    def dht_routing_table_peers(self) -> list[ID]:
        """Peers in the DHT routing table (empty without ``dht=True``)."""
        return list(self._dht.routing_table.get_peer_ids()) if self._dht is not None else []

    async def dht_round(self, dht: KadDHT | None = None) -> int:
        """One bounded discovery round; returns how many peers got connected during it.

        Connected peers go into the routing table.  Then, unless the node already holds
        ``dht_max_peers`` connections, up to ``DHT_MAX_QUERIES_PER_ROUND`` FIND_NODE queries go to
        *connected* peers only (our own id, plus one random key per non-empty bucket, as Kademlia's
        refresh does; all within ``DHT_LOOKUP_TIMEOUT``), so a query never dials anyone; the closer
        peers they name land in the peerstore and routing table.  Finally up to
        ``DHT_MAX_DIALS_PER_ROUND`` table peers not yet connected (nor banned) are dialled, never past
        ``dht_max_peers`` connections.  Successive rounds query the peers the previous ones connected:
        an iterative Kademlia walk, one hop per round, with the node's connection cap respected."""
        dht = dht if dht is not None else self._dht
        host = self._host
        if dht is None or host is None:
            raise P2PError("DHT is not running (construct the node with dht=True)")
        before = set(host.get_connected_peers())
        live = [pid for pid in before if not self.is_banned(pid)][: self._dht_max_peers]
        for pid in live:
            with trio.move_on_after(DHT_LOOKUP_TIMEOUT), suppress(Exception):
                await dht.add_peer(pid)
        if len(before) >= self._dht_max_peers:
            return 0
        keys = [self.peer_id.to_bytes()]
        for bucket in dht.routing_table.buckets:
            if bucket.size() > 0:
                keys.append(gen_random_key_in_bucket(bucket))
        queries = [(pid, key) for key in keys for pid in live][:DHT_MAX_QUERIES_PER_ROUND]

        async def query(pid: ID, key: bytes) -> None:
            if pid not in host.get_connected_peers():
                return  # went away meanwhile: querying it would dial it
            try:
                # py-libp2p's single-peer FIND_NODE: records the answer's addresses in the peerstore
                # and routing table (the public lookup also dials every peer it hears of).
                await dht.peer_routing._query_peer_for_closest(pid, key)
            except Exception as exc:
                logger.debug("dht: FIND_NODE to %s failed: %r", pid, exc)

        with trio.move_on_after(DHT_LOOKUP_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for pid, key in queries:
                    nursery.start_soon(query, pid, key)
        connected = set(host.get_connected_peers())
        candidates = [
            pid
            for pid in dht.routing_table.get_peer_ids()
            if pid != self.peer_id and pid not in connected and not self.is_banned(pid)
        ]
        for pid in candidates[:DHT_MAX_DIALS_PER_ROUND]:
            if len(host.get_connected_peers()) >= self._dht_max_peers:
                break
            addrs = host.get_peerstore().addrs(pid)
            if not addrs:
                continue
            with trio.move_on_after(DHT_DIAL_TIMEOUT):
                try:
                    await host.connect(PeerInfo(pid, addrs))
                except Exception as exc:
                    logger.debug("dht: dial %s failed: %r", pid, exc)
                    dht.routing_table.remove_peer(pid)  # Kademlia: unreachable peers leave the table
        return len(set(host.get_connected_peers()) - before)

    async def _dht_loop(self, dht: KadDHT) -> None:
        """Discovery rounds: 0.5 s apart at start, doubling up to ``dht_interval`` (and back to fast
        whenever a round found someone new, since the neighbourhood is then still changing)."""
        delay = 0.5
        while True:
            try:
                found = await self.dht_round(dht)
            except Exception as exc:  # a DHT bug must not take the node down
                logger.warning("dht: discovery round failed: %r", exc)
                found = 0
            if found:
                logger.info("dht: connected %d new peer(s)", found)
                delay = 0.5
            await trio.sleep(delay)
            delay = min(delay * 2, self._dht_interval)

    # ------------------------------------------------------------------ bans

    @staticmethod
    def _ban_key(peer: ID | str) -> str:
        """One key for a peer whether named by peer id or Ethereum address: the id embeds the key, so
        it maps to the address; a non-secp256k1 id (never one of ours) is keyed by the id itself."""
        if isinstance(peer, ID):
            return _safe_address(peer)
        if peer.startswith(("0x", "0X")) and len(peer) == 42:
            try:
                return to_checksum_address(peer.lower())
            except Exception as exc:
                raise ValueError(f"not an Ethereum address: {peer!r}") from exc
        try:
            return _safe_address(ID.from_base58(peer))
        except Exception as exc:
            raise ValueError(f"not a peer id or an Ethereum address: {peer!r}") from exc

    def ban(self, peer: ID | str, seconds: float) -> None:
        """Disconnect ``peer`` (peer id, base58 id or Ethereum address) and refuse it for ``seconds``.

        While banned, its inbound connections are closed before registration, dials to it fail, and
        gossip it forwards or authored is dropped before validation.  Sync so the gossip validator
        callback can call it; the disconnect itself runs in the node's nursery.  A second ban only
        ever extends the first."""
        key = self._ban_key(peer)
        now = time.monotonic()
        until = now + max(0.0, seconds)
        self._bans[key] = max(until, self._bans.get(key, until))
        if len(self._bans) > MAX_TRACKED_PEERS:  # forget expired bans, then the ones ending soonest
            for k in [k for k, t in self._bans.items() if t <= now]:
                del self._bans[k]
            while len(self._bans) > MAX_TRACKED_PEERS:
                del self._bans[min(self._bans, key=self._bans.__getitem__)]
        if self._host is None or self._nursery is None:
            return
        for pid in self._host.get_connected_peers():
            if _safe_address(pid) == key:
                self._nursery.start_soon(self._disconnect, pid)

    def unban(self, peer: ID | str) -> None:
        """Lift a ban early (operator action); the peer may reconnect or be dialled again at once."""
        self._bans.pop(self._ban_key(peer), None)

    def ban_remaining(self, peer: ID | str) -> float:
        """Seconds left in ``peer``'s ban, 0.0 when not banned (expired bans are forgotten here)."""
        key = self._ban_key(peer)
        until = self._bans.get(key)
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            del self._bans[key]
            return 0.0
        return left

    def is_banned(self, peer: ID | str) -> bool:
        """Whether ``peer`` is inside a ban now (cheap: called per received gossip message)."""
        if not self._bans:
            return False
        return self.ban_remaining(peer) > 0

    @property
    def banned(self) -> dict[str, float]:
        """Active bans: key (Ethereum address, or ``peer:<id>``) -> seconds left."""
        now = time.monotonic()
        return {k: until - now for k, until in self._bans.items() if until > now}

    def _member_peer(self, peer_id: ID) -> bool:
        """Whether a peer is one of the pool's members (True for all when the node knows no membership)."""
        return self._is_member is None or _allowed(self._is_member, _safe_address(peer_id))

    def _request_budgets(self, sender: str, ip: str) -> list[tuple[str, int]]:
        """The budgets (bookkeeping key, bytes) a request of `sender` from `ip` draws on."""
        if self._is_member is not None and _allowed(self._is_member, sender):
            return [("members", MAX_MEMBER_REQUEST_BYTES)]
        return [
            ("ip:" + ip, MAX_REQUEST_BYTES_PER_IP),
            ("net:" + _prefix_of(ip), MAX_REQUEST_BYTES_PER_NETWORK),
            ("outsiders", MAX_REQUEST_BYTES),
        ]

    @property
    def inbound_refused(self) -> dict[str, int]:
        """Inbound connections refused before their handshake, per reason (rate, per-ip, per-network)."""
        swarm = self._host.get_network() if self._host is not None else None
        return dict(_inbound_refused.get(swarm, {})) if swarm is not None else {}

    def _count_bad_signature(self, forwarder: ID) -> None:
        address = _safe_address(forwarder)
        self.rejections[address] += 1
        self.bad_signatures += 1
        if self._on_bad_gossip is not None:
            try:
                self._on_bad_gossip(address)
            except Exception as exc:
                logger.debug("bad-gossip callback raised: %s", exc)

    def _count_banned_drop(self) -> None:
        self.dropped_banned += 1

    async def _disconnect(self, peer_id: ID) -> None:
        host = self._host
        if host is None:
            return
        with trio.move_on_after(2.0):
            try:
                await host.get_network().close_peer(peer_id)
            except Exception as exc:
                logger.debug("closing banned peer %s: %r", peer_id, exc)

    def _gate_connections(self, host: IHost) -> None:
        """Refuse connections of banned peers at registration, inbound and outbound alike.

        The swarm's own gate filters by IP only (useless against a peer id, and every test peer is on
        127.0.0.1); ``add_conn`` is where both directions learn the authenticated peer id, after the
        Noise handshake and before the connection is announced to pubsub and identify."""
        swarm = host.get_network()
        original = swarm.add_conn  # type: ignore[attr-defined]

        async def add_conn(muxed_conn: Any, direction: str = "unknown") -> Any:
            if self.is_banned(muxed_conn.peer_id):
                with suppress(Exception):
                    await muxed_conn.close()
                raise SwarmException(f"peer {muxed_conn.peer_id} is banned")
            if direction == "inbound" and not self._member_peer(muxed_conn.peer_id):
                outsiders = sum(1 for pid in swarm.connections if not self._member_peer(pid))  # type: ignore[attr-defined]
                if outsiders >= self.max_outsider_connections:
                    self.inbound_outsiders_refused += 1
                    with suppress(Exception):
                        await muxed_conn.close()
                    raise SwarmException(f"{outsiders} connections of non-members already")
            return await original(muxed_conn, direction)

        swarm.add_conn = add_conn  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ gossip

    def subscribe(self, topic: str) -> trio.MemoryReceiveChannel[tuple[bytes, str]]:
        """Receive channel of ``(data, sender_address)`` for ``topic``.

        The buffer is bounded and filled with ``send_nowait``: a slow consumer loses messages (counted
        in ``dropped[topic]``) but never blocks pubsub for everyone else.
        """
        send, recv = trio.open_memory_channel[tuple[bytes, str]](self._subscription_buffer)
        self._subs.setdefault(topic, []).append(send)
        if topic not in self._joined:
            self._joined.add(topic)
            nursery = self._nursery
            if nursery is None:
                self._initial_topics.append(topic)
            else:
                nursery.start_soon(self._join, topic)
        return recv

    async def _join(self, topic: str) -> None:
        pubsub = self._require_pubsub()
        self._joined.add(topic)
        if topic not in pubsub.topic_validators:  # publish() may have registered it already
            pubsub.set_topic_validator(topic, self._make_validator(topic), False)
        if topic not in pubsub.topic_ids:
            await pubsub.subscribe(topic)

    def _make_validator(self, topic: str) -> Callable[[ID, rpc_pb2.Message], bool]:
        def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            if forwarder == self.peer_id:
                return True  # our own publish: the app vetted it; "received" means from others
            try:
                sender = _address_from_id_bytes(msg.from_id)
                ok = self._validator is None or bool(self._validator(topic, msg.data, sender))
            except Exception as exc:
                logger.debug("validator raised on %s: %s", topic, exc)
                ok = False
            if not ok:
                self.rejections[_safe_address(forwarder)] += 1
            return ok

        return validate

    def _deliver(self, msg: rpc_pb2.Message) -> None:
        try:
            sender = _address_from_id_bytes(msg.from_id)
        except Exception:
            return  # signatures are strict, so this cannot be a well-formed message
        if sender == self.address and not self._deliver_own:
            return
        item = (bytes(msg.data), sender)
        for topic in msg.topicIDs:
            channels = self._subs.get(topic, [])
            for ch in list(channels):
                try:
                    ch.send_nowait(item)
                except trio.WouldBlock:
                    self.dropped[topic] += 1
                    if self.dropped[topic] == 1 or self.dropped[topic] % 1000 == 0:
                        logger.warning("gossip: subscriber of %s full, %d dropped", topic, self.dropped[topic])
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    channels.remove(ch)  # the consumer closed its end: stop feeding it

    async def publish(self, topic: str, data: bytes) -> None:
        """Sign (libp2p key) and publish; joins the topic for routing if not subscribed."""
        if len(data) > self.max_message_size:
            raise P2PError(f"message of {len(data)} bytes exceeds {self.max_message_size}")
        pubsub = self._require_pubsub()
        if topic not in pubsub.topic_validators:
            # Validator registration keeps inbound checks uniform even for publish-only topics.
            pubsub.set_topic_validator(topic, self._make_validator(topic), False)
        self._publish_times.append(trio.current_time())
        try:
            await pubsub.publish(topic, data)
        except Exception as exc:
            raise P2PError(f"publish on {topic} failed: {exc}") from exc

    # ------------------------------------------------------------------ request-response

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
            sender = _safe_address(stream.muxed_conn.peer_id)
            if self._streams_in_progress[sender] >= MAX_STREAMS_PER_PEER:
                self.requests_refused["streams"] += 1
                await _reset(stream)
                return
            self._streams_in_progress[sender] += 1
            try:
                if allow is not None and not _allowed(allow, sender):
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
                    try:
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
                        reply = bytes([_STATUS_ERR]) + _frame(f"handler error: {type(exc).__name__}".encode())
                    await stream.write(reply)
                await stream.close()
                _drop_unread(stream)  # whatever the peer sent past its request
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

    # ------------------------------------------------------------------ helpers

    def _require_host(self) -> IHost:
        if self._host is None:
            raise P2PError("node is not running")
        return self._host

    def _require_pubsub(self) -> _NodePubsub:
        if self._pubsub is None:
            raise P2PError("node is not running")
        return self._pubsub


async def _no_auto_connect() -> None:
    return None


def _drop_unread(stream: INetStream) -> None:
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


async def _refuse(stream: INetStream, why: str) -> None:
    """Answer a request we will not read with `why`, then let the stream go: our clients close theirs
    once they have read the answer; one that does not is reset after a second. What the peer sent
    meanwhile is dropped, not buffered (at most a muxer window, for at most that second)."""
    with suppress(Exception), trio.move_on_after(2.0):
        await stream.write(bytes([_STATUS_ERR]) + _frame(why.encode()))
        await stream.close()
    _drop_unread(stream)  # and whatever still comes
    muxed = getattr(stream, "muxed_stream", None)
    for _ in range(4):  # a few wake-ups at most, whatever the peer does
        if muxed is None or getattr(muxed, "recv_closed", True):
            break
        await trio.sleep(0.25)
    await _reset(stream)


async def _reset(stream: INetStream) -> None:
    _drop_unread(stream)
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        with suppress(Exception):
            await stream.reset()


def address_set(peers: Sequence[ID]) -> set[str]:
    """Ethereum addresses of a list of peer ids (convenience for membership checks and tests)."""
    return {_safe_address(p) for p in peers}
