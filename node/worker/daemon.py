"""The worker daemon (`intellect-node join --pool ID`): a GPU (or CPU) becomes a verified, paid worker.

Start-up, each step idempotent (it reads chain state first, so a restart redoes nothing): register the
provider and stake the pool's minimum (after confirmation unless `--yes`), bind the node key, ask the
coordinator for an invite over p2p and join the pool. Then the loop: pull a task, generate with the
vLLM engine, score, prove with TOPLOC, write the rollout file to disk and to sqlite, upload it, submit
it, announce it on gossip. Alongside: heartbeats on gossip, and claims of every final reward.

Crash safety: a rollout is on disk and in the `rollouts` table before it is uploaded; on restart
every rollout not yet answered by the coordinator is uploaded and submitted again (the coordinator
treats a repeat as a duplicate). Transactions go through the durable journal.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from .. import ops, protocol
from ..chain import ChainClient, ChainError, Deployment
from ..chain.errors import RpcUnavailable
from ..chain.messages import tokens
from ..chain.signing import RolloutClaim
from ..daemon import (
    count,
    new_ledger_events,
    open_pool_chain,
    open_pool_network,
    pool_peers,
    retry_rpc,
)
from ..inference.tools import ModelTools
from ..inference.types import ContextTooShort
from ..p2p.blobs import BlobStore, serve_blobs
from ..p2p.host import Refused
from ..p2p.network import PoolNetwork
from ..policy import PolicyBook
from ..rollout.file import MAX_FILE_BYTES, RolloutFile, work_key
from ..store import DISK_FULL_PREFIX, write_file_when_room
from ..verify import PoolFileCheck
from .accusations import AccusationsMixin
from .generation import GenerationMixin, PolicyUnavailable
from .joining import JoiningMixin
from .rules import claim_step, recorded_for
from .state import WorkerState
from .submitting import SubmittingMixin

log = logging.getLogger("intellect.worker")

#: Chain seconds before a disputed record of ours is read again by the claim scan.
DISPUTE_RECHECK_S = 60


# Devnet adversaries: another model's weights; a hotter temperature than claimed; one completion per
# prompt copied to fill the group (paid as many); TOPLOC proofs that crash the reference verifier.
CHEATS = ("model", "temperature", "duplicate", "poison")


@dataclass
class WorkerConfig:
    pool_id: int
    data_dir: Path
    rpc_url: str
    deployment: Deployment
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: list[str] = field(default_factory=list)
    yes: bool = False
    steps: int = 0
    stake: int | None = None
    compute_units: int = 1
    cheat: str | None = None
    heartbeat_every: float = 5.0
    claim_every: float = 5.0
    connect_wait: float = 120.0
    rpc_wait: float = 60.0
    relay_host: str = "127.0.0.1"
    relay_port: int | None = None
    policy_wait: float = 300.0
    fresh_wait: float = 20.0
    outage_max_delay: float = 60.0  # longest back-off between tries while the coordinator is down
    self_check: float = 0.0  # share of our rollouts we run the validators' checks on before submitting


class Worker(JoiningMixin, GenerationMixin, AccusationsMixin, SubmittingMixin):
    def __init__(
        self,
        cfg: WorkerConfig,
        provider: LocalAccount,
        node: LocalAccount,
        *,
        confirm: Callable[[str], bool] | None = None,
        metrics: Any = None,
    ) -> None:
        if cfg.cheat is not None and cfg.cheat not in CHEATS:
            raise ValueError(f"unknown cheat {cfg.cheat!r}; one of {', '.join(CHEATS)}")
        self.cfg = cfg
        self.provider = provider
        self.node = node
        self.confirm = confirm
        self.metrics = metrics
        self.state = WorkerState(cfg.data_dir / "worker.db")
        self.store = self.state.store
        (cfg.data_dir / "rollouts").mkdir(parents=True, exist_ok=True)
        self.chain: ChainClient | None = None
        self.net: PoolNetwork | None = None
        self.coordinator_peer: str | None = None
        self.engine: Any = None
        self.engine_model: str | None = None
        self.tools: ModelTools | None = None
        self.phase = "starting"
        self.stake_now = 0
        self.last_error = ""
        self.book = PolicyBook()
        self._checker: PoolFileCheck | None = None
        self.self_checked = 0  # rollouts `guard` ran the validators' checks on
        self.spec: Any = None  # the pool's task spec (`off_spec`), read at start or on the first task
        self._engine_lock = trio.Lock()
        self.envs: dict[str, Any] = {}  # environments by name, prepared (`GenerationMixin.environment`)
        self.loaded_version = 0
        self.downloaded: dict[int, Path] = {}
        self.weights_hash: dict[int, str] = {}  # version -> manifest hash of the weights downloaded for it
        self.phase_started_work = False  # set once joined: from then on the worker waits out outages
        self._downloading: set[int] = set()
        self._new_download = trio.Event()
        self.download_took: float | None = None  # seconds the last policy download took (inf: it failed)
        self.relay: Any = None
        self._relay_store: Any = None
        self.relay_url: str | None = None
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        counts = self.store.counts("rollouts")
        units = self.state.accepted_units()
        return {
            "role": "worker",
            "pool": self.cfg.pool_id,
            "node": self.node.address,
            "provider": self.provider.address,
            "phase": self.phase,
            "cheat": self.cfg.cheat,
            "rollouts": counts,
            "accepted": counts.get("accepted", 0),
            "steps": self.cfg.steps,
            "units_accepted": units,
            "claimed_tokens": self.claimed_tokens(),
            "stake": self.stake_now,
            "policy_version": self.loaded_version,
            "policy_announced": self.book.latest,
            "relay": self.relay_url,
            "peers": len(self.net.node.peers) if self.net else 0,
            "txs": self.store.journal.counts(),
            "rpc": self.chain.rpc.health() if self.chain is not None else [],
            "last_error": self.last_error,
        }

    def _count(self, name: str, value: float = 1.0, **labels: str) -> None:
        count(self.metrics, name, value, **labels)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        self.phase = "connecting to the chain"
        self.chain, info = await open_pool_chain(cfg, self.provider, self.store, "worker")
        try:
            if info["statusName"] != "active":
                raise ChainError(
                    f"pool {cfg.pool_id} is {info['statusName']}, not active",
                    "wait for the pool owner to start it, or pick another pool",
                )
            await self.ensure_stake(info)  # a provider short of stake hears so before any engine load
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.prepare_engine, info)  # overlaps the steps below
                await self.ensure_node_bound()
                bootstrap, self.coordinator_peer = pool_peers(cfg.bootstrap, info)
                _, self.net = await open_pool_network(
                    nursery, self.chain, cfg.pool_id, bytes(self.node.key), cfg.listen, bootstrap
                )
                async with self.net:
                    self._nursery = nursery
                    if cfg.relay_port is not None:
                        await self._start_relay(nursery)
                    nursery.start_soon(self._policy_loop)
                    await self.connect_coordinator()
                    await self.ensure_member()
                    task_status.started()
                    self.phase_started_work = True
                    self._serve_files()
                    nursery.start_soon(self._heartbeat_loop)
                    nursery.start_soon(self._claim_loop)
                    nursery.start_soon(self._appeal_loop)
                    nursery.start_soon(self._verdict_loop)
                    await self.resume()
                    await self.work_loop()
                    self.phase = "done: heartbeating and claiming"
                    log.info("finished %d step(s); still heartbeating and claiming rewards", cfg.steps)
                    await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                log.info("stopping: network closed, releasing the engine")
                if self.engine is not None:
                    engine, self.engine = self.engine, None
                    with trio.move_on_after(30):
                        await trio.to_thread.run_sync(engine.close, abandon_on_cancel=True)
                await self.chain.aclose()
                self.store.close()
                log.info("stopped")

    # ------------------------------------------------------------------ set-up

    # ------------------------------------------------------------------ work

    def claimed_tokens(self) -> int:
        """Rewards claimed so far (base units), from the claims this worker recorded."""
        return self.state.claimed_tokens()

    def accepted_count(self) -> int:
        return self.state.accepted_count()

    async def resume(self) -> None:
        for r in self.state.unsubmitted():
            log.info("re-submitting rollout %s built before a restart", r["work_key"][:12])
            await self.submit(r["work_key"], r["task_id"], Path(r["path"]).read_bytes())

    async def work_loop(self) -> None:
        while self.cfg.steps <= 0 or self.accepted_count() < self.cfg.steps:
            self.phase = "requesting a task"
            try:
                named = await self.version_to_name()  # before the seed is known: the task is bound to it
                body = {} if named is None else {"version": named}
                reply = await self._request(protocol.TASK_PROTOCOL, body, "task request")
            except protocol.ProtocolError as exc:  # refused (not a member yet, say): ask again later
                self.phase, self.last_error = "task refused; asking again in 30 s", str(exc)
                log.warning("task request refused (asking again in 30 s): %s", exc)
                await trio.sleep(30.0)
                continue
            if "task" not in reply:  # the coordinator throttles generation to what its trainer can use
                self.phase = str(reply.get("reason", "waiting for a task"))[:60]
                if "lapsed" in reply:  # tasks we let expire unsubmitted (down too long, or too slow for them)
                    self.last_error = str(reply.get("reason", ""))[:300]
                    log.warning("no task for now: %s", self.last_error)
                await trio.sleep(min(30.0, max(0.5, float(reply.get("retry_after", 2.0)))))
                continue
            task = protocol.Task.from_wire(reply.get("task"))
            wrong = await self.off_spec(task)
            if wrong is not None:  # validators judge by the spec: work on other terms would be slashed
                self.phase, self.last_error = "refused a task that is not under the pool's spec", wrong
                log.error("COORDINATOR FAULT: task %s refused: %s (asking again in 30 s)", task.task_id, wrong)
                await trio.sleep(30.0)
                continue
            self.phase = f"generating task {task.task_id}"
            try:
                data = await self.generate(task)
            except PolicyUnavailable as exc:
                self.last_error = str(exc)
                log.warning("%s; asking for work again in 30 s", exc)
                await trio.sleep(30.0)
                continue
            except ContextTooShort as exc:  # its completions would be cut short, i.e. judged truncated
                self.phase, self.last_error = "refused a task too long for this engine's context", str(exc)
                log.error("task %s refused: %s (asking again in 30 s)", task.task_id, exc)
                await trio.sleep(30.0)
                continue
            await self.guard(data)
            key = work_key(data)
            path = self.cfg.data_dir / "rollouts" / f"{key[2:]}.parquet"
            await write_file_when_room(path, data, self._disk_full)
            if self.last_error.startswith(DISK_FULL_PREFIX):
                self.last_error = ""
            f = RolloutFile.from_bytes(data)
            units = f.units
            mean = sum(s.reward for s in f.samples) / len(f.samples)
            self.state.add_rollout(key, task.task_id, path, units, mean)
            self._count("rollouts_generated")
            self._count("tokens_generated", units)
            self._count("proofs_built", sum(len(s.proofs) for s in f.samples))
            await self.submit(key, task.task_id, data)

    def _disk_full(self, why: str) -> None:
        self.phase, self.last_error = "waiting for disk space", why
        log.error("%s", why)

    def claim(self, key: str) -> RolloutClaim:
        assert self.chain is not None
        return ops.rollout_claim(self.chain, self.cfg.pool_id, key)

    def _serve_files(self) -> None:
        """Serve our rollout files by hash, and their signatures, to the pool's validators and members:
        a validator fetches from us when the coordinator does not serve a record's file, and work
        nobody serves by its deadline is invalidated (we signed it, so we keep it)."""
        assert self.net is not None
        net = self.net
        files = BlobStore(self.cfg.data_dir / "rollouts", MAX_FILE_BYTES, suffix=".parquet")

        def allowed(sender: str) -> bool:
            return net.membership().role(sender) is not None

        serve_blobs(net.node, files, allow=allowed, accept_uploads=False)

        async def on_signature(request: bytes, sender: str) -> bytes:
            if not allowed(sender):
                raise Refused("not a member of this pool")
            key = protocol.unpack(request, "signature request").get("work_key")
            if not isinstance(key, str) or not self.state.has_rollout(key):
                return protocol.refuse(f"no rollout {key!r} here")
            return protocol.ok(signature=self.claim(key).sign(self.node))

        net.node.set_handler(protocol.SIGNATURE_PROTOCOL, on_signature)

    # ------------------------------------------------------------------ policy versions

    # ------------------------------------------------------------------ background

    async def _heartbeat_loop(self) -> None:
        assert self.net is not None
        while True:
            try:
                body: dict[str, Any] = {
                    "accepted": self.accepted_count(),
                    "phase": self.phase,
                    "policy": self.loaded_version,
                }
                if self.relay_url:
                    body["relay"] = self.relay_url
                await self.net.publish("heartbeat", protocol.pack(body))
                self._count("heartbeats")
            except Exception as exc:
                log.debug("heartbeat failed: %r", exc)
            await trio.sleep(self.cfg.heartbeat_every)

    async def _claim_loop(self) -> None:
        assert self.chain is not None
        while True:
            await trio.sleep(self.cfg.claim_every)
            try:
                await self.claim_final()
            except (ChainError, RpcUnavailable) as exc:
                self.last_error = str(exc)
                log.warning("claiming failed (will retry): %s", exc)

    async def _appeal_loop(self) -> None:
        assert self.chain is not None
        while True:
            await trio.sleep(self.cfg.claim_every)
            try:
                await self.appeal_accusations()
            except (ChainError, RpcUnavailable) as exc:
                self.last_error = str(exc)
                log.warning("following accusations failed (will retry): %s", exc)

    async def claimable(self) -> list[str]:
        """The provider's work that is final now. Incremental, so its cost does not grow with the chain's
        history: the ledger events after a durable cursor (in bounded pages) add the provider's newly
        recorded work to the state; each record whose window has ended is read on chain (getRecord)
        once: claimable, still disputed (looked at again a minute later), or gone (claimed, invalidated,
        removed by a reorganisation)."""
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        got = await new_ledger_events(
            c, self.state.store, "claim-cursor", pool, ("WorkRecorded", "WorkBatchRecorded"),
            on_reorg=self.state.reopen_recorded_after,
        )  # fmt: skip
        if got is not None:
            events, move = got
            self.state.track_recorded(recorded_for(events, self.provider.address), move)
        now = await retry_rpc(c.timestamp, "chain time")
        keys: list[str] = []
        for key, deadline in self.state.due_recorded(now, limit=ops.MAX_BATCH):
            rec = await retry_rpc(lambda k=key: ops.record(c, pool, k), "work record")
            ours = str(rec["provider"]).lower() == self.provider.address.lower()
            deadline = max(deadline, int(rec["deadline"]))  # a dispute that did not stand moves it later
            step = claim_step(str(rec["statusName"]), ours, deadline, now)
            if step == "claim":
                keys.append(key)
            elif step == "forget":
                self.state.done_recorded([key], int(self.state.store.get("claim-cursor", "0") or 0))
            else:
                self.state.check_later(key, max(deadline, now + DISPUTE_RECHECK_S))
        return keys

    async def claim_final(self) -> int:
        assert self.chain is not None
        c = self.chain
        keys = await self.claimable()
        if not keys:
            self.stake_now = int(await c.call("ProviderRegistry", "stakeOf", self.provider.address))
            return 0
        reward, receipts = await ops.claim_now(c, self.cfg.pool_id, keys)
        self.state.done_recorded(keys, max(r.block_number for r in receipts))
        self.state.add_claims(receipts)
        self._count("claims", len(keys))
        self._count("rewards_claimed_tokens", reward / 10**18)
        log.info("claimed %s for %d final work record(s)", tokens(reward), len(keys))
        # claimed work is final: nobody can ask for its file any more. (Files of invalidated work stay,
        # for an appeal; the claim scan covers the provider's other nodes too, whose files are not here.)
        gone = 0
        for k in keys:
            path = self.cfg.data_dir / "rollouts" / f"{k.removeprefix('0x')}.parquet"
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                gone += 1
        if gone:
            log.info("deleted %d rollout file(s) of claimed work", gone)
        return reward
