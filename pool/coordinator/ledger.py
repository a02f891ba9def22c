"""The coordinator and the chain's ledger: accepted rollouts recorded in batches (within the pool's
budget), invalidations followed (and a node blacklisted past the pool's limit), files nobody recorded
deleted, and validators' evidence documents kept to serve. A mixin of `Coordinator`."""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from node import ops
from node.chain import ChainError
from node.daemon import (
    new_evidence,
    new_ledger_events,
    retry_rpc,
)
from node.p2p.rules import ROLE_VALIDATOR

log = logging.getLogger("intellect.coordinator")


class LedgerMixin:
    """State set up by `Coordinator.__init__`."""

    cfg: Any
    store: Any

    async def _record_loop(self) -> None:
        while True:
            await trio.sleep(self.cfg.record_every)
            try:
                await self.follow_invalidations()
                await self.record_pending()
                self.last_error = ""
            except (ChainError, trio.TooSlowError) as exc:
                self.last_error = str(exc)
                log.warning("recording work failed (will retry): %s", exc)

    def invalidations(self, node: str) -> int:
        return self.state.invalidations(node)

    async def follow_invalidations(self) -> int:
        """Read the pool's `WorkInvalidated` events: the node of each invalidated record (from our own
        rows) has its untrained rollouts dropped, and after `blacklist_after` of them it gets no more tasks
        and is blacklisted on chain. Returns how many new invalidations were read."""
        assert self.chain is not None
        # bounded reads: a long outage is caught up in several rounds
        got = await new_ledger_events(
            self.chain, self.store, "invalidation_cursor", self.cfg.pool_id, "WorkInvalidated", max_blocks=10_000,
            on_reorg=self.state.forget_invalidations_after,  # a removed invalidation must not count to a blacklist
        )  # fmt: skip
        if got is None:
            return 0
        events, move = got
        found: list[tuple[str, str | None, int]] = []
        for ev in events:
            key = str(ev.args["workKey"])
            row = self.state.rollout(key)
            found.append((key, row["node"] if row is not None else None, ev.block_number))
        self.state.add_invalidations(found, move)
        nodes = {node for _, node, _ in found if node is not None}
        for node in sorted(nodes):
            n = self.invalidations(node)
            log.warning("work of node %s was invalidated (%d so far): its untrained rollouts are dropped", node, n)
            if 0 < self.cfg.blacklist_after <= n:
                await self._blacklist(node)
        return len(events)

    async def _blacklist(self, node: str) -> None:
        assert self.chain is not None
        try:
            if not await self.chain.call("PoolManager", "isBlacklisted", self.cfg.pool_id, node):
                await self.record_all(node)  # what it submitted is recorded (and judged), not lost
                await self.chain.transact(
                    "PoolManager", "blacklistNode", self.cfg.pool_id, node, what=f"blacklist {node}"
                )
                self._count("chain_tx_sent", kind="blacklistNode")
                log.warning("blacklisted node %s: %d invalidated record(s)", node, self.invalidations(node))
        except ChainError as exc:
            log.warning("blacklisting %s failed: %s", node, exc)

    async def record_all(self, node: str) -> None:
        """Record every accepted rollout of `node` (before it stops being a member, after which the
        ledger refuses its records). Raises ChainError if that fails: the caller must not eject then.
        Every batch settles each row it reads (recorded, found recorded already, or dropped), so the loop
        ends when none is left."""
        left = -1
        for _ in range(10_000):
            await self.record_pending(node)
            n = self.state.unrecorded(node)
            if not n:
                return
            if n == left:  # no progress: the pool's budget cannot reserve the rewards
                raise ChainError(
                    f"{n} accepted rollout(s) of {node} cannot be recorded: the pool's budget cannot reserve "
                    "their rewards",
                    "fund the pool (`intellect-node pool fund`)",
                )
            left = n

    async def record_pending(self, node: str | None = None) -> int:
        """Record up to one batch of accepted rollouts (of `node` only, when given); returns how many
        were recorded now. One batch at a time: the record loop and an ejection never send the same
        rows twice."""
        async with self._recording:
            return await self._record_batch(node)

    async def _record_batch(self, node: str | None) -> int:
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        rows = self.state.to_record(node, self.cfg.batch_size)
        if not rows:
            return 0
        todo = []
        for r in rows:
            rec = await retry_rpc(lambda r=r: ops.record(c, pool, r["work_key"]), "record lookup")
            if rec["status"] != 0:  # recorded by a batch whose receipt a crash kept us from seeing
                self.state.set_recorded([r["work_key"]])
                continue
            why = int(await retry_rpc(lambda r=r: c.call("WorkLedger", "recordable", pool, r["node"]), "recordable"))
            if why != 0:
                # 1: not a member any more; 2: its provider's stake fell below the pool's minimum (only a
                # slash can do that: unstaking below it is refused), and the ledger records nothing then.
                note = "node left the pool before recording" if why == 1 else "provider's stake is below the minimum"
                self.state.set_dropped(r["work_key"], note)
                continue
            todo.append(r)
        if not todo:
            return 0
        todo = await self._within_budget(todo)
        if not todo:
            return 0
        items = [
            ops.WorkItem(r["node"], r["work_key"], int(r["units"]), int(r["policy_version"]), r["proof_commitment"])
            for r in todo
        ]
        receipts = await ops.record_work(c, pool, items)
        tx = receipts[-1].tx_hash
        self.state.set_recorded([r["work_key"] for r in todo], tx)
        self._count("work_records_submitted", len(todo))
        self._count("chain_tx_sent", kind="recordWork")
        log.info("recorded %d rollouts on chain in %s", len(todo), tx)
        return len(todo)

    async def _within_budget(self, rows: list[Any]) -> list[Any]:
        """The longest prefix of `rows` whose rewards the pool's unreserved budget covers: recording
        reserves each reward, and the ledger refuses a batch the budget cannot cover. What does not fit
        stays accepted until the pool is funded."""
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        free = int(await retry_rpc(lambda: c.call("WorkLedger", "surplus", pool), "pool surplus"))
        rate = int((await retry_rpc(lambda: c.call("PoolManager", "poolTerms", pool), "pool terms"))["rewardRate"])
        fit, owed = [], 0
        for r in rows:
            owed += int(r["units"]) * rate
            if owed > free:
                break
            fit.append(r)
        if len(fit) < len(rows):
            self._count("work_records_unfunded", len(rows) - len(fit))
            now = time.monotonic()
            if now - self._unfunded_warned > 60:
                self._unfunded_warned = now
                log.warning(
                    "pool %d cannot reserve the rewards of %d accepted rollout(s) (unreserved budget %d): "
                    "they wait until the owner funds the pool (`intellect-node pool fund`)",
                    pool, len(rows) - len(fit), free,
                )  # fmt: skip
        return fit

    async def _orphan_loop(self) -> None:
        while True:
            await trio.sleep(min(60.0, self.cfg.orphan_after / 4))
            self.delete_orphans()

    def delete_orphans(self) -> int:
        """Delete blobs uploaded more than `orphan_after` seconds ago that no accepted rollout names: an
        upload never submitted (or refused) cannot fill the disk."""
        n = 0
        for key in self.blobs.keys_older_than(self.cfg.orphan_after):
            if self.state.rollout(key) is None:
                self.blobs.delete(key)
                n += 1
        if n:
            log.info("deleted %d uploaded blob(s) that were never accepted", n)
        return n

    async def _evidence_loop(self) -> None:
        assert self.net is not None
        async for env in self.net.subscribe("verdict"):
            await self.keep_evidence(env.sender, env.body)

    async def keep_evidence(self, sender: str, body: bytes) -> bool:
        """Keep the evidence document a pool validator's failed verdict carries, when it is about a
        rollout we accepted and hashes to the hash it names (`node.daemon.new_evidence`), to serve it by
        that hash (the one on chain): an accused worker that was offline when the verdict went round
        still gets it. Returns whether it was kept."""
        assert self.membership is not None
        if self.membership.snapshot().role(sender) != ROLE_VALIDATOR:
            return False
        got = new_evidence(self.store, sender, body)
        if got is None:
            return False
        key, digest, doc, _ = got
        try:
            await trio.to_thread.run_sync(self.evidence.put, doc)  # an fsync'd write: not in the loop's thread
        except OSError as exc:
            log.warning("could not keep the evidence %s on %s: %s", digest[:14], key[:12], exc)
            return False
        self.state.add_evidence(digest, key, sender)
        return True
