"""GossipSub for the node: messages go to its own bounded, always-drained subscriber channels, a banned
peer's messages are dropped before any validation, a bad signature is charged to the forwarding peer,
and the app's validator sees every message from another peer before it is delivered or forwarded.
A mixin of `P2PNode`."""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.io.exceptions import IOException, MessageTooLarge
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.stream.exceptions import StreamEOF, StreamError
from libp2p.peer.id import ID
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from .errors import P2PError
from .gate import BoundedCounts
from .gossip_router import CountingGossipSub, GateScorer
from .gossip_wire import (
    COALESCE_MAX_BYTES,
    PEER_HAS_KEPT,
    RecentIds,
    ValidationCache,
    coalesce,
    drop_known,
)
from .identity import address_from_id_bytes, safe_address
from .patches import verify_gossip_signature

__all__ = [
    "COALESCE_MAX_BYTES",
    "PEER_HAS_KEPT",
    "SPAM_LIMIT_PER_SECOND",
    "SUBSCRIPTION_BUFFER",
    "CountingGossipSub",
    "GateScorer",
    "GossipMixin",
    "NodePubsub",
    "RecentIds",
    "ValidationCache",
    "Validator",
    "coalesce",
    "drop_known",
]

logger = logging.getLogger(__name__)

# A peer's reader lets the node's other tasks run after this many messages of one RPC (up to ~1 MiB).
YIELD_EVERY = 32

Validator = Callable[[str, bytes, str], bool]
"""``validator(topic, data, sender_address) -> accept``; sender is the message originator."""

SUBSCRIPTION_BUFFER = 4096
# Realistic per-peer, per-topic spam limit (msg/s); the library default of 10 starves honest bursts.
SPAM_LIMIT_PER_SECOND = 5000.0

# Flush heuristics: a receiver's pubsub loop handles roughly 500-1000 signed msg/s in one process;
# 400/s keeps the linger on the safe side.
_RECEIVER_RATE = 200.0  # msg/s a busy receiver surely consumes; lower = safer, slower exit
_BACKLOG_WINDOW_S = 3.0


class NodePubsub(Pubsub):
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
        old = self.validation_cache
        self.validation_cache = ValidationCache(old.ttl, old.max_size)  # type: ignore[assignment]
        self._deliver = deliver
        self._is_banned = is_banned
        self._on_banned_drop = on_banned_drop
        self._on_bad_signature = on_bad_signature
        self.copies_received = 0  # gossip messages received, copies of one already seen included
        self.copies_spared = 0  # queued copies not sent: their peer had sent us the message meanwhile
        self._peer_has: dict[ID, RecentIds] = {}

    async def continuously_read_stream(self, stream: INetStream) -> None:
        """A peer's pubsub stream, read as the library does (bounded RPCs, the sender's signed record, then
        messages, subscriptions and control), but each new message is handled here, in this reader, instead
        of in a service task started for it: that start (task object, manager bookkeeping, trio spawn) was
        7 % of a forwarding node's CPU. A peer's messages are now handled one after another, in the order
        it sent them; handling never waits on the network (forwarding only queues, delivery is
        `send_nowait`), so a peer that sends faster than we handle is slowed by TCP, not by tasks piling
        up. A message whose handling raises is logged and dropped; the stream goes on."""
        peer_id = stream.muxed_conn.peer_id
        has = self._peer_has[peer_id] = RecentIds()
        try:
            while self.manager.is_running:
                data = await _pubsub_module.read_varint_prefixed_bytes_limited(stream, self.max_inbound_rpc_size)
                rpc = rpc_pb2.RPC()
                rpc.ParseFromString(data)
                if not _pubsub_module.maybe_consume_signed_record(rpc, self.host, peer_id):
                    logger.debug("gossip: invalid signed record from %s, RPC ignored", peer_id)
                    continue
                self.copies_received += len(rpc.publish)
                for n, msg in enumerate(rpc.publish):
                    if n % YIELD_EVERY == YIELD_EVERY - 1:
                        # handling never waits, so one RPC of thousands of messages would hold the whole
                        # node (every other peer, the heartbeat) until its last one: let them run
                        await trio.lowlevel.checkpoint()
                    if not self._is_subscribed_to_msg(msg):
                        continue
                    if self._is_msg_seen(msg):
                        # a copy of a message already handled (most of what a mesh delivers: each peer
                        # forwards each message to its whole mesh): dropped, and the peer has it
                        has.add(self._msg_id_constructor(msg))
                        continue
                    try:
                        await self.push_msg(peer_id, msg)
                    except Exception as exc:
                        logger.debug("gossip: message from %s dropped: %r", peer_id, exc)
                if rpc.subscriptions:
                    if len(rpc.subscriptions) > self.max_subscriptions_per_rpc:
                        logger.debug("gossip: %s sent %d subscriptions in one RPC", peer_id, len(rpc.subscriptions))
                    else:
                        for sub in rpc.subscriptions:
                            self.handle_subscription(peer_id, sub)
                if rpc.HasField("control"):
                    await self.router.handle_rpc(rpc, peer_id)
        except MessageTooLarge as exc:
            logger.debug("gossip: RPC over the size limit from %s: %s", peer_id, exc)
            with contextlib.suppress(Exception):
                await stream.reset()
            self._handle_dead_peer(peer_id)
        except (StreamEOF, StreamError, IOException, RawConnError) as exc:
            logger.debug("gossip: stream of %s ended: %r", peer_id, exc)
        finally:
            if self._peer_has.get(peer_id) is has:
                del self._peer_has[peer_id]

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        self._deliver(publish_message)

    async def handle_sending_messages(self, peer_id: ID, stream: Any, queue: Any) -> None:
        """The library's per-peer writer, sending what piled up in the queue while it was writing as one
        RPC (`coalesce`), less the messages the peer sent us meanwhile (`drop_known`): the busier a node,
        the fewer frames and copies each message costs it and its peers, instead of a backlog that grows
        once it falls behind."""
        pending: rpc_pb2.RPC | None = None
        inner = getattr(queue, "_queue", None)  # RpcQueue's PriorityQueue: a pop that never waits
        take: Callable[[], rpc_pb2.RPC | None] = inner.pop if inner is not None else (lambda: None)
        try:
            while True:
                rpc = pending if pending is not None else await queue.pop()
                if rpc is None:
                    return
                rpc, pending = coalesce(rpc, take)
                has = self._peer_has.get(peer_id)
                if has and rpc.publish:
                    spared = drop_known(rpc, has, self._msg_id_constructor)
                    if spared:
                        self.copies_spared += spared
                        if not rpc.publish and not rpc.subscriptions and not rpc.HasField("control"):
                            continue
                if not await self.write_msg(stream, rpc):
                    return
        except Exception:
            logger.debug("sending loop for %s terminated with error", peer_id)
            self._handle_dead_peer(peer_id)

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


class GossipMixin:
    """Publish, subscribe and the gossip figures of a `P2PNode` (state set up by `P2PNode.__init__`)."""

    peer_id: ID
    address: str
    max_message_size: int
    rejections: BoundedCounts
    dropped: defaultdict[str, int]
    dropped_banned: int
    bad_signatures: int
    _validator: Validator | None
    _on_bad_gossip: Callable[[str], None] | None
    _subs: dict[str, list[trio.MemorySendChannel[tuple[bytes, str]]]]
    _joined: set[str]
    _initial_topics: list[str]
    _subscription_buffer: int
    _deliver_own: bool
    _publish_times: deque[float]
    _nursery: trio.Nursery | None
    _pubsub: NodePubsub | None
    _gossipsub: CountingGossipSub | None

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
    def copies_received(self) -> int:
        """Gossip messages received from peers, including copies of messages already seen: over the
        messages delivered, how many times the mesh carried each one to this node."""
        return self._pubsub.copies_received if self._pubsub else 0

    @property
    def copies_spared(self) -> int:
        """Queued gossip copies not sent because their peer sent us the message meanwhile."""
        return self._pubsub.copies_spared if self._pubsub else 0

    @property
    def dropped_outbound(self) -> int:
        """Outbound gossip RPCs dropped by the router (full queue or oversize)."""
        return self._gossipsub.dropped_rpcs if self._gossipsub else 0

    def _count_bad_signature(self, forwarder: ID) -> None:
        address = safe_address(forwarder)
        self.rejections[address] += 1
        self.bad_signatures += 1
        if self._on_bad_gossip is not None:
            try:
                self._on_bad_gossip(address)
            except Exception as exc:
                logger.debug("bad-gossip callback raised: %s", exc)

    def _count_banned_drop(self) -> None:
        self.dropped_banned += 1

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
                sender = address_from_id_bytes(msg.from_id)
                ok = self._validator is None or bool(self._validator(topic, msg.data, sender))
            except Exception as exc:
                logger.debug("validator raised on %s: %s", topic, exc)
                ok = False
            if not ok:
                self.rejections[safe_address(forwarder)] += 1
            return ok

        return validate

    def _deliver(self, msg: rpc_pb2.Message) -> None:
        try:
            sender = address_from_id_bytes(msg.from_id)
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

    def _require_pubsub(self) -> NodePubsub:
        if self._pubsub is None:
            raise P2PError("node is not running")
        return self._pubsub
