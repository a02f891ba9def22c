"""`intellect-node devnet`: the whole protocol on one machine, on a local anvil chain.

It starts anvil, deploys the contracts, creates, funds and starts a pool whose bootstrap record is the
coordinator's address, then runs every role as its own process on 127.0.0.1: a coordinator, a
validator, honest workers and (with `--adversary`) a cheating worker. Workers stake, bind and join by
themselves (`join --yes`), exactly as a user's machine would. Once every worker has done its steps and
the validator has checked every record, chain time is fast-forwarded past the validation window; the
honest workers claim, the cheater has been invalidated and slashed, and the devnet ends with the audit
and a summary (`--report FILE` writes it as JSON).

`--chain-only` stops after the chain side (a pool with one joined node), for exploring the contracts.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import httpx
import trio
from libp2p.peer.id import ID

from node import ops
from node.audit_read import audit
from node.chain import ChainClient, Deployment
from node.chain.abi import topic
from node.chain.anvil import ANVIL_KEYS, Anvil, advance_time, free_port
from node.chain.messages import tokens
from node.chain.rpc import RpcClient
from node.errors import IntellectError
from node.keys import from_hex
from node.p2p.host import identity_from_eth_key

from .deploy import TOKEN, DeployParams, deploy

ROOT = Path(__file__).resolve().parent.parent
# Completion budget of the devnet's tasks and evaluation: twice the largest thinking-budget target (32), so
# running on to the limit is the worst length for every target. Any early stop then scores at least as well
# as no stop, and GRPO can only push the end-of-sequence token up from where the tiny random model starts
# (it ends a few percent of its completions early). With 48, a very short completion on a 32-token target
# scored below running on, and unlucky first steps could push EOS down until it was never sampled again,
# leaving the reward flat (see tests/integration/test_devnet_learns.py).
DEVNET_MAX_TOKENS = 64


def task_spec(model: str, env: str) -> dict[str, Any]:
    return {
        "name": "devnet-arithmetic",
        "model": model,
        "environment": env,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": DEVNET_MAX_TOKENS},
        "group_size": 8,
        "async_level": 2,
    }


@dataclass(frozen=True)
class DevnetOptions:
    workdir: Path
    port: int = 0
    chain_id: int = 31337
    keep_running: bool = False
    as_json: bool = False
    window: int = 24 * 3600
    chain_only: bool = False
    model: str = "smollm2"
    env: str = "thinking-budget"
    train: bool | None = None  # None: on for the tiny model or with a GPU (SmolLM2 steps take minutes on a CPU)
    train_files: int = 2
    seed: int | None = None  # fixed task seeds for the coordinator
    eval_problems: int = 0  # after training: score the base and final policies on this many held-out problems
    steps: int = 3
    workers: int = 2
    adversary: bool = False
    adversary_kind: str = "model"
    report: Path | None = None
    timeout: float = 900.0
    live: bool | None = None


@dataclass(frozen=True)
class Roles:
    """Keys of the devnet's parties: anvil's prefunded accounts (public, local only)."""

    owner: Any
    coordinator: Any
    validator: Any
    provider: Any
    node: Any
    workers: list[tuple[Any, Any]] = field(default_factory=list)
    jurors: list[Any] = field(default_factory=list)  # validators that only sit on dispute committees
    liar: Any = None  # the lying validator of `--adversary-kind lying-validator`

    @classmethod
    def default(cls) -> Roles:
        k = [from_hex(x) for x in ANVIL_KEYS]
        # Beyond anvil's ten funded accounts: fixed keys, given ether by `create_pool` (local only).
        extra = [from_hex("0x" + hashlib.sha256(f"intellect devnet {n}".encode()).hexdigest()) for n in range(3)]
        # (provider, node) pairs for up to 3 workers: accounts 3/4, 5/6, 7/8
        return cls(
            owner=k[0], coordinator=k[1], validator=k[2], provider=k[3], node=k[4],
            workers=[(k[3], k[4]), (k[5], k[6]), (k[7], k[8])], jurors=extra[:2], liar=extra[2],
        )  # fmt: skip

    @property
    def validators(self) -> list[Any]:
        """Every validator the devnet's pool names: the checking one, the jurors and the liar."""
        return [self.validator, *self.jurors, self.liar]


#: Devnet dispute terms: an hour to appeal and an hour to vote (the devnet fast-forwards the chain by
#: the validation window once work is checked and disputes are decided), committees of up to three.
DEVNET_DISPUTES = ops.DisputeTerms(appeal_period=3600, vote_period=3600, committee_size=3)


def peer_id_of(account: Any) -> str:
    return ID.from_pubkey(identity_from_eth_key(bytes(account.key)).public_key).to_base58()


async def create_pool(url: str, opts: DevnetOptions, roles: Roles, say: Any, bootstrap: str) -> dict[str, Any]:
    lying = opts.adversary and opts.adversary_kind == "lying-validator"  # only then is the liar named
    async with RpcClient(url) as rpc:
        dep = await deploy(rpc, roles.owner, DeployParams(), rpc_url=url, progress=say)
        for v in roles.validators:  # gas for the keys beyond anvil's funded ones
            await rpc.request("anvil_setBalance", [v.address, hex(10**20)])
    dep.save(opts.workdir / "deployment.json")
    spec_bytes = json.dumps(task_spec(opts.model, opts.env), sort_keys=True).encode()
    (opts.workdir / "task-spec.json").write_bytes(spec_bytes)
    owner = await ChainClient.connect(url, dep, roles.owner)
    try:
        mint = [(roles.owner.address, 100_000)] + [(p.address, 1_000) for p, _ in roles.workers]
        mint += [(v.address, 1_000) for v in roles.validators]  # their dispute bonds
        for who, amount in mint:
            await owner.transact("IntellectToken", "mint", who, amount * TOKEN, what="mint")
        say("minted test tokens to the pool owner, the providers and the validators")
        spec = ops.PoolSpec(
            coordinator=roles.coordinator.address,
            spec_uri=(opts.workdir / "task-spec.json").resolve().as_uri(),
            spec_hash="0x" + hashlib.sha256(spec_bytes).hexdigest(),
            reward_rate=10**15,
            validation_window=opts.window,
            slash_amount=5 * TOKEN,
            min_stake=20 * TOKEN,
            bootstrap=bootstrap,
            validators=tuple(v.address for v in roles.validators if v is not roles.liar or lying),
            disputes=DEVNET_DISPUTES,
        )
        pool_id, _ = await ops.create_pool(owner, spec)
        await owner.transact("PoolManager", "startPool", pool_id, what="pool start")
        await ops.fund_pool(owner, pool_id, 10_000 * TOKEN)
        say(
            f"created, started and funded pool {pool_id} (reward {tokens(spec.reward_rate)}/unit, "
            f"window {opts.window} s, slash {tokens(spec.slash_amount)})"
        )
    finally:
        await owner.aclose()
    return {"deployment": dep, "pool": pool_id}


async def join_one_node(url: str, dep: Any, roles: Roles, pool_id: int, say: Any) -> None:
    """The chain-only devnet: one provider with one node joined by a coordinator's invite."""
    provider = await ChainClient.connect(url, dep, roles.provider)
    coord = await ChainClient.connect(url, dep, roles.coordinator)
    try:
        await ops.register_provider(provider, 100 * TOKEN)
        sig = await ops.node_signature(provider, roles.node, roles.provider.address)
        await ops.add_node(provider, roles.node.address, 1, sig)
        say(f"registered provider {roles.provider.address} and bound node {roles.node.address}")
        invite = await ops.make_invite(coord, roles.coordinator, pool_id, roles.node.address, 3600)
        await ops.join_pool(provider, invite)
        say(f"node {roles.node.address} joined pool {pool_id} with a coordinator's invite")
    finally:
        await provider.aclose()
        await coord.aclose()


# ---------------------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    role: str
    http_port: int
    data_dir: Path
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    status: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True
        )
        log.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

    def tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def stop_all(procs: list[Proc], timeout: float = 20.0) -> None:
    """SIGTERM every process at once, wait for all (bounded), SIGKILL the rest."""
    for p in procs:
        if p.alive() and p.popen is not None:
            p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        if p.popen is None:
            continue
        try:
            p.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill9()


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def make_procs(opts: DevnetOptions, url: str, roles: Roles, pool_id: int, coord_port: int) -> list[Proc]:
    opts = resolve_train(opts)
    dep = str(opts.workdir / "deployment.json")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    base_env.update({"INTELLECT_RPC_URL": url, "INTELLECT_DEPLOYMENT": dep, "PYTHONUNBUFFERED": "1"})
    procs = []

    def add(name: str, role: str, args: list[str], key: Any, node_key: Any = None) -> None:
        port = free_port()
        env = dict(base_env, INTELLECT_PRIVATE_KEY=key.key.hex())
        if node_key is not None:
            env["INTELLECT_NODE_KEY"] = node_key.key.hex()
        d = opts.workdir / name
        argv = cli_argv(*args, "--data-dir", str(d), "--metrics", f"127.0.0.1:{port}")
        procs.append(Proc(name, role, port, d, argv, env, opts.workdir / f"{name}.log"))

    add(
        "coordinator",
        "coordinator",
        ["coordinator", "--pool", str(pool_id), "--listen", f"/ip4/127.0.0.1/tcp/{coord_port}",
         "--model", opts.model, "--env", opts.env, "--record-every", "2", "--eject-after", "900",
         "--weights", f"127.0.0.1:{free_port()}", "--train-files", str(opts.train_files),
         "--train" if opts.train else "--no-train",
         "--lr", "3e-4" if opts.model.startswith("tiny") else "1e-5"]
        + (["--seed", str(opts.seed)] if opts.seed is not None else []),
        roles.coordinator,
    )  # fmt: skip
    validate = ["validate", "--pool", str(pool_id), "--listen", "/ip4/127.0.0.1/tcp/0", "--model", opts.model]
    add("validator", "validator", validate, roles.validator)
    lying = opts.adversary and opts.adversary_kind == "lying-validator"
    if opts.adversary:
        # Jurors check nothing on their own (sample rate 0) and sit on the committees of appeals.
        for i, juror in enumerate(roles.jurors):
            add(f"juror{i + 1}", "validator", [*validate, "--sample-rate", "0"], juror)
    if lying:
        add("liar", "validator", [*validate, "--lie"], roles.liar)
    n_workers = opts.workers + (1 if opts.adversary and not lying else 0)
    if n_workers > len(roles.workers):
        raise click.UsageError(f"the devnet has keys for {len(roles.workers)} workers")
    for i in range(n_workers):
        provider, node = roles.workers[i]
        cheat = opts.adversary and not lying and i == n_workers - 1
        args = ["join", "--pool", str(pool_id), "--listen", "/ip4/127.0.0.1/tcp/0", "--steps", str(opts.steps), "--yes"]
        if cheat:
            args += ["--cheat", opts.adversary_kind]
        elif i == 0 and opts.train:
            args += ["--relay", f"127.0.0.1:{free_port()}"]  # the first worker also relays checkpoints
        add("cheater" if cheat else f"worker{i + 1}", "worker", args, provider, node)
    return procs


async def poll_status(client: httpx.AsyncClient, procs: list[Proc]) -> None:
    for p in procs:
        try:
            r = await client.get(f"http://127.0.0.1:{p.http_port}/status", timeout=2.0)
            p.status = r.json() if r.status_code == 200 else {"error": r.status_code}
        except (httpx.HTTPError, ValueError):
            p.status = {"phase": "starting"} if p.alive() else {"phase": "exited"}


def status_line(p: Proc) -> str:
    s = p.status
    if p.role == "worker":
        return (
            f"{p.name:<11} {s.get('phase', '?')[:38]:<38} accepted {s.get('accepted', 0)}/{s.get('steps', '?')}"
            f"  policy v{s.get('policy_version', 0)}  claimed {tokens(int(s.get('claimed_tokens', 0)))}"
        )
    if p.role == "coordinator":
        r = s.get("rollouts", {})
        curve = s.get("reward_curve", [])
        return (
            f"{p.name:<11} members {len(s.get('members', []))}  accepted {r.get('accepted', 0)}"
            f"  recorded {r.get('recorded', 0)}  rejected {sum(s.get('rejected', {}).values())}"
            f"  policy v{s.get('policy_version', 0)}  reward/step {' '.join(f'{x:.2f}' for x in curve[-6:]) or '-'}"
        )
    c = s.get("checks", {})
    return (
        f"{p.name:<11} seen {s.get('seen', 0)}  ok {c.get('ok', 0)}  invalidated {c.get('invalidated', 0)}"
        f"  open {s.get('open', 0)}"
    )


class DevnetFailed(IntellectError):
    """The devnet did not reach the outcome it checks for (a role exited, a stage timed out, a wrong result)."""


async def orchestrate(
    url: str, opts: DevnetOptions, roles: Roles, pool_id: int, procs: list[Proc], say: Any
) -> dict[str, Any]:
    by_role = {p.name: p for p in procs}
    coord = by_role["coordinator"]
    checkers = [p for p in procs if p.name in ("validator", "liar")]  # the validators that check every record
    workers = [p for p in procs if p.role == "worker"]
    deadline = time.monotonic() + opts.timeout
    live = opts.live if opts.live is not None else (sys.stdout.isatty() and not opts.as_json)
    view: Any = None
    if live:
        from rich.live import Live

        view = Live(refresh_per_second=2, transient=False)
        view.start()
    last_print = 0.0

    def show(stage: str) -> None:
        nonlocal last_print
        lines = [f"[{time.strftime('%H:%M:%S')}] {stage}"] + ["  " + status_line(p) for p in procs]
        if view is not None:
            from rich.text import Text

            view.update(Text("\n".join(lines)))
        elif time.monotonic() - last_print > 10 and not opts.as_json:
            last_print = time.monotonic()
            click.echo("\n".join(lines))

    async def wait_until(cond: Any, stage: str) -> None:
        while True:
            await poll_status(client, procs)
            show(stage)
            for p in procs:
                if not p.alive():
                    click.echo(f"--- {p.name}\n{p.tail()}", err=True)
                    raise DevnetFailed(
                        f"{p.name} exited with code {p.popen.returncode if p.popen else '?'}",
                        f"its log is {p.log_path} (last lines above)",
                    )
            if cond():
                return
            if time.monotonic() > deadline:
                click.echo("\n".join(f"--- {p.name}\n{p.tail(8)}" for p in procs), err=True)
                raise DevnetFailed(
                    f"timed out after {opts.timeout:.0f} s while: {stage}",
                    f"the roles' logs are in {opts.workdir} (last lines above); --timeout gives more time",
                )
            await trio.sleep(1.0)

    try:
        async with httpx.AsyncClient() as client:
            await wait_until(
                lambda: all(w.status.get("accepted", 0) >= opts.steps for w in workers),
                f"workers generating {opts.steps} step(s) each",
            )

            def recorded_and_checked() -> bool:
                r = coord.status.get("rollouts", {})
                total = sum(w.status.get("accepted", 0) for w in workers)
                return (
                    r.get("accepted", 0) == 0
                    and r.get("recorded", 0) + r.get("dropped", 0) >= total
                    and all(v.status.get("seen", 0) >= r.get("recorded", 0) for v in checkers)
                    and all(v.status.get("open", 1) == 0 for v in checkers)
                )

            await wait_until(recorded_and_checked, "recording work on chain and validating it")
            reader = await ChainClient.connect(url, Deployment.load(opts.workdir / "deployment.json"))
            try:
                await decide_disputes(reader, pool_id, wait_until)
            finally:
                await reader.aclose()
            async with RpcClient(url) as rpc:
                await advance_time(rpc, opts.window + 1)
            say(f"fast-forwarded chain time by {opts.window + 1} s: the validation window is over")
            reader = await ChainClient.connect(url, Deployment.load(opts.workdir / "deployment.json"))
            try:
                while int((await reader.call("WorkLedger", "poolAccount", pool_id))["pendingUnits"]) > 0:
                    await wait_until(lambda: True, "workers claiming final rewards")
                    await trio.sleep(1.0)
                report = await audit(reader, pool_id)
                bond = int((await reader.call("PoolManager", "disputeTerms", pool_id))["bond"])
                disputes = dispute_summary(report.nodes, bond, roles)
            finally:
                await reader.aclose()
    finally:
        if view is not None:
            view.stop()
    return build_report(opts, roles, pool_id, procs, report) | {"disputes": disputes}


#: Seconds an accusation is given for its provider's worker to appeal before the chain is fast-forwarded
#: (workers look every `claim_every`, 5 s).
APPEAL_GRACE = 20.0


async def decide_disputes(reader: ChainClient, pool_id: int, wait_until: Any) -> None:
    """Before time moves on: every accusation has had `APPEAL_GRACE` seconds to be appealed, and every
    appeal and challenge has been decided by its committee (a vote period that ran out under the
    fast-forward would decide nothing)."""
    first_seen: dict[str, float] = {}
    state = {"done": False}

    async def poll() -> None:
        events = await reader.events(["WorkLedger"], topics=[None, topic(pool_id)])
        now = time.monotonic()
        contested, resolved = set(), set()
        for e in events:
            k = str(e.args.get("workKey"))
            if e.name == "WorkAccused":
                first_seen.setdefault(k, now)
            elif e.name in ("WorkAppealed", "WorkChallenged"):
                contested.add(k)
            elif e.name == "DisputeResolved":
                resolved.add(k)
        graced = all(now - t >= APPEAL_GRACE for k, t in first_seen.items() if k not in contested)
        state["done"] = graced and contested <= resolved

    await poll()
    while not state["done"]:
        await wait_until(lambda: True, "appeals of accused work decided by their committees")
        await trio.sleep(2.0)
        await poll()


def dispute_summary(nodes: dict[str, Any], bond: int, roles: Roles) -> dict[str, Any]:
    """Every dispute of the pool, from the audit's replay of its events (`nodes`: the audit report's
    ledgers): who accused or challenged, whether it was appealed, and the verdict; per accuser, how
    many of its accusations stood and the bonds it lost (its `bond` for each one overturned)."""
    names = {v.address: n for n, v in [("validator", roles.validator), ("liar", roles.liar)]}
    names |= {j.address: f"juror{i + 1}" for i, j in enumerate(roles.jurors)}
    by_key: dict[str, dict[str, Any]] = {}
    for ledger in nodes.values():
        for d in ledger["disputes"]:
            if d["kind"] == "soft invalidation":
                continue
            by_key[d["work_key"]] = {
                "by": names.get(d["by"], d["by"]), "provider": ledger["provider"], "appealed": d["kind"] == "appeal",
                "verdict": d["verdict"], "kind": "challenge" if d["kind"] == "challenge" else "accusation",
            }  # fmt: skip
    per: dict[str, dict[str, int]] = {}
    for d in by_key.values():
        p = per.setdefault(d["by"], {"accused": 0, "upheld": 0, "overturned": 0, "bonds_lost": 0})
        p["accused"] += 1
        if d["verdict"] in ("upheld", "overturned"):
            p[d["verdict"]] += 1
        if d["verdict"] == "overturned":
            p["bonds_lost"] += bond
    return {"records": by_key, "by_accuser": per}


def build_report(opts: DevnetOptions, roles: Roles, pool_id: int, procs: list[Proc], rep: Any) -> dict[str, Any]:
    opts = resolve_train(opts)
    coord = next(p for p in procs if p.role == "coordinator")
    per_node = coord.status.get("per_node", {})
    nodes = {}
    for p in procs:
        if p.role != "worker":
            continue
        node = p.status.get("node", "")
        ledger = rep.nodes.get(node, {})
        acc = per_node.get(node, {})
        nodes[p.name] = {
            "node": node,
            "provider": p.status.get("provider"),
            "cheater": p.name == "cheater",
            "rollouts_accepted": acc.get("recorded", 0) + acc.get("accepted", 0),
            "rollouts_invalidated": ledger.get("invalidated_records", 0),
            "trainer_refused": coord.status.get("trainer_refused", {}).get(node, 0),
            "trainer_took": coord.status.get("trainer_took", {}).get(node, 0),
            "units_recorded": ledger.get("recorded_units", 0),
            "units_invalidated": ledger.get("invalidated_units", 0),
            "units_claimed": ledger.get("claimed_units", 0),
            "tokens_claimed": ledger.get("claimed_tokens", 0),
            "slashes": ledger.get("slashes", []),
            "slashed_tokens": ledger.get("slashed_tokens", 0),
        }
    return {
        "pool": pool_id,
        "model": opts.model,
        "steps": opts.steps,
        "seed": opts.seed,
        "adversary": opts.adversary_kind if opts.adversary else None,
        "nodes": nodes,
        "validator": next(p for p in procs if p.role == "validator").status.get("checks", {}),
        "coordinator": {k: coord.status.get(k) for k in ("rollouts", "rejected", "mean_reward", "txs")},
        "training": {
            "enabled": opts.train,
            "policy_version": coord.status.get("policy_version", 0),
            "reward_curve": coord.status.get("reward_curve", []),
            "trained_versions": coord.status.get("trained_versions", []),
            "stale_never_trained": coord.status.get("stale_never_trained", 0),
            "samples_trained": coord.status.get("samples_trained", 0),
            "samples_verified": coord.status.get("samples_verified", 0),
            "rollout_versions": coord.status.get("rollout_versions", {}),
            "relays": coord.status.get("relays", []),
            "relays_refused": coord.status.get("relays_refused", {}),
        },
        "audit": {
            "consistent": rep.consistent,
            "mismatches": rep.mismatches,
            "totals": rep.totals,
            "providers": rep.providers,
        },
    }


def check_outcome(report: dict[str, Any]) -> list[str]:
    """What went wrong, if anything: honest work claimed, cheating invalidated and slashed, audit clean."""
    problems = []
    for name, n in report["nodes"].items():
        if n["cheater"]:
            if n["rollouts_invalidated"] == 0 or n["slashed_tokens"] == 0:
                problems.append(f"{name} cheated but was not invalidated and slashed")
            if n["units_claimed"]:
                problems.append(f"{name} cheated but claimed {n['units_claimed']} units")
        else:
            if n["rollouts_invalidated"]:
                problems.append(f"honest {name} had {n['rollouts_invalidated']} rollout(s) invalidated")
            if n.get("trainer_refused"):
                problems.append(f"the trainer refused {n['trainer_refused']} honest rollout(s) of {name}")
            if n["units_claimed"] == 0 or n["units_claimed"] != n["units_recorded"]:
                problems.append(f"honest {name} claimed {n['units_claimed']} of {n['units_recorded']} units")
    d = report.get("disputes", {"records": {}, "by_accuser": {}})
    if report.get("adversary") == "lying-validator":
        liar = d["by_accuser"].get("liar", {})
        if not liar.get("accused"):
            problems.append("the lying validator accused nothing")
        elif liar.get("upheld") or liar.get("overturned") != liar.get("accused"):
            problems.append(f"the lying validator's accusations were not all overturned on appeal: {liar}")
        elif not liar.get("bonds_lost"):
            problems.append("the lying validator lost no bond")
    for k, rec in d["records"].items():
        if rec["appealed"] and rec["verdict"] == "open":
            problems.append(f"the appeal of {k} was never decided")
    t = report.get("training", {})
    if t.get("samples_verified", 0) != t.get("samples_trained", 0):
        problems.append(f"trained on {t['samples_trained']} samples, only {t['samples_verified']} verified first")
    if not report["audit"]["consistent"]:
        problems.append("audit found mismatches: " + "; ".join(report["audit"]["mismatches"][:5]))
    return problems


def resolve_train(opts: DevnetOptions) -> DevnetOptions:
    if opts.train is not None:
        return opts
    import torch

    return replace(opts, train=opts.model.startswith("tiny") or torch.cuda.is_available())


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the `finally` blocks that stop the daemons and anvil


def run_devnet(opts: DevnetOptions) -> dict[str, Any]:
    opts = resolve_train(opts)
    signal.signal(signal.SIGTERM, _terminate)
    opts.workdir.mkdir(parents=True, exist_ok=True)
    port = opts.port or free_port()
    say = (lambda m: None) if opts.as_json else (lambda m: click.echo(m))
    started = time.monotonic()
    roles = Roles.default()
    coord_port = free_port()
    bootstrap = f"/ip4/127.0.0.1/tcp/{coord_port}/p2p/{peer_id_of(roles.coordinator)}"
    with Anvil(port=port, chain_id=opts.chain_id, log_file=str(opts.workdir / "anvil.log")) as anvil:
        say(f"anvil running on {anvil.url} (chain id {opts.chain_id})")
        if not opts.train:
            say("training is off (--train turns it on; a SmolLM2 policy step takes minutes on a CPU)")
        made = trio.run(create_pool, anvil.url, opts, roles, say, bootstrap)
        pool_id = made["pool"]
        dep = made["deployment"]
        if opts.chain_only:
            trio.run(join_one_node, anvil.url, dep, roles, pool_id, say)
            summary = chain_summary(anvil.url, opts, roles, pool_id, dep)
        else:
            procs = make_procs(opts, anvil.url, roles, pool_id, coord_port)
            say(f"starting {', '.join(p.name for p in procs)} (logs in {opts.workdir}/<name>.log)")
            try:
                for p in procs:
                    p.start()
                report = trio.run(orchestrate, anvil.url, opts, roles, pool_id, procs, say)
            finally:
                stop_all(procs)
            report["seconds"] = round(time.monotonic() - started, 1)
            problems = check_outcome(report)
            report["ok"] = not problems
            report["problems"] = problems
            summary = report
            curve = report["training"]["reward_curve"]
            if curve and opts.eval_problems:
                report["training"]["eval"] = held_out_eval(opts, len(curve), say)
            if curve:
                from .plot import line_chart

                png = (opts.report or opts.workdir / "report.json").with_suffix(".reward.png")
                line_chart(curve, png, title=f"devnet mean reward per policy step ({opts.env}, {opts.model})")
                report["training"]["reward_plot"] = str(png)
            if opts.report is not None:
                opts.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
            print_summary(report, say)
        summary["seconds"] = round(time.monotonic() - started, 2)
        (opts.workdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        if opts.as_json:
            click.echo(json.dumps(summary, indent=2, default=str))
        if opts.keep_running:
            say(f"anvil keeps running on {anvil.url}; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                say("stopping")
        if not opts.chain_only and summary["problems"]:
            raise DevnetFailed("devnet outcome is wrong: " + "; ".join(summary["problems"]))
    return summary


def held_out_eval(opts: DevnetOptions, version: int, say: Any) -> dict[str, Any]:
    """`intellect-node eval` of the base model against the final policy version (in its own process:
    one vLLM engine per process), on held-out problems with paired sampling seeds."""
    ckpt = opts.workdir / "coordinator" / "checkpoints" / f"v{version}"
    out = opts.workdir / "eval.json"
    say(f"evaluating the base model and policy version {version} on {opts.eval_problems} held-out problems")
    argv = cli_argv(
        "eval", "--model", opts.model, "--env", opts.env, "--checkpoint", f"final={ckpt}",
        "--problems", str(opts.eval_problems), "--max-tokens", str(DEVNET_MAX_TOKENS), "--json",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    with open(opts.workdir / "eval.log", "wb") as log_file:
        p = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=log_file, env=env, cwd=str(ROOT), timeout=900, check=False
        )
    if p.returncode != 0:
        raise DevnetFailed(f"the evaluation failed (exit {p.returncode}); see {opts.workdir / 'eval.log'}")
    out.write_bytes(p.stdout)
    data: dict[str, Any] = json.loads(p.stdout)
    data["version"] = version
    g = data["gain_over_base"]["final"]
    m = data["mean_reward"]
    say(f"  held-out mean reward: base {m['base']:+.3f}, v{version} {m['final']:+.3f} "
        f"(gain {g['gain']:+.3f} +- {g['se']:.3f})")  # fmt: skip
    return data


def chain_summary(url: str, opts: DevnetOptions, roles: Roles, pool_id: int, dep: Any) -> dict[str, Any]:
    async def info() -> dict[str, Any]:
        c = await ChainClient.connect(url, dep)
        try:
            return await ops.pool_info(c, pool_id)
        finally:
            await c.aclose()

    pinfo = trio.run(info)
    return {
        "rpc_url": url,
        "chain_id": dep.chain_id,
        "deployment": str(opts.workdir / "deployment.json"),
        "contracts": dep.contracts,
        "pool": pool_id,
        "pool_status": pinfo["statusName"],
        "members": pinfo["members"],
        "roles": {
            "owner": roles.owner.address,
            "coordinator": roles.coordinator.address,
            "validator": roles.validator.address,
            "provider": roles.provider.address,
            "node": roles.node.address,
        },
    }


def print_summary(report: dict[str, Any], say: Any) -> None:
    say("")
    say(f"devnet summary (pool {report['pool']}, model {report['model']}, {report['steps']} step(s) per worker)")
    for name, n in report["nodes"].items():
        say(
            f"  {name:<9} accepted {n['rollouts_accepted']:>2}  invalidated {n['rollouts_invalidated']:>2}  "
            f"units {n['units_recorded']:>5}  claimed {tokens(n['tokens_claimed'])}  "
            f"slashed {tokens(n['slashed_tokens'])}"
        )
        for s in n["slashes"]:
            say(f"            slash {tokens(s['amount'])} for work {s['work_key'][:14]}... in tx {s['tx']}")
    t = report.get("training", {})
    if t.get("enabled"):
        curve = " ".join(f"{x:.3f}" for x in t.get("reward_curve", []))
        say(f"  training: policy version {t.get('policy_version')}, mean reward per step: {curve or '-'}")
        say(
            f"  trained on {t.get('samples_trained', 0)} samples, {t.get('samples_verified', 0)} verified first; "
            f"rollouts refused by the trainer's checks: "
            + (", ".join(f"{k} {n['trainer_refused']}" for k, n in report["nodes"].items() if n.get("trainer_refused"))
               or "none")
        )  # fmt: skip
        if t.get("reward_plot"):
            say(f"  reward curve plotted in {t['reward_plot']}")
    d = report.get("disputes", {}).get("by_accuser", {})
    for who, n in d.items():
        say(
            f"  disputes by {who}: {n['accused']} accusation(s), {n['upheld']} upheld, {n['overturned']} overturned"
            + (f" (lost {tokens(n['bonds_lost'])} in bonds)" if n["bonds_lost"] else "")
        )
    a = report["audit"]
    say(f"  audit: {'consistent' if a['consistent'] else 'MISMATCHES: ' + '; '.join(a['mismatches'][:3])}")
    if report["problems"]:
        say("  PROBLEMS: " + "; ".join(report["problems"]))
    else:
        if report.get("adversary") == "lying-validator":
            say("  outcome as expected: honest work claimed, the lying validator's accusations overturned on appeal")
        elif report.get("adversary"):
            say("  outcome as expected: honest work claimed, cheating invalidated and slashed")
        else:
            say("  outcome as expected: honest work recorded, verified and claimed")
