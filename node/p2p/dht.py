"""Peer discovery through a Kademlia DHT, in bounded rounds the node drives itself (the library's own
refresh dials every peer it queries, past any connection cap). A mixin of `P2PNode`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress

import trio
from libp2p.abc import IHost
from libp2p.kad_dht.kad_dht import KadDHT
from libp2p.kad_dht.routing_table import gen_random_key_in_bucket
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from .errors import P2PError

logger = logging.getLogger(__name__)

# DHT discovery: lookups are bounded by this, dials by the connect timeout, rounds by the interval.
DHT_LOOKUP_TIMEOUT = 5.0
DHT_DIAL_TIMEOUT = 5.0
DHT_MAX_DIALS_PER_ROUND = 8
DHT_MAX_QUERIES_PER_ROUND = 16


class NodeDHT(KadDHT):
    """KadDHT without its own maintenance loop: that loop refreshes the routing table at start and every
    10 minutes, and a refresh dials every peer it queries, past any connection cap.  The node's
    discovery loop (`P2PNode.dht_round`) does the refreshing instead, capped and with timeouts.  Values
    and provider records are not used, so their republishing is not needed either."""

    async def _run_main_loop(self) -> None:
        await trio.sleep_forever()


class DhtMixin:
    """The DHT discovery rounds of a `P2PNode` (state set up by `P2PNode.__init__`)."""

    peer_id: ID
    _dht: KadDHT | None
    _host: IHost | None
    _dht_max_peers: int
    _dht_interval: float

    is_banned: Callable[[ID | str], bool]  # GateMixin's

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
