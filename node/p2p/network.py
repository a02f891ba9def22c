"""One pool's gossip network: the libp2p host (`host.P2PNode`) wired to the pure message core.

`host.py` only moves bytes and `rules.py` only judges them; this module is the glue a node uses:

- one topic per message kind, ``intellect/<pool>/<kind>``, so peers can subscribe to what they need
  and GossipSub's per-topic spam limits apply per kind;
- every message received from another peer goes through `MessageValidator.check` inside the host's
  topic validator, i.e. *before* GossipSub forwards it, so a bad message dies at the first hop;
- every author has a budget per kind (`rules.SenderBudget`, `budgets`: messages per second and burst;
  None for no limit): what a member sends beyond it is dropped before it is forwarded (`RATE`);
- rejections are counted per reason (`rejected`) and charged to the message author in a `PeerScore`
  (a message whose libp2p signature fails, to the peer that forwarded it);
  an author past the threshold is banned at the host (`P2PNode.ban`: disconnected, refused both ways,
  its gossip dropped unread) and anything of it still in flight is refused (`BANNED`) until it expires;
- accepted messages reach `subscribe(kind)` channels as decoded `Envelope` objects;
- `publish` seals with the node's Ethereum key (the same key as its libp2p identity), with a seq that
  strictly increases even across restarts, so receivers' replay windows never drop honest messages.

Membership comes from a caller-supplied callable returning a cached snapshot: the chain is never
queried per message (the caller refreshes the snapshot on chain events).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import trio
from eth_account import Account
from eth_account.signers.local import LocalAccount

from .envelope import KINDS, Envelope, EnvelopeError, RejectReason, decode, encode, seal
from .host import SUBSCRIPTION_BUFFER, P2PNode
from .rules import DEFAULT_BUDGETS, Membership, MessageValidator, PeerScore, SenderBudget

logger = logging.getLogger(__name__)

# `_accepted`: at most this many envelopes of at most this many bytes each (2 MiB in all); a larger one is
# decoded twice, which next to its size costs little.
ACCEPTED_KEPT = 512
ACCEPTED_MAX_BYTES = 4096
TOPIC_PREFIX = "intellect"


def pool_topic(pool: int, kind: str) -> str:
    """Gossip topic of `kind` messages in `pool`; one definition so every node derives the same name."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    return f"{TOPIC_PREFIX}/{pool}/{kind}"


class PoolNetwork:
    """Gossip for one pool, run as an async context manager (``async with PoolNetwork(...) as net``).

    Rejections are charged to the message *author* (the libp2p source peer that signed the gossip
    message): the host's validator callback only exposes the author, and since a rejected message is
    never forwarded, the author of a rejected message is also the first-hop peer that sent it, except
    when peers' membership snapshots disagree (light weights cover that case).
    """

    def __init__(
        self,
        *,
        private_key: bytes,
        pool: int,
        membership: Callable[[], Membership],
        listen: str = "/ip4/127.0.0.1/tcp/0",
        bootstrap: Iterable[str] = (),
        score: PeerScore | None = None,
        max_skew: float = 30.0,
        replay_window: int = 1024,
        budgets: dict[str, tuple[float, float]] | None = DEFAULT_BUDGETS,
        subscription_buffer: int = SUBSCRIPTION_BUFFER,
        clock: Callable[[], float] = time.time,
        **node_options: Any,
    ) -> None:
        self.pool = pool
        self.account: LocalAccount = Account.from_key(private_key)
        self.membership = membership
        self.validator = MessageValidator(
            pool,
            membership,
            max_skew=max_skew,
            window=replay_window,
            budget=SenderBudget(budgets) if budgets is not None else None,
        )
        self.score = score if score is not None else PeerScore()
        self.clock = clock
        self.rejected: Counter[RejectReason] = Counter()
        # Envelopes `_validate` accepted, by their bytes, until `_pump` hands them on (bounded: what the host
        # drops after validating, e.g. a full subscriber channel, is pushed out by newer ones).
        self._accepted: OrderedDict[bytes, Envelope] = OrderedDict()
        """Received messages dropped by this node, per reason (BANNED included)."""
        self.dropped: defaultdict[str, int] = defaultdict(int)
        """Accepted envelopes lost because a subscriber's buffer was full, per kind."""
        self.topics: dict[str, str] = {kind: pool_topic(pool, kind) for kind in KINDS}
        self._subscription_buffer = subscription_buffer
        self._subs: dict[str, list[trio.MemorySendChannel[Envelope]]] = {kind: [] for kind in KINDS}
        # Start at the wall clock in microseconds, then count: a restarted node lands above every seq
        # it used before (it cannot have sent a million messages a second), and consecutive messages
        # get consecutive seqs, so receivers' replay windows (a count of seqs) tolerate reordering.
        self._seq = time.time_ns() // 1000
        self.node = P2PNode(
            private_key=private_key,
            listen=listen,
            topics=self.topics.values(),
            validator=self._validate,
            bootstrap=bootstrap,
            subscription_buffer=subscription_buffer,
            on_bad_gossip=self._bad_gossip,
            is_member=lambda address: self.membership().role(address) is not None,
            **node_options,
        )
        if self.node.address != self.account.address:  # one key, one identity: a mismatch is a bug
            raise RuntimeError("libp2p identity and Ethereum account disagree")
        self._stack: AsyncExitStack | None = None

    @property
    def address(self) -> str:
        """This node's checksummed Ethereum address (the `sender` of everything it publishes)."""
        return self.account.address

    @property
    def listen_addrs(self) -> list[str]:
        """Dialable multiaddrs (with ``/p2p/<id>``) for other nodes' `connect` or bootstrap lists."""
        return self.node.listen_addrs

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> PoolNetwork:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            # The nursery is entered before the host so that it outlives it: on exit the host closes
            # its subscription channels first, which ends the pumps, and only then the nursery joins.
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)
            await stack.enter_async_context(self.node)
            for kind, topic in self.topics.items():
                nursery.start_soon(self._pump, kind, self.node.subscribe(topic))
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
            await stack.__aexit__(exc_type, exc, tb)
        finally:
            for channels in self._subs.values():
                for ch in channels:
                    ch.close()

    # ------------------------------------------------------------------ peers

    async def connect(self, addr: str) -> None:
        """Dial another node (multiaddr with ``/p2p/``); raises `P2PError` on failure."""
        await self.node.connect(addr)

    async def wait_for_peers(self, count: int, timeout: float = 5.0, kinds: Iterable[str] = KINDS) -> None:
        """Wait until `count` peers announced every topic of `kinds`; a publish before that reaches nobody."""
        with trio.fail_after(timeout):
            for kind in kinds:
                await self.node.wait_for_topic_peers(self.topics[kind], count, timeout)

    async def wait_for_mesh(self, count: int, timeout: float = 5.0, kinds: Iterable[str] = KINDS) -> None:
        """Wait until `count` peers are in our GossipSub mesh of every topic of `kinds` (a publish goes
        to mesh peers only, so this is the precise "ready to send" condition); raises `P2PError`."""
        deadline = trio.current_time() + timeout
        for kind in kinds:
            await self.node.wait_for_mesh(self.topics[kind], count, max(0.0, deadline - trio.current_time()))

    # ------------------------------------------------------------------ receive

    def _validate(self, topic: str, data: bytes, sender_address: str) -> bool:
        """Host topic validator: runs before GossipSub forwards, so False stops the message here."""
        now = self.clock()
        if self.score.banned(sender_address, now):
            self._reject(sender_address, RejectReason.BANNED, now, "author is banned")
            return False
        try:
            # The host hands us the author of a strictly signed GossipSub message (signature verified
            # before any topic validator runs), keyed by the same secp256k1 key as its Ethereum account.
            env = self.validator.check(data, peer_address=sender_address, now=now, author_verified=True)
        except EnvelopeError as exc:
            self._reject(sender_address, exc.reason, now, str(exc))
            return False
        if self.topics.get(env.kind) != topic:
            # A valid envelope on another kind's topic would bypass per-kind subscriptions and limits.
            self._reject(sender_address, RejectReason.KIND, now, f"{env.kind} envelope on topic {topic}")
            return False
        if len(data) <= ACCEPTED_MAX_BYTES:
            self._accepted[bytes(data)] = env
            if len(self._accepted) > ACCEPTED_KEPT:
                self._accepted.popitem(last=False)
        return True

    def _bad_gossip(self, forwarder: str) -> None:
        """A message whose libp2p signature failed: charged to the peer that forwarded it to us."""
        self._reject(forwarder, RejectReason.BAD_SIGNATURE, self.clock(), "gossip with an invalid libp2p signature")

    def _reject(self, author: str, reason: RejectReason, now: float, detail: str) -> None:
        self.rejected[reason] += 1
        logger.debug("pool %d: dropped message from %s: %s", self.pool, author, detail)
        if self.score.penalize(author, reason, now):
            logger.warning(
                "pool %d: banning %s for %.0f s (last: %s)", self.pool, author, self.score.ban_seconds, detail
            )
            # The score only judges; the host enforces: disconnect, refuse, drop its gossip unread.
            try:
                self.node.ban(author, self.score.ban_seconds)
            except ValueError:  # an author key we cannot name (never a peer of ours): score-only ban
                logger.debug("pool %d: cannot ban %r at the host", self.pool, author)

    async def _pump(self, kind: str, chan: trio.MemoryReceiveChannel[tuple[bytes, str]]) -> None:
        """Turn the host's accepted bytes of one topic into Envelopes for this kind's subscribers.

        The bytes already passed `_validate`, which kept their envelope (`_accepted`); one it no longer
        holds (pushed out by newer ones) is decoded again (cheaply: no signature recovery)."""
        async with chan:
            async for data, _author in chan:
                env = self._accepted.pop(data, None)
                if env is None:
                    try:
                        env = decode(data, max_bytes=self.validator.max_bytes)
                    except EnvelopeError:  # pragma: no cover - the validator accepted these exact bytes
                        logger.error("pool %d: accepted bytes no longer decode on %s", self.pool, kind)
                        continue
                channels = self._subs[kind]
                for ch in list(channels):
                    try:
                        ch.send_nowait(env)
                    except trio.WouldBlock:
                        self.dropped[kind] += 1
                        if self.dropped[kind] == 1 or self.dropped[kind] % 1000 == 0:
                            logger.warning(
                                "pool %d: %s subscriber full, %d dropped", self.pool, kind, self.dropped[kind]
                            )
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        channels.remove(ch)

    def subscribe(self, kind: str) -> trio.MemoryReceiveChannel[Envelope]:
        """Receive channel of accepted envelopes of `kind` from other nodes (never our own).

        Bounded and fed with ``send_nowait``: a slow consumer loses messages (counted in
        ``dropped[kind]``) instead of stalling gossip for every other kind and peer."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        send, recv = trio.open_memory_channel[Envelope](self._subscription_buffer)
        self._subs[kind].append(send)
        return recv

    # ------------------------------------------------------------------ send

    def next_seq(self) -> int:
        """The next seq: one more than the last (see the constructor for why it starts at the clock)."""
        self._seq += 1
        return self._seq

    def seal(self, kind: str, body: bytes) -> Envelope:
        """Sign an envelope of `kind` for this pool with the node's key, stamped with the current time."""
        return seal(self.account, kind=kind, pool=self.pool, seq=self.next_seq(), time=self.clock(), body=body)

    async def publish(self, kind: str, body: bytes) -> Envelope:
        """Seal `body` as a `kind` message and gossip it; returns the envelope sent.

        Raises EnvelopeError(OVERSIZE) locally for what peers would drop as oversize (a node that sent
        it would be penalised by every neighbour), and P2PError if the host cannot publish. Whether this
        node may send `kind` is left to the receivers, whose membership snapshot is what counts."""
        topic = pool_topic(self.pool, kind)
        env = self.seal(kind, body)
        data = encode(env)
        if len(data) > self.validator.max_bytes:
            raise EnvelopeError(
                RejectReason.OVERSIZE, f"envelope is {len(data)} bytes, limit {self.validator.max_bytes}"
            )
        await self.node.publish(topic, data)
        return env


__all__ = ["TOPIC_PREFIX", "PoolNetwork", "pool_topic"]
