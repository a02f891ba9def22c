"""The node's GossipSub router (`CountingGossipSub`) and its peer scorer (`GateScorer`): py-libp2p's, with
dropped RPCs counted and the per-message work of forwarding cut (see each method)."""

from __future__ import annotations

import bisect
import logging
import math
import time
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.score import PeerScorer

logger = logging.getLogger("node.p2p.gossip")


class GateScorer(PeerScorer):
    """The router's peer scorer, whose gates skip computing a score that cannot fail them. py-libp2p 0.8.1
    asks them for every message, every peer it may go to, up to three times (publish, gossip, graylist),
    and each asks the score anew from nested per-peer, per-topic counters (5 % of a node's CPU in
    `bench/gossip.py`); with a threshold at minus infinity (the library's defaults, which the node keeps)
    every score passes. A finite threshold is checked as before. Counters, decay and penalties are
    untouched."""

    def allow_publish(self, peer: ID, topics: list[str]) -> bool:
        if topics and self.params.publish_threshold == -math.inf:
            return True
        return super().allow_publish(peer, topics)

    def allow_gossip(self, peer: ID, topics: list[str]) -> bool:
        if topics and self.params.gossip_threshold == -math.inf:
            return True
        return super().allow_gossip(peer, topics)

    def is_graylisted(self, peer: ID, topics: list[str]) -> bool:
        if self.params.graylist_threshold == -math.inf:
            return False
        return super().is_graylisted(peer, topics)


class CountingGossipSub(GossipSub):
    """GossipSub that counts the RPCs it drops (full queue, oversize) instead of only debug-logging, with
    `GateScorer` as its scorer."""

    dropped_rpcs: int = 0

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        if type(self.scorer) is PeerScorer:  # fresh: no peer yet, nothing counted
            self.scorer = GateScorer(self.scorer.params)

    def send_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, priority: bool = False) -> None:
        """Queue `rpc` for `peer_id`. The library copies it, attaches control waiting for a retry, and cuts
        it into parts of at most the queue's message size, rebuilding it field by field in Python even when
        it is one part (6 % of a forwarding node's CPU). When nothing waits to ride along and it fits, the
        copy (each peer's queue needs its own: queued RPCs are merged later, `coalesce`) is queued as
        is; anything else takes the library's path."""
        pubsub = self.pubsub
        queue = pubsub.peer_queues.get(peer_id) if pubsub is not None else None
        if queue is None or peer_id in self._pending_control:
            super().send_rpc(peer_id, rpc, priority)
            return
        outbound = rpc_pb2.RPC()
        outbound.CopyFrom(rpc)
        if outbound.ByteSize() > queue.max_message_size:
            super().send_rpc(peer_id, rpc, priority)
            return
        if not queue.push(outbound, priority=priority):
            self._handle_dropped_rpc(peer_id, outbound, "queue_full")

    def _check_spam_protection(self, peer_id: ID, msg: rpc_pb2.Message) -> bool:
        """The library's per-peer, per-topic rate limit (`max_messages_per_topic_per_second` in any second),
        with the expired times cut by a binary search instead of a list rebuilt per message (the list is
        appended in time order; a clock stepping back only keeps a few stale times a second longer)."""
        if not self.spam_protection_enabled:
            return True
        now = time.time()
        for topic in msg.topicIDs:
            stamps = self.message_rate_limits[peer_id][topic]
            cut = bisect.bisect_right(stamps, now - 1.0)
            if cut:
                del stamps[:cut]
            if len(stamps) >= self.max_messages_per_topic_per_second:
                logger.warning("gossip: %s over %d messages a second on %s", peer_id, len(stamps), topic)
                if self.scorer is not None:
                    self.scorer.penalize_behavior(peer_id, 5.0)
                return False
            stamps.append(now)
        return True

    def _handle_dropped_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        self.dropped_rpcs += 1
        if self.dropped_rpcs == 1 or self.dropped_rpcs % 1000 == 0:
            logger.warning("gossip: dropped %d outbound RPCs (last: %s to %s)", self.dropped_rpcs, reason, peer_id)
        super()._handle_dropped_rpc(peer_id, rpc, reason)
