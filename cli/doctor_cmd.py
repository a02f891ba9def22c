"""`intellect-node doctor`: preflight checks before `join`, one line each, pass or fail with the fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from node import doctor, ops
from node.chain import ChainError

from ._common import Settings, common, run


@click.command("doctor")
@click.option("--pool", "pool_id", type=int, required=True, help="The pool you mean to join.")
@click.option("--provider", help="The provider whose funds to check (default: the signing key's address, if any).")
@click.option(
    "--data-dir", default="~/.intellect-node/worker", show_default=True, help="Where the worker will keep its state."
)
@click.option("--listen", default="/ip4/0.0.0.0/tcp/0", show_default=True, help="The worker's libp2p listen address.")
@click.option(
    "--metrics", "metrics_at", default="127.0.0.1:9410", show_default=True, help="The worker's /metrics address."
)
@click.option(
    "--min-free-gb", type=float, default=doctor.MIN_FREE_GB, show_default=True, help="Disk space to insist on."
)
@common
def doctor_command(
    s: Settings, pool_id: int, provider: str | None, data_dir: str, listen: str, metrics_at: str, min_free_gb: float
) -> None:
    """Check this machine before `join`: Python and packages, GPU or CPU mode, disk, ports, the RPC endpoint
    and its chain, the pool and its spec and model, the provider's gas and stake, and the coordinator's
    address. Changes nothing. Exits 1 if any check fails."""
    checks = [doctor.check_python(), doctor.check_packages(), doctor.check_accelerator()]
    checks.append(doctor.check_sandbox_cgroup())
    checks.append(doctor.check_disk(Path(data_dir), min_free_gb))
    hp = doctor.multiaddr_host_port(listen)
    checks.append(
        doctor.check_port("p2p port", *hp) if hp else doctor.Check("p2p port", False, listen, "pass /ip4/H/tcp/P")
    )
    host, _, port = metrics_at.rpartition(":")
    ok_port = port.isdigit() and int(port) < 65536
    checks.append(doctor.check_port("metrics port", host or "127.0.0.1", int(port)) if ok_port
                  else doctor.Check("metrics port", False, metrics_at, "pass HOST:PORT"))  # fmt: skip
    who = ops.checksum(provider, "provider") if provider else None
    if who is None:
        acct = s.account(required=False)
        who = acct.address if acct is not None else None
    try:
        dep = s.deployment()
        chain, _ = run(doctor.chain_checks, s.url_for(dep), dep, pool_id, who)
    except ChainError as exc:
        chain = [doctor.Check("deployment", False, exc.message, exc.hint or "pass --deployment FILE")]
    checks += chain
    failed = [c for c in checks if c.ok is False]
    if s.as_json:
        click.echo(json.dumps({"ok": not failed, "checks": [c.to_dict() for c in checks]}, indent=2))
    else:
        for c in checks:
            click.echo(c.line())
        click.echo(
            f"{len(failed)} check(s) failed" if failed else "all checks passed: `intellect-node join` should work"
        )
    if failed:
        sys.exit(1)
