"""Chain-backed membership snapshots for one pool: what `PoolNetwork` consults per message.

The gossip validator runs for every received message, so it must never wait on the chain. This module
keeps a `Membership` in memory and refreshes it in the background from the chain's event log:

- coordinator: `PoolManager.getPool(pool).coordinator` (one view call per poll, so a replaced
  coordinator is picked up even though the contract emits no event for it);
- validators: `ValidatorAdded` / `ValidatorRemoved` of this pool on the `PoolManager` (each pool names its own);
- members: `NodeJoined` adds, `NodeLeft` / `NodeEjected` / `NodeBlacklisted` remove, for this pool.

Events are replayed once from the deployment block, then only new blocks are read on each poll. A poll
is all-or-nothing: its events are applied to copies and committed with the new block cursor only when
every call succeeded, so an RPC failure half-way never leaves a half-updated snapshot. On failure the
last good snapshot stays in force and the poll is retried with exponential back-off.

Events are read `confirmations` blocks under the head (the network's default, `INTELLECT_CONFIRMATIONS`),
so a shallow reorganisation never reaches the view. A deeper one is seen (the block the view was read
up to has another hash now) and the view is rebuilt from the deployment block: what it removed is gone.
"""

from __future__ import annotations

import logging
import time

import trio

from ..chain.client import ChainClient
from ..chain.errors import RpcError
from .rules import Membership, normalize_address

logger = logging.getLogger(__name__)

_MEMBER_ADD = frozenset({"NodeJoined"})
_MEMBER_REMOVE = frozenset({"NodeLeft", "NodeEjected", "NodeBlacklisted"})
_VALIDATOR_EVENTS = frozenset({"ValidatorAdded", "ValidatorRemoved"})


class ChainMembership:
    """Cached on-chain roles of `pool`; `snapshot()` is the `membership` callable of `PoolNetwork`.

    Start it with ``await nursery.start(cm.run)``: `start` returns once the first snapshot is loaded,
    so nothing ever sees a node without a membership view."""

    def __init__(
        self,
        client: ChainClient,
        pool: int,
        *,
        interval: float = 2.0,
        max_backoff: float = 30.0,
        poll_timeout: float = 30.0,
        max_blocks_per_poll: int = 50_000,
        confirmations: int | None = None,
    ) -> None:
        if interval <= 0 or max_backoff < interval or poll_timeout <= 0 or max_blocks_per_poll < 1:
            raise ValueError("need interval > 0, max_backoff >= interval, poll_timeout > 0, max_blocks_per_poll >= 1")
        self.client = client
        self.pool = pool
        self.interval = interval
        self.max_backoff = max_backoff
        self.poll_timeout = poll_timeout
        self.max_blocks_per_poll = max_blocks_per_poll
        self.confirmations = max(0, client.confirmations if confirmations is None else confirmations)
        self.reorgs = 0
        """Reorganisations seen deeper than `confirmations` (each one rebuilt the view from the deployment)."""
        self.failures = 0
        """Consecutive failed polls (0 when the last poll succeeded): a health signal for operators."""
        self.last_refresh: float | None = None
        """`time.monotonic()` of the last successful poll; how stale the snapshot may be."""
        self.block = -1
        """Last block whose events are reflected in the snapshot (-1 before the first load)."""
        self._block_hash = ""
        self._snapshot: Membership | None = None
        self._validators: set[str] = set()
        self._members: set[str] = set()
        self._changed = trio.Event()

    # ------------------------------------------------------------------ reading

    def snapshot(self) -> Membership:
        """The cached membership (no I/O: safe to call per message). Raises before the first load."""
        snap = self._snapshot
        if snap is None:
            raise RuntimeError(f"membership of pool {self.pool} not loaded yet (start `run` first)")
        return snap

    @property
    def loaded(self) -> bool:
        """Whether a first snapshot exists."""
        return self._snapshot is not None

    async def wait_for_change(self) -> Membership:
        """Wait until the next refresh that changes the snapshot, and return the new one."""
        await self._changed.wait()
        return self.snapshot()

    # ------------------------------------------------------------------ refreshing

    async def refresh(self) -> Membership:
        """One poll: read the coordinator and the events since the last poll, commit, return the snapshot.

        Raises on RPC failure without touching the cached state (the caller decides about retrying)."""
        c = self.client
        with trio.fail_after(self.poll_timeout):
            head = await c.rpc.block_number() - self.confirmations
            pool = await c.call("PoolManager", "getPool", self.pool, block=hex(head) if head >= 0 else "latest")
            last, last_hash = self.block, self._block_hash
            validators, members = set(self._validators), set(self._members)
            rebuild = False
            if last_hash:
                now_hash = await c.rpc.block_hash(last)
                if now_hash is None:  # a lagging endpoint: ask again next poll, the view stays as it is
                    raise RpcError(f"the RPC endpoint does not serve block {last} (yet)")
                if now_hash != last_hash:
                    # The block the view was read up to is gone: a reorganisation deeper than the
                    # confirmation depth. What it removed (a join, a kick) must not stay: the view is
                    # read again from the deployment, whole, before it replaces the current one.
                    logger.warning(
                        "pool %d: block %d was reorganised away; rebuilding the membership view", self.pool, last
                    )
                    self.reorgs += 1
                    rebuild = True
                    last, last_hash, validators, members = -1, "", set(), set()
            start = max(last + 1, c.deployment.block)
            while start <= head:
                end = min(head, start + self.max_blocks_per_poll - 1)
                for ev in await c.events(["PoolManager"], from_block=start, to_block=end):
                    self._apply(ev.name, ev.args, validators, members)
                last, last_hash = end, await c.rpc.block_hash(end) or ""
                if not rebuild:
                    break  # a poll reads one page; a long catch-up takes several polls
                start = end + 1
        if int(pool["status"]) == 0:
            raise LookupError(f"pool {self.pool} does not exist on chain")
        snap = Membership(
            pool=self.pool,
            coordinator=str(pool["coordinator"]),
            validators=frozenset(validators),
            members=frozenset(members),
        )
        # Commit: nothing above this line modified the cached state.
        self._validators, self._members = validators, members
        self.block, self._block_hash = last, last_hash
        self.last_refresh = time.monotonic()
        self.failures = 0
        if snap != self._snapshot:
            self._snapshot = snap
            self._changed.set()
            self._changed = trio.Event()
        return snap

    def _apply(self, name: str, args: dict[str, object], validators: set[str], members: set[str]) -> None:
        if name not in _MEMBER_ADD and name not in _MEMBER_REMOVE and name not in _VALIDATOR_EVENTS:
            return
        try:
            pool_id = int(args.get("poolId", -1))  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return
        if name in _VALIDATOR_EVENTS:
            account = normalize_address(str(args.get("validator", "")))
            if pool_id != self.pool or account is None:
                return
            if name == "ValidatorAdded":
                validators.add(account)
            else:
                validators.discard(account)
            return
        node = normalize_address(str(args.get("node", "")))
        if pool_id != self.pool or node is None:
            return
        if name in _MEMBER_ADD:
            members.add(node)
        else:
            members.discard(node)

    async def run(self, task_status: trio.TaskStatus[Membership] = trio.TASK_STATUS_IGNORED) -> None:
        """Poll forever: every `interval` seconds when healthy, straight away while catching up on a
        long history, with exponential back-off (capped at `max_backoff`) after failures. Signals
        `task_status.started(snapshot)` after the first successful load; never raises on RPC errors."""
        delay = self.interval
        started = False
        while True:
            try:
                before = self.block
                await self.refresh()
            except (Exception, trio.TooSlowError) as exc:
                self.failures += 1
                level = logging.WARNING if self.failures in (1, 10) or self.failures % 100 == 0 else logging.DEBUG
                logger.log(
                    level,
                    "membership of pool %d: refresh failed (%d in a row, retry in %.1f s; keeping block %d): %r",
                    self.pool,
                    self.failures,
                    delay,
                    self.block,
                    exc,
                )
                await trio.sleep(delay)
                delay = min(delay * 2, self.max_backoff)
                continue
            delay = self.interval
            if not started:
                started = True
                task_status.started(self.snapshot())
            # A full page of blocks means there is more history to read: no sleep until caught up.
            if self.block - before < self.max_blocks_per_poll:
                await trio.sleep(self.interval)


__all__ = ["ChainMembership"]
