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
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from . import ops, protocol
from .chain import ChainClient, ChainError, Deployment
from .chain.abi import topic
from .chain.errors import RpcUnavailable
from .daemon import ModelTools, connect_chain, count, model_tools, open_pool_network, pool_peers, retry_rpc
from .p2p.blobs import fetch_blob
from .p2p.host import P2PError
from .p2p.network import PoolNetwork
from .policy import PolicyAnnouncement, PolicyBook, checkpoint_folder
from .rollout.checks import Reason, Verdict
from .rollout.file import RolloutFile, RolloutFormatError
from .store import DISK_FULL, Store, StoreError, settle_journal, write_file
from .tasks.math import get_env
from .verify import Calibrated, FileVerdict, verify_file

log = logging.getLogger("intellect.validator")

SCHEMA = """
CREATE TABLE IF NOT EXISTS checks (
    work_key TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    provider TEXT NOT NULL,
    units INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    block INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',  -- pending | skipped | ok | invalid | invalidated | settled | unavailable
    reason TEXT,
    evidence TEXT,
    tx TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    checked_at REAL
);
CREATE INDEX IF NOT EXISTS checks_status ON checks(status);
"""


@dataclass
class ValidatorConfig:
    pool_id: int
    data_dir: Path
    rpc_url: str
    deployment: Deployment
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: list[str] | None = None
    model: str = "tiny"
    env: str = "math"
    thresholds: str | None = None
    sample_rate: float = 1.0
    poll_every: float = 2.0
    max_fetch_attempts: int = 20
    margin: int = 30
    rpc_wait: float = 60.0
    max_rollout_bytes: int = 16 * 1024 * 1024


class Validator:
    def __init__(self, cfg: ValidatorConfig, key: LocalAccount, metrics: Any = None) -> None:
        if not 0.0 <= cfg.sample_rate <= 1.0:
            raise ValueError("sample rate must be in [0, 1]")
        self.cfg = cfg
        self.key = key
        self.metrics = metrics
        self.store = Store(cfg.data_dir / "validator.db", SCHEMA)
        self.evidence_dir = cfg.data_dir / "evidence"
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        secret = self.store.get("sampling_secret")
        if secret is None:
            secret = secrets.token_hex(32)
            self.store.put("sampling_secret", secret)
        self.secret = bytes.fromhex(secret)
        self.env = get_env(cfg.env)
        self.calibrated = Calibrated.load(cfg.thresholds or cfg.model.split(":")[0])
        self.tools: ModelTools | None = None
        self.prefill: Any = None
        self.chain: ChainClient | None = None
        self.net: PoolNetwork | None = None
        self.coordinator_peer: str | None = None
        self.last_error = ""
        self.book = PolicyBook()
        for k, v in self.store.query("SELECT k, v FROM kv WHERE k LIKE 'policy:%'"):
            self.book.hashes[int(k.split(":")[1])] = v
        self.prefills: dict[int, Any] = {}

    def status(self) -> dict[str, Any]:
        counts = self.store.counts("checks")
        return {
            "role": "validator",
            "pool": self.cfg.pool_id,
            "address": self.key.address,
            "cursor": int(self.store.get("cursor", "-1") or -1),
            "checks": counts,
            "seen": sum(counts.values()),
            "open": counts.get("pending", 0) + counts.get("invalid", 0),
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
            role = await self.chain.call("ProviderRegistry", "VALIDATOR_ROLE")
            if not await self.chain.call("ProviderRegistry", "hasRole", role, self.key.address):
                raise ChainError(
                    f"{self.key.address} does not hold the validator role",
                    "ask governance to grant it (`intellect-node validator grant`)",
                )
            bootstrap, self.coordinator_peer = pool_peers(cfg.bootstrap, info)
            self.tools = await trio.to_thread.run_sync(model_tools, cfg.model)
            self.prefill = await trio.to_thread.run_sync(self._load_prefill)
            async with trio.open_nursery() as nursery:
                _, self.net = await open_pool_network(
                    nursery, self.chain, cfg.pool_id, bytes(self.key.key), cfg.listen, bootstrap
                )
                async with self.net:
                    nursery.start_soon(self._policy_loop)
                    task_status.started()
                    log.info("validating pool %d (sample rate %.2f)", cfg.pool_id, cfg.sample_rate)
                    while True:
                        try:
                            await self.follow()
                            await self.check_open()
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

    def _load_prefill(self) -> Any:
        from .inference.engine import HfPrefill

        assert self.tools is not None
        return HfPrefill(self.tools.path)

    # ------------------------------------------------------------------ following the ledger

    async def follow(self) -> int:
        """Read new `WorkRecorded` events into the `checks` table; returns how many were new."""
        assert self.chain is not None
        c = self.chain
        cursor = int(self.store.get("cursor", str(c.deployment.block - 1)) or 0)
        head = await retry_rpc(c.rpc.block_number, "block number")
        if head <= cursor:
            return 0
        events = await retry_rpc(
            lambda: c.events(
                ["WorkLedger"], from_block=cursor + 1, to_block=head, topics=[None, topic(self.cfg.pool_id)]
            ),
            "work events",
        )
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        for ev in events:
            if ev.name != "WorkRecorded":
                continue
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
        stmts.append(
            ("INSERT INTO kv(k, v) VALUES('cursor', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (str(head),))
        )
        self.store.execute_many(stmts)
        return len(stmts) - 1

    async def check_open(self) -> None:
        rows = self.store.query("SELECT * FROM checks WHERE status IN ('pending', 'invalid') ORDER BY block")
        for r in rows:
            await self.check_one(dict(r))

    async def check_one(self, r: dict[str, Any]) -> None:
        assert self.chain is not None
        c, pool, key = self.chain, self.cfg.pool_id, r["work_key"]
        rec = await retry_rpc(lambda: ops.record(c, pool, key), "record lookup")
        if rec["status"] != 1:  # already invalidated (maybe by our own tx before a restart) or claimed
            status = "invalidated" if r["status"] == "invalid" and rec["statusName"] == "invalidated" else "settled"
            self.store.execute("UPDATE checks SET status = ? WHERE work_key = ?", (status, key))
            return
        now = await c.timestamp()
        if now + self.cfg.margin >= int(rec["deadline"]):
            self.store.execute(
                "UPDATE checks SET status = 'settled', reason = 'deadline too close' WHERE work_key = ?", (key,)
            )
            return
        if r["status"] == "pending":
            if not self.sampled(key):
                self.store.execute("UPDATE checks SET status = 'skipped' WHERE work_key = ?", (key,))
                return
            verdict = await self._verify(r)
            if verdict is None:
                return
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
            r["evidence"] = evidence
        await self._invalidate(key, str(r["evidence"]), r["node"])

    async def _invalidate(self, key: str, evidence: str, node: str) -> None:
        assert self.chain is not None
        try:
            rc = await ops.invalidate(self.chain, self.cfg.pool_id, key, evidence)
        except ChainError as exc:
            if getattr(exc, "name", None) in ("AlreadySettled", "DeadlinePassed"):
                self.store.execute("UPDATE checks SET status = 'settled' WHERE work_key = ?", (key,))
                return
            raise
        ev = rc.event("WorkInvalidated").args
        self.store.execute("UPDATE checks SET status = 'invalidated', tx = ? WHERE work_key = ?", (rc.tx_hash, key))
        self._count("invalidations")
        self._count("chain_tx_sent", kind="invalidateWork")
        log.warning(
            "INVALIDATED work %s of node %s: slashed %s base units (tx %s)", key[:12], node, ev["slashed"], rc.tx_hash
        )

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
        from .weights.client import DownloadError, download

        if version in self.prefills:
            return self.prefills[version]
        if version == 0:
            return self.prefill
        h = self.book.hashes.get(version)
        if h is None or not self.book.sources:
            log.info("policy version %d not announced yet; checking its work later", version)
            return None
        assert self.tools is not None
        try:
            path = await download(version, h, list(self.book.sources), self.cfg.data_dir / "weights", keep=4)
        except DownloadError as exc:
            log.warning("cannot fetch policy version %d yet: %s", version, exc)
            return None
        folder = await trio.to_thread.run_sync(
            checkpoint_folder, self.tools.path, path, self.cfg.data_dir / "models" / f"v{version}"
        )
        from .inference.engine import HfPrefill

        model = await trio.to_thread.run_sync(HfPrefill, folder)
        for old in sorted(self.prefills)[:-2]:  # keep a few versions in memory
            del self.prefills[old]
        self.prefills[version] = model
        return model

    def _save_evidence(self, key: str, verdict: dict[str, Any]) -> str:
        body = json.dumps({"work_key": key, "pool": self.cfg.pool_id, **verdict}, sort_keys=True).encode()
        digest = "0x" + hashlib.sha256(body).hexdigest()
        write_file(self.evidence_dir / f"{digest[2:]}.json", body)
        return digest

    async def _publish_verdict(self, key: str, ok: bool, reason: str, evidence: str) -> None:
        if self.net is None:
            return
        try:
            await self.net.publish(
                "verdict", protocol.pack({"work_key": key, "ok": ok, "reason": reason, "evidence": evidence})
            )
        except Exception as exc:
            log.debug("verdict announcement failed: %r", exc)

    async def _verify(self, r: dict[str, Any]) -> dict[str, Any] | None:
        """The verdict dict, or None when the file could not be fetched this round."""
        assert self.net is not None and self.coordinator_peer is not None and self.tools is not None
        key = r["work_key"]
        try:
            data = await fetch_blob(self.net.node, self.coordinator_peer, key, max_bytes=self.cfg.max_rollout_bytes)
        except P2PError as exc:
            attempts = int(r["attempts"]) + 1
            self.store.execute("UPDATE checks SET attempts = ? WHERE work_key = ?", (attempts, key))
            log.warning("cannot fetch rollout %s yet (attempt %d): %s", key[:12], attempts, exc)
            if attempts >= self.cfg.max_fetch_attempts:
                # Data the coordinator recorded but will not serve: flagged, not slashed (the worker
                # uploaded it; the fault may be the coordinator's).
                self.store.execute("UPDATE checks SET status = 'unavailable' WHERE work_key = ?", (key,))
            return None
        try:
            f = RolloutFile.from_bytes(data, max_bytes=self.cfg.max_rollout_bytes)
        except RolloutFormatError as exc:
            return FileVerdict(Verdict(Reason.MALFORMED, str(exc)), []).to_dict()
        if f.header.node.lower() != str(r["node"]).lower() or f.header.pool_id != self.cfg.pool_id:
            return FileVerdict(Verdict(Reason.MALFORMED, "file header names another node or pool"), []).to_dict()
        if f.header.model != self.cfg.model.split(":")[0] and f.header.model != self.cfg.model:
            return FileVerdict(Verdict(Reason.MALFORMED, f"file claims model {f.header.model}"), []).to_dict()
        tools = self.tools
        prefill = await self.prefill_for(int(r["policy_version"]))
        if prefill is None:
            return None

        def run() -> dict[str, Any]:
            # one batched forward pass for the whole file (same math as one at a time, much faster)
            pairs = [(list(s.prompt_tokens), list(s.completion_tokens)) for s in f.samples if s.completion_tokens]
            done = {(tuple(p), tuple(c)): r for (p, c), r in zip(pairs, prefill.prefill_many(pairs), strict=True)}

            def fn(prompt: list[int], completion: list[int]) -> Any:
                p = done.get((tuple(prompt), tuple(completion))) or prefill.prefill(prompt, completion)
                return p.hidden, p.logprobs

            return verify_file(
                f,
                fn,
                env=get_env(f.header.env) if f.header.env in ("math", "thinking-budget") else self.env,
                encode_prompt=tools.encode,
                decode=tools.decode,
                stop_ids=tools.stop_ids,
                calibrated=self.calibrated,
                expected_policy=int(r["policy_version"]),
            ).to_dict()

        started = time.monotonic()
        verdict = await trio.to_thread.run_sync(run)
        log.info(
            "checked %s (%d samples) in %.1f s: %s",
            key[:12],
            len(f.samples),
            time.monotonic() - started,
            "ok" if verdict["ok"] else verdict["verdict"]["reason"],
        )
        return verdict
