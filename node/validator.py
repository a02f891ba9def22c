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
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from . import ops, protocol
from .chain import ChainClient, ChainError, Deployment
from .chain.errors import RpcUnavailable
from .chain.signing import RolloutClaim
from .daemon import (
    PolicyPrefills,
    connect_chain,
    count,
    new_ledger_events,
    open_pool_network,
    pool_peers,
    retry_rpc,
    serve_evidence,
)
from .errors import ConfigError
from .evidence import MAX_EVIDENCE_BYTES, MAX_SERVED_EVIDENCE_BYTES
from .inference.tools import ModelTools, model_tools
from .p2p.blobs import BlobStore, fetch_blob
from .p2p.host import P2PError, eth_address_from_peer_id
from .p2p.network import PoolNetwork
from .policy import PolicyAnnouncement, PolicyBook
from .rollout.checks import Reason, Verdict
from .rollout.file import RolloutFile
from .store import DISK_FULL, Store, StoreError, settle_journal, write_evidence
from .tasks.math import get_env
from .taskspec import TaskSpec, TaskSpecError, pool_spec
from .verify import Calibrated, FileVerdict, PoolFileCheck

log = logging.getLogger("intellect.validator")

SCHEMA = """
CREATE TABLE IF NOT EXISTS checks (
    work_key TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    provider TEXT NOT NULL,
    units INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    block INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',  -- pending | skipped | ok | invalid | accused | invalidated | overturned | settled | unsigned | error
    reason TEXT,
    evidence TEXT,
    tx TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,      -- internal errors while checking (ours, not the worker's)
    checked_at REAL
);
CREATE INDEX IF NOT EXISTS checks_status ON checks(status);
CREATE TABLE IF NOT EXISTS duties (
    work_key TEXT PRIMARY KEY,              -- an appeal or a challenge in this pool
    kind TEXT NOT NULL,
    block INTEGER NOT NULL DEFAULT 0,       -- where it opened: its committee comes from the validators then
    status TEXT NOT NULL DEFAULT 'open',    -- open | voted | not-drawn | closed
    vote TEXT,
    tx TEXT
);
"""


@dataclass
class ValidatorConfig:
    pool_id: int
    data_dir: Path
    rpc_url: str
    deployment: Deployment
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: list[str] | None = None
    model: str | None = None  # None: the model the pool's task spec names; another one refuses to start
    thresholds: str | None = None
    sample_rate: float = 1.0
    poll_every: float = 2.0
    max_internal_errors: int = 3  # a check that fails on our side this often is given up, loudly
    refetch_every: float = 20.0  # unavailable work is asked for again this often, until its deadline
    margin: int = 30
    rpc_wait: float = 60.0
    max_rollout_bytes: int = 16 * 1024 * 1024
    lie: bool = False  # devnet adversary: accuses every record it checks, and votes to uphold every accusation


class Validator:
    def __init__(self, cfg: ValidatorConfig, key: LocalAccount, metrics: Any = None) -> None:
        if not 0.0 <= cfg.sample_rate <= 1.0:
            raise ValueError("sample rate must be in [0, 1]")
        self.cfg = cfg
        self.key = key
        self.metrics = metrics
        self.store = Store(cfg.data_dir / "validator.db", SCHEMA)
        self.store.add_column("checks", "errors", "INTEGER NOT NULL DEFAULT 0")
        self.store.add_column("duties", "block", "INTEGER NOT NULL DEFAULT 0")
        self.evidence_dir = cfg.data_dir / "evidence"
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        secret = self.store.get("sampling_secret")
        if secret is None:
            secret = secrets.token_hex(32)
            self.store.put("sampling_secret", secret)
        self.secret = bytes.fromhex(secret)
        self.spec: TaskSpec | None = None
        self.calibrated: Calibrated | None = None
        self.last_fetch: dict[str, float] = {}
        self.tools: ModelTools | None = None
        self.prefill: Any = None
        self.chain: ChainClient | None = None
        self.net: PoolNetwork | None = None
        self.coordinator_peer: str | None = None
        self.last_error = ""
        self.book = PolicyBook()
        for k, v in self.store.query("SELECT k, v FROM kv WHERE k LIKE 'policy:%'"):
            self.book.hashes[int(k.split(":")[1])] = v
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
            "last_error": self.last_error,
        }

    def _count(self, name: str, value: float = 1.0, **labels: str) -> None:
        count(self.metrics, name, value, **labels)

    def sampled(self, key: str) -> bool:
        if self.cfg.sample_rate >= 1.0:
            return True
        h = hashlib.sha256(self.secret + bytes.fromhex(key.removeprefix("0x"))).digest()
        return int.from_bytes(h[:8], "big") < self.cfg.sample_rate * 2**64

    # ------------------------------------------------------------------ lifecycle

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        self.chain = await connect_chain(
            cfg.rpc_url, cfg.deployment, self.key, journal=self.store.journal, wait=cfg.rpc_wait, what="validator"
        )
        try:
            await settle_journal(self.store.journal, self.chain.sender)  # type: ignore[arg-type]
            info = await ops.pool_info(self.chain, cfg.pool_id)
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
                _, self.net = await open_pool_network(
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
        self.env = get_env(spec.env)
        self.calibrated = Calibrated.load(self.cfg.thresholds or spec.model)
        return model

    def _load_prefill(self) -> Any:
        from .inference.engine import HfPrefill

        assert self.tools is not None
        return HfPrefill(self.tools.path)

    # ------------------------------------------------------------------ following the ledger

    async def follow(self) -> int:
        """Read new `WorkRecorded` events into the `checks` table; returns how many were new."""
        assert self.chain is not None
        got = await new_ledger_events(self.chain, self.store, "cursor", self.cfg.pool_id, "WorkRecorded")
        if got is None:
            return 0
        events, move = got
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        for ev in events:
            a = ev.args
            stmts.append(
                (
                    "INSERT OR IGNORE INTO checks(work_key, node, provider, units, policy_version, block) "
                    "VALUES(?, ?, ?, ?, ?, ?)",
                    (
                        str(a["workKey"]),
                        str(a["node"]),
                        str(a["provider"]),
                        int(a["units"]),
                        int(a["policyVersion"]),
                        ev.block_number,
                    ),
                )
            )
        self.store.execute_many(stmts + move)
        return len(stmts)

    async def check_open(self) -> None:
        rows = self.store.query(
            "SELECT * FROM checks WHERE status IN ('pending', 'invalid', 'unsigned') ORDER BY block"
        )
        for r in rows:
            await self.check_one(dict(r))

    async def check_one(self, r: dict[str, Any]) -> None:
        """One record, one step further: checked, invalidated, or left for the next round. Nothing a
        worker or a coordinator sends ends here as an exception: a bad file is a verdict, a failure of
        ours is retried `max_internal_errors` times and then reported."""
        assert self.chain is not None
        c, pool, key = self.chain, self.cfg.pool_id, r["work_key"]
        rec = await retry_rpc(lambda: ops.record(c, pool, key), "record lookup")
        if rec["status"] != 1:  # invalidated or accused (maybe by our own tx before a restart), or claimed
            d = await retry_rpc(lambda: ops.dispute(c, pool, key), "dispute lookup")
            ours = r["status"] == "invalid" and str(d["accuser"]).lower() == self.key.address.lower()
            if ours and d["kindName"] in ("accusation", "appeal"):
                status = "accused"
            elif ours or (r["status"] == "invalid" and rec["statusName"] == "invalidated"):
                status = "invalidated"
            else:
                status = "settled"
            self.store.execute("UPDATE checks SET status = ? WHERE work_key = ?", (status, key))
            return
        now = await c.timestamp()
        deadline = int(rec["deadline"])
        if now + self.cfg.margin >= deadline:
            self.store.execute(
                "UPDATE checks SET status = 'settled', reason = 'deadline too close' WHERE work_key = ?", (key,)
            )
            return
        if r["status"] == "pending":
            if not self.sampled(key) and self.store.get(f"suspect:{key}") is None:
                self.store.execute("UPDATE checks SET status = 'skipped' WHERE work_key = ?", (key,))
                return
            try:
                verdict = await self._verify(r, last_chance=now + 2 * self.cfg.margin >= deadline)
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
            if self.cfg.lie:  # the devnet's lying validator: every checked record "fails"
                verdict = {**verdict, "ok": False, "verdict": {**verdict["verdict"], "reason": "made-up"}}
            evidence = self._save_evidence(key, verdict)
            ok = verdict["ok"]
            self.store.execute(
                "UPDATE checks SET status = ?, reason = ?, evidence = ?, checked_at = ? WHERE work_key = ?",
                ("ok" if ok else "invalid", verdict["verdict"]["reason"], evidence, time.time(), key),
            )
            self._count("verdicts", result="ok" if ok else "failed")
            await self._publish_verdict(key, ok, verdict["verdict"]["reason"], evidence)
            if ok:
                log.info("work %s of node %s verified", key[:12], r["node"])
                return
            r["evidence"], r["reason"] = evidence, verdict["verdict"]["reason"]
        if r["status"] == "unsigned" and time.monotonic() - self.last_fetch.get(key, -1e9) < self.cfg.refetch_every:
            return
        self.last_fetch[key] = time.monotonic()
        if not await self.node_signed(key, r["node"]):
            # The coordinator recorded work that nobody can show the node made: slashing the node for it
            # would punish whoever the coordinator names. Reported instead, never invalidated; asked for
            # again until the deadline, in case the signature reaches us late.
            if r["status"] != "unsigned":
                self.store.execute("UPDATE checks SET status = 'unsigned' WHERE work_key = ?", (key,))
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
        errors = int(self.store.scalar("SELECT errors FROM checks WHERE work_key = ?", (key,)) or 0) + 1
        give_up = errors >= self.cfg.max_internal_errors
        self.store.execute(
            "UPDATE checks SET errors = ?, status = ?, reason = ? WHERE work_key = ?",
            (errors, "error" if give_up else r["status"], f"internal error: {type(exc).__name__}: {exc}"[:500], key),
        )
        self.last_error = f"checking {key[:12]}: {type(exc).__name__}: {exc}"
        self._count("verdicts", result="error")
        if give_up:
            log.error("GAVE UP checking work %s after %d internal errors", key[:12], errors, exc_info=exc)
        else:
            log.warning("checking work %s failed on our side (attempt %d): %r", key[:12], errors, exc)

    async def node_signed(self, key: str, node: str) -> bool:
        """Whether we hold, or can get from the coordinator or the node, the node's signature of `key`."""
        claim = self.claim(key)
        sig = self.store.get(f"sig:{key}")
        if claim.signed_by(sig, node):
            return True
        for peer in self._sources(node):
            try:
                reply = protocol.reply_body(
                    await self.net.node.request(  # type: ignore[union-attr]
                        peer, protocol.SIGNATURE_PROTOCOL, protocol.pack({"work_key": key}), timeout=10.0
                    ),
                    "signature",
                )
            except (P2PError, protocol.ProtocolError) as exc:
                log.info("no signature of %s from %s: %s", key[:12], peer, exc)
                continue
            if claim.signed_by(reply.get("signature"), node):
                self.store.put(f"sig:{key}", str(reply["signature"]))
                return True
            log.warning("%s sent a signature of %s that is not node %s's", peer, key[:12], node)
        return False

    def claim(self, key: str) -> RolloutClaim:
        assert self.chain is not None
        return ops.rollout_claim(self.chain, self.cfg.pool_id, key)

    def _sources(self, node: str) -> list[str]:
        """Where a record's file and signature may be fetched: the coordinator, then the node itself at
        the address it announced (its peer id checked to be the node's key)."""
        out = [self.coordinator_peer] if self.coordinator_peer else []
        raw = self.store.get(f"peer:{node.lower()}")
        if raw:
            out += [a for a in json.loads(raw) if isinstance(a, str)]
        return out

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
        """A failed verdict from the pool's coordinator makes us check that record whatever the sample
        rate (even if it was skipped already). Only the coordinator is heard, and only to make us look:
        the verdict is always our own. Returns whether the hint was taken."""
        if sender.lower() != coordinator.lower():
            return False
        try:
            msg = protocol.unpack(body, "verdict")
        except protocol.ProtocolError:
            return False
        key = msg.get("work_key")
        if msg.get("ok") is not False or not isinstance(key, str) or not re.fullmatch(r"0x[0-9a-f]{64}", key):
            return False
        self.store.put(f"suspect:{key}", str(msg.get("reason", ""))[:100])
        self.store.execute("UPDATE checks SET status = 'pending' WHERE work_key = ? AND status = 'skipped'", (key,))
        log.info("the coordinator's trainer refused work %s (%s): checking it", key[:12], str(msg.get("reason"))[:100])
        return True

    async def _invalidate(self, key: str, evidence: str, node: str, reason: str = "") -> None:
        """Invalidate failed work: softly (no slash) when its file was never served, since nobody can
        show what it held; otherwise hard, an accusation with the pool's bond that becomes a slash when
        its appeal period ends unappealed (`settle_accusations`)."""
        assert self.chain is not None
        hard = reason != str(Reason.UNAVAILABLE)
        try:
            rc = await ops.invalidate(self.chain, self.cfg.pool_id, key, evidence, hard=hard)
        except ChainError as exc:
            if getattr(exc, "name", None) in ("AlreadySettled", "DeadlinePassed", "AlreadyDisputed"):
                self.store.execute("UPDATE checks SET status = 'settled' WHERE work_key = ?", (key,))
                return
            raise
        status = "accused" if hard else "invalidated"
        self.store.execute("UPDATE checks SET status = ?, tx = ? WHERE work_key = ?", (status, rc.tx_hash, key))
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
            log.warning("REVOKED work %s of node %s without a slash (%s) (tx %s)", key[:12], node, reason, rc.tx_hash)

    async def settle_accusations(self) -> None:
        """Our accusations, one step further: final once the appeal period ended unappealed (which
        pays our bond back and the bounty), followed while appealed, closed when the committee decided."""
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        rows = self.store.query("SELECT work_key FROM checks WHERE status = 'accused'")
        if not rows:
            return
        now = await c.timestamp()
        for row in rows:
            key = str(row["work_key"])
            d = await retry_rpc(lambda key=key: ops.dispute(c, pool, key), "dispute lookup")
            verdict, kind = d["verdictName"], d["kindName"]
            try:
                if verdict == "open" and kind == "accusation" and now >= int(d["appealEnd"]):
                    rc = await ops.finalize_invalidation(c, pool, key)
                    ev = rc.event("WorkInvalidated").args
                    log.warning(
                        "INVALIDATED work %s: slashed %s base units (tx %s)", key[:12], ev["slashed"], rc.tx_hash
                    )
                    verdict = "upheld"
                elif verdict == "open" and kind in ("appeal", "challenge") and now >= int(d["voteEnd"]):
                    await ops.resolve_lapsed(c, pool, key)
                    verdict = "lapsed"
            except ChainError as exc:
                if getattr(exc, "name", None) not in ("NotDisputed",):
                    raise
                d = await ops.dispute(c, pool, key)
                verdict = d["verdictName"]
            if verdict != "open":
                status = {"upheld": "invalidated", "overturned": "overturned"}.get(verdict, "settled")
                self.store.execute("UPDATE checks SET status = ? WHERE work_key = ?", (status, key))
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
            events, move = got
            stmts = [
                ("INSERT OR IGNORE INTO duties(work_key, kind, block) VALUES(?, ?, ?)",
                 (str(ev.args["workKey"]), "appeal" if ev.name == "WorkAppealed" else "challenge", ev.block_number))
                for ev in events
            ]  # fmt: skip
            self.store.execute_many(stmts + move)
        for row in self.store.query("SELECT * FROM duties WHERE status = 'open'"):
            key = str(row["work_key"])
            d = await retry_rpc(lambda key=key: ops.dispute(c, pool, key), "dispute lookup")
            if d["verdictName"] != "open":
                self.store.execute("UPDATE duties SET status = 'closed' WHERE work_key = ?", (key,))
                continue
            if not d["drawn"]:
                await ops.draw_committee(c, pool, key, int(row["block"]) or None)
                d = await ops.dispute(c, pool, key)
                if not d["drawn"]:
                    continue  # its seed block is not mined yet, or the draw was committed anew
            state = int(await c.call("WorkLedger", "jurorState", pool, key, me))
            if state != 1:
                self.store.execute(
                    "UPDATE duties SET status = ? WHERE work_key = ?", ("voted" if state == 2 else "not-drawn", key)
                )
                continue
            r = self.store.one("SELECT * FROM checks WHERE work_key = ?", (key,))
            if r is None:
                continue  # the record's event has not been followed yet
            # Without the file (or the weights) this round, no vote: we judge only what we can check.
            verdict = await self._verify(dict(r))
            if verdict is None or verdict["verdict"]["reason"] == str(Reason.UNAVAILABLE):
                continue
            uphold = not verdict["ok"] or self.cfg.lie
            try:
                rc = await ops.vote(c, pool, key, uphold)
            except ChainError as exc:
                if getattr(exc, "name", None) not in ("NotDisputed", "VotePeriodOver", "NotJuror"):
                    raise
                self.store.execute("UPDATE duties SET status = 'closed' WHERE work_key = ?", (key,))
                continue
            self.store.execute(
                "UPDATE duties SET status = 'voted', vote = ?, tx = ? WHERE work_key = ?",
                ("uphold" if uphold else "overturn", rc.tx_hash, key),
            )
            self._count("chain_tx_sent", kind="vote")
            log.warning(
                "COMMITTEE: voted to %s the invalidation of work %s (our check: %s) (tx %s)",
                "uphold" if uphold else "overturn", key[:12], "failed" if not verdict["ok"] else "ok", rc.tx_hash,
            )  # fmt: skip

    async def _policy_loop(self) -> None:
        assert self.net is not None
        async for env in self.net.subscribe("policy"):
            try:
                ann = PolicyAnnouncement.from_body(env.body)
            except protocol.ProtocolError:
                continue
            known = set(self.book.hashes)
            self.book.update(ann)
            for v in set(self.book.hashes) - known:
                self.store.put(f"policy:{v}", self.book.hashes[v])

    async def prefill_for(self, version: int) -> Any:
        """The prefill model of policy `version` (downloaded and checked by hash on first use), or
        None while its announcement or checkpoint is not available yet."""
        if self.prefills is None:
            assert self.tools is not None
            self.prefills = PolicyPrefills(self.tools, self.book, self.cfg.data_dir, keep=3)
            if self.prefill is not None:
                self.prefills.held[0] = self.prefill
        return await self.prefills.get(version)

    def _save_evidence(self, key: str, verdict: dict[str, Any]) -> str:
        return write_evidence(self.evidence_dir, {"work_key": key, "pool": self.cfg.pool_id, **verdict})

    def evidence_doc(self, evidence: str) -> bytes | None:
        """Our evidence document of hash `evidence` (None if we hold none, or it is too large to publish)."""
        if not re.fullmatch(r"0x[0-9a-f]{64}", evidence):
            return None
        try:
            doc = (self.evidence_dir / f"{evidence[2:]}.json").read_bytes()
        except OSError:
            return None
        return doc if len(doc) <= MAX_EVIDENCE_BYTES else None

    async def _publish_verdict(self, key: str, ok: bool, reason: str, evidence: str) -> None:
        """A verdict on gossip; a failed one carries its evidence document (`node.evidence`), so the
        accused worker and the pool's committee can re-check each of its claims against the file."""
        if self.net is None:
            return
        msg: dict[str, Any] = {"work_key": key, "ok": ok, "reason": reason, "evidence": evidence}
        doc = None if ok else self.evidence_doc(evidence)
        if doc is not None:
            msg["doc"] = doc
        try:
            await self.net.publish("verdict", protocol.pack(msg))
        except Exception as exc:
            log.debug("verdict announcement failed: %r", exc)

    async def fetch(self, r: dict[str, Any]) -> bytes | None:
        """The record's file from the coordinator, else from the node; None if neither serves it now."""
        assert self.net is not None
        key, errors = r["work_key"], []
        for peer in self._sources(str(r["node"])):
            try:
                return await fetch_blob(self.net.node, peer, key, max_bytes=self.cfg.max_rollout_bytes)
            except P2PError as exc:
                errors.append(f"{peer[-12:]}: {exc}")
        attempts = int(r["attempts"]) + 1
        self.store.execute("UPDATE checks SET attempts = ? WHERE work_key = ?", (attempts, key))
        log.warning("cannot fetch rollout %s yet (attempt %d): %s", key[:12], attempts, "; ".join(errors))
        return None

    async def _verify(self, r: dict[str, Any], last_chance: bool = False) -> dict[str, Any] | None:
        """The verdict dict, or None when the file or the weights could not be fetched this round.
        Unavailable work is asked for again every `refetch_every` seconds; once its deadline is close
        (`last_chance`) and neither the coordinator nor the node serves it, that is the verdict."""
        key = r["work_key"]
        if not last_chance and time.monotonic() - self.last_fetch.get(key, -1e9) < self.cfg.refetch_every:
            return None
        self.last_fetch[key] = time.monotonic()
        data = await self.fetch(r)
        if data is None:
            if not last_chance or not self.sampled(key):
                # A record we check only because the coordinator's trainer hinted at it is never
                # invalidated for want of its file: the coordinator claims to have read that file, so a
                # coordinator that hints and then withholds it could get an honest node slashed.
                return None
            detail = (
                f"neither the coordinator nor node {r['node']} served the file after {int(r['attempts']) + 1} tries"
            )
            return FileVerdict(Verdict(Reason.UNAVAILABLE, detail), []).to_dict()
        self.last_fetch.pop(key, None)
        f = await trio.to_thread.run_sync(self.intake, data, r)  # parsing a hostile file takes CPU, not the loop
        if isinstance(f, FileVerdict):
            return f.to_dict()
        prefill = await self.prefill_for(int(r["policy_version"]))
        if prefill is None:
            return None
        started = time.monotonic()
        result = await trio.to_thread.run_sync(self.judge, f, r, prefill)
        log.info(
            "checked %s in %.1f s: %s", key[:12], time.monotonic() - started,
            "ok" if result["ok"] else result["verdict"]["reason"],
        )  # fmt: skip
        return result

    @property
    def checker(self) -> PoolFileCheck:
        """The pool's checks of one file (`node.verify.PoolFileCheck`), once the spec and model are loaded."""
        assert self.spec is not None and self.tools is not None and self.calibrated is not None
        return PoolFileCheck(self.spec, self.tools, self.calibrated, self.cfg.pool_id, self.cfg.max_rollout_bytes)

    def intake(self, data: bytes, r: dict[str, Any]) -> RolloutFile | FileVerdict:
        """The checks that need no model (parse, header terms, bounds) of record `r`'s file."""
        return self.checker.intake(data, str(r["node"]))

    def judge(self, f: RolloutFile, r: dict[str, Any], prefill: Any) -> dict[str, Any]:
        """The full check of a file that passed `intake` (blocking: prefill and checks; run in a thread)."""
        return self.checker.judge(f, prefill, int(r["policy_version"]))


def _peer_is(addr: str, address: str) -> bool:
    """Whether the multiaddr `addr` ends in the peer id of the key of Ethereum `address`."""
    try:
        return eth_address_from_peer_id(addr.rsplit("/p2p/", 1)[1]).lower() == address.lower()
    except Exception:
        return False
