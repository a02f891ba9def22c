"""`intellect-node explorer`: the read-only web UI of a deployment's pools."""

from __future__ import annotations

import click
import trio

from node.errors import ConfigError

from ._common import Settings, common, run
from .daemons import host_port


@click.command("explorer")
@click.option("--pool", "pools", type=int, multiple=True, help="Show this pool (repeatable; default: every pool).")
@click.option(
    "--status",
    "status_urls",
    multiple=True,
    help="A daemon's status page to show live (repeatable), e.g. http://127.0.0.1:9100/status; "
    "the coordinator's gives the reward chart.",
)
@click.option("--listen", default="127.0.0.1:8090", show_default=True, help="HOST:PORT to serve on.")
@click.option("--refresh", type=float, default=10.0, show_default=True, help="Seconds between chain reads.")
@common
def explorer_command(
    s: Settings, pools: tuple[int, ...], status_urls: tuple[str, ...], listen: str, refresh: float
) -> None:
    """Serve a web page of the deployment's pools: parameters, budget, members and their stake,
    validators, work per node with transaction hashes, every slash with its evidence and dispute, the
    reward per policy version, and live daemons. Read-only; no key is needed."""
    from pool.explorer.server import Explorer, serve_explorer

    hp = host_port(listen)
    if hp is None:
        raise ConfigError("--listen is empty", "pass HOST:PORT, e.g. --listen 127.0.0.1:8090")
    host, port = hp
    if refresh < 1:
        raise ConfigError(f"--refresh {refresh} is under a second", "pass --refresh 1 or more")

    async def go() -> None:
        async with await s.client(signer=False) as c:
            ex = Explorer(c, pools=pools, status_urls=status_urls, refresh=refresh)
            async with trio.open_nursery() as nursery:
                bound = await nursery.start(serve_explorer, ex, host, port)
                click.echo(f"explorer on http://{host}:{bound}/ (Ctrl-C stops it)")

    run(go)
