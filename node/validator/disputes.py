"""The validator in disputes: its accusations followed to their end (final once unappealed, decided by a
committee otherwise), and the pool's appeals and challenges whose committee it is drawn onto, where it
votes its own check of the file. A mixin of `Validator`."""

from __future__ import annotations

import logging
from typing import Any

from eth_account.signers.local import LocalAccount

from .. import ops
from ..chain import ChainClient, ChainError
from ..daemon import (
    new_ledger_events,
    retry_rpc,
)
from ..rollout.checks import Reason
from . import rules
from .state import ValidatorState

log = logging.getLogger("intellect.validator")


class DisputesMixin:
    """State set up by `Validator.__init__`."""

    cfg: Any
    key: LocalAccount
    state: ValidatorState
    store: Any
    chain: ChainClient | None
    _verify: Any
    _count: Any
    node_signed: Any

    async def settle_accusations(self) -> None:
        """Our accusations (hard and soft), one step further: final once the appeal period ended
        unappealed (our bond back, no bounty: the slash goes to the treasury), followed while appealed,
        closed when the committee decided."""
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        accused = self.state.accused()
        if not accused:
            return
        now = await c.timestamp()
        for key in accused:
            d = await retry_rpc(lambda key=key: ops.dispute(c, pool, key), "dispute lookup")
            verdict, kind = d["verdictName"], d["kindName"]
            try:
                if verdict == "open" and kind == "accusation" and now >= int(d["appealEnd"]):
                    rc = await ops.finalize_invalidation(c, pool, key)
                    if d["hard"]:
                        ev = rc.event("WorkInvalidated").args
                        log.warning(
                            "INVALIDATED work %s: slashed %s base units (tx %s)", key[:12], ev["slashed"], rc.tx_hash
                        )
                    else:
                        log.warning("REVOKED work %s without a slash (tx %s)", key[:12], rc.tx_hash)
                    verdict = "upheld"
                elif verdict == "open" and kind in ("appeal", "challenge") and now >= int(d["voteEnd"]):
                    await ops.resolve_lapsed(c, pool, key)
                    verdict = "lapsed"
            except ChainError as exc:
                if getattr(exc, "name", None) not in ("NotDisputed",):
                    raise
                d = await ops.dispute(c, pool, key)
                verdict = d["verdictName"]
            status = rules.after_dispute(verdict)
            if status is not None:
                self.state.set_status(key, status)
                if status == "overturned":
                    log.warning("our accusation of work %s was OVERTURNED on appeal: our bond is lost", key[:12])

    async def serve_committees(self) -> None:
        """Appeals and challenges in the pool: draw their committee once its seed block exists, and when
        we are on it, check the record's file ourselves and vote (uphold the invalidation only if our
        own check fails). Our vote is never the accuser's word: it is our verdict."""
        assert self.chain is not None
        c, pool, me = self.chain, self.cfg.pool_id, self.key.address
        got = await new_ledger_events(c, self.store, "duty-cursor", pool, ("WorkAppealed", "WorkChallenged"))
        if got is not None:
            self.state.add_duties(*got)
        for row in self.state.open_duties():
            key = str(row["work_key"])
            d = await retry_rpc(lambda key=key: ops.dispute(c, pool, key), "dispute lookup")
            if d["verdictName"] != "open":
                self.state.set_duty(key, "closed")
                continue
            if not d["drawn"]:
                await ops.draw_committee(c, pool, key)
                d = await ops.dispute(c, pool, key)
                if not d["drawn"]:
                    continue  # its seed block is not mined yet
            duty = rules.duty_after_juror_state(int(await c.call("WorkLedger", "jurorState", pool, key, me)))
            if duty is not None:
                self.state.set_duty(key, duty)
                continue
            r = self.state.check(key)
            if r is None:
                continue  # the record's event has not been followed yet
            # Without the file (or the weights) this round, no vote: we judge only what we can check.
            verdict = await self._verify(r)
            if verdict is None or verdict["verdict"]["reason"] == str(Reason.UNAVAILABLE):
                continue
            uphold = rules.vote_upholds(verdict) or self.cfg.lie
            if uphold and d["hard"] and not await self.node_signed(key, str(r["node"])):
                # the ledger checked the node's signature when the dispute opened; we check it too, and
                # never vote a slash for work we cannot show the node signed
                log.warning("work %s: no signature of node %s over it reaches us; not voting yet", key[:12], r["node"])
                continue
            try:
                rc = await ops.vote(c, pool, key, uphold)
            except ChainError as exc:
                if getattr(exc, "name", None) not in rules.VOTE_MOOT:
                    raise
                self.state.set_duty(key, "closed")
                continue
            self.state.set_duty(key, "voted", "uphold" if uphold else "overturn", rc.tx_hash)
            self._count("chain_tx_sent", kind="vote")
            log.warning(
                "COMMITTEE: voted to %s the invalidation of work %s (our check: %s) (tx %s)",
                "uphold" if uphold else "overturn", key[:12], "failed" if not verdict["ok"] else "ok", rc.tx_hash,
            )  # fmt: skip
