"""The pool owner's coordinator daemon (`intellect-node coordinator --pool ID`).

It signs invites for nodes that qualify, hands out tasks (prompts drawn from a seed the worker cannot
pick), accepts rollout uploads after cheap checks (`node.protocol.check_submission`), records accepted
work on chain in batches, publishes the policy version, and ejects members that stop heartbeating.

Crash safety: an upload is answered "accepted" only after its row is committed to sqlite, and the
rollout bytes are already in the content-addressed blob store by then; batches go through the
durable transaction journal, and before each batch the chain is asked which keys are already
recorded, so a restart neither loses an accepted rollout nor records one twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import secrets
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from node import ops, protocol
from node.chain import ChainClient, ChainError, Deployment
from node.chain.errors import RpcUnavailable
from node.chain.signing import RolloutClaim
from node.daemon import (
    connect_chain,
    count,
    new_evidence,
    new_ledger_events,
    retry_rpc,
    serve_evidence,
)
from node.errors import ConfigError
from node.evidence import MAX_SERVED_EVIDENCE_BYTES
from node.inference.tools import ModelTools, model_tools
from node.p2p.blobs import BlobStore, serve_blobs
from node.p2p.envelope import Envelope
from node.p2p.host import COORDINATOR_MAX_CONNECTIONS, P2PError
from node.p2p.membership import ChainMembership
from node.p2p.network import PoolNetwork
from node.p2p.rules import ROLE_VALIDATOR
from node.policy import HISTORY, PolicyAnnouncement, RelayBook, announcement_sources, parse_heartbeat, relay_url
from node.rollout.file import RolloutFile, RolloutFormatError
from node.rollout.intake import completion_hashes
from node.store import Store, evidence_hash, settle_journal, write_evidence
from node.tasks.math import get_env
from node.taskspec import TaskSpec, TaskSpecError, pool_spec
from node.toploc import proof_commitment
from node.weights.client import make_http_client, probe_relay
from node.weights.serve import serve_weights
from node.weights.store import WeightStore

log = logging.getLogger("intellect.coordinator")

REJECTION_DETAIL = 300  # characters of a refusal's detail kept (and sent back)
MAX_REJECTIONS = 10_000  # newest refusals kept in the state file
REJECTION_LOG_EVERY = 10.0  # seconds between log lines about one sender's refusals
OUTSIDER_COOLDOWN = 10.0  # seconds between chain reads (and invites) for one sender that is no member

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'issued',     -- issued | submitted | superseded
    work_key TEXT,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_node ON tasks(node, status);
CREATE TABLE IF NOT EXISTS rollouts (
    work_key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    node TEXT NOT NULL,
    units INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    proof_commitment TEXT NOT NULL,
    mean_reward REAL NOT NULL,
    accepted_at REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'accepted',   -- accepted | recorded | dropped
    tx TEXT,
    note TEXT,
    trained INTEGER NOT NULL DEFAULT 0,        -- 0 not yet | 1 trained on | -1 never (stale, unreadable) | -2 failed the trainer's checks
    signature TEXT                             -- the node's RolloutClaim signature of the work key
);
CREATE TABLE IF NOT EXISTS completions (       -- every accepted completion, to judge copies across files
    prompt TEXT NOT NULL,                      -- sha256 of the prompt token ids
    completion TEXT NOT NULL,                  -- sha256 of prompt and completion token ids
    work_key TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS completions_prompt ON completions(prompt);
CREATE INDEX IF NOT EXISTS completions_completion ON completions(completion);
CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts(status);
CREATE TABLE IF NOT EXISTS rejections (
    at REAL NOT NULL, node TEXT NOT NULL, reason TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    version INTEGER PRIMARY KEY,               -- the version this step produced
    mean_reward REAL NOT NULL,
    files INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    stale INTEGER NOT NULL,
    versions TEXT NOT NULL,                    -- policy versions of the rollouts trained on
    seconds REAL NOT NULL,
    manifest_hash TEXT NOT NULL,
    at REAL NOT NULL,
    verified INTEGER NOT NULL DEFAULT 0        -- of the samples, those the trainer's checks passed
);
CREATE TABLE IF NOT EXISTS invalidated (       -- WorkInvalidated events of this pool, with the node we accepted it from
    work_key TEXT PRIMARY KEY, node TEXT, block INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS invites (
    node TEXT PRIMARY KEY, nonce TEXT NOT NULL, expiry INTEGER NOT NULL, signature TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (          -- the pool's validators' evidence documents we keep and serve
    hash TEXT PRIMARY KEY, work_key TEXT NOT NULL, sender TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_work_key ON evidence(work_key);
"""


@dataclass
class CoordinatorConfig:
    pool_id: int
    data_dir: Path
    rpc_url: str
    deployment: Deployment
    listen: str = "/ip4/127.0.0.1/tcp/0"
    # The task terms: None takes the pool's task spec's; a value that disagrees with it refuses to start
    # (validators check work against the spec, so tasks under other terms would all be invalidated).
    model: str | None = None
    env: str | None = None
    prompts: int = 4
    group_size: int | None = None
    sampling: dict[str, Any] | None = None
    task_ttl: float = 900.0
    invite_ttl: int = 3600
    record_every: float = 2.0
    batch_size: int = 256
    eject_after: float = 600.0
    heartbeat_grace: float = 120.0
    async_level: int | None = None
    policy_version: int = 0
    max_rollout_bytes: int = 16 * 1024 * 1024
    rpc_wait: float = 60.0
    train: bool = False
    train_files: int = 2
    lr: float = 2e-4
    weights_host: str = "127.0.0.1"
    weights_port: int = 0
    weights_rate: float | None = None
    keep_checkpoints: int = 4  # newest checkpoints always served
    keep_checkpoint_seconds: float = 6 * 3600.0  # and every version current within this long
    blacklist_after: int = 0  # invalidated records after which a node gets no task and is blacklisted (0: never)
    orphan_after: float = 600.0  # an upload no accepted rollout names is deleted after this long
    thresholds: str | None = None  # calibrated thresholds for the trainer's checks (default: the spec model's)
    seed: int | None = None  # fixed task seeds (reproducible experiments); None: unpredictable


class Coordinator:
    def __init__(self, cfg: CoordinatorConfig, key: LocalAccount, metrics: Any = None) -> None:
        self.cfg = cfg
        self.key = key
        self.metrics = metrics
        self._parse_limiter = trio.CapacityLimiter(4)  # rollout files parsed at once on submission
        self._member_hosts: tuple[float, set[str]] = (-1e9, set())
        self.store = Store(cfg.data_dir / "coordinator.db", SCHEMA)
        self.store.add_column("rollouts", "signature", "TEXT")
        self.store.add_column("steps", "verified", "INTEGER NOT NULL DEFAULT 0")
        self.blobs = BlobStore(cfg.data_dir / "blobs", cfg.max_rollout_bytes)
        # evidence documents by hash: the trainer's own verdicts and those the pool's validators publish
        self.evidence = BlobStore(cfg.data_dir / "evidence", MAX_SERVED_EVIDENCE_BYTES, suffix=".json")
        self.spec: TaskSpec | None = None
        self.env: Any = get_env(cfg.env) if cfg.env else None
        self.tools: ModelTools | None = None
        self.checks: Any = None  # node.verify.FileChecks for the trainer (set when training)
        self._recording = trio.Lock()
        self._rejection_logged: dict[str, float] = {}
        self.chain: ChainClient | None = None
        self.membership: ChainMembership | None = None
        self.net: PoolNetwork | None = None
        self.rejected: Counter[str] = Counter()
        self.heartbeats: dict[str, float] = {}
        self.started_at = time.time()
        self.ready = trio.Event()
        self.last_error = ""
        self.trainer: Any = None
        self.weights = WeightStore(cfg.data_dir / "weights", keep=cfg.keep_checkpoints)
        self.origin_url: str | None = None
        self.relays = RelayBook()
        self._announce_now = trio.Event()
        self.outsiders: dict[str, float] = {}
        self.invite_replies: dict[str, tuple[float, bytes]] = {}
        self._unfunded_warned = -1e9

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        counts = self.store.counts("rollouts")
        per_node: dict[str, dict[str, int]] = {}
        for r in self.store.query("SELECT node, status, COUNT(*), SUM(units) FROM rollouts GROUP BY node, status"):
            d = per_node.setdefault(r[0], {})
            d[r[1]] = int(r[2])
            d[f"{r[1]}_units"] = int(r[3] or 0)
        rewards = self.store.query("SELECT AVG(mean_reward) FROM rollouts WHERE status IN ('accepted','recorded')")
        return {
            "role": "coordinator",
            "pool": self.cfg.pool_id,
            "address": self.key.address,
            "ready": self.ready.is_set(),
            "listen": self.net.listen_addrs if self.net else [],
            "peers": len(self.net.node.peers) if self.net else 0,
            "members": sorted(self.membership.snapshot().members) if self.membership and self.membership.loaded else [],
            "tasks_issued": int(self.store.scalar("SELECT COUNT(*) FROM tasks") or 0),
            "rollouts": counts,
            "per_node": per_node,
            "rejected": dict(self.rejected),
            "mean_reward": rewards[0][0] if rewards and rewards[0][0] is not None else None,
            "policy_version": self.cfg.policy_version,
            "training": self.cfg.train,
            "reward_curve": [
                round(float(r[0]), 4) for r in self.store.query("SELECT mean_reward FROM steps ORDER BY version")
            ],
            "trained_versions": [
                json.loads(r[0]) for r in self.store.query("SELECT versions FROM steps ORDER BY version")
            ],
            "stale_never_trained": int(self.store.scalar("SELECT COUNT(*) FROM rollouts WHERE trained = -1") or 0),
            # rollouts the trainer's checks refused, per node, and the samples trained / verified before training
            "trainer_refused": {
                str(r[0]): int(r[1])
                for r in self.store.query("SELECT node, COUNT(*) FROM rollouts WHERE trained = -2 GROUP BY node")
            },
            # rollouts that went into a policy step having passed the trainer's checks, per node (a group
            # whose rewards are all equal has no advantage and trains no sample, but was still taken)
            "trainer_took": {
                str(r[0]): int(r[1])
                for r in self.store.query("SELECT node, COUNT(*) FROM rollouts WHERE trained = 1 GROUP BY node")
            },
            "samples_trained": int(self.store.scalar("SELECT COALESCE(SUM(samples), 0) FROM steps") or 0),
            "samples_verified": int(self.store.scalar("SELECT COALESCE(SUM(verified), 0) FROM steps") or 0),
            "relays": sorted(self.relays.live(time.time())),
            "relays_refused": self.relays.refused(time.time()),
            "rollout_versions": self._rollout_versions(),
            "txs": self.store.journal.counts(),
            "gossip_rejected": {str(k): v for k, v in self.net.rejected.items()} if self.net else {},
            "last_error": self.last_error,
        }

    def _rollout_versions(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for node, v in self.store.query("SELECT node, policy_version FROM rollouts ORDER BY accepted_at"):
            out.setdefault(node, []).append(int(v))
        return out

    def _count(self, name: str, value: float = 1.0, **labels: str) -> None:
        count(self.metrics, name, value, **labels)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        self.chain = await connect_chain(
            cfg.rpc_url, cfg.deployment, self.key, journal=self.store.journal, wait=cfg.rpc_wait, what="coordinator"
        )
        try:
            settled = await settle_journal(self.store.journal, self.chain.sender)  # type: ignore[arg-type]
            if settled:
                log.info("settled %d transaction(s) sent before a restart", len(settled))
            info = await ops.pool_info(self.chain, cfg.pool_id)
            if info["coordinator"].lower() != self.key.address.lower():
                raise ChainError(
                    f"{self.key.address} is not the coordinator of pool {cfg.pool_id} (that is {info['coordinator']})",
                    "run the coordinator with the pool's coordinator key",
                )
            if info["statusName"] != "active":
                raise ChainError(
                    f"pool {cfg.pool_id} is {info['statusName']}, not active",
                    "start it with `intellect-node pool start`",
                )
            self.load_spec(await self.fetch_spec(info))
            self.tools = await trio.to_thread.run_sync(model_tools, cfg.model)
            if cfg.train:
                self.checks = self.training_checks()
            cfg.policy_version = int(self.store.get("policy_version", "0") or 0)
            self.membership = ChainMembership(self.chain, cfg.pool_id, interval=1.0)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.membership.run)
                if cfg.train:
                    port = await nursery.start(
                        functools.partial(
                            serve_weights, self.weights, cfg.weights_host, cfg.weights_port,
                            rate_limit_bytes_per_s=cfg.weights_rate, relay_hosts=self.relay_hosts,
                            member_hosts=self.member_hosts,
                        )
                    )  # fmt: skip
                    self.origin_url = f"http://{cfg.weights_host}:{port}"
                    self.trainer = await trio.to_thread.run_sync(self._load_trainer)
                    log.info(
                        "training on: policy version %d, weights served at %s", cfg.policy_version, self.origin_url
                    )
                self.net = PoolNetwork(
                    private_key=bytes(self.key.key),
                    pool=cfg.pool_id,
                    membership=self.membership.snapshot,
                    listen=cfg.listen,
                    max_connections=COORDINATOR_MAX_CONNECTIONS,  # every worker and validator dials it
                )
                async with self.net:
                    serve_blobs(self.net.node, self.blobs, max_uploads=32, allow=self.may_use_blobs)
                    serve_evidence(self.net, self.evidence)
                    self.net.node.set_handler(protocol.INVITE_PROTOCOL, self._on_invite)
                    self.net.node.set_handler(protocol.TASK_PROTOCOL, self._on_task)
                    self.net.node.set_handler(protocol.SUBMIT_PROTOCOL, self._on_submit, timeout=60.0)
                    self.net.node.set_handler(protocol.SIGNATURE_PROTOCOL, self._on_signature)
                    nursery.start_soon(self._record_loop)
                    nursery.start_soon(self._heartbeat_loop)
                    nursery.start_soon(self._evidence_loop)
                    nursery.start_soon(self._eject_loop)
                    nursery.start_soon(self._policy_loop)
                    nursery.start_soon(self._orphan_loop)
                    if cfg.train:
                        nursery.start_soon(self._train_loop)
                        nursery.start_soon(self._relay_probe_loop)
                    log.info("coordinator of pool %d listening on %s", cfg.pool_id, ", ".join(self.net.listen_addrs))
                    self.ready.set()
                    task_status.started(self.net.listen_addrs)
                    await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self.chain.aclose()
                self.store.close()

    async def fetch_spec(self, info: dict[str, Any]) -> TaskSpec:
        try:
            return await pool_spec(info)
        except TaskSpecError as exc:
            raise TaskSpecError(exc.message, exc.hint or "serve the spec at the pool's spec URI") from None

    def load_spec(self, spec: TaskSpec) -> None:
        """Take the task terms from the pool's spec; a configured value that differs is an error."""
        cfg = self.cfg
        wanted = {
            "model": (cfg.model, spec.model),
            "env": (cfg.env, spec.env),
            "group_size": (cfg.group_size, spec.group_size),
            "async_level": (cfg.async_level, spec.async_level),
        }
        for k, v in (cfg.sampling or {}).items():
            wanted[f"sampling.{k}"] = (v, spec.sampling.get(k))
        wrong = [f"{k} {mine!r} (the spec says {theirs!r})" for k, (mine, theirs) in wanted.items()
                 if mine is not None and mine != theirs]  # fmt: skip
        if wrong:
            raise ConfigError(
                f"pool {cfg.pool_id}'s task spec disagrees with this coordinator's settings: {', '.join(wrong)}",
                "leave those options out (the spec's values are used), or create a pool with another spec",
            )
        cfg.model, cfg.env, cfg.group_size, cfg.async_level = spec.model, spec.env, spec.group_size, spec.async_level
        cfg.sampling = dict(spec.sampling)
        self.spec = spec
        self.env = get_env(spec.env)

    def training_checks(self) -> Any:
        """The checks the trainer runs on every sample before it trains on it (the validator's, from the
        same spec and thresholds). A pool whose model has no calibrated thresholds cannot train safely."""
        from node.verify import Calibrated, pool_checks

        assert self.spec is not None and self.tools is not None
        try:
            calibrated = Calibrated.load(self.cfg.thresholds or self.spec.model)
        except ConfigError as exc:
            raise ConfigError(
                f"cannot train pool {self.cfg.pool_id}: {exc.message}",
                "the trainer checks every rollout with the validators' thresholds; pass --thresholds FILE",
            ) from None
        return pool_checks(self.spec, self.tools, calibrated)

    # ------------------------------------------------------------------ request handlers

    async def _on_invite(self, request: bytes, sender: str) -> bytes:
        """An invite (or the reason there is none). The one request outsiders may make, so its answer is
        cached per sender for `OUTSIDER_COOLDOWN` seconds: asking again costs no chain read."""
        now = time.monotonic()
        cached = self.invite_replies.get(sender)
        if cached is not None and now - cached[0] < OUTSIDER_COOLDOWN:
            return cached[1]
        if len(self.invite_replies) > 10_000:
            self.invite_replies.clear()
        reply = await self._invite_reply(sender)
        self.invite_replies[sender] = (now, reply)
        return reply

    async def _invite_reply(self, sender: str) -> bytes:
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        try:
            membership = await c.call("PoolManager", "membershipOf", sender)
            if int(membership["poolId"]) == pool:
                return protocol.ok(member=True)
            if int(membership["poolId"]) != 0:
                return protocol.refuse(
                    f"node {sender} is in pool {membership['poolId']}", "leave that pool first (`node leave`)"
                )
            provider = await c.call("ProviderRegistry", "providerOf", sender)
            if int(provider, 16) == 0:
                return protocol.refuse(f"node {sender} is not bound to a provider", "bind it with `node add` first")
            if await c.call("PoolManager", "isBlacklisted", pool, sender):
                return protocol.refuse(f"node {sender} is blacklisted in pool {pool}")
            stake = int(await c.call("ProviderRegistry", "stakeOf", provider))
            need = int((await c.call("PoolManager", "getPool", pool))["minStake"])
            if stake < need:
                return protocol.refuse(
                    f"provider {provider} stakes {stake} base units, pool {pool} needs {need}", "stake more"
                )
            now = await c.timestamp()
            row = self.store.one("SELECT * FROM invites WHERE node = ?", (sender,))
            if (
                row is not None
                and int(row["expiry"]) > now + 60
                and not await c.call("PoolManager", "isInviteUsed", pool, int(row["nonce"]))
            ):
                inv = {"nonce": int(row["nonce"]), "expiry": int(row["expiry"]), "signature": row["signature"]}
            else:
                invite = await ops.make_invite(c, self.key, pool, sender, self.cfg.invite_ttl)
                self.store.execute(
                    "INSERT INTO invites(node, nonce, expiry, signature) VALUES(?, ?, ?, ?) "
                    "ON CONFLICT(node) DO UPDATE SET nonce=excluded.nonce, expiry=excluded.expiry, "
                    "signature=excluded.signature",
                    (sender, str(invite.nonce), invite.expiry, invite.signature),
                )
                inv = {"nonce": invite.nonce, "expiry": invite.expiry, "signature": invite.signature}
            log.info("invite for node %s to pool %d", sender, pool)
            return protocol.ok(member=False, invite=inv)
        except RpcUnavailable:
            return protocol.refuse("the coordinator cannot reach its chain node right now", "retry in a minute")

    async def _is_member(self, node: str) -> bool:
        """From the membership snapshot; a sender not in it (maybe one that joined a second ago) costs
        at most one chain read per `OUTSIDER_COOLDOWN` seconds, whatever it sends."""
        assert self.membership is not None and self.chain is not None
        if node in self.membership.snapshot().members:
            return True
        now = time.monotonic()
        if now - self.outsiders.get(node, -1e9) < OUTSIDER_COOLDOWN:
            return False
        if len(self.outsiders) > 10_000:
            self.outsiders.clear()
        self.outsiders[node] = now
        member = bool(await self.chain.call("PoolManager", "isMember", self.cfg.pool_id, node))
        if member:
            self.outsiders.pop(node, None)
        return member

    def may_use_blobs(self, sender: str) -> bool:
        """Uploads and downloads: members (their own rollouts) and validators (to check them) only."""
        assert self.membership is not None
        return self.membership.snapshot().role(sender) is not None

    async def _on_task(self, request: bytes, sender: str) -> bytes:
        cfg = self.cfg
        try:
            if not await self._is_member(sender):
                return protocol.refuse(f"node {sender} is not a member of pool {cfg.pool_id}", "join the pool first")
        except RpcUnavailable:
            return protocol.refuse("the coordinator cannot reach its chain node right now", "retry in a minute")
        if 0 < cfg.blacklist_after <= self.invalidations(sender):
            return protocol.refuse(f"node {sender} had {self.invalidations(sender)} record(s) invalidated in this pool")
        now = time.time()
        row = self.store.one(
            "SELECT task_id, body FROM tasks WHERE node = ? AND status = 'issued' AND expires_at > ? "
            "ORDER BY expires_at DESC",
            (sender, now + 30),
        )
        if row is not None:  # the open task again: asking twice never yields a second seed to pick from
            open_task = protocol.unpack(bytes.fromhex(row["body"]), "task")
            if int(open_task.get("policy_version", 0)) >= cfg.policy_version - cfg.async_level:
                return protocol.ok(task=open_task)
            # The policy moved on since it was issued (the worker was down): its rollouts could never be
            # trained on and the versions it allows may be gone, so it is replaced by a fresh one.
            self.store.execute("UPDATE tasks SET status = 'superseded' WHERE task_id = ?", (row["task_id"],))
            log.info("task %s of %s superseded: issued at policy version %s", row["task_id"], sender,
                     open_task.get("policy_version"))  # fmt: skip
        if cfg.train and self.backlog(now) >= cfg.train_files * (cfg.async_level + 1):
            # Asynchrony is bounded: no more work is handed out than the trainer can consume before the
            # policy moves `async_level` versions on; workers wait instead of generating stale rollouts.
            return protocol.ok(retry_after=2.0, reason="waiting for the trainer")
        task = protocol.Task(
            task_id="t-" + secrets.token_hex(8),
            pool_id=cfg.pool_id,
            node=sender,
            env=cfg.env,
            seed=self._task_seed(),
            prompts=cfg.prompts,
            group_size=cfg.group_size,
            sampling=dict(cfg.sampling),
            policy_version=cfg.policy_version,
            model=cfg.model,
            issued_at=now,
            expires_at=now + cfg.task_ttl,
            min_policy_version=max(0, cfg.policy_version - cfg.async_level),
        )
        body = protocol.pack(task.to_wire())
        self.store.execute(
            "INSERT INTO tasks(task_id, node, body, expires_at) VALUES(?, ?, ?, ?)",
            (task.task_id, sender, body.hex(), task.expires_at),
        )
        self._count("tasks_issued")
        return protocol.ok(task=task.to_wire())

    def _task_seed(self) -> int:
        """The seed the next task's problems are drawn from. Unpredictable by default, so a worker cannot
        prepare answers ahead; with `seed` set, the n-th task issued gets sha256(seed, n), the same
        sequence of problems on every run (and across restarts: n is counted in the state file)."""
        if self.cfg.seed is None:
            return secrets.randbits(62)
        n = int(self.store.scalar("SELECT COUNT(*) FROM tasks") or 0)
        digest = hashlib.sha256(f"intellect-node task seed {self.cfg.seed} {n}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 2

    def backlog(self, now: float) -> int:
        """Rollouts the trainer has not consumed yet: accepted-untrained plus tasks still open."""
        untrained = self.store.scalar(
            "SELECT COUNT(*) FROM rollouts WHERE trained = 0 AND status IN ('accepted', 'recorded')"
        )
        open_tasks = self.store.scalar("SELECT COUNT(*) FROM tasks WHERE status = 'issued' AND expires_at > ?", (now,))
        return int(untrained or 0) + int(open_tasks or 0)

    def _reject(self, sender: str, reason: str, detail: str) -> bytes:
        """Count a refused submission and keep a bounded record of it: the sender's text is cut to
        `REJECTION_DETAIL` characters, the table to the newest `MAX_REJECTIONS` rows, and one sender gets
        a log line at most every `REJECTION_LOG_EVERY` seconds (a member that spams refusals costs us
        neither disk nor log)."""
        self.rejected[reason] += 1
        self._count("rollouts_rejected", reason=reason)
        detail = detail[:REJECTION_DETAIL]
        self.store.execute_many(
            [
                ("INSERT INTO rejections(at, node, reason, detail) VALUES(?, ?, ?, ?)",
                 (time.time(), sender, reason, detail)),
                ("DELETE FROM rejections WHERE rowid <= (SELECT MAX(rowid) FROM rejections) - ?", (MAX_REJECTIONS,)),
            ]
        )  # fmt: skip
        now = time.monotonic()
        if now - self._rejection_logged.get(sender, -1e9) >= REJECTION_LOG_EVERY:
            self._rejection_logged[sender] = now
            if len(self._rejection_logged) > 10_000:
                self._rejection_logged.pop(next(iter(self._rejection_logged)))
            log.info("rejected a rollout from %s: %s (%s)", sender, reason, detail)
        return protocol.refuse(f"rollout rejected: {reason}: {detail}")

    def claim(self, key: str) -> RolloutClaim:
        assert self.chain is not None
        return ops.rollout_claim(self.chain, self.cfg.pool_id, key)

    async def _on_signature(self, request: bytes, sender: str) -> bytes:
        """The node's signature of an accepted file, for validators (and members) only."""
        assert self.membership is not None
        if self.membership.snapshot().role(sender) is None:
            return protocol.refuse("signatures are served to the pool's validators and members")
        key = protocol.unpack(request, "signature request").get("work_key")
        row = (
            self.store.one("SELECT signature FROM rollouts WHERE work_key = ?", (key,))
            if isinstance(key, str)
            else None
        )
        if row is None or not row["signature"]:
            return protocol.refuse(f"no signed rollout {key!r} here")
        return protocol.ok(signature=row["signature"])

    def _prior(self, f: RolloutFile) -> tuple[dict[Any, int], dict[Any, int]]:
        """Draws of each of the file's prompts and copies of each of its completions in accepted files."""
        draws: dict[Any, int] = {}
        copies: dict[Any, int] = {}
        for s in f.samples:
            p, c = completion_hashes(s)
            pk, ck = tuple(s.prompt_tokens), (tuple(s.prompt_tokens), tuple(s.completion_tokens))
            if pk not in draws:
                draws[pk] = int(self.store.scalar("SELECT COUNT(*) FROM completions WHERE prompt = ?", (p,)) or 0)
            if ck not in copies:
                copies[ck] = int(self.store.scalar("SELECT COUNT(*) FROM completions WHERE completion = ?", (c,)) or 0)
        return draws, copies

    async def _on_submit(self, request: bytes, sender: str) -> bytes:
        assert self.tools is not None and self.membership is not None
        try:
            if not await self._is_member(sender):
                return protocol.refuse(f"node {sender} is not a member of pool {self.cfg.pool_id}")
        except RpcUnavailable:
            return protocol.refuse("the coordinator cannot reach its chain node right now", "retry in a minute")
        req = protocol.unpack(request, "submission")
        key, task_id, signature = req.get("work_key"), req.get("task_id"), req.get("signature")
        if not isinstance(key, str) or not isinstance(task_id, str) or not re.fullmatch(r"0x[0-9a-f]{64}", key):
            return protocol.refuse("malformed submission: work_key (0x + 64 lowercase hex) and task_id are required")
        done = self.store.one("SELECT status FROM rollouts WHERE work_key = ?", (key,))
        if done is not None:
            return protocol.ok(status="duplicate", work_key=key)
        trow = self.store.one("SELECT * FROM tasks WHERE task_id = ?", (task_id,))
        if trow is None or trow["node"] != sender:
            return self._reject(sender, "unknown-task", f"task {task_id} was not issued to {sender}")
        if trow["status"] == "superseded":
            return self._reject(sender, "task-superseded", f"task {task_id} was replaced after the policy moved on")
        if trow["status"] != "issued":
            return self._reject(sender, "task-done", f"task {task_id} already has rollout {trow['work_key']}")
        if not self.claim(key).signed_by(signature, sender):
            # Without it, a validator could never show the file is the node's: the node could deny it, or
            # we could be accused of recording work it never made.
            return self._reject(sender, "unsigned", "the submission carries no valid signature of the node's key")
        data = self.blobs.get(key)
        if data is None:
            return protocol.refuse(f"rollout {key} has not been uploaded", "upload it before submitting")
        try:  # in a thread (a hostile file costs its decode budget in CPU), a few at a time (and in memory)
            f = await trio.to_thread.run_sync(
                functools.partial(RolloutFile.from_bytes, data, max_bytes=self.cfg.max_rollout_bytes),
                limiter=self._parse_limiter,
            )
        except RolloutFormatError as exc:
            self.blobs.delete(key)
            return self._reject(sender, "malformed", str(exc))
        task = protocol.Task.from_wire(protocol.unpack(bytes.fromhex(trow["body"]), "task"))
        tools = self.tools
        draws, copies = self._prior(f)
        decision = await trio.to_thread.run_sync(
            lambda: protocol.check_submission(
                f,
                task,
                sender=sender,
                now=time.time(),
                current_policy=self.cfg.policy_version,
                async_level=self.cfg.async_level,
                env=self.env,
                encode_prompt=tools.encode,
                decode=tools.decode,
                vocab_size=tools.vocab_size,
                prior_draws=draws,
                prior_copies=copies,
            )
        )
        if not decision.accepted:
            self.blobs.delete(key)
            return self._reject(sender, decision.reason, decision.detail)
        commitment = "0x" + proof_commitment([p for s in f.samples for p in s.proofs]).hex()
        mean_reward = sum(s.reward for s in f.samples) / len(f.samples)
        self.store.execute_many(
            [
                (
                    "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, "
                    "mean_reward, accepted_at, signature) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, task_id, sender, f.units, f.header.policy_version, commitment, mean_reward, time.time(),
                     signature),
                ),
                ("UPDATE tasks SET status = 'submitted', work_key = ? WHERE task_id = ?", (key, task_id)),
            ]
            + [
                ("INSERT INTO completions(prompt, completion, work_key) VALUES(?, ?, ?)", (*completion_hashes(s), key))
                for s in f.samples
            ]
        )  # fmt: skip
        self._count("rollouts_accepted")
        self._count("tokens_generated", f.units)
        log.info("accepted rollout %s from %s: %d units, mean reward %.3f", key[:12], sender, f.units, mean_reward)
        return protocol.ok(status="accepted", work_key=key, units=f.units)

    # ------------------------------------------------------------------ loops

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
        return int(self.store.scalar("SELECT COUNT(*) FROM invalidated WHERE node = ?", (node,)) or 0)

    async def follow_invalidations(self) -> int:
        """Read the pool's `WorkInvalidated` events: the node of each invalidated record (from our own
        rows) has its untrained rollouts dropped, and after `blacklist_after` of them it gets no more tasks
        and is blacklisted on chain. Returns how many new invalidations were read."""
        assert self.chain is not None
        # bounded reads: a long outage is caught up in several rounds
        got = await new_ledger_events(
            self.chain, self.store, "invalidation_cursor", self.cfg.pool_id, "WorkInvalidated", max_blocks=10_000
        )
        if got is None:
            return 0
        events, move = got
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        nodes: set[str] = set()
        for ev in events:
            key = str(ev.args["workKey"])
            row = self.store.one("SELECT node FROM rollouts WHERE work_key = ?", (key,))
            node = row["node"] if row is not None else None
            stmts.append(("INSERT OR IGNORE INTO invalidated(work_key, node, block) VALUES(?, ?, ?)",
                          (key, node, ev.block_number)))  # fmt: skip
            if node is not None:
                nodes.add(node)
                stmts.append(
                    (
                        "UPDATE rollouts SET trained = -1, note = 'node had work invalidated' "
                        "WHERE node = ? AND trained = 0",
                        (node,),
                    )
                )
        self.store.execute_many(stmts + move)
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
            n = self.store.scalar("SELECT COUNT(*) FROM rollouts WHERE status = 'accepted' AND node = ?", (node,))
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
        rows = self.store.query(
            "SELECT * FROM rollouts WHERE status = 'accepted' AND (? IS NULL OR node = ?) ORDER BY accepted_at LIMIT ?",
            (node, node, self.cfg.batch_size),
        )
        if not rows:
            return 0
        todo = []
        for r in rows:
            rec = await retry_rpc(lambda r=r: ops.record(c, pool, r["work_key"]), "record lookup")
            if rec["status"] != 0:  # recorded by a batch whose receipt a crash kept us from seeing
                self.store.execute("UPDATE rollouts SET status = 'recorded' WHERE work_key = ?", (r["work_key"],))
                continue
            why = int(await retry_rpc(lambda r=r: c.call("WorkLedger", "recordable", pool, r["node"]), "recordable"))
            if why != 0:
                # 1: not a member any more; 2: its provider's stake fell below the pool's minimum (only a
                # slash can do that: unstaking below it is refused), and the ledger records nothing then.
                note = "node left the pool before recording" if why == 1 else "provider's stake is below the minimum"
                self.store.execute(
                    "UPDATE rollouts SET status = 'dropped', note = ? WHERE work_key = ?", (note, r["work_key"])
                )
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
        self.store.execute_many(
            [("UPDATE rollouts SET status = 'recorded', tx = ? WHERE work_key = ?", (tx, r["work_key"])) for r in todo]
        )
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
            if self.store.one("SELECT 1 FROM rollouts WHERE work_key = ?", (key,)) is None:
                self.blobs.delete(key)
                n += 1
        if n:
            log.info("deleted %d uploaded blob(s) that were never accepted", n)
        return n

    async def _heartbeat_loop(self) -> None:
        assert self.net is not None
        async for env in self.net.subscribe("heartbeat"):
            self._on_heartbeat(env)

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
        self.store.execute(
            "INSERT OR IGNORE INTO evidence(hash, work_key, sender, at) VALUES(?, ?, ?, ?)",
            (digest, key, sender.lower(), time.time()),
        )
        return True

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
        rows = self.store.query("SELECT version, manifest_hash FROM steps ORDER BY version DESC LIMIT ?", (HISTORY,))
        return {int(r[0]): str(r[1]) for r in rows}

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

    # ------------------------------------------------------------------ training

    def _load_trainer(self) -> Any:
        from pool.grpo import Trainer

        assert self.tools is not None
        v = self.cfg.policy_version
        ckpts = self.cfg.data_dir / "checkpoints"
        source = ckpts / f"v{v}" if v > 0 else self.tools.path
        trainer = Trainer(source, lr=self.cfg.lr, async_level=self.cfg.async_level, seed=v, checks=self.checks)
        if trainer.load_optimizer(source):
            log.info("resumed the optimizer state of policy version %d", v)
        elif v > 0:
            log.warning("no optimizer state saved with policy version %d: AdamW starts afresh", v)
        # after a restart: the weights of the versions rollouts may still come from, for their old log-probs
        for old in range(max(0, v - self.cfg.async_level), v):
            folder = ckpts / f"v{old}" if old > 0 else self.tools.path
            if (folder / "model.safetensors").is_file():
                trainer.remember(old, folder)
        return trainer

    def retained_versions(self, new: int, now: float) -> set[int]:
        """Versions whose checkpoints stay served (beyond the newest `keep_checkpoints`) once `new` is
        published: every version that was current within the last `keep_checkpoint_seconds`. Rollouts
        come from such versions, and a validator that was down or behind must still be able to fetch
        the weights a rollout claims before its validation deadline."""
        rows = self.store.query("SELECT version FROM steps WHERE at >= ?", (now - self.cfg.keep_checkpoint_seconds,))
        recent = {int(r[0]) for r in rows} | {new}
        return recent | {w - 1 for w in recent if w > 0}

    async def _train_loop(self) -> None:
        while True:
            await trio.sleep(1.0)
            try:
                await self.train_step()
            except Exception as exc:
                self.last_error = f"training: {exc!r}"
                log.exception("training step failed (will retry)")
                await trio.sleep(5.0)

    async def train_step(self) -> bool:
        """One GRPO step on the oldest untrained rollouts, if there are enough; publishes the new version.

        Rollouts more than `async_level` versions behind are marked stale and never trained on. The
        new version is committed (rows marked trained, the step recorded, the version bumped) in one
        sqlite transaction after its checkpoint is saved and published; a crash before that commit
        retrains the same rollouts (the version it may have published is dropped first), a crash after
        it only delays the announcement. A step that fails in between (a full disk) leaves the trainer at
        the last committed version."""
        cfg = self.cfg
        v = cfg.policy_version
        self.store.execute(
            "UPDATE rollouts SET trained = -1 WHERE trained = 0 AND policy_version < ?", (v - cfg.async_level,)
        )
        rows = self.store.query(
            "SELECT work_key FROM rollouts WHERE trained = 0 AND status IN ('accepted', 'recorded') "
            "ORDER BY accepted_at LIMIT ?",
            (cfg.train_files,),
        )
        if len(rows) < cfg.train_files:
            return False
        keys, files = [], []
        for k in (r[0] for r in rows):
            data = self.blobs.get(k)
            try:
                if data is None:
                    raise RolloutFormatError("its blob is gone")
                files.append(RolloutFile.from_bytes(data, max_bytes=cfg.max_rollout_bytes))
                keys.append(k)
            except RolloutFormatError as exc:  # never retried for ever: dropped from training, once
                log.error("rollout %s cannot be trained on (%s); dropped from training", k[:12], exc)
                self.store.execute("UPDATE rollouts SET trained = -1, note = ? WHERE work_key = ?", (str(exc)[:200], k))
        if len(files) < cfg.train_files:
            return False
        new = v + 1
        if new in self.weights.versions():  # published by an attempt that died before its commit
            log.warning("dropping policy version %d, published but never committed by an earlier attempt", new)
            self.weights.remove(new)
        stats = await trio.to_thread.run_sync(self.trainer.step, files, v)
        failed = {keys[i]: verdict for i, verdict in stats.rejected}
        protect = self.retained_versions(new, time.time())
        try:
            manifest = await self._publish_step(new, protect)
            self._commit_step(new, keys, files, stats, manifest.manifest_hash(), failed)
        except Exception:
            # The trainer in memory has taken a step that is not committed (a full disk, say): go back to
            # the last committed version, so that the retry trains on these rollouts once, not twice.
            self.weights.remove(new)
            self.trainer = await trio.to_thread.run_sync(self._load_trainer)
            raise
        from pool.grpo import OPTIMIZER_FILE

        self._announce_now.set()
        for key, verdict in failed.items():
            await self._report_failed(key, verdict)
        for old in sorted((cfg.data_dir / "checkpoints").glob("v*")):
            n = int(old.name[1:]) if old.name[1:].isdigit() else None
            if n is not None and n <= new - cfg.keep_checkpoints and n not in protect:
                shutil.rmtree(old, ignore_errors=True)
            elif n is not None and n < new:  # the optimizer state is only needed to resume from the newest
                (old / OPTIMIZER_FILE).unlink(missing_ok=True)
        log.info(
            "policy step -> version %d: mean reward %.3f over %d files (versions %s), %d samples trained, %.1f s",
            new, stats.mean_reward, len(files), sorted({f.header.policy_version for f in files}),
            stats.samples_trained, stats.seconds,
        )  # fmt: skip
        return True

    async def _report_failed(self, key: str, verdict: dict[str, Any]) -> None:
        """A rollout the trainer's checks refused: logged, its verdict kept, and published on the verdict
        topic, where validators take it as a reason to check that record themselves, whatever their
        sample rate. It is still recorded on chain: the node signed it, and a validator that agrees
        invalidates it and slashes the node (dropping it would make cheating free to try). The
        coordinator's word slashes nobody: validators judge the file themselves."""
        reason = verdict["verdict"]["reason"]
        record = {"work_key": key, "pool": self.cfg.pool_id, "by": "trainer", **verdict}
        folder = self.cfg.data_dir / "evidence"
        try:
            folder.mkdir(exist_ok=True)
            digest = write_evidence(folder, record)
        except OSError as exc:
            digest = evidence_hash(record)
            log.warning("could not keep the trainer's verdict on %s: %s", key[:12], exc)
        log.warning(
            "rollout %s of node %s failed the trainer's checks (%s): not trained on; reported to the validators",
            key[:12], self.store.scalar("SELECT node FROM rollouts WHERE work_key = ?", (key,)), reason,
        )  # fmt: skip
        self._count("trainer_rejected")
        if self.net is not None:
            msg = {"work_key": key, "ok": False, "reason": reason, "evidence": digest, "by": "trainer"}
            try:
                await self.net.publish("verdict", protocol.pack(msg))
            except Exception as exc:  # no peers: the validators still check it by their sample rate
                log.info("could not publish the trainer's verdict on %s: %r", key[:12], exc)

    async def _publish_step(self, new: int, protect: set[int]) -> Any:
        """Save the trainer's weights (and optimizer state) as checkpoint `new` and publish it on the
        weight server (pruning old versions but those in `protect`); returns the manifest."""
        trainer = self.trainer

        def save() -> Path:
            folder = trainer.save(self.cfg.data_dir / "checkpoints" / f"v{new}")
            trainer.save_optimizer(folder)
            return folder

        ckpt = await trio.to_thread.run_sync(save)
        # split in a worker thread; the store's maps and events change only here, in trio's thread (the
        # weight server reads them between our awaits, and a relay's waiters are trio events)
        manifest = await trio.to_thread.run_sync(self.weights.split_version, ckpt / "model.safetensors", new)
        gone = self.weights.adopt(manifest, protect)
        await trio.to_thread.run_sync(lambda: [shutil.rmtree(d, ignore_errors=True) for d in gone])
        return manifest

    def _commit_step(
        self,
        new: int,
        keys: list[str],
        files: list[Any],
        stats: Any,
        manifest_hash: str,
        failed: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """One transaction: the rollouts marked trained (or failed: never trained on; still recorded, so
        that validators slash their nodes), the step recorded, the version bumped."""
        cfg = self.cfg
        failed = failed or {}
        versions = sorted({f.header.policy_version for f in files})
        marks: list[tuple[str, tuple[Any, ...]]] = []
        for k in keys:
            if k in failed:
                note = f"failed the trainer's checks: {failed[k]['verdict']['reason']}"
                marks.append(("UPDATE rollouts SET trained = -2, note = ? WHERE work_key = ?", (note, k)))
            else:
                marks.append(("UPDATE rollouts SET trained = 1 WHERE work_key = ?", (k,)))
        self.store.execute_many(
            [
                *marks,
                (
                    "INSERT OR REPLACE INTO steps(version, mean_reward, files, samples, stale, versions, seconds, "
                    "manifest_hash, at, verified) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        new,
                        float(stats.mean_reward),
                        len(files),
                        int(stats.samples_trained),
                        int(stats.stale_rejected),
                        json.dumps(versions),
                        float(stats.seconds),
                        manifest_hash,
                        time.time(),
                        int(stats.verified),
                    ),
                ),
                (
                    "INSERT INTO kv(k, v) VALUES('policy_version', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                    (str(new),),
                ),
            ]
        )
        cfg.policy_version = new
        if self.metrics is not None:
            self.metrics.policy_version.set(new)
