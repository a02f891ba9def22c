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
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from eth_account.signers.local import LocalAccount

from node import protocol
from node.chain import ChainClient, ChainError, Deployment
from node.daemon import (
    count,
    open_pool_chain,
    serve_evidence,
)
from node.errors import ConfigError
from node.evidence import MAX_SERVED_EVIDENCE_BYTES
from node.inference.tools import ModelTools, model_tools
from node.p2p.blobs import BlobStore, serve_blobs
from node.p2p.host import COORDINATOR_MAX_CONNECTIONS
from node.p2p.membership import ChainMembership
from node.p2p.network import PoolNetwork
from node.p2p.rules import SenderBudget
from node.p2p.uploads import MIN_UPLOAD_RATE, UPLOAD_GRACE, UploadState
from node.policy import RelayBook
from node.tasks import get_env
from node.taskspec import TaskSpec, TaskSpecError, pool_spec
from node.weights.serve import serve_weights
from node.weights.store import WeightStore

from .intake import OUTSIDER_READS, REQUEST_BUDGETS, IntakeMixin
from .ledger import LedgerMixin
from .network import NetworkMixin
from .state import CoordinatorState
from .training import TrainingMixin

if TYPE_CHECKING:
    from node.verify import Calibrated

log = logging.getLogger("intellect.coordinator")


SMALL_REQUEST = 4096


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
    resend_margin: float = 30.0  # an open task with less life left than this is not sent again: a new one is
    lapse_limit: int = 2  # tasks a node may let expire unsubmitted within lapse_window before new ones wait
    lapse_window: float = 6 * 3600.0
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
    max_uploads: int = 32  # uploads in progress at once (one per member node with an open task)
    min_upload_rate: float = MIN_UPLOAD_RATE  # below it on average (after upload_grace s), a slot is given up
    upload_grace: float = UPLOAD_GRACE
    thresholds: Calibrated | None = None  # --thresholds, loaded, for the trainer's checks (None: the spec model's)
    seed: int | None = None  # fixed task seeds (reproducible experiments); None: unpredictable
    explorer: tuple[str, int] | None = None  # serve the pool's explorer here (`pool.explorer`)
    explorer_status: tuple[str, ...] = ()  # other daemons' /status pages it shows live


class Coordinator(IntakeMixin, LedgerMixin, NetworkMixin, TrainingMixin):
    def __init__(self, cfg: CoordinatorConfig, key: LocalAccount, metrics: Any = None) -> None:
        self.cfg = cfg
        self.key = key
        self.metrics = metrics
        self._parse_limiter = trio.CapacityLimiter(4)  # rollout files parsed at once on submission
        self._parsing: set[str] = set()  # nodes whose file is being parsed
        # task requests and submissions a member node may make: a flood of either (each one a database
        # read or write) is turned away before it costs more than its decoding
        self.request_budget = SenderBudget(REQUEST_BUDGETS)
        self._member_hosts: tuple[float, set[str]] = (-1e9, set())
        self.state = CoordinatorState(cfg.data_dir / "coordinator.db")
        self.store = self.state.store
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
        self.upload_state: UploadState | None = None  # uploads in progress (set when the network is up)
        self.net: PoolNetwork | None = None
        self.rejected: Counter[str] = Counter()
        self.heartbeats: dict[str, float] = {}
        self.started_at = time.time()
        self.ready = trio.Event()
        self.last_error = ""
        self.trainer: Any = None
        self.weights = WeightStore(cfg.data_dir / "weights", keep=cfg.keep_checkpoints)
        self.origin_url: str | None = None
        self.explorer_url: str | None = None
        self.relays = RelayBook()
        self._announce_now = trio.Event()
        self.outsiders: dict[str, float] = {}
        self.invite_replies: dict[str, tuple[float, bytes]] = {}
        self.outsider_reads = SenderBudget(OUTSIDER_READS)
        self._unfunded_warned = -1e9

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        figures = self.state.figures()
        return {
            "role": "coordinator",
            "pool": self.cfg.pool_id,
            "address": self.key.address,
            "ready": self.ready.is_set(),
            "listen": self.net.listen_addrs if self.net else [],
            "peers": len(self.net.node.peers) if self.net else 0,
            "members": sorted(self.membership.snapshot().members) if self.membership and self.membership.loaded else [],
            **figures,
            "rejected": dict(self.rejected),
            "policy_version": self.cfg.policy_version,
            "training": self.cfg.train,
            "relays": sorted(self.relays.live(time.time())),
            "relays_refused": self.relays.refused(time.time()),
            "txs": self.store.journal.counts(),
            "rpc": self.chain.rpc.health() if self.chain is not None else [],
            "gossip_rejected": {str(k): v for k, v in self.net.rejected.items()} if self.net else {},
            "explorer": self.explorer_url,
            "last_error": self.last_error,
        }

    async def _start_explorer(self, nursery: trio.Nursery) -> None:
        from pool.explorer.server import Explorer, serve_explorer

        assert self.chain is not None and self.cfg.explorer is not None
        ex = Explorer(
            self.chain,
            pools=(self.cfg.pool_id,),
            status_urls=self.cfg.explorer_status,
            status_fns=(self.status,),
            refresh=5.0,
        )
        host, port = self.cfg.explorer
        bound = await nursery.start(serve_explorer, ex, host, port)
        self.explorer_url = f"http://{host}:{bound}/pool/{self.cfg.pool_id}"
        log.info("pool explorer at %s", self.explorer_url)

    def _count(self, name: str, value: float = 1.0, **labels: str) -> None:
        count(self.metrics, name, value, **labels)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        self.chain, info = await open_pool_chain(cfg, self.key, self.store, "coordinator")
        try:
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
            await trio.to_thread.run_sync(self.env.prepare)  # e.g. the code sandbox: refused here if it cannot be
            self.tools = await trio.to_thread.run_sync(model_tools, cfg.model)
            if cfg.train:
                self.checks = self.training_checks()
            cfg.policy_version = int(self.store.get("policy_version", "0") or 0)
            self.membership = ChainMembership(self.chain, cfg.pool_id, interval=1.0)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.membership.run)
                if cfg.explorer is not None:
                    await self._start_explorer(nursery)
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
                    self.upload_state = serve_blobs(
                        self.net.node, self.blobs, max_uploads=cfg.max_uploads, allow=self.may_use_blobs,
                        may_upload=self.may_upload, submitted=self.state.has_rollout,
                        min_rate=cfg.min_upload_rate, grace=cfg.upload_grace,
                    )  # fmt: skip
                    serve_evidence(self.net, self.evidence)
                    self.net.node.set_handler(protocol.INVITE_PROTOCOL, self._on_invite)
                    # a task request or a submission is a few hundred bytes: a bigger frame is refused unread
                    self.net.node.set_handler(protocol.TASK_PROTOCOL, self._on_task, max_request=SMALL_REQUEST)
                    self.net.node.set_handler(
                        protocol.SUBMIT_PROTOCOL, self._on_submit, timeout=60.0, max_request=SMALL_REQUEST
                    )
                    self.net.node.set_handler(protocol.SIGNATURE_PROTOCOL, self._on_signature)
                    self.note_downtime(time.time())
                    nursery.start_soon(self.alive_loop)
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
        self.env = spec.environment()  # the version and content the spec pins, or refused

    def training_checks(self) -> Any:
        """The checks the trainer runs on every sample before it trains on it (the validator's, from the
        same spec and thresholds). A pool whose model has no calibrated thresholds cannot train safely."""
        from node.verify import Calibrated, pool_checks

        assert self.spec is not None and self.tools is not None
        try:
            calibrated = self.cfg.thresholds or Calibrated.for_spec(self.spec)
        except ConfigError as exc:
            raise ConfigError(
                f"cannot train pool {self.cfg.pool_id}: {exc.message}",
                "the trainer checks every rollout with the validators' thresholds; pass --thresholds FILE",
            ) from None
        return pool_checks(self.spec, self.tools, calibrated)

    # ------------------------------------------------------------------ request handlers

    # ------------------------------------------------------------------ loops

    # ------------------------------------------------------------------ training
