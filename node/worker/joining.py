"""How a worker gets into a pool: stake enough (asking first unless `--yes`), bind its node to its
provider, reach the coordinator over libp2p (retried through outages) and take its invitation to join.
A mixin of `Worker`."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from node.errors import PeerError

from .. import ops, protocol
from ..chain import ChainError
from ..chain.messages import tokens
from ..chain.signing import Invite
from ..daemon import (
    retry,
)
from ..errors import IntellectError
from ..p2p.host import P2PError

log = logging.getLogger("intellect.worker")


class Declined(IntellectError):
    """The user answered no to a confirmation."""


class JoiningMixin:
    """State set up by `Worker.__init__`."""

    cfg: Any
    state: Any
    store: Any

    def _ask(self, question: str) -> None:
        if self.cfg.yes:
            log.info("%s: yes (--yes)", question)
            return
        if self.confirm is None or not self.confirm(question):
            raise Declined(question)

    async def ensure_stake(self, info: dict[str, Any]) -> None:
        assert self.chain is not None
        c = self.chain
        self.phase = "staking"
        me = dict(await c.call("ProviderRegistry", "getProvider", self.provider.address))
        min_provider = int(await c.call("ProviderRegistry", "minProviderStake"))
        need = max(int(info["minStake"]), min_provider, 1)
        if self.cfg.stake is not None:
            need = max(need, self.cfg.stake)
        if not me["registered"]:
            self._ask(f"register provider {self.provider.address} with a stake of {tokens(need)}")
            await ops.register_provider(c, need)
            self._count("chain_tx_sent", kind="registerProvider")
            log.info("registered provider %s with %s", self.provider.address, tokens(need))
        elif int(me["staked"]) < need:
            more = need - int(me["staked"])
            self._ask(f"add {tokens(more)} of stake to reach pool {self.cfg.pool_id}'s minimum of {tokens(need)}")
            await ops.stake(c, more)
            self._count("chain_tx_sent", kind="stake")
        required = int(await c.call("ProviderRegistry", "requiredStake", self.provider.address))
        node_info = dict(await c.call("ProviderRegistry", "getNode", self.node.address))
        if int(node_info["provider"], 16) == 0:
            per_unit = int(await c.call("ProviderRegistry", "stakePerComputeUnit"))
            required += per_unit * self.cfg.compute_units
        staked = int(await c.call("ProviderRegistry", "stakeOf", self.provider.address))
        if staked < required:
            self._ask(f"add {tokens(required - staked)} of stake for this node's compute units")
            await ops.stake(c, required - staked)
        self.stake_now = int(await c.call("ProviderRegistry", "stakeOf", self.provider.address))

    async def ensure_node_bound(self) -> None:
        assert self.chain is not None
        c = self.chain
        owner = await c.call("ProviderRegistry", "providerOf", self.node.address)
        if int(owner, 16) != 0:
            if owner.lower() != self.provider.address.lower():
                raise ChainError(
                    f"node {self.node.address} is bound to provider {owner}, not {self.provider.address}",
                    "use that provider's key, or another node key",
                )
            return
        self.phase = "binding the node"
        sig = await ops.node_signature(c, self.node, self.provider.address)
        await ops.add_node(c, self.node.address, self.cfg.compute_units, sig)
        self._count("chain_tx_sent", kind="addNode")
        log.info("bound node %s to provider %s", self.node.address, self.provider.address)

    async def connect_coordinator(self) -> None:
        assert self.net is not None and self.coordinator_peer is not None
        self.phase = "connecting to the coordinator"
        net, peer = self.net, self.coordinator_peer
        try:
            await self._retry_p2p(lambda: net.connect(peer), "connecting to the coordinator")
        except P2PError as exc:
            raise PeerError(
                f"the coordinator at {peer} is unreachable (gave up after {self.cfg.connect_wait:.0f} s): {exc}",
                "check that the coordinator runs and that the pool's bootstrap address is current",
            ) from None

    async def _retry_p2p(self, fn: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Retry while the coordinator does not answer: `connect_wait` seconds while joining (a wrong
        address should fail fast), for ever once working (an outage should not end a worker), with
        back-off up to `outage_max_delay` and the reason in the status."""
        working = self.phase_started_work
        return await retry(
            fn,
            what,
            errors=(P2PError,),
            wait=math.inf if working else self.cfg.connect_wait,
            delay=1.0,
            max_delay=self.cfg.outage_max_delay if working else 15.0,
            on_retry=self._outage if working else None,
        )

    def _outage(self, why: str) -> None:
        self.phase, self.last_error = "waiting for the coordinator", why

    async def _request(self, proto: str, body: dict[str, Any], what: str, timeout: float = 30.0) -> dict[str, Any]:
        assert self.net is not None and self.coordinator_peer is not None
        node, peer = self.net.node, self.coordinator_peer
        try:
            data = await self._retry_p2p(lambda: node.request(peer, proto, protocol.pack(body), timeout=timeout), what)
        except P2PError as exc:
            raise PeerError(f"{what}: the coordinator did not answer: {exc}", "is it running?") from None
        if self.last_error.startswith(f"{what} failed"):
            self.last_error = ""
        return protocol.reply_body(data, what)

    async def _invite(self, patience: float = 300.0, every: float = 5.0) -> dict[str, Any]:
        """The coordinator's answer to an invite request, asked again every `every` seconds for up to
        `patience` while it answers "busy" (its budget of chain reads for newcomers is spent: many nodes
        joining at once, or a flood of fresh identities); any other refusal at once."""
        deadline = trio.current_time() + patience
        while True:
            try:
                return await self._request(protocol.INVITE_PROTOCOL, {}, "invite request")
            except protocol.ProtocolError as exc:
                if "refused: busy" not in str(exc) or trio.current_time() + every > deadline:
                    raise
                self.phase = "waiting for an invite (the coordinator is busy)"
                await trio.sleep(every)

    async def ensure_member(self) -> None:
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        m = await c.call("PoolManager", "membershipOf", self.node.address)
        if int(m["poolId"]) == pool:
            return
        if int(m["poolId"]) != 0:
            raise ChainError(f"node {self.node.address} is already in pool {m['poolId']}", "leave it first")
        self.phase = "joining the pool"
        reply = await self._invite()
        if reply.get("member"):
            return
        inv = reply.get("invite")
        if not isinstance(inv, dict):
            raise PeerError("the coordinator sent a malformed invite")
        invite = Invite(
            pool_id=pool,
            node=self.node.address,
            nonce=int(inv["nonce"]),
            expiry=int(inv["expiry"]),
            chain_id=c.deployment.chain_id,
            pool_manager=c.contract("PoolManager"),
            signature=str(inv["signature"]),
        )
        info = await ops.pool_info(c, pool)
        if invite.signer().lower() != str(info["coordinator"]).lower():
            raise PeerError("the invite is not signed by the pool's coordinator", "ask the right coordinator")
        await ops.join_pool(c, invite, pool)
        self._count("chain_tx_sent", kind="joinPool")
        log.info("node %s joined pool %d", self.node.address, pool)
