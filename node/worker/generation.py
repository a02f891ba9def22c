"""How the worker generates: the vLLM engine (the devnet's cheats included), the policy version a task
allows (hot reload, bounded wait for a download), the checkpoint downloads and the relay it serves them
from. A mixin of `Worker`."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from typing import Any

import trio

from .. import protocol
from ..errors import IntellectError
from ..inference.tools import model_tools
from ..policy import PolicyAnnouncement
from ..rollout.file import RolloutHeader
from ..tasks import get_env
from . import rules

log = logging.getLogger("intellect.worker")


class PolicyUnavailable(IntellectError):
    """No checkpoint a task allows could be fetched in time; the worker asks for work again later."""


class SelfCheckFailed(IntellectError):
    """A rollout this machine just made fails the pool's validators' own checks: submitting it would be
    invalidated and slashed, so the worker stops first."""


class GenerationMixin:
    """State set up by `Worker.__init__`."""

    cfg: Any
    state: Any
    store: Any
    spec: Any
    envs: dict[str, Any]

    def _load_engine(self, model: str, noise: float = 0.0) -> None:
        from ..inference.engine import VllmEngine

        if self.engine is not None and self.engine_model == model:
            return
        if self.engine is not None:
            self.engine.close()
        tools = model_tools(model)
        self.engine = VllmEngine(tools.path, seed=0)
        if noise > 0:  # the devnet adversary: almost the pool's model, not quite
            from ..tampering import _load_state, noisy_weights

            self.engine.reload_weights(noisy_weights(_load_state(tools.path), noise, seed=7))
        self.engine_model = model
        self.tools = tools

    async def load_engine(self, pool_model: str) -> None:
        """The engine for `pool_model`, loaded once (a second caller waits for the first's load)."""
        model, noise = pool_model, 0.0
        if self.cfg.cheat == "model":
            # another model's weights: the tiny model with another seed, else the pool's model with
            # 5 % multiplicative noise on every weight (same tokenizer, so the prompts still match)
            if pool_model == "tiny":
                model = "tiny:1"
            else:
                noise = 0.05
        async with self._engine_lock:
            if self.engine is None or self.engine_model != model:
                self.phase = f"loading model {model}"
                await trio.to_thread.run_sync(self._load_engine, model, noise)

    async def prepare_engine(self, info: dict[str, Any]) -> None:
        """Load the engine for the pool's model while the worker stakes, binds its node and reaches the
        coordinator (each of those waits on the chain or the network; the load on the CPU or GPU)."""
        from ..taskspec import TaskSpecError, pool_spec

        try:
            self.spec = self.spec or await pool_spec(info)
        except TaskSpecError as exc:  # the first task says which model; its check logs why
            log.info("engine not preloaded: %s", exc)
            return
        started = trio.current_time()
        await self.load_engine(self.spec.model)
        log.info("engine for %s ready in %.1f s", self.spec.model, trio.current_time() - started)

    async def generate(self, task: protocol.Task) -> bytes:
        from ..inference.engine import SamplingSpec
        from ..rollout.build import build_rollout_file

        await self.load_engine(task.model)
        version = await self.ensure_policy(task)
        assert self.tools is not None
        tools, env = self.tools, await self.environment(task.env)
        problems = env.problems(task.seed, task.prompts)
        s = task.sampling
        temperature = float(s["temperature"]) * (2.0 if self.cfg.cheat == "temperature" else 1.0)
        exact = bool(s.get("exact", False))
        spec = SamplingSpec(
            temperature=temperature,
            top_p=float(s.get("top_p", 1.0)),
            max_tokens=int(s["max_tokens"]),
            # exact sampling draws completion (group, sample) from the task's own seed, as validators replay
            seed=task.seed if exact else task.seed % (2**31),
            top_k=int(s.get("top_k", -1)),
            stop_token_ids=tuple(sorted(tools.stop_ids)),
            exact=exact,
        )
        header = RolloutHeader(
            pool_id=task.pool_id,
            node=self.node.address,
            policy_version=version,
            env=task.env,
            task_seed=task.seed,
            sampling=dict(s),
            model=task.model,
            # the weights generated with, signed with the file: validators judge it against these alone
            extra={"task_id": task.task_id, **({"weights": self.weights_hash[version]} if version > 0 else {})},
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

    async def environment(self, name: str) -> Any:
        """The task's environment, prepared once: the version and content the pool's spec pins where the
        spec could be read (`EnvironmentMismatch` otherwise), its sandbox set up for code (a worker that
        cannot sandbox stops with the reason, before it generates anything)."""
        if name not in self.envs:
            spec = self.spec
            env = spec.environment() if spec is not None and spec.env == name else get_env(name)
            await trio.to_thread.run_sync(env.prepare)
            self.envs[name] = env
        return self.envs[name]

    async def off_spec(self, task: protocol.Task) -> str | None:
        """Why `task` is not under the pool's spec (`rules.task_against_spec`), or None. The spec is read
        from its on-chain URI and hash once; if it cannot be read the task is taken unchecked (logged):
        validators could not check the work either, and the pool's owner must fix the URI."""
        if task.pool_id != self.cfg.pool_id:  # checked whether or not the spec can be read
            return rules.task_against_spec(
                task.env, task.model, task.sampling, task.group_size, None, task.pool_id, self.cfg.pool_id
            )
        if self.spec is None:
            from .. import ops
            from ..taskspec import TaskSpecError, pool_spec

            try:
                self.spec = await pool_spec(await ops.pool_info(self.chain, self.cfg.pool_id))  # type: ignore[attr-defined]
            except TaskSpecError as exc:
                log.warning("cannot check tasks against the pool's spec: %s", exc)
                return None
        return rules.task_against_spec(
            task.env, task.model, task.sampling, task.group_size, self.spec, task.pool_id, self.cfg.pool_id
        )

    async def guard(self, data: bytes) -> None:
        """`join --self-check RATE`: run every check a validator runs (`_model_check`) on our first
        rollout and on about RATE of the others, before they are submitted; stop with the reason if one
        fails (a broken GPU, driver or engine is found before it costs stake)."""
        rate = float(self.cfg.self_check)
        if rate <= 0 or (self.self_checked and random.random() >= rate):
            return
        self.phase = "checking our own rollout as the validators will"
        verdict = await self._model_check(data)  # type: ignore[attr-defined]
        self.self_checked += 1
        self._count("self_checks")  # type: ignore[attr-defined]
        if verdict is None:
            log.warning("self-check skipped: the weights of the rollout's policy version cannot be had yet")
            return
        if not verdict["ok"]:
            v = verdict["verdict"]
            failing = [
                f"group {x['group']} sample {x['sample']}" for x in verdict.get("samples", []) if x["reason"] != "ok"
            ]
            raise SelfCheckFailed(
                f"a rollout this machine just made fails the pool's checks: {v['reason']} ({str(v.get('detail', ''))[:200]})"
                + (f" in {', '.join(failing[:4])}" if failing else "")
                + "; it was not submitted",
                "validators would invalidate it and slash the stake: check this machine's GPU, driver and engine "
                "(`intellect-node rollout verify` runs the same checks on a file)",
            )
        log.info("self-check: our rollout passes every check a validator runs")

    async def _start_relay(self, nursery: trio.Nursery) -> None:
        from ..weights.serve import serve_weights
        from ..weights.store import WeightStore

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
                    from ..weights.relay import Relay

                    assert self._nursery is not None
                    self.relay = Relay(self._relay_store, upstreams)
                    await self._nursery.start(self.relay.run)
                else:
                    self.relay.upstreams = upstreams
            v = self.book.latest
            if v > 0 and v not in self.downloaded and v not in self._downloading and v in self.book.hashes:
                self._start_download(v)

    async def _download(self, version: int) -> None:
        from ..weights.client import DownloadError, download

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
            self.weights_hash[version] = h
            for old in [v for v in self.downloaded if v < version - 4]:
                self.downloaded.pop(old, None)  # (`weights_hash` keeps every version: a loaded one may be old)
            self.download_took = time.monotonic() - started
            log.info("policy version %d downloaded and verified in %.1f s", version, self.download_took)
            self._new_download.set()
            self._new_download = trio.Event()
        except DownloadError as exc:
            self.download_took = float("inf")  # name held versions from now on (`version_to_name`)
            log.warning("download of policy version %d failed: %s", version, exc)
        finally:
            self._downloading.discard(version)

    def held_version(self) -> int:
        """The newest policy version this worker can generate with without a download (the one it names
        when it asks for a task; the coordinator binds the task to it if it is fresh enough)."""
        return max([self.loaded_version, *self.downloaded])

    async def version_to_name(self) -> int | None:
        """The version to name in a task request, before its seed is known (the task is bound to it).
        While this worker's downloads have been quick (within `fresh_wait`; none yet counts as quick),
        none: the task is bound to the current version, the freshest rollouts for the trainer, fetched
        in `ensure_policy`. Once a download was slow or failed, the newest held, after a short wait
        (`fresh_wait`) for a newer one already downloading, so it keeps generating while big checkpoints
        arrive instead of binding tasks to weights it cannot get in time."""
        if rules.follows_current(self.download_took, self.cfg.fresh_wait):
            return None
        deadline = trio.current_time() + self.cfg.fresh_wait
        while any(v > self.held_version() for v in self._downloading) and trio.current_time() < deadline:
            self.phase = "waiting for a newer policy version's download"
            with trio.move_on_at(min(deadline, trio.current_time() + 5.0)):
                await self._new_download.wait()
        return self.held_version()

    async def ensure_policy(self, task: protocol.Task) -> int:
        """Load the newest checkpoint that is fresh enough for `task` (hot reload, no restart);
        wait (bounded) for a download when the loaded one is too old. Returns the version in use."""
        deadline = trio.current_time() + self.cfg.policy_wait
        # A newer version that is already downloading is worth a short wait (seconds on a LAN);
        # without one the worker goes on with what it has, as long as the task allows it.
        fresh_deadline = trio.current_time() + self.cfg.fresh_wait
        while True:
            best = rules.best_downloaded(self.downloaded, task.min_policy_version, task.policy_version)
            # a newer one, or an older one when the task is bound below what is loaded (a task resent
            # from before a reload): without going back it could never be generated
            if best is not None and (best > self.loaded_version or self.loaded_version > task.policy_version):
                if self.cfg.cheat != "model":  # the model cheater keeps its own weights and lies
                    self.phase = f"loading policy version {best}"
                    await trio.to_thread.run_sync(self.engine.reload_weights, self.downloaded[best])
                self.loaded_version = best
                log.info("now generating with policy version %d", best)
            in_flight = rules.newer_coming(
                self.loaded_version, self._downloading, self.book.latest, task.policy_version
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
        v = rules.version_to_fetch(
            self.book.hashes, self.downloaded, self._downloading, task.min_policy_version, task.policy_version
        )
        if v is not None:
            self._start_download(v)

    def _start_download(self, version: int) -> None:
        assert self._nursery is not None
        self._downloading.add(version)
        self._nursery.start_soon(self._download, version)
