"""Who may connect and be heard: bans (by peer id or Ethereum address, expiring), the cap on inbound
connections of non-members, and bounded per-peer bookkeeping. A mixin of `P2PNode`."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID

from .identity import ban_key, safe_address
from .patches import inbound_refused_counts

logger = logging.getLogger(__name__)

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


def allowed(allow: Callable[[str], bool], sender: str) -> bool:
    try:
        return bool(allow(sender))
    except Exception as exc:  # a gate that fails refuses
        logger.debug("allow check raised for %s: %r", sender, exc)
        return False


class GateMixin:
    """Bans and the connection gate of a `P2PNode` (its state is set up by `P2PNode.__init__`)."""

    _bans: dict[str, float]
    _host: IHost | None
    _nursery: trio.Nursery | None
    _is_member: Callable[[str], bool] | None
    max_outsider_connections: int
    inbound_outsiders_refused: int

    def ban(self, peer: ID | str, seconds: float) -> None:
        """Disconnect ``peer`` (peer id, base58 id or Ethereum address) and refuse it for ``seconds``.

        While banned, its inbound connections are closed before registration, dials to it fail, and
        gossip it forwards or authored is dropped before validation.  Sync so the gossip validator
        callback can call it; the disconnect itself runs in the node's nursery.  A second ban only
        ever extends the first."""
        key = ban_key(peer)
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
            if safe_address(pid) == key:
                self._nursery.start_soon(self._disconnect, pid)

    def unban(self, peer: ID | str) -> None:
        """Lift a ban early (operator action); the peer may reconnect or be dialled again at once."""
        self._bans.pop(ban_key(peer), None)

    def ban_remaining(self, peer: ID | str) -> float:
        """Seconds left in ``peer``'s ban, 0.0 when not banned (expired bans are forgotten here)."""
        key = ban_key(peer)
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
        return self._is_member is None or allowed(self._is_member, safe_address(peer_id))

    @property
    def inbound_refused(self) -> dict[str, int]:
        """Inbound connections refused before their handshake, per reason (rate, per-ip, per-network)."""
        swarm = self._host.get_network() if self._host is not None else None
        return dict(inbound_refused_counts.get(swarm, {})) if swarm is not None else {}

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
