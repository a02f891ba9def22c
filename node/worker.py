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
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from node.errors import IntellectError, PeerError

from . import ops, protocol
from .chain import ChainClient, ChainError, Deployment
from .chain.errors import RpcUnavailable
from .chain.messages import tokens
from .chain.signing import Invite, RolloutClaim
from .daemon import (
    PolicyPrefills,
    connect_chain,
    count,
    fetch_evidence,
    new_evidence,
    new_ledger_events,
    open_pool_network,
    pool_peers,
    retry,
    retry_rpc,
)
from .evidence import MAX_SERVED_EVIDENCE_BYTES, EvidenceError, compare, parse_evidence
from .inference.tools import ModelTools, model_tools
from .p2p.blobs import BlobStore, serve_blobs, upload_blob
from .p2p.host import P2PError, Refused
from .p2p.network import PoolNetwork
from .policy import PolicyAnnouncement, PolicyBook
from .rollout.file import MAX_FILE_BYTES, RolloutFile, RolloutHeader, work_key
from .store import DISK_FULL_PREFIX, Store, settle_journal, write_file_when_room
from .tasks.math import get_env
from .taskspec import pool_spec
from .verify import Calibrated, PoolFileCheck

log = logging.getLogger("intellect.worker")

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    work_key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    path TEXT NOT NULL,
    units INTEGER NOT NULL,
    mean_reward REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'built',   -- built | accepted | rejected
    detail TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS claims (tx TEXT PRIMARY KEY, keys INTEGER NOT NULL, reward TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS evidence (
    hash TEXT PRIMARY KEY,                  -- sha256 of the document: the evidence hash on chain
    work_key TEXT NOT NULL,                 -- one of our rollouts, found failing by a validator
    sender TEXT NOT NULL,
    doc BLOB NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS appeals (
    work_key TEXT PRIMARY KEY,              -- a hard invalidation of our work
    status TEXT NOT NULL,                   -- appealed | declined | failed-self-check | too-late
    detail TEXT,
    tx TEXT,
    at REAL NOT NULL
);
"""

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


class PolicyUnavailable(IntellectError):
    """No checkpoint a task allows could be fetched in time; the worker asks for work again later."""


class Declined(IntellectError):
    """The user answered no to a confirmation."""


class Worker:
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
        self.store = Store(cfg.data_dir / "worker.db", SCHEMA)
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
        self.loaded_version = 0
        self.downloaded: dict[int, Path] = {}
        self.phase_started_work = False  # set once joined: from then on the worker waits out outages
        self._downloading: set[int] = set()
        self._new_download = trio.Event()
        self.relay: Any = None
        self._relay_store: Any = None
        self.relay_url: str | None = None
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        counts = self.store.counts("rollouts")
        units = int(self.store.scalar("SELECT SUM(units) FROM rollouts WHERE status = 'accepted'") or 0)
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
            "last_error": self.last_error,
        }

    def _count(self, name: str, value: float = 1.0, **labels: str) -> None:
        count(self.metrics, name, value, **labels)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        self.phase = "connecting to the chain"
        self.chain = await connect_chain(
            cfg.rpc_url, cfg.deployment, self.provider, journal=self.store.journal, wait=cfg.rpc_wait, what="worker"
        )
        try:
            await settle_journal(self.store.journal, self.chain.sender)  # type: ignore[arg-type]
            info = await ops.pool_info(self.chain, cfg.pool_id)
            if info["statusName"] != "active":
                raise ChainError(
                    f"pool {cfg.pool_id} is {info['statusName']}, not active",
                    "wait for the pool owner to start it, or pick another pool",
                )
            await self.ensure_stake(info)
            await self.ensure_node_bound()
            bootstrap, self.coordinator_peer = pool_peers(cfg.bootstrap, info)
            async with trio.open_nursery() as nursery:
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

    def _ask(self, question: str) -> None:
        if self.cfg.yes:
            log.info("%s: yes (--yes)", question)
            return
        if self.confirm is None or not self.confirm(question):
            raise Declined(question)

    async def ensure_stake(self, info: dict[str, Any]) -> None:
        assert self.chain is not None
        c = self.chain
        self.phase = "staking"
        me = dict(await c.call("ProviderRegistry", "getProvider", self.provider.address))
        min_provider = int(await c.call("ProviderRegistry", "minProviderStake"))
        need = max(int(info["minStake"]), min_provider, 1)
        if self.cfg.stake is not None:
            need = max(need, self.cfg.stake)
        if not me["registered"]:
            self._ask(f"register provider {self.provider.address} with a stake of {tokens(need)}")
            await ops.register_provider(c, need)
            self._count("chain_tx_sent", kind="registerProvider")
            log.info("registered provider %s with %s", self.provider.address, tokens(need))
        elif int(me["staked"]) < need:
            more = need - int(me["staked"])
            self._ask(f"add {tokens(more)} of stake to reach pool {self.cfg.pool_id}'s minimum of {tokens(need)}")
            await ops.stake(c, more)
            self._count("chain_tx_sent", kind="stake")
        required = int(await c.call("ProviderRegistry", "requiredStake", self.provider.address))
        node_info = dict(await c.call("ProviderRegistry", "getNode", self.node.address))
        if int(node_info["provider"], 16) == 0:
            per_unit = int(await c.call("ProviderRegistry", "stakePerComputeUnit"))
            required += per_unit * self.cfg.compute_units
        staked = int(await c.call("ProviderRegistry", "stakeOf", self.provider.address))
        if staked < required:
            self._ask(f"add {tokens(required - staked)} of stake for this node's compute units")
            await ops.stake(c, required - staked)
        self.stake_now = int(await c.call("ProviderRegistry", "stakeOf", self.provider.address))

    async def ensure_node_bound(self) -> None:
        assert self.chain is not None
        c = self.chain
        owner = await c.call("ProviderRegistry", "providerOf", self.node.address)
        if int(owner, 16) != 0:
            if owner.lower() != self.provider.address.lower():
                raise ChainError(
                    f"node {self.node.address} is bound to provider {owner}, not {self.provider.address}",
                    "use that provider's key, or another node key",
                )
            return
        self.phase = "binding the node"
        sig = await ops.node_signature(c, self.node, self.provider.address)
        await ops.add_node(c, self.node.address, self.cfg.compute_units, sig)
        self._count("chain_tx_sent", kind="addNode")
        log.info("bound node %s to provider %s", self.node.address, self.provider.address)

    async def connect_coordinator(self) -> None:
        assert self.net is not None and self.coordinator_peer is not None
        self.phase = "connecting to the coordinator"
        net, peer = self.net, self.coordinator_peer
        try:
            await self._retry_p2p(lambda: net.connect(peer), "connecting to the coordinator")
        except P2PError as exc:
            raise PeerError(
                f"the coordinator at {peer} is unreachable (gave up after {self.cfg.connect_wait:.0f} s): {exc}",
                "check that the coordinator runs and that the pool's bootstrap address is current",
            ) from None

    async def _retry_p2p(self, fn: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Retry while the coordinator does not answer: `connect_wait` seconds while joining (a wrong
        address should fail fast), for ever once working (an outage should not end a worker), with
        back-off up to `outage_max_delay` and the reason in the status."""
        working = self.phase_started_work
        return await retry(
            fn,
            what,
            errors=(P2PError,),
            wait=math.inf if working else self.cfg.connect_wait,
            delay=1.0,
            max_delay=self.cfg.outage_max_delay if working else 15.0,
            on_retry=self._outage if working else None,
        )

    def _outage(self, why: str) -> None:
        self.phase, self.last_error = "waiting for the coordinator", why

    async def _request(self, proto: str, body: dict[str, Any], what: str, timeout: float = 30.0) -> dict[str, Any]:
        assert self.net is not None and self.coordinator_peer is not None
        node, peer = self.net.node, self.coordinator_peer
        try:
            data = await self._retry_p2p(lambda: node.request(peer, proto, protocol.pack(body), timeout=timeout), what)
        except P2PError as exc:
            raise PeerError(f"{what}: the coordinator did not answer: {exc}", "is it running?") from None
        if self.last_error.startswith(f"{what} failed"):
            self.last_error = ""
        return protocol.reply_body(data, what)

    async def ensure_member(self) -> None:
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        m = await c.call("PoolManager", "membershipOf", self.node.address)
        if int(m["poolId"]) == pool:
            return
        if int(m["poolId"]) != 0:
            raise ChainError(f"node {self.node.address} is already in pool {m['poolId']}", "leave it first")
        self.phase = "joining the pool"
        reply = await self._request(protocol.INVITE_PROTOCOL, {}, "invite request")
        if reply.get("member"):
            return
        inv = reply.get("invite")
        if not isinstance(inv, dict):
            raise PeerError("the coordinator sent a malformed invite")
        invite = Invite(
            pool_id=pool,
            node=self.node.address,
            nonce=int(inv["nonce"]),
            expiry=int(inv["expiry"]),
            chain_id=c.deployment.chain_id,
            pool_manager=c.contract("PoolManager"),
            signature=str(inv["signature"]),
        )
        info = await ops.pool_info(c, pool)
        if invite.signer().lower() != str(info["coordinator"]).lower():
            raise PeerError("the invite is not signed by the pool's coordinator", "ask the right coordinator")
        await ops.join_pool(c, invite, pool)
        self._count("chain_tx_sent", kind="joinPool")
        log.info("node %s joined pool %d", self.node.address, pool)

    # ------------------------------------------------------------------ work

    def claimed_tokens(self) -> int:
        """Rewards claimed so far (base units), from the claims this worker recorded."""
        return sum(int(r[0]) for r in self.store.query("SELECT reward FROM claims"))

    def accepted_count(self) -> int:
        return int(self.store.scalar("SELECT COUNT(*) FROM rollouts WHERE status = 'accepted'") or 0)

    async def resume(self) -> None:
        rows = self.store.query("SELECT * FROM rollouts WHERE status = 'built' ORDER BY created")
        for r in rows:
            log.info("re-submitting rollout %s built before a restart", r["work_key"][:12])
            await self.submit(r["work_key"], r["task_id"], Path(r["path"]).read_bytes())

    async def work_loop(self) -> None:
        while self.cfg.steps <= 0 or self.accepted_count() < self.cfg.steps:
            self.phase = "requesting a task"
            try:
                reply = await self._request(protocol.TASK_PROTOCOL, {}, "task request")
            except protocol.ProtocolError as exc:  # refused (not a member yet, say): ask again later
                self.phase, self.last_error = "task refused; asking again in 30 s", str(exc)
                log.warning("task request refused (asking again in 30 s): %s", exc)
                await trio.sleep(30.0)
                continue
            if "task" not in reply:  # the coordinator throttles generation to what its trainer can use
                self.phase = str(reply.get("reason", "waiting for a task"))[:60]
                await trio.sleep(min(30.0, max(0.5, float(reply.get("retry_after", 2.0)))))
                continue
            task = protocol.Task.from_wire(reply.get("task"))
            self.phase = f"generating task {task.task_id}"
            try:
                data = await self.generate(task)
            except PolicyUnavailable as exc:
                self.last_error = str(exc)
                log.warning("%s; asking for work again in 30 s", exc)
                await trio.sleep(30.0)
                continue
            key = work_key(data)
            path = self.cfg.data_dir / "rollouts" / f"{key[2:]}.parquet"
            await write_file_when_room(path, data, self._disk_full)
            if self.last_error.startswith(DISK_FULL_PREFIX):
                self.last_error = ""
            f = RolloutFile.from_bytes(data)
            units = f.units
            mean = sum(s.reward for s in f.samples) / len(f.samples)
            self.store.execute(
                "INSERT OR IGNORE INTO rollouts(work_key, task_id, path, units, mean_reward, created) "
                "VALUES(?, ?, ?, ?, ?, ?)",
                (key, task.task_id, str(path), units, mean, time.time()),
            )
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
            if not isinstance(key, str) or self.store.one("SELECT 1 FROM rollouts WHERE work_key = ?", (key,)) is None:
                return protocol.refuse(f"no rollout {key!r} here")
            return protocol.ok(signature=self.claim(key).sign(self.node))

        net.node.set_handler(protocol.SIGNATURE_PROTOCOL, on_signature)

    async def submit(self, key: str, task_id: str, data: bytes) -> None:
        assert self.net is not None and self.coordinator_peer is not None
        signature = self.claim(key).sign(self.node)  # deterministic (RFC 6979): the same bytes after a restart
        self.phase = f"uploading {key[:12]}"
        node, peer = self.net.node, self.coordinator_peer
        try:  # as long as any other request waits for the coordinator (--connect-wait)
            await self._retry_p2p(lambda: upload_blob(node, peer, data), f"upload of {key[:12]}")
        except P2PError as exc:
            raise PeerError(f"upload of rollout {key} failed: {exc}", "the coordinator may be down") from None
        self._count("rollouts_uploaded")
        try:
            reply = await self._request(
                protocol.SUBMIT_PROTOCOL,
                {"work_key": key, "task_id": task_id, "signature": signature},
                "submission",
                timeout=60.0,
            )
        except protocol.ProtocolError as exc:
            self.store.execute(
                "UPDATE rollouts SET status = 'rejected', detail = ? WHERE work_key = ?", (str(exc), key)
            )
            self._count("rollouts_rejected", reason="coordinator")
            log.warning("rollout %s rejected: %s", key[:12], exc)
            return
        self.store.execute("UPDATE rollouts SET status = 'accepted' WHERE work_key = ?", (key,))
        self._count("rollouts_accepted")
        log.info("rollout %s %s (%s units)", key[:12], reply.get("status"), reply.get("units", "?"))
        try:
            body = {"work_key": key, "task_id": task_id, "signature": signature, "addrs": self.net.listen_addrs[:4]}
            await self.net.publish("rollout", protocol.pack(body))
        except Exception as exc:
            log.debug("announcement failed: %r", exc)

    def _load_engine(self, model: str, noise: float = 0.0) -> None:
        from .inference.engine import VllmEngine

        if self.engine is not None and self.engine_model == model:
            return
        if self.engine is not None:
            self.engine.close()
        tools = model_tools(model)
        self.engine = VllmEngine(tools.path, seed=0)
        if noise > 0:  # the devnet adversary: almost the pool's model, not quite
            from .calibrate import _load_state, noisy_weights

            self.engine.reload_weights(noisy_weights(_load_state(tools.path), noise, seed=7))
        self.engine_model = model
        self.tools = tools

    async def generate(self, task: protocol.Task) -> bytes:
        from .inference.engine import SamplingSpec
        from .rollout.build import build_rollout_file

        model, noise = task.model, 0.0
        if self.cfg.cheat == "model":
            # another model's weights: the tiny model with another seed, else the pool's model with
            # 5 % multiplicative noise on every weight (same tokenizer, so the prompts still match)
            if task.model == "tiny":
                model = "tiny:1"
            else:
                noise = 0.05
        if self.engine is None or self.engine_model != model:
            self.phase = f"loading model {model}"
            await trio.to_thread.run_sync(self._load_engine, model, noise)
        version = await self.ensure_policy(task)
        assert self.tools is not None
        tools, env = self.tools, get_env(task.env)
        problems = env.problems(task.seed, task.prompts)
        s = task.sampling
        temperature = float(s["temperature"]) * (2.0 if self.cfg.cheat == "temperature" else 1.0)
        spec = SamplingSpec(
            temperature=temperature,
            top_p=float(s.get("top_p", 1.0)),
            max_tokens=int(s["max_tokens"]),
            seed=task.seed % (2**31),
            stop_token_ids=tuple(sorted(tools.stop_ids)),
        )
        header = RolloutHeader(
            pool_id=task.pool_id,
            node=self.node.address,
            policy_version=version,
            env=task.env,
            task_seed=task.seed,
            sampling=dict(s),
            model=task.model,
            extra={"task_id": task.task_id},
        )

        cheat = self.cfg.cheat

        def work() -> bytes:
            prompts = [tools.encode(p.prompt) for p in problems]
            if cheat == "duplicate":  # one draw per prompt, sent as the whole group, its logprobs inflated
                groups = []  # (to 0, so the coordinator's cheap bound, which trusts them, sees nothing wrong)
                for g in self.engine.generate(prompts, spec, n=1):
                    g[0].logprobs = [0.0] * len(g[0].tokens)
                    groups.append([g[0]] * task.group_size)
            else:
                groups = self.engine.generate(prompts, spec, n=task.group_size)
            f = build_rollout_file(header, problems, groups, env=env, decode=tools.decode)
            if cheat == "poison":  # modulus 0: the reference verifier dies of a division by zero on it
                f = replace(f, samples=[replace(x, proofs=[bytes(258)] * len(x.proofs)) for x in f.samples])
            return f.to_bytes()

        return await trio.to_thread.run_sync(work)

    # ------------------------------------------------------------------ policy versions

    async def _start_relay(self, nursery: trio.Nursery) -> None:
        from .weights.serve import serve_weights
        from .weights.store import WeightStore

        self._relay_store = WeightStore(self.cfg.data_dir / "relay", keep=3)
        port = await nursery.start(serve_weights, self._relay_store, self.cfg.relay_host, self.cfg.relay_port)
        self.relay_url = f"http://{self.cfg.relay_host}:{port}"
        log.info("serving policy checkpoints as a relay at %s", self.relay_url)

    async def _policy_loop(self) -> None:
        assert self.net is not None
        async for env in self.net.subscribe("policy"):
            try:
                ann = PolicyAnnouncement.from_body(env.body)
            except protocol.ProtocolError as exc:
                log.warning("ignoring a policy announcement: %s", exc)
                continue
            self.book.update(ann)
            upstreams = [u.rstrip("/") for u in ann.sources if u != self.relay_url]
            if self.relay_url is not None and upstreams:
                if self.relay is None:  # the relay starts with the first upstreams it hears of
                    from .weights.relay import Relay

                    assert self._nursery is not None
                    self.relay = Relay(self._relay_store, upstreams)
                    await self._nursery.start(self.relay.run)
                else:
                    self.relay.upstreams = upstreams
            v = self.book.latest
            if v > 0 and v not in self.downloaded and v not in self._downloading and v in self.book.hashes:
                self._start_download(v)

    async def _download(self, version: int) -> None:
        from .weights.client import DownloadError, download

        h = self.book.hashes[version]
        try:
            sources = [u for u in self.book.sources if u != self.relay_url]
            if self.relay is not None:
                self.relay.announce(version, h)
                if await self.relay.wait(version, 300.0):
                    sources = [self.relay_url, *sources]  # type: ignore[list-item]
            started = time.monotonic()
            path = await download(version, h, sources, self.cfg.data_dir / "weights", keep=4)
            self.downloaded[version] = path
            for old in [v for v in self.downloaded if v < version - 4]:
                self.downloaded.pop(old, None)
            log.info("policy version %d downloaded and verified in %.1f s", version, time.monotonic() - started)
            self._new_download.set()
            self._new_download = trio.Event()
        except DownloadError as exc:
            log.warning("download of policy version %d failed: %s", version, exc)
        finally:
            self._downloading.discard(version)

    async def ensure_policy(self, task: protocol.Task) -> int:
        """Load the newest checkpoint that is fresh enough for `task` (hot reload, no restart);
        wait (bounded) for a download when the loaded one is too old. Returns the version in use."""
        deadline = trio.current_time() + self.cfg.policy_wait
        # A newer version that is already downloading is worth a short wait (seconds on a LAN);
        # without one the worker goes on with what it has, as long as the task allows it.
        fresh_deadline = trio.current_time() + self.cfg.fresh_wait
        while True:
            usable = [v for v in self.downloaded if task.min_policy_version <= v <= task.policy_version]
            best = max(usable, default=None)
            if best is not None and best > self.loaded_version:
                if self.cfg.cheat != "model":  # the model cheater keeps its own weights and lies
                    self.phase = f"loading policy version {best}"
                    await trio.to_thread.run_sync(self.engine.reload_weights, self.downloaded[best])
                self.loaded_version = best
                log.info("now generating with policy version %d", best)
            in_flight = any(self.loaded_version < v <= task.policy_version for v in self._downloading) or (
                task.policy_version > max(self.book.latest, self.loaded_version)  # announcement still on its way
            )
            fresh_enough = task.min_policy_version <= self.loaded_version <= task.policy_version
            if not fresh_enough and best is None and not in_flight:
                self._fetch_for(task)
            if fresh_enough and (not in_flight or trio.current_time() > fresh_deadline):
                return self.loaded_version
            if trio.current_time() > deadline:
                raise PolicyUnavailable(
                    f"policy version {task.min_policy_version}+ not available after {self.cfg.policy_wait:.0f} s; "
                    "check that the coordinator's weight server and relays are reachable"
                )
            self.phase = f"waiting for policy version {task.min_policy_version}"
            with trio.move_on_after(5.0):
                await self._new_download.wait()

    def _fetch_for(self, task: protocol.Task) -> None:
        """Start downloading the newest announced version `task` allows, when none is held: the task may
        predate the latest announcement (it was issued before a restart), and only the latest version
        is fetched as announcements arrive."""
        wanted = [
            v
            for v in self.book.hashes
            if task.min_policy_version <= v <= task.policy_version and v > 0 and v not in self.downloaded
        ]
        if wanted and not any(v in self._downloading for v in wanted):
            self._start_download(max(wanted))

    def _start_download(self, version: int) -> None:
        assert self._nursery is not None
        self._downloading.add(version)
        self._nursery.start_soon(self._download, version)

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
        self.store.execute(
            "INSERT OR IGNORE INTO evidence(hash, work_key, sender, doc, at) VALUES(?, ?, ?, ?, ?)",
            (digest, key, sender.lower(), doc, time.time()),
        )

    def self_check(self, key: str) -> tuple[str | None, bytes]:
        """Why our own file for `key` could not stand whatever a model says (None: it could), and its
        bytes: we must hold it, its bytes must hash to the key, and it must parse under the bounded
        reader every checker uses. `recheck` adds the validators' model-based check."""
        row = self.store.one("SELECT path FROM rollouts WHERE work_key = ?", (key,))
        if row is None:
            return "not a rollout of this node", b""
        try:
            data = Path(str(row["path"])).read_bytes()
        except OSError as exc:
            return f"the file is gone: {exc}", b""
        if work_key(data) != key:
            return "the file on disk does not hash to its work key", b""
        try:
            RolloutFile.from_bytes(data)
        except Exception as exc:
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
            return f"our own re-check fails too: {v['reason']} ({str(v.get('detail', ''))[:200]})", "; ".join(notes)
        notes.append("our re-check of every completion passes")
        if claims is not None:
            notes += [line for line in compare(claims, verdict) if line.startswith("DISPUTE")][:4]
        return None, "; ".join(notes)

    async def evidence_of(self, key: str, digest: str, accuser: str) -> dict[str, Any] | None:
        """The evidence document of hash `digest` about our work `key`: the copy its verdict brought,
        else one asked by its hash of the accuser and the coordinator (and kept); None if none is had."""
        row = self.store.one("SELECT doc FROM evidence WHERE hash = ?", (digest,))
        if row is not None:
            try:
                return parse_evidence(
                    bytes(row["doc"]), expected_hash=digest, work_key=key, max_bytes=MAX_SERVED_EVIDENCE_BYTES
                )
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
            self._checker = PoolFileCheck(spec, tools, Calibrated.load(spec.model), self.cfg.pool_id, MAX_FILE_BYTES)
        checker = self._checker
        f = checker.intake(data, self.node.address)
        if not isinstance(f, RolloutFile):
            return f.to_dict()
        version = f.header.policy_version
        prefills = PolicyPrefills(checker.tools, self.book, self.cfg.data_dir, keep=1)
        prefill = await prefills.get(version, self.downloaded.get(version))
        if prefill is None:
            return None
        try:
            return await trio.to_thread.run_sync(checker.judge, f, prefill, version)
        finally:
            prefills.held.clear()

    async def appeal_accusations(self) -> int:
        """Hard invalidations of this node's work: appealed (with the pool's bond) when our self-check
        of the file passes, and only with `--yes` (else the command to appeal is logged). Returns how
        many were appealed now."""
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        got = await new_ledger_events(c, self.store, "accused-cursor", pool, "WorkAccused")
        if got is None:
            return 0
        events, move = got
        mine = [ev for ev in events if str(ev.args["provider"]).lower() == self.provider.address.lower()]
        appealed = 0
        for ev in mine:
            key = str(ev.args["workKey"])
            if self.store.one("SELECT 1 FROM appeals WHERE work_key = ?", (key,)) is not None:
                continue
            if self.store.one("SELECT 1 FROM rollouts WHERE work_key = ?", (key,)) is None:
                continue  # work of another node of the same provider: its own worker answers
            try:
                why, notes = await self.recheck(key, str(ev.args["evidenceHash"]), str(ev.args["accuser"]))
            except Exception as exc:  # a fault of ours must not cost the appeal (nor kill the daemon)
                log.exception("re-check of accused work %s failed", key[:12])
                why, _ = self.self_check(key)
                notes = f"re-check failed ({type(exc).__name__}: {exc}); deciding on the file's integrity alone"
            status, detail, tx = "appealed", notes, None
            if why is not None and self.cfg.cheat is not None:
                # the devnet's cheater appeals anyway, betting on the committee: a true invalidation stands
                log.warning("work %s fails our own re-check (%s); appealing anyway (cheater)", key[:12], why)
                why = None
            if why is not None:
                status, detail = "failed-self-check", why
            elif not self.cfg.yes:
                status = "declined"
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
            self.store.execute(
                "INSERT OR IGNORE INTO appeals(work_key, status, detail, tx, at) VALUES(?, ?, ?, ?, ?)",
                (key, status, detail[:500], tx, time.time()),
            )
            log.warning(
                "work %s accused by %s: %s%s", key[:12], ev.args["accuser"], status, f" ({detail})" if detail else ""
            )
        self.store.execute_many(move)
        return appealed

    async def claim_final(self) -> int:
        assert self.chain is not None
        c = self.chain
        keys = await retry_rpc(lambda: ops.claimable_keys(c, self.cfg.pool_id, self.provider.address), "claim scan")
        if not keys:
            self.stake_now = int(await c.call("ProviderRegistry", "stakeOf", self.provider.address))
            return 0
        reward, receipts = await ops.claim(c, self.cfg.pool_id, keys)
        self.store.execute_many(
            (
                "INSERT OR IGNORE INTO claims(tx, keys, reward, at) VALUES(?, ?, ?, ?)",
                (
                    r.tx_hash,
                    len(r.all("WorkClaimed")),
                    str(sum(int(e.args["reward"]) for e in r.all("WorkClaimed"))),
                    time.time(),
                ),
            )
            for r in receipts
        )
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
