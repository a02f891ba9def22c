"""The devnet's processes: every role as its own `intellect-node` process on 127.0.0.1, its log, its
/status endpoint polled for the live line, and a clean stop of them all."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx

from node.chain.anvil import free_port
from node.chain.messages import tokens

from .setup import ROOT, DevnetOptions, Roles, resolve_train


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
    explorer: str = ""  # the coordinator's: the URL of the pool's explorer

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
    """SIGTERM every process at once, wait for all (bounded), SIGKILL the rest. A second Ctrl-C or
    SIGTERM while it waits kills the rest at once: they run in sessions of their own, so nothing else
    would stop them."""
    try:
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
    except KeyboardInterrupt:
        for p in procs:
            if p.alive() and p.popen is not None:
                os.killpg(p.popen.pid, signal.SIGKILL)
        for p in procs:
            if p.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(5)  # reaped: a killed process is gone at once
        raise


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
    lying = opts.adversary and "lying-validator" in opts.adversary_kinds
    cheats = [k for k in opts.adversary_kinds if k != "lying-validator"] if opts.adversary else []
    if opts.adversary:
        # Jurors check nothing on their own (sample rate 0) and sit on the committees of appeals.
        for i, juror in enumerate(roles.jurors):
            add(f"juror{i + 1}", "validator", [*validate, "--sample-rate", "0"], juror)
    if lying:
        add("liar", "validator", [*validate, "--lie"], roles.liar)
    n_workers = opts.workers + len(cheats)
    if n_workers > len(roles.workers):
        raise click.UsageError(
            f"the devnet has keys for {len(roles.workers)} workers, cheaters included (with several adversary "
            "kinds, pass --workers 1)"
        )
    for i in range(n_workers):
        provider, node = roles.workers[i]
        cheat = cheats[i - opts.workers] if i >= opts.workers else None
        args = ["join", "--pool", str(pool_id), "--listen", "/ip4/127.0.0.1/tcp/0", "--steps", str(opts.steps), "--yes"]
        if cheat is not None:
            args += ["--cheat", cheat]
        elif i == 0 and opts.train:
            args += ["--relay", f"127.0.0.1:{free_port()}"]  # the first worker also relays checkpoints
        name = f"worker{i + 1}" if cheat is None else "cheater" if len(cheats) == 1 else f"cheater-{cheat}"
        add(name, "worker", args, provider, node)
    coord = procs[0]  # the pool's explorer, with every other role's status page live
    coord.explorer = f"http://127.0.0.1:{free_port()}/pool/{pool_id}"
    coord.argv += ["--explorer", coord.explorer.split("/")[2]]
    for p in procs[1:]:
        coord.argv += ["--explorer-status", f"http://127.0.0.1:{p.http_port}/status"]
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
