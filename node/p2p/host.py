"""libp2p host layer: TCP + Noise + Yamux, GossipSub 1.1 and request-response streams under trio.

One concern per module: `patches` (py-libp2p fixes), `identity` (Ethereum key = peer id), `gate` (bans,
who may connect), `gossip`, `dht` (discovery), `reqresp` (request-response); this module is the host
that runs them together and the public face of the layer.

This module only moves bytes.  Message semantics (envelopes, membership, replay windows) live in the
pure core and plug in through the ``validator`` callback, which sees every gossip message received
from another peer before it is delivered or forwarded.

py-libp2p 0.8.1 facts the host itself works around (see shared/TOOLCHAIN.md; `patches` has the rest):
pubsub must run before the first dial, or it never sees those connections; queued publishes are lost on
exit, so ``__aexit__`` waits (bounded) for the queues to drain; the swarm's auto-connector re-dials every
peer it ever saw, so it is turned off.
"""

from __future__ import annotations

import logging
import resource
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack, suppress
from types import TracebackType

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIPSUB_PROTOCOL_ID
from libp2p.tools.anyio_service import background_trio_service

from .dht import DhtMixin, NodeDHT
from .errors import P2PError, Refused
from .gate import MAX_TRACKED_PEERS, BoundedCounts, GateMixin, allowed
from .gossip import SPAM_LIMIT_PER_SECOND, SUBSCRIPTION_BUFFER, CountingGossipSub, GossipMixin, NodePubsub, Validator
from .identity import address_set, eth_address_from_peer_id, identity_from_eth_key, safe_address
from .patches import DEFAULT_MAX_MESSAGE, OUTBOUND_QUEUE_SIZE, quiet_libp2p_logs
from .reqresp import (
    DEFAULT_MAX_REQUEST,
    DEFAULT_MAX_RESPONSE,
    MAX_MEMBER_REQUEST_BYTES,
    MAX_REQUEST_BYTES,
    MAX_REQUEST_BYTES_PER_IP,
    MAX_REQUEST_BYTES_PER_NETWORK,
    MAX_STREAMS_PER_PEER,
    REQUEST_READ_TIMEOUT,
    SMALL_REQUEST,
    Handler,
    RequestsMixin,
)

__all__ = [
    "COORDINATOR_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_REQUEST",
    "DEFAULT_MAX_RESPONSE",
    "MAX_MEMBER_REQUEST_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_BYTES_PER_IP",
    "MAX_REQUEST_BYTES_PER_NETWORK",
    "MAX_STREAMS_PER_PEER",
    "MAX_TRACKED_PEERS",
    "REQUEST_READ_TIMEOUT",
    "SMALL_REQUEST",
    "SUBSCRIPTION_BUFFER",
    "BoundedCounts",
    "Handler",
    "P2PError",
    "P2PNode",
    "Refused",
    "Validator",
    "address_set",
    "eth_address_from_peer_id",
    "identity_from_eth_key",
    "quiet_libp2p_logs",
]

logger = logging.getLogger(__name__)

# Connections: the library's default of 300 (250 of them inbound) suits a worker; the coordinator, which
# every worker dials, takes COORDINATOR_MAX_CONNECTIONS.
DEFAULT_MAX_CONNECTIONS = 300
COORDINATOR_MAX_CONNECTIONS = 4096
RESERVED_OUTBOUND = 50
INBOUND_UPGRADE_TIMEOUT = 5.0

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


class P2PNode(GateMixin, GossipMixin, DhtMixin, RequestsMixin):
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
        self._pubsub: NodePubsub | None = None
        self._gossipsub: CountingGossipSub | None = None

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
                # a connection that has not finished its Noise and muxer handshakes holds an inbound
                # slot: 5 s is ample on a slow link (a few round trips), and frees slots twice as fast
                # as the library's 10 s against peers that connect and never speak
                inbound_upgrade_timeout=INBOUND_UPGRADE_TIMEOUT,
            ),
        )

        # The swarm's auto-connector aims at (low+high watermark)/2 = 150 connections and re-dials
        # every peer in the peerstore, dead ones included, with an INFO/ERROR log line per cycle.
        # No config value turns it off (the target is a midpoint), so its step is disabled here;
        # reconnection to the peers we care about is the bootstrap loop's job.
        auto_connector = getattr(host.get_network(), "auto_connector", None)
        if auto_connector is not None:
            auto_connector.maybe_connect = _no_auto_connect
        gossipsub = CountingGossipSub(
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
            pubsub = NodePubsub(
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
                dht = NodeDHT(
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
            if not allowed(address_ok, safe_address(peer_id)):
                continue
            for conn in conns if isinstance(conns, list) else [conns]:
                with suppress(Exception):
                    remote = conn.muxed_conn.get_remote_address()
                    if remote:
                        out.add(str(remote[0]))
        return out

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

    def _require_host(self) -> IHost:
        if self._host is None:
            raise P2PError("node is not running")
        return self._host


async def _no_auto_connect() -> None:
    return None
