"""The worker when its work is accused: the validators' verdicts and evidence documents kept, its own
re-check of the file (integrity, then every check a validator runs, then each claim of the evidence),
and the answer on chain (an appeal with the pool's bond, only for work that stands). A mixin of
`Worker`."""

from __future__ import annotations

import logging
from typing import Any

import trio

from .. import ops
from ..chain import ChainError
from ..daemon import (
    PolicyPrefills,
    fetch_evidence,
    new_evidence,
    new_ledger_events,
)
from ..evidence import MAX_SERVED_EVIDENCE_BYTES, EvidenceError, compare, parse_evidence
from ..inference.tools import model_tools
from ..policy import weights_of
from ..rollout.budget import MemoryBudget
from ..rollout.checks import invalidation_is_hard, stored_reason
from ..rollout.file import MAX_FILE_BYTES, RolloutFile, RolloutFormatError, work_key
from ..taskspec import pool_spec
from ..verify import Calibrated, PoolFileCheck
from . import rules

log = logging.getLogger("intellect.worker")


class AccusationsMixin:
    """State set up by `Worker.__init__`."""

    cfg: Any
    state: Any
    store: Any

    async def _verdict_loop(self) -> None:
        assert self.net is not None
        async for env in self.net.subscribe("verdict"):
            self.take_evidence(env.sender, env.body)

    def take_evidence(self, sender: str, body: bytes) -> bool:
        """Keep the evidence document of a failed verdict on one of our rollouts (the network has checked
        that `sender` is a validator or the coordinator), if it is the document its verdict names
        (`node.daemon.new_evidence`); the appeal's re-check answers it claim by claim. Returns whether
        it was kept."""
        got = new_evidence(self.store, sender, body)
        if got is None:
            return False
        key, digest, doc, claims = got
        self._keep_evidence(digest, key, sender, doc)
        reason = claims["verdict"]["reason"]
        log.warning("validator %s finds our work %s failing (%s); evidence kept", sender, key[:12], reason)
        return True

    def _keep_evidence(self, digest: str, key: str, sender: str, doc: bytes) -> None:
        self.state.keep_evidence(digest, key, sender, doc)

    def self_check(self, key: str) -> tuple[str | None, bytes]:
        """Why our own file for `key` could not stand whatever a model says (None: it could), and its
        bytes: we must hold it, its bytes must hash to the key, and it must parse under the bounded
        reader every checker uses. `recheck` adds the validators' model-based check."""
        path = self.state.rollout_path(key)
        if path is None:
            return "not a rollout of this node", b""
        try:
            data = path.read_bytes()
        except OSError as exc:
            return f"the file is gone: {exc}", b""
        if work_key(data) != key:
            return "the file on disk does not hash to its work key", b""
        try:  # our own file: a parse of its own budget, never a shared one another parse could hold
            RolloutFile.from_bytes(data, memory=MemoryBudget())
        except RolloutFormatError as exc:
            return f"the file does not parse: {exc}", b""
        return None, data

    async def recheck(self, key: str, evidence_hash: str, accuser: str = "") -> tuple[str | None, str]:
        """Our own re-check of an accused file before we appeal: `self_check`, then every check a
        validator runs (`node.verify.PoolFileCheck`, with a prefill of the file's policy version), then
        each claim of the accuser's evidence document (from its gossip, else asked by its hash of the
        accuser and the coordinator) against our verdict. Returns (why we must not appeal, or None;
        notes for the log and the `appeals` table)."""
        why, data = self.self_check(key)
        if why is not None:
            return why, ""
        notes: list[str] = []
        claims: dict[str, Any] | None = None

        async def get_claims() -> None:
            nonlocal claims
            claims = await self.evidence_of(key, evidence_hash.lower(), accuser)

        # the document only annotates the decision: it is had while the model checks, never before it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(get_claims)
            try:
                verdict = await self._model_check(data)
            except Exception as exc:  # our side cannot check (spec, weights, memory): the file's integrity decides
                verdict = None
                notes.append(f"no model re-check ({type(exc).__name__}: {exc})")
        if claims is None:
            notes.insert(0, "no evidence document about this work reached us, and nobody serves one")
        if verdict is None:
            notes.append("appealing on the file's integrity alone")
            return None, "; ".join(notes)
        if not verdict["ok"]:
            v = verdict["verdict"]
            if not invalidation_is_hard(stored_reason(verdict)):
                # only near its threshold: no ground for a slash, and committees overturn it (vote_upholds)
                notes.append(f"our re-check finds only a failure near its threshold ({v['reason']}): appealing")
                return None, "; ".join(notes)
            return f"our own re-check fails too: {v['reason']} ({str(v.get('detail', ''))[:200]})", "; ".join(notes)
        notes.append("our re-check of every completion passes")
        if claims is not None:
            notes += [line for line in compare(claims, verdict) if line.startswith("DISPUTE")][:4]
        return None, "; ".join(notes)

    async def evidence_of(self, key: str, digest: str, accuser: str) -> dict[str, Any] | None:
        """The evidence document of hash `digest` about our work `key`: the copy its verdict brought,
        else one asked by its hash of the accuser and the coordinator (and kept); None if none is had."""
        held = self.state.evidence_doc(digest)
        if held is not None:
            try:
                return parse_evidence(held, expected_hash=digest, work_key=key, max_bytes=MAX_SERVED_EVIDENCE_BYTES)
            except EvidenceError as exc:  # an accuser naming the evidence of another record: none for this one
                log.warning("the evidence %s of the accusation of our work %s: %s", digest[:14], key[:12], exc)
                return None
        if self.net is None:
            return None
        got = await fetch_evidence(self.net, self.coordinator_peer, accuser, digest, key)
        if got is None:
            return None
        claims, doc = got
        self._keep_evidence(digest, key, accuser or "fetched", doc)
        log.info("had the evidence %s of the accusation of our work %s by its hash", digest[:14], key[:12])
        return claims

    async def _model_check(self, data: bytes) -> dict[str, Any] | None:
        """The validators' whole check of our file `data` (None while its policy's weights cannot be
        had). The pool's spec and thresholds are read on first use; models are released afterwards."""
        if self._checker is None:
            assert self.chain is not None
            spec = await pool_spec(await ops.pool_info(self.chain, self.cfg.pool_id))
            tools = self.tools or await trio.to_thread.run_sync(model_tools, spec.model)
            self._checker = PoolFileCheck(spec, tools, Calibrated.for_spec(spec), self.cfg.pool_id, MAX_FILE_BYTES)
        checker = self._checker
        f = checker.intake(data, self.node.address)
        if not isinstance(f, RolloutFile):
            return f.to_dict()
        version, weights = f.header.policy_version, weights_of(f.header)
        if version > 0 and weights is None:
            return None  # a file of ours names its weights; this one cannot be re-checked
        prefills = PolicyPrefills(checker.tools, self.book, self.cfg.data_dir, keep=1)
        have = self.downloaded.get(version) if self.weights_hash.get(version) == weights else None
        prefill = await prefills.get(version, have, weights=weights)
        if prefill is None:
            return None
        try:
            return await trio.to_thread.run_sync(checker.judge, f, prefill, version)
        finally:
            prefills.held.clear()

    async def appeal_accusations(self) -> int:
        """Accusations of this node's work, hard and soft (a soft one revokes the reward): appealed
        (with the pool's bond) when our self-check of the file passes, and only with `--yes` (else the
        command to appeal is logged). Returns how many were appealed now."""
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        got = await new_ledger_events(c, self.store, "accused-cursor", pool, ("WorkAccused", "WorkSoftInvalidated"))
        if got is None:
            return 0
        events, move = got
        mine = [ev for ev in events if str(ev.args["provider"]).lower() == self.provider.address.lower()]
        appealed = 0
        for ev in mine:
            key, accuser = str(ev.args["workKey"]), str(ev.args.get("accuser") or ev.args.get("validator"))
            if self.state.answered(key):
                continue
            if not self.state.has_rollout(key):
                continue  # work of another node of the same provider: its own worker answers
            try:
                why, notes = await self.recheck(key, str(ev.args["evidenceHash"]), accuser)
            except Exception as exc:  # a fault of ours must not cost the appeal (nor kill the daemon)
                log.exception("re-check of accused work %s failed", key[:12])
                why, _ = self.self_check(key)
                notes = f"re-check failed ({type(exc).__name__}: {exc}); deciding on the file's integrity alone"
            if why is not None and self.cfg.cheat is not None:
                # the devnet's cheater appeals anyway, betting on the committee: a true invalidation stands
                log.warning("work %s fails our own re-check (%s); appealing anyway (cheater)", key[:12], why)
            status, detail, tx = rules.answer(why, self.cfg.cheat is not None, self.cfg.yes), notes, None
            if status == "failed-self-check":
                detail = str(why)
            elif status == "declined":
                detail = (
                    f"appeal with `intellect-node work appeal --pool {pool} --key {key}` before {ev.args['appealEnd']}"
                    + (f" ({notes})" if notes else "")
                )
            else:
                try:
                    tx = (await ops.appeal(c, pool, key)).tx_hash
                    appealed += 1
                except ChainError as exc:
                    status, detail = "too-late", str(exc)
            self.state.add_answer(key, status, detail, tx)
            log.warning(
                "work %s accused%s by %s: %s%s", key[:12], "" if ev.name == "WorkAccused" else " (soft)", accuser,
                status, f" ({detail})" if detail else "",
            )  # fmt: skip
        self.store.execute_many(move)
        return appealed
