"""The validator daemon (`intellect-node validate --pool ID`): re-checks recorded work and invalidates
cheating inside the validation window.

It follows `WorkRecorded` events of the pool (a durable block cursor), samples records at a
configurable rate (the choice is keyed by this validator's secret, so a worker cannot predict it),
fetches each sampled rollout file by its hash from the coordinator, runs the prefill with the pool's
model and every check of `node.verify.verify_file` (TOPLOC, sampling statistics, termination,
reward), and invalidates failing work on chain before its deadline with the hash of the verdict as
evidence (the verdict JSON is kept under `evidence/`). Verdicts are published on gossip.

Crash safety: records are committed to sqlite with the cursor in one transaction; an invalidation goes
through the durable transaction journal and is preceded by a chain read of the record's status, so a
restart never sends it twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from .. import ops, protocol
from ..chain import ChainClient, ChainError, Deployment
from ..chain.errors import RpcUnavailable
from ..daemon import (
    PolicyPrefills,
    count,
    new_ledger_events,
    open_pool_chain,
    open_pool_network,
    pool_peers,
    retry_rpc,
    serve_evidence,
)
from ..errors import ConfigError
from ..evidence import MAX_SERVED_EVIDENCE_BYTES
from ..inference.tools import ModelTools, model_tools
from ..p2p.blobs import BlobStore
from ..p2p.envelope import encode
from ..p2p.membership import ChainMembership
from ..p2p.network import PoolNetwork
from ..policy import PolicyAnnouncement, PolicyBook
from ..rollout.checks import Reason, cumulative_termination
from ..store import DISK_FULL, StoreError
from ..taskspec import TaskSpec, TaskSpecError, pool_spec
from ..verify import Calibrated
from . import rules
from .checking import CheckingMixin, _peer_is
from .disputes import DisputesMixin
from .state import ValidatorState

log = logging.getLogger("intellect.validator")
GONE = "gone"  # a `settled` record the chain no longer holds (a reorganisation): reopened if it comes back


@dataclass
class ValidatorConfig:
    pool_id: int
    data_dir: Path
    rpc_url: str
    deployment: Deployment
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: list[str] | None = None
    model: str | None = None  # None: the model the pool's task spec names; another one refuses to start
    thresholds: Calibrated | None = None  # --thresholds, loaded; None: the spec model's shipped one
    sample_rate: float = 1.0
    prefill_dtype: str | None = (
        None  # None: the thresholds' preferred calibrated precision (`Calibrated.prefill_dtype`)
    )
    poll_every: float = 2.0
    max_internal_errors: int = 3  # a check that fails on our side this often is given up, loudly
    refetch_every: float = 20.0  # unavailable work is asked for again this often, until its deadline
    margin: int = 30
    rpc_wait: float = 60.0
    max_rollout_bytes: int = 16 * 1024 * 1024
    lie: bool = False  # devnet adversary: accuses every record it checks, and votes to uphold every accusation


class Validator(CheckingMixin, DisputesMixin):
    def __init__(self, cfg: ValidatorConfig, key: LocalAccount, metrics: Any = None) -> None:
        if not 0.0 <= cfg.sample_rate <= 1.0:
            raise ValueError("sample rate must be in [0, 1]")
        self.cfg = cfg
        self._lies = 0  # the devnet liar's accusations so far (`_invalidate`)
        self.key = key
        self.metrics = metrics
        self.state = ValidatorState(cfg.data_dir / "validator.db")
        self.store = self.state.store
        self.evidence_dir = cfg.data_dir / "evidence"
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        self.secret = self.state.sampling_secret()
        self.spec: TaskSpec | None = None
        self.calibrated: Calibrated | None = None
        self.prefill_dtype = "float32"  # set with the thresholds, from the pool's spec
        self.last_fetch: dict[str, float] = {}
        self.tools: ModelTools | None = None
        self.prefill: Any = None
        self.chain: ChainClient | None = None
        self.net: PoolNetwork | None = None
        self.membership: ChainMembership | None = None
        self.coordinator_peer: str | None = None
        self.last_error = ""
        self.book = PolicyBook()
        for version, hashes in self.state.policy_hashes().items():
            for h in hashes:
                self.book.heard(version, h)
        self.prefills: PolicyPrefills | None = None

    def status(self) -> dict[str, Any]:
        counts = self.store.counts("checks")
        return {
            "role": "validator",
            "pool": self.cfg.pool_id,
            "address": self.key.address,
            "cursor": int(self.store.get("cursor", "-1") or -1),
            "checks": counts,
            "seen": sum(counts.values()),
            "open": counts.get("pending", 0) + counts.get("invalid", 0) + counts.get("unsigned", 0),
            "accused": counts.get("accused", 0),
            "duties": self.store.counts("duties"),
            "txs": self.store.journal.counts(),
            "rpc": self.chain.rpc.health() if self.chain is not None else [],
            "last_error": self.last_error,
            # versions the coordinator announced with more than one hash: its lie, shown by the explorer
            "policy_conflicts": {str(v): hs for v, hs in self.book.conflicts().items()},
        }

    def _count(self, name: str, value: float = 1.0, **labels: str) -> None:
        count(self.metrics, name, value, **labels)

    def node_termination(self, node: str, verdict: dict[str, Any]) -> dict[str, Any]:
        """A passing file's stop figures (statistical pools) added to its node's totals, and the
        cumulative termination test on them (`cumulative_termination`): a node whose files stop less
        than the model says, file after file, has this file revoked softly and every later record of it
        checked, where each file alone passed."""
        fig = (verdict.get("verdict") or {}).get("figures") or {}
        if not verdict.get("ok") or "expected_stops" not in fig:
            return verdict
        t = cumulative_termination(
            *self.state.add_stops(node, fig["stops"], fig["expected_stops"], fig["stop_variance"])
        )
        if t.ok:
            return verdict
        if self.state.node_suspect(node) is None:
            log.warning("node %s stops less than the model says across its files: checking all its work", node)
        self.state.mark_node_suspect(node, str(t.reason))
        return {**verdict, "ok": False, "verdict": t.to_dict()}

    def sampled(self, key: str) -> bool:
        if self.cfg.sample_rate >= 1.0:
            return True
        h = hashlib.sha256(self.secret + bytes.fromhex(key.removeprefix("0x"))).digest()
        return int.from_bytes(h[:8], "big") < self.cfg.sample_rate * 2**64

    # ------------------------------------------------------------------ lifecycle

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        self.chain, info = await open_pool_chain(cfg, self.key, self.store, "validator")
        try:
            if not await self.chain.call("PoolManager", "isPoolValidator", cfg.pool_id, self.key.address):
                raise ChainError(
                    f"{self.key.address} is not a validator of pool {cfg.pool_id}",
                    "ask the pool's owner to name it (`intellect-node validator add --pool ID ADDRESS`)",
                )
            bootstrap, self.coordinator_peer = pool_peers(cfg.bootstrap, info)
            model = await self.load_spec(info)
            self.tools = await trio.to_thread.run_sync(model_tools, model)
            self.prefill = await trio.to_thread.run_sync(self._load_prefill)
            async with trio.open_nursery() as nursery:
                self.membership, self.net = await open_pool_network(
                    nursery, self.chain, cfg.pool_id, bytes(self.key.key), cfg.listen, bootstrap
                )
                async with self.net:
                    # by hash, for the accused worker and committees that missed a verdict's gossip (and
                    # a document too large for gossip)
                    serve_evidence(self.net, BlobStore(self.evidence_dir, MAX_SERVED_EVIDENCE_BYTES, suffix=".json"))
                    nursery.start_soon(self._policy_loop)
                    nursery.start_soon(self._announcement_loop)
                    nursery.start_soon(self._hint_loop, str(info["coordinator"]))
                    task_status.started()
                    log.info("validating pool %d (sample rate %.2f)", cfg.pool_id, cfg.sample_rate)
                    while True:
                        try:
                            await self.follow()
                            await self.check_open()
                            await self.settle_accusations()
                            await self.serve_committees()
                            self.last_error = ""
                        except (ChainError, RpcUnavailable, trio.TooSlowError, StoreError, OSError) as exc:
                            if isinstance(exc, OSError) and exc.errno not in DISK_FULL:
                                raise
                            self.last_error = str(exc)  # a full disk too: the window is long, room may come
                            log.warning("validation round failed (will retry): %s", exc)
                        await trio.sleep(cfg.poll_every)
        finally:
            with trio.CancelScope(shield=True):
                await self.chain.aclose()
                self.store.close()

    async def load_spec(self, info: dict[str, Any]) -> str:
        """Read the pool's task spec (checked against its on-chain hash): the model, environment and
        sampling parameters every file is checked against. Returns the model to load; a `--model` that
        is not the spec's is refused, since it would find every honest file malformed."""
        try:
            spec = await pool_spec(info)
        except TaskSpecError as exc:
            raise TaskSpecError(exc.message, exc.hint or "a validator checks work against the pool's spec") from None
        model = self.cfg.model or spec.model
        if model != spec.model and model.split(":")[0] != spec.model:
            raise ConfigError(
                f"--model {model} is not the model of pool {self.cfg.pool_id} ({spec.model}, from its task spec)",
                f"run with --model {spec.model}, or leave --model out",
            )
        self.spec = spec
        self.env = spec.environment()  # the version and content the spec pins, or refused
        await trio.to_thread.run_sync(self.env.prepare)  # e.g. the code sandbox: refused here if it cannot be
        self.calibrated = self.cfg.thresholds or Calibrated.for_spec(spec)
        self.prefill_dtype = self.calibrated.prefill_dtype(self.cfg.prefill_dtype)
        return model

    def _load_prefill(self) -> Any:
        from ..inference.engine import HfPrefill

        assert self.tools is not None
        log.info("prefill in %s", self.prefill_dtype)
        return HfPrefill(self.tools.path, dtype=self.prefill_dtype)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ following the ledger

    async def follow(self) -> int:
        """Read new `WorkRecorded` events into the `checks` table; returns how many were new."""
        assert self.chain is not None
        got = await new_ledger_events(self.chain, self.store, "cursor", self.cfg.pool_id, "WorkRecorded")
        if got is None:
            return 0
        return self.state.add_records(*got)

    async def check_open(self) -> None:
        for r in self.state.open_checks(rules.OPEN):
            await self.check_one(r)

    async def check_one(self, r: dict[str, Any]) -> None:
        """One record, one step further: checked, invalidated, or left for the next round. Nothing a
        worker or a coordinator sends ends here as an exception: a bad file is a verdict, a failure of
        ours is retried `max_internal_errors` times and then reported."""
        assert self.chain is not None
        c, pool, key = self.chain, self.cfg.pool_id, r["work_key"]
        rec = await retry_rpc(lambda: ops.record(c, pool, key), "record lookup")
        if rec["statusName"] == "none":  # a reorganisation removed it; if it comes back, it is read again
            self.state.set_status(key, "settled", GONE)
            return
        if rec["status"] != 1:  # invalidated or accused (maybe by our own tx before a restart), or claimed
            d = await retry_rpc(lambda: ops.dispute(c, pool, key), "dispute lookup")
            ours = r["status"] == "invalid" and str(d["accuser"]).lower() == self.key.address.lower()
            self.state.set_status(key, rules.after_record_left(r["status"], ours, d["kindName"], rec["statusName"]))
            return
        now = await c.timestamp()
        deadline = int(rec["deadline"])
        if rules.too_late(now, self.cfg.margin, deadline):
            self.state.set_status(key, "settled", "deadline too close")
            return
        if r["status"] == "pending":
            if not self.sampled(key) and self.state.suspect(key) is None and not self.state.node_suspect(r["node"]):
                self.state.set_status(key, "skipped")
                return
            try:
                verdict = await self._verify(r, last_chance=rules.last_chance(now, self.cfg.margin, deadline))
            except (RpcUnavailable, StoreError):
                raise
            except OSError as exc:
                if exc.errno in DISK_FULL:
                    raise
                self._internal_error(r, exc)
                return
            except Exception as exc:
                self._internal_error(r, exc)
                return
            if verdict is None:
                return
            verdict = self.node_termination(str(r["node"]), verdict)
            if self.cfg.lie:  # the devnet's lying validator: every checked record "fails"
                verdict = {**verdict, "ok": False, "verdict": {**verdict["verdict"], "reason": "made-up"}}
            evidence = self._save_evidence(key, verdict)
            ok = verdict["ok"]
            reason = rules.stored_reason(verdict)
            self.state.set_verdict(key, rules.after_check(ok), reason, evidence)
            self._count("verdicts", result="ok" if ok else "failed")
            await self._publish_verdict(key, ok, reason, evidence)
            if ok:
                log.info("work %s of node %s verified", key[:12], r["node"])
                return
            r["evidence"], r["reason"] = evidence, reason
        if r["status"] == "unsigned" and time.monotonic() - self.last_fetch.get(key, -1e9) < self.cfg.refetch_every:
            return
        self.last_fetch[key] = time.monotonic()
        if not await self.node_signed(key, r["node"]):
            # The coordinator recorded work that nobody can show the node made: slashing the node for it
            # would punish whoever the coordinator names. Reported instead, never invalidated; asked for
            # again until the deadline, in case the signature reaches us late.
            if r["status"] != "unsigned":
                self.state.set_status(key, "unsigned")
                await self._publish_verdict(key, False, str(Reason.UNSIGNED), str(r["evidence"]))
                self._count("verdicts", result="unsigned")
                log.error(
                    "COORDINATOR FAULT: work %s recorded for node %s failed its check (%s) but carries no signature "
                    "of that node; it is not invalidated (evidence %s)", key[:12], r["node"], r.get("reason"),
                    r["evidence"],
                )  # fmt: skip
            return
        self.last_fetch.pop(key, None)
        await self._invalidate(key, str(r["evidence"]), r["node"], str(r.get("reason") or ""))

    def _internal_error(self, r: dict[str, Any], exc: BaseException) -> None:
        """A check that failed on our side (a bug, the prefill, the model): retried a bounded number of
        times, then given up and reported loudly; never the end of the daemon."""
        key = r["work_key"]
        errors = self.state.count_error(key)
        status = rules.after_internal_error(errors, self.cfg.max_internal_errors, r["status"])
        give_up = status == "error"
        self.state.set_status(key, status, f"internal error: {type(exc).__name__}: {exc}"[:500])
        self.last_error = f"checking {key[:12]}: {type(exc).__name__}: {exc}"
        self._count("verdicts", result="error")
        if give_up:
            log.error("GAVE UP checking work %s after %d internal errors", key[:12], errors, exc_info=exc)
        else:
            log.warning("checking work %s failed on our side (attempt %d): %r", key[:12], errors, exc)

    async def _announcement_loop(self) -> None:
        """Rollout announcements: each carries the node's signature of its file and where the node
        serves it. Kept only when the signature is the sender's and its addresses name its own key."""
        assert self.net is not None and self.chain is not None
        async for env in self.net.subscribe("rollout"):
            try:
                body = protocol.unpack(env.body, "rollout announcement")
            except protocol.ProtocolError:
                continue
            key, sig, addrs = body.get("work_key"), body.get("signature"), body.get("addrs", [])
            if not isinstance(key, str) or not re.fullmatch(r"0x[0-9a-f]{64}", key):
                continue
            if not self.claim(key).signed_by(sig, env.sender):
                continue
            self.store.put(f"sig:{key}", str(sig))
            if isinstance(addrs, list):
                mine = [a for a in addrs[:4] if isinstance(a, str) and len(a) < 300 and _peer_is(a, env.sender)]
                if mine:
                    self.store.put(f"peer:{env.sender.lower()}", json.dumps(mine))

    async def _hint_loop(self, coordinator: str) -> None:
        """The coordinator's trainer checks every rollout before training on it and publishes the ones
        that fail (`take_hint`)."""
        assert self.net is not None
        async for env in self.net.subscribe("verdict"):
            self.take_hint(env.sender, env.body, coordinator)

    def take_hint(self, sender: str, body: bytes, coordinator: str) -> bool:
        """A failed verdict from the pool's coordinator, or its request to check a record its trainer's
        checks did not cover (`check: true`: a file too old to train on), makes us check that record
        whatever the sample rate (even if it was skipped already). Only the coordinator is heard, and
        only to make us look: the verdict is always our own. Returns whether the hint was taken."""
        if sender.lower() != coordinator.lower():
            return False
        try:
            msg = protocol.unpack(body, "verdict")
        except protocol.ProtocolError:
            return False
        key = msg.get("work_key")
        if (
            (msg.get("ok") is not False and msg.get("check") is not True)
            or not isinstance(key, str)
            or not re.fullmatch(r"0x[0-9a-f]{64}", key)
        ):
            return False
        self.state.mark_suspect(key, str(msg.get("reason", ""))[:100])
        log.info("the coordinator's trainer refused work %s (%s): checking it", key[:12], str(msg.get("reason"))[:100])
        return True

    async def _invalidate(self, key: str, evidence: str, node: str, reason: str = "") -> None:
        """Invalidate failed work: softly (no slash) when its file was never served, since nobody can
        show what it held, or when every failure was near its threshold; otherwise hard, an accusation
        with the pool's bond that becomes a slash when its appeal period ends unappealed
        (`settle_accusations`). See `rules.invalidation_is_hard`."""
        assert self.chain is not None
        # a slash needs the node's signature over the work (`node_signed` fetched it before any verdict)
        sig = self.store.get(f"sig:{key}")
        hard = rules.invalidation_is_hard(reason) and bool(sig)
        if self.cfg.lie:  # the devnet's lying validator: every other accusation soft (both kinds get appealed)
            self._lies += 1
            hard = hard and self._lies % 2 == 0
        if self.membership is not None:  # the pool's validators take turns: no accusation mined as a revert
            turn = rules.invalidation_turn(key, self.chain.address, self.membership.snapshot().validators)
            await trio.sleep(turn * rules.INVALIDATION_STAGGER)
        try:
            rc = await ops.invalidate(self.chain, self.cfg.pool_id, key, evidence, hard=hard, signature=sig)
        except ChainError as exc:
            name = getattr(exc, "name", None)
            if name in rules.ALREADY_DONE:
                # settled, or held by another's dispute: the next round reads which (`after_record_left`)
                if name == "NamedAfterWork":
                    self.state.set_status(key, "settled", "recorded before we were named")
                return
            raise
        self.state.set_sent(key, "accused", rc.tx_hash)  # hard or soft: final after its appeal period
        self._count("invalidations")
        self._count("chain_tx_sent", kind="invalidateWork")
        if hard:
            # once more, now that it is an accusation: a worker that missed the first may appeal it
            await self._publish_verdict(key, False, reason, evidence)
            ev = rc.event("WorkAccused").args
            log.warning(
                "ACCUSED work %s of node %s (bond %s): slashed at %s unless appealed (tx %s)",
                key[:12], node, ev["bond"], ev["appealEnd"], rc.tx_hash,
            )  # fmt: skip
        else:
            log.warning(
                "REVOKING work %s of node %s without a slash (%s): final at %s unless appealed (tx %s)",
                key[:12], node, reason, rc.event("WorkSoftInvalidated").args["appealEnd"], rc.tx_hash,
            )  # fmt: skip

    async def _policy_loop(self) -> None:
        assert self.net is not None
        async for env in self.net.subscribe("policy"):
            try:
                ann = PolicyAnnouncement.from_body(env.body)
            except protocol.ProtocolError:
                continue
            # the hashes this announcement is the first to name (each new one is kept with the signed
            # envelope that carried it); then its sources and version
            new = [(v, h) for v, h in (*ann.history.items(), (ann.version, ann.manifest_hash)) if self.book.heard(v, h)]
            self.book.update(ann)
            envelope = encode(env) if new else b""
            for v, h in new:
                self.state.add_policy_hash(v, h, envelope)
                first = self.book.announced[v][0]
                if h != first:
                    log.error(
                        "the coordinator announced policy version %d with another hash (%s, first %s): "
                        "files are judged against the weights their workers signed for",
                        v, h[:12], first[:12],
                    )  # fmt: skip
