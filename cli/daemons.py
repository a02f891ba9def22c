"""The long-running commands: `join` (worker), `validate` (validator) and `coordinator` (pool owner)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from node import keys
from node.errors import ConfigError
from node.p2p.discovery import parse_bootstrap
from node.runtime import fatal_errors, make_metrics, run_daemon, setup_logging

from ._common import AMOUNT, Settings, common

NODE_KEY_ENV = "INTELLECT_NODE_KEY"


def host_port(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    try:
        return (host or "127.0.0.1", int(port))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not HOST:PORT") from None


def _bootstrap(values: tuple[str, ...]) -> list[str]:
    try:
        return [a for v in values for a in parse_bootstrap(v)]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _thresholds(thresholds: str | None) -> Any:
    """The `Calibrated` a --thresholds names, loaded now: a bad one fails at once (a `ConfigError`), not
    after the chain, the spec and the model load. None: the daemon takes the spec model's shipped one."""
    if not thresholds:
        return None
    from node.verify import Calibrated

    return Calibrated.load(thresholds)


def _data_dir(data_dir: str) -> Path:
    """The daemon's --data-dir, made if missing; one that cannot be (a file in the way, no permission, a
    read-only disk) is a `ConfigError` now, before a key or a state file is written."""
    d = Path(data_dir).expanduser()
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not os.access(d, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(d))
    except OSError as exc:
        raise ConfigError(f"cannot use --data-dir {d}: {exc.strerror or exc}", "pass a writable folder") from None
    return d


def _node_key(data_dir: Path, node_keystore: str | None) -> Any:
    """The node's key: a keystore, INTELLECT_NODE_KEY, or one created on first start in the data dir."""
    if node_keystore:
        return keys.load_keystore(node_keystore)
    hexkey = os.environ.get(NODE_KEY_ENV)
    if hexkey:
        return keys.from_hex(hexkey, NODE_KEY_ENV)
    path = data_dir / "node-key.json"
    if path.exists():
        return keys.load_keystore(path) if os.environ.get(keys.PASSWORD_ENV) else _read_plain(path)
    if os.environ.get(keys.PASSWORD_ENV):
        acct = keys.new_keystore(path, os.environ[keys.PASSWORD_ENV])
    else:
        from eth_account import Account

        acct = Account.create()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"plain_private_key": acct.key.hex()}, fh)
        click.echo(f"created node key {acct.address} in {path} (unencrypted: set {keys.PASSWORD_ENV} to encrypt)")
    return acct


def _read_plain(path: Path) -> Any:
    data = json.loads(path.read_text())
    if "plain_private_key" not in data:
        raise ConfigError(f"{path} is an encrypted keystore", f"set {keys.PASSWORD_ENV}")
    return keys.from_hex(data["plain_private_key"], str(path))


def _confirm(question: str) -> bool:
    return bool(click.confirm(question + "?", default=False))


@click.command("join")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id to work for.")
@click.option("--data-dir", type=click.Path(file_okay=False), default="~/.intellect-node/worker", show_default=True)
@click.option(
    "--node-keystore",
    type=click.Path(dir_okay=False),
    help="Node key keystore (else INTELLECT_NODE_KEY, else a key created in the data dir).",
)
@click.option("--listen", default="/ip4/0.0.0.0/tcp/0", show_default=True, help="libp2p listen multiaddr.")
@click.option("--bootstrap", multiple=True, help="Bootstrap multiaddr(s) (default: the pool's on-chain record).")
@click.option("--stake", type=AMOUNT, help="Stake at least this much (default: the pool's minimum).")
@click.option("--steps", type=int, default=0, show_default=True, help="Stop taking tasks after N accepted (0: never).")
@click.option(
    "--cheat", type=click.Choice(["model", "temperature", "duplicate", "poison"]), hidden=True, help="Devnet adversary."
)
@click.option(
    "--metrics",
    "metrics_at",
    default="127.0.0.1:9410",
    show_default=True,
    help="HOST:PORT of /metrics and /status ('' disables).",
)
@click.option("--yes", is_flag=True, help="Do not ask before staking.")
@click.option(
    "--relay",
    "relay_at",
    default="",
    help="HOST:PORT to also serve policy checkpoints as a relay of the weight broadcast ('' : no relay).",
)
@click.option(
    "--self-check",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Run every check a validator runs on the first rollout and on this share of the others before "
    "submitting them; stop if one fails (finds a broken GPU or driver before it costs stake).",
)
@click.option("--rpc-wait", type=float, default=60.0, hidden=True, help="Seconds to retry an unreachable RPC at start.")
@click.option(
    "--connect-wait", type=float, default=120.0, hidden=True, help="Seconds to retry an unreachable coordinator."
)
@click.option("-v", "--verbose", is_flag=True)
@common
def join_command(
    s: Settings,
    pool_id: int,
    data_dir: str,
    node_keystore: str | None,
    listen: str,
    bootstrap: tuple[str, ...],
    stake: int | None,
    steps: int,
    cheat: str | None,
    metrics_at: str,
    yes: bool,
    relay_at: str,
    self_check: float,
    rpc_wait: float,
    connect_wait: float,
    verbose: bool,
) -> None:
    """Turn this machine into a worker of pool POOL: stake, join, generate verified rollouts, earn."""
    from node.worker import Declined, Worker, WorkerConfig

    setup_logging(verbose)
    d = _data_dir(data_dir)
    dep = s.deployment()
    provider = s.account()
    node = _node_key(d, node_keystore)
    cfg = WorkerConfig(
        pool_id=pool_id,
        data_dir=d,
        rpc_url=s.url_for(dep),
        deployment=dep,
        listen=listen,
        bootstrap=_bootstrap(bootstrap),
        yes=yes,
        steps=steps,
        stake=stake,
        cheat=cheat,
        rpc_wait=rpc_wait,
        connect_wait=connect_wait,
        self_check=self_check,
    )
    relay = host_port(relay_at)
    if relay is not None:
        cfg.relay_host, cfg.relay_port = relay
    metrics = make_metrics("worker")
    try:
        with fatal_errors():
            worker = Worker(cfg, provider, node, confirm=_confirm, metrics=metrics)
        run_daemon(worker, metrics, host_port(metrics_at), "worker", d)
    except Declined as exc:
        raise ConfigError(f"not confirmed: {exc}", "pass --yes to skip the question") from None


@click.command("validate")
@click.option("--pool", "pool_id", type=int, required=True)
@click.option("--data-dir", type=click.Path(file_okay=False), default="~/.intellect-node/validator", show_default=True)
@click.option("--listen", default="/ip4/0.0.0.0/tcp/0", show_default=True)
@click.option("--bootstrap", multiple=True, help="Bootstrap multiaddr(s) (default: the pool's on-chain record).")
@click.option(
    "--model",
    default=None,
    help="Model to check with (default: the one the pool's task spec names; any other is refused).",
)
@click.option("--thresholds", help="Thresholds file or name (default: the model's shipped calibration).")
@click.option(
    "--sample-rate",
    type=click.FloatRange(0, 1),
    default=1.0,
    show_default=True,
    help="Fraction of recorded work to re-check.",
)
@click.option(
    "--prefill-dtype",
    type=click.Choice(["float32", "bfloat16"]),
    default=None,
    help="Precision of the re-computation (default: float32 where the thresholds were calibrated for it). "
    "bfloat16 is about twice as fast on CPUs with bf16 units; allowed only where the thresholds' calibration "
    "covered it (the shipped tiny one does).",
)
@click.option("--metrics", "metrics_at", default="127.0.0.1:9411", show_default=True)
@click.option("--rpc-wait", type=float, default=60.0, hidden=True, help="Seconds to retry an unreachable RPC at start.")
@click.option("--lie", is_flag=True, hidden=True, help="Devnet adversary: accuse all work, uphold every accusation.")
@click.option("-v", "--verbose", is_flag=True)
@common
def validate_command(
    s: Settings,
    pool_id: int,
    data_dir: str,
    listen: str,
    bootstrap: tuple[str, ...],
    model: str | None,
    thresholds: str | None,
    sample_rate: float,
    prefill_dtype: str | None,
    metrics_at: str,
    rpc_wait: float,
    lie: bool,
    verbose: bool,
) -> None:
    """Re-check recorded work of pool POOL and invalidate cheating inside the validation window; sit on
    the pool's dispute committees when drawn."""
    from node.validator import Validator, ValidatorConfig

    setup_logging(verbose)
    calibrated = _thresholds(thresholds)
    if calibrated is not None:
        calibrated.prefill_dtype(prefill_dtype)  # refused now, before the chain is read
    d = _data_dir(data_dir)
    dep = s.deployment()
    key = s.account()
    cfg = ValidatorConfig(
        pool_id=pool_id,
        data_dir=d,
        rpc_url=s.url_for(dep),
        deployment=dep,
        listen=listen,
        bootstrap=_bootstrap(bootstrap) or None,
        model=model,
        thresholds=calibrated,
        sample_rate=sample_rate,
        prefill_dtype=prefill_dtype,
        rpc_wait=rpc_wait,
        lie=lie,
    )
    metrics = make_metrics("validator")
    with fatal_errors():
        validator = Validator(cfg, key, metrics)
    run_daemon(validator, metrics, host_port(metrics_at), "validator", d)


@click.command("coordinator")
@click.option("--pool", "pool_id", type=int, required=True)
@click.option(
    "--data-dir", type=click.Path(file_okay=False), default="~/.intellect-node/coordinator", show_default=True
)
@click.option("--listen", default="/ip4/0.0.0.0/tcp/4001", show_default=True)
@click.option("--model", help="The pool's model (default: its task spec's; another one is refused).")
@click.option(
    "--env",
    "env_name",
    type=click.Choice(["math", "thinking-budget", "code"]),
    help="Environment (default: the spec's).",
)
@click.option("--prompts", type=int, default=4, show_default=True, help="Problems per task.")
@click.option("--group-size", type=int, help="Completions per problem (default: the spec's).")
@click.option("--max-tokens", type=int, help="Completion budget (default: the spec's).")
@click.option("--temperature", type=float, help="Sampling temperature (default: the spec's).")
@click.option("--record-every", type=float, default=5.0, show_default=True, help="Seconds between work batches.")
@click.option(
    "--eject-after", type=float, default=600.0, show_default=True, help="Eject members silent this long (0: never)."
)
@click.option(
    "--blacklist-after",
    type=int,
    default=0,
    show_default=True,
    help="Blacklist a node (no more tasks) after this many of its records were invalidated (0: never).",
)
@click.option(
    "--lapse-limit",
    type=int,
    default=2,
    show_default=True,
    help="Tasks a node may let expire unsubmitted in 6 h before it waits for new ones (-1: no limit); "
    "letting tasks lapse is how a worker would pick which tasks' outcomes it submits.",
)
@click.option(
    "--explorer", "explorer_at", default="", help="HOST:PORT to serve the pool's explorer web page ('': none)."
)
@click.option("--explorer-status", multiple=True, help="A daemon's /status URL the explorer shows live (repeatable).")
@click.option("--train/--no-train", default=False, show_default=True, help="Train the policy with GRPO.")
@click.option("--train-files", type=int, default=2, show_default=True, help="Rollout files per policy step.")
@click.option("--lr", type=float, default=2e-4, show_default=True, help="Learning rate (AdamW).")
@click.option(
    "--thresholds",
    help="Thresholds for the trainer's checks of every rollout (file or model name; default: the spec model's).",
)
@click.option("--async-level", type=int, help="Oldest usable policy: current - N (default: the spec's).")
@click.option(
    "--seed",
    type=int,
    help="Fixed task seeds (the same problems in the same order every run). Predictable: experiments only.",
)
@click.option(
    "--weights", "weights_at", default="127.0.0.1:0", show_default=True, help="HOST:PORT of the checkpoint origin."
)
@click.option("--weights-rate", type=float, help="Upload cap of the origin in bytes/s (default: none).")
@click.option(
    "--keep-checkpoint-hours",
    type=float,
    default=6.0,
    show_default=True,
    help="Serve every policy version that was current this recently (validators fetch the version a "
    "rollout claims; set it to how far validators may fall behind). The newest 4 are always kept.",
)
@click.option("--metrics", "metrics_at", default="127.0.0.1:9412", show_default=True)
@click.option("--rpc-wait", type=float, default=60.0, hidden=True, help="Seconds to retry an unreachable RPC at start.")
@click.option("-v", "--verbose", is_flag=True)
@common
def coordinator_command(
    s: Settings,
    pool_id: int,
    data_dir: str,
    listen: str,
    model: str | None,
    env_name: str | None,
    prompts: int,
    group_size: int | None,
    max_tokens: int | None,
    temperature: float | None,
    record_every: float,
    eject_after: float,
    blacklist_after: int,
    lapse_limit: int,
    explorer_at: str,
    explorer_status: tuple[str, ...],
    train: bool,
    train_files: int,
    lr: float,
    thresholds: str | None,
    async_level: int | None,
    seed: int | None,
    weights_at: str,
    weights_rate: float | None,
    keep_checkpoint_hours: float,
    metrics_at: str,
    rpc_wait: float,
    verbose: bool,
) -> None:
    """Coordinate pool POOL: invites, tasks, rollout intake, batched work records, ejections, and with
    --train the GRPO trainer and the origin of the weight broadcast. Model, environment, sampling, group
    size and async level come from the pool's task spec (checked against its on-chain hash)."""
    from pool.coordinator import Coordinator, CoordinatorConfig

    setup_logging(verbose)
    calibrated = _thresholds(thresholds)
    d = _data_dir(data_dir)
    dep = s.deployment()
    key = s.account()
    cfg = CoordinatorConfig(
        pool_id=pool_id,
        data_dir=d,
        rpc_url=s.url_for(dep),
        deployment=dep,
        listen=listen,
        model=model,
        env=env_name,
        prompts=prompts,
        group_size=group_size,
        sampling={k: v for k, v in (("temperature", temperature), ("max_tokens", max_tokens)) if v is not None} or None,
        record_every=record_every,
        eject_after=eject_after,
        blacklist_after=blacklist_after,
        lapse_limit=lapse_limit,
        rpc_wait=rpc_wait,
        train=train,
        train_files=train_files,
        lr=lr,
        thresholds=calibrated,
        async_level=async_level,
        weights_rate=weights_rate,
        keep_checkpoint_seconds=keep_checkpoint_hours * 3600.0,
        seed=seed,
        explorer=host_port(explorer_at),
        explorer_status=tuple(explorer_status),
    )
    weights = host_port(weights_at)
    if weights is not None:
        cfg.weights_host, cfg.weights_port = weights
    metrics = make_metrics("coordinator")
    with fatal_errors():
        coordinator = Coordinator(cfg, key, metrics)
    run_daemon(coordinator, metrics, host_port(metrics_at), "coordinator", d)


COMMANDS = [join_command, validate_command, coordinator_command]
