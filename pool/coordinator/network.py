"""The coordinator on the pool's gossip: members' heartbeats (silent members ejected), the relays they
offer (probed before they are announced), and the policy announcements that tell workers which
weights to use and where to fetch them. A mixin of `Coordinator`."""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from node.chain import ChainError
from node.p2p.envelope import Envelope
from node.p2p.host import P2PError
from node.policy import HISTORY, PolicyAnnouncement, announcement_sources, parse_heartbeat, relay_url
from node.weights.client import make_http_client, probe_relay

log = logging.getLogger("intellect.coordinator")


class NetworkMixin:
    """State set up by `Coordinator.__init__`."""

    cfg: Any
    store: Any

    async def _heartbeat_loop(self) -> None:
        assert self.net is not None
        async for env in self.net.subscribe("heartbeat"):
            self._on_heartbeat(env)

    def _on_heartbeat(self, env: Envelope) -> None:
        now = time.time()
        self.heartbeats[env.sender] = now
        relay = relay_url(parse_heartbeat(env.body).get("relay"))
        if relay is not None:
            self.relays.heard(env.sender, relay, now)
        self._count("heartbeats")

    async def _eject_loop(self) -> None:
        assert self.membership is not None and self.chain is not None
        if self.cfg.eject_after <= 0:
            return
        while True:
            await trio.sleep(min(10.0, self.cfg.eject_after / 4))
            now = time.time()
            for node in sorted(self.membership.snapshot().members):
                last = self.heartbeats.get(node, self.started_at + self.cfg.heartbeat_grace)
                if now - last <= self.cfg.eject_after:
                    continue
                try:
                    if await self.chain.call("PoolManager", "isMember", self.cfg.pool_id, node):
                        await self.record_all(node)  # its accepted work first: a non-member's cannot be recorded
                        await self.chain.transact(
                            "PoolManager", "ejectNode", self.cfg.pool_id, node, what=f"eject {node}"
                        )
                        self._count("chain_tx_sent", kind="ejectNode")
                        log.warning("ejected node %s: no heartbeat for %.0f s", node, now - last)
                except ChainError as exc:
                    log.warning("ejecting %s failed: %s", node, exc)
                self.heartbeats.pop(node, None)

    def member_hosts(self) -> set[str]:
        """Where the pool's members connect from (their libp2p connections to us), for the weight origin's
        member slots; recomputed at most every 2 s (the origin asks on every connection past its cap)."""
        now = time.monotonic()
        if self.net is not None and now - self._member_hosts[0] > 2.0:
            try:
                ips = self.net.node.peer_ips(self.may_use_blobs)  # members and validators
            except P2PError:  # the host is not up yet
                ips = set()
            self._member_hosts = (now, ips)
        return self._member_hosts[1]

    def relay_hosts(self) -> set[str]:
        """IP addresses of the listed relays (those the announcement lists as sources): only their requests
        to the origin get relay priority (the header alone could be sent by anyone)."""
        return self.relays.hosts(time.time())

    def history(self) -> dict[int, str]:
        """Manifest hashes of the last HISTORY policy versions."""
        return self.state.history(HISTORY)

    async def _relay_probe_loop(self) -> None:
        """Probe the relays members name (see `RelayBook`): only those that serve a checkpoint of ours are
        listed. At most 8 probes at a time, each bounded by `probe_relay`'s timeout."""
        limit = trio.CapacityLimiter(8)
        async with make_http_client(max_connections=8) as client:

            async def probe(url: str, history: dict[int, str]) -> None:
                async with limit:
                    try:
                        why = await probe_relay(client, url, history)
                    except Exception as exc:  # a URL a member chose must never take the coordinator down
                        why = f"probe failed: {type(exc).__name__}: {exc}"
                before = self.relays.checks.get(url)
                self.relays.record(url, why is None, time.time(), why or "")
                if before is None or before.ok != (why is None):  # log changes, not every probe
                    log.info("relay %s %s", url, "listed" if why is None else f"not listed: {why}")

            while True:
                due = self.relays.due(time.time())
                if due:
                    history = self.history()
                    async with trio.open_nursery() as probes:
                        for url in due:
                            probes.start_soon(probe, url, history)
                await trio.sleep(2.0)

    def announcement(self) -> PolicyAnnouncement:
        history = self.history()
        v = self.cfg.policy_version
        return PolicyAnnouncement(
            version=v,
            model=self.cfg.model,
            manifest_hash=history.get(v, ""),
            sources=announcement_sources(self.origin_url, self.relays.live(time.time())) if self.cfg.train else [],
            history=history,
        )

    async def _policy_loop(self) -> None:
        assert self.net is not None
        while True:
            try:
                await self.net.publish("policy", self.announcement().to_body())
            except Exception as exc:  # no peers yet, or shutting down
                log.debug("policy announcement failed: %r", exc)
            with trio.move_on_after(5.0):
                await self._announce_now.wait()
            self._announce_now = trio.Event()
