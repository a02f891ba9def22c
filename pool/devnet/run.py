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

import json
import os
import subprocess
import sys
import time
from typing import Any

import click
import httpx
import trio

from node.audit_read import audit
from node.chain import ChainClient, Deployment
from node.chain.anvil import Anvil, advance_time, free_port
from node.chain.rpc import RpcClient
from node.errors import IntellectError
from node.runtime import run_trio, stop_on_sigterm

from .procs import Proc, cli_argv, make_procs, poll_status, status_line, stop_all
from .report import build_report, chain_summary, check_outcome, decide_disputes, dispute_summary, print_summary
from .setup import (
    DEVNET_MAX_TOKENS,
    ROOT,
    DevnetOptions,
    Roles,
    clear_previous_run,
    create_pool,
    join_one_node,
    peer_id_of,
    resolve_train,
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
                explorer = await explorer_agrees(client, procs[0].explorer, pool_id, report)
                bond = int((await reader.call("PoolManager", "disputeTerms", pool_id))["bond"])
                disputes = dispute_summary(report.nodes, bond, roles)
            finally:
                await reader.aclose()
    finally:
        if view is not None:
            view.stop()
    return build_report(opts, roles, pool_id, procs, report) | {"disputes": disputes, "explorer": explorer}


async def keep_explorer(url: str, opts: DevnetOptions, pool_id: int, port: int, coordinator: dict[str, Any]) -> None:
    """`--keep-running`: once the roles have stopped, the pool's explorer from the chain, with the
    coordinator's last status page (its reward curve) as it stopped, until Ctrl-C."""
    from pool.explorer.server import Explorer, serve_explorer

    last = {**coordinator, "name": "coordinator (stopped with the devnet)"}
    async with await ChainClient.connect(url, Deployment.load(opts.workdir / "deployment.json")) as chain:
        ex = Explorer(chain, pools=(pool_id,), status_fns=(lambda: last,), refresh=5.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_explorer, ex, "127.0.0.1", port)
            await trio.sleep_forever()


async def explorer_agrees(client: httpx.AsyncClient, url: str, pool_id: int, report: Any) -> dict[str, Any]:
    """The coordinator's explorer, once it has read the chain at the audit's block or later: whether its
    totals and per-node ledgers are the audit's."""
    api = url.split("/pool/")[0] + f"/api/pool/{pool_id}"
    seen: dict[str, Any] = {}
    with trio.move_on_after(30):
        while True:
            try:
                seen = (await client.get(api, timeout=5)).json().get("audit") or {}
            except (httpx.HTTPError, ValueError):
                seen = {}
            if int(seen.get("block", -1)) >= report.block:
                break
            await trio.sleep(1.0)
    same = seen.get("totals") == report.totals and seen.get("nodes") == report.nodes
    return {"url": url, "block": seen.get("block"), "matches_audit": bool(seen) and same}


def run_devnet(opts: DevnetOptions) -> dict[str, Any]:
    opts = resolve_train(opts)
    stop_on_sigterm()
    opts.workdir.mkdir(parents=True, exist_ok=True)
    port = opts.port or free_port()
    say = (lambda m: None) if opts.as_json else (lambda m: click.echo(m))
    if clear_previous_run(opts.workdir):
        say(f"cleared the previous devnet run from {opts.workdir} (a new chain starts every time)")
    started = time.monotonic()
    roles = Roles.default()
    coord_port = free_port()
    bootstrap = f"/ip4/127.0.0.1/tcp/{coord_port}/p2p/{peer_id_of(roles.coordinator)}"
    with Anvil(port=port, chain_id=opts.chain_id, log_file=str(opts.workdir / "anvil.log")) as anvil:
        say(f"anvil running on {anvil.url} (chain id {opts.chain_id})")
        if not opts.train:
            say("training is off (--train turns it on; a SmolLM2 policy step takes minutes on a CPU)")
        made = run_trio(create_pool, anvil.url, opts, roles, say, bootstrap)
        pool_id = made["pool"]
        dep = made["deployment"]
        if opts.chain_only:
            run_trio(join_one_node, anvil.url, dep, roles, pool_id, say)
            summary = chain_summary(anvil.url, opts, roles, pool_id, dep)
        else:
            procs = make_procs(opts, anvil.url, roles, pool_id, coord_port)
            after = free_port() if opts.keep_running else None  # the explorer that outlives the roles
            say(f"starting {', '.join(p.name for p in procs)} (logs in {opts.workdir}/<name>.log)")
            say(f"the pool's explorer: {procs[0].explorer} (while the devnet runs)")
            try:
                for p in procs:
                    p.start()
                report = run_trio(orchestrate, anvil.url, opts, roles, pool_id, procs, say)
            finally:
                stop_all(procs)
            report["seconds"] = round(time.monotonic() - started, 1)
            if after is not None:
                report["explorer"]["after"] = f"http://127.0.0.1:{after}/pool/{pool_id}"
            problems = check_outcome(report)
            report["ok"] = not problems
            report["problems"] = problems
            summary = report
            curve = report["training"]["reward_curve"]
            if curve and opts.eval_problems:
                report["training"]["eval"] = held_out_eval(opts, len(curve), say)
            if curve:
                from ..plot import line_chart

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
                if opts.chain_only:
                    while True:
                        time.sleep(3600)
                else:
                    say(f"the pool's explorer keeps running at {summary['explorer']['after']}")
                    run_trio(keep_explorer, anvil.url, opts, pool_id, after, procs[0].status)
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
