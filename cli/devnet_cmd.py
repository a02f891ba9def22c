"""`devnet`: the whole network (chain, coordinator, workers, validators) on this machine."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("devnet")
@click.option(
    "--dir",
    "workdir",
    default="devnet",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the devnet writes its deployment, state and logs.",
)
@click.option("--port", type=int, default=0, help="anvil port (default: a free one).")
@click.option("--chain-id", type=int, default=31337, show_default=True, help="84532 mimics Base Sepolia.")
@click.option(
    "--model",
    default="tiny",
    show_default=True,
    help="tiny (a 4-layer Llama built here in seconds: the whole story in 2-5 minutes on 2 CPU cores) or "
    "smollm2 (SmolLM2-135M-Instruct, a real instruct model: its checks take minutes a file on a CPU).",
)
@click.option(
    "--env",
    "env_name",
    type=click.Choice(["math", "thinking-budget", "code"]),
    default="thinking-budget",
    show_default=True,
)
@click.option("--steps", type=int, default=3, show_default=True, help="Tasks each worker completes.")
@click.option(
    "--train/--no-train",
    default=None,
    help="Train the policy (GRPO) while it runs (default: on for --model tiny or with a GPU).",
)
@click.option("--train-files", type=int, default=2, show_default=True, help="Rollout files per policy step.")
@click.option("--seed", type=int, help="Fixed task seeds: the same problems in the same order on every run.")
@click.option("--workers", type=click.IntRange(1, 2), default=2, show_default=True, help="Honest workers.")
@click.option(
    "--adversary/--honest",
    default=True,
    show_default=True,
    help="An adversary (a cheating worker by default) and two jurors beside the honest roles, so the run shows "
    "cheating caught and slashed; --honest runs honest roles only.",
)
@click.option(
    "--adversary-kind",
    type=click.Choice(["model", "temperature", "duplicate", "poison", "lying-validator"]),
    multiple=True,
    default=("model",),
    show_default=True,
    help="How the adversary cheats: another model's weights, a hotter temperature than claimed, one completion "
    "copied to fill each group (duplicate), proofs that crash the reference verifier (poison), or a validator "
    "that accuses honest work (lying-validator: its accusations are appealed and overturned). Repeat it for one "
    "cheating worker of each kind in the same run (with --workers 1).",
)
@click.option("--window", type=int, default=24 * 3600, show_default=True, help="Validation window (seconds).")
@click.option("--report", type=click.Path(dir_okay=False), help="Write the outcome (with the audit) as JSON here.")
@click.option(
    "--timeout",
    type=float,
    help="Give up after this many seconds (default: 900 with --model tiny, 3600 with smollm2 on a CPU).",
)
@click.option("--chain-only", is_flag=True, help="Only the chain side: a pool with one joined node, no daemons.")
@click.option(
    "--keep-running", is_flag=True, help="Keep anvil (and, after a full run, the pool's explorer) running until Ctrl-C."
)
@click.option(
    "--eval",
    "eval_problems",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="After training, score the base and final policies on this many held-out problems (0: off).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def devnet_cmd(
    workdir: str,
    port: int,
    chain_id: int,
    model: str,
    env_name: str,
    steps: int,
    train: bool | None,
    train_files: int,
    seed: int | None,
    workers: int,
    adversary: bool,
    adversary_kind: tuple[str, ...],
    window: int,
    report: str | None,
    timeout: float | None,
    chain_only: bool,
    keep_running: bool,
    eval_problems: int,
    as_json: bool,
) -> None:
    """Run the local devnet: anvil, contracts, a pool, a coordinator, workers, a validator (and with
    --adversary a cheater) as separate processes on 127.0.0.1; ends with a summary and the audit."""
    from pool.devnet import DevnetOptions, run_devnet

    if len(set(adversary_kind)) != len(adversary_kind):
        raise click.UsageError("each --adversary-kind may be given once")
    if "lying-validator" in adversary_kind and len(adversary_kind) > 1:
        raise click.UsageError("--adversary-kind lying-validator runs alone (its run has no cheating worker)")

    run_devnet(
        DevnetOptions(
            workdir=Path(workdir).resolve(),  # the roles run in the repository, not in the caller's folder
            port=port,
            chain_id=chain_id,
            keep_running=keep_running,
            as_json=as_json,
            window=window,
            chain_only=chain_only,
            model=model,
            env=env_name,
            steps=steps,
            train=train,
            train_files=train_files,
            seed=seed,
            workers=workers,
            adversary=adversary,
            adversary_kinds=tuple(adversary_kind),
            report=Path(report) if report else None,
            timeout=timeout if timeout is not None else (900.0 if model.startswith("tiny") else 3600.0),
            eval_problems=eval_problems,
        )
    )
