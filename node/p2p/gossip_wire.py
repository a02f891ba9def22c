"""Gossip's wire and cache helpers (no I/O): RPCs merged for one peer (`coalesce`), the messages a peer
already has (`RecentIds`, `drop_known`), and pubsub's validation cache (`ValidationCache`). Used by
`node.p2p.gossip`'s reader and writer."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import ValidationResult

# Outbound coalescing: publish RPCs queued for one peer while its writer was busy go out as one RPC of
# at most this many bytes (one varint, one Noise frame, one Yamux frame, one send(), one peer record and
# one parse at the receiver instead of one each per message). Far under what any node accepts in one RPC
# (a single envelope may be 256 KiB, `envelope.MAX_ENVELOPE_BYTES`).
COALESCE_MAX_BYTES = 64 * 1024


def _publish_only(rpc: rpc_pb2.RPC) -> bool:
    """An RPC that only carries messages (no subscriptions, no control): such RPCs may be merged in
    order; control (GRAFT, PRUNE, IHAVE, IWANT) is never merged, so its order and meaning stay as sent."""
    return bool(rpc.publish) and not rpc.subscriptions and not rpc.HasField("control")


def coalesce(
    first: rpc_pb2.RPC, take: Callable[[], rpc_pb2.RPC | None], max_bytes: int = COALESCE_MAX_BYTES
) -> tuple[rpc_pb2.RPC, rpc_pb2.RPC | None]:
    """Merge into `first` the publish-only RPCs that `take()` hands out next (None: nothing queued),
    while the result stays within `max_bytes`. Returns the RPC to send and the first RPC taken but not
    merged (to be sent after it, in order), if any."""
    if not _publish_only(first):
        return first, None
    size = first.ByteSize()
    while size < max_bytes:
        nxt = take()
        if nxt is None:
            return first, None
        extra = sum(m.ByteSize() + 8 for m in nxt.publish)  # each message's tag and length prefix: < 8
        if not _publish_only(nxt) or size + extra > max_bytes:
            return first, nxt
        first.publish.extend(nxt.publish)
        size += extra
    return first, None


# Per peer, the ids of the last messages it sent us that we already had: a copy still queued for it is not
# sent (it has the message). Bounded per peer; the entry goes with the peer's stream.
PEER_HAS_KEPT = 512


class RecentIds:
    """A bounded set of message ids, oldest dropped first."""

    def __init__(self, limit: int = PEER_HAS_KEPT) -> None:
        self.limit = max(1, limit)
        self._ids: dict[bytes, None] = {}

    def add(self, msg_id: bytes) -> None:
        ids = self._ids
        ids[msg_id] = None
        if len(ids) > self.limit:
            del ids[next(iter(ids))]

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


def drop_known(rpc: rpc_pb2.RPC, known: RecentIds, msg_id: Callable[[rpc_pb2.Message], bytes]) -> int:
    """Remove from `rpc` the messages whose id is in `known` (the peer it goes to sent us them: it has
    them); returns how many. Subscriptions and control stay as they are."""
    keep = [m for m in rpc.publish if msg_id(m) not in known]
    dropped = len(rpc.publish) - len(keep)
    if dropped:
        del rpc.publish[:]
        rpc.publish.extend(keep)
    return dropped


class ValidationCache:
    """Pubsub's cache of validation results by message id, in O(1) per message: py-libp2p 0.8.1 keeps its
    LRU order in a list, so every put scans and shifts up to `max_size` ids (1000): 2.8 % of a node's CPU
    in `bench/gossip.py --nodes 20`, more the larger the cache. An entry older than `ttl` seconds is gone,
    a hit becomes the newest, a full cache drops its oldest.

    Unlike the library's, it never answers "valid": a message is named by its author and seqno, the seen
    cache forgets a name after 120 s while this one kept it for 300 s, and pubsub took a cached "valid" as
    the answer without running the validator. A member could send other bytes under an old seqno, signed
    with its own key, and have them delivered unchecked (`tests/adversarial/test_gossip_seqno_reuse.py`).
    Each new message is validated; a copy of one being handled never gets here (the seen check comes
    first). A cached refusal still saves the work: only the author can sign under its name."""

    def __init__(self, ttl: float, max_size: int) -> None:
        self.ttl = ttl
        self.max_size = max(1, max_size)
        self.cache: OrderedDict[bytes, ValidationResult] = OrderedDict()

    def get(self, msg_id: bytes) -> ValidationResult | None:
        result = self.cache.get(msg_id)
        if result is None:
            return None
        if time.time() - result.timestamp > self.ttl:
            del self.cache[msg_id]
            return None
        if result.is_valid:
            return None
        self.cache.move_to_end(msg_id)
        return result

    def put(self, msg_id: bytes, result: ValidationResult) -> None:
        self.cache.pop(msg_id, None)
        while len(self.cache) >= self.max_size:
            self.cache.popitem(last=False)
        self.cache[msg_id] = result

    def clear_expired(self) -> None:
        now = time.time()
        for msg_id in [k for k, r in self.cache.items() if now - r.timestamp > self.ttl]:
            del self.cache[msg_id]
