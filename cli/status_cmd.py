"""`intellect-node status`: a provider's standing in one pool (stake, nodes, work, slashes)."""

from __future__ import annotations

import os
from typing import Any

import click

from node import keys, ops
from node.errors import ConfigError
from node.status import format_status
from node.status_read import provider_status

from ._common import Settings, common, output, run


@click.command("status")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--node", help="Only this node (its provider is looked up on chain).")
@click.option("--provider", help="The provider to show (default: the signing key's address).")
@common
def status_command(s: Settings, pool_id: int, node: str | None, provider: str | None) -> None:
    """Explain a provider's standing in a pool: stake, node membership, work records
    (pending with time left / claimable / claimed / invalidated) and every slash with its tx.

    Reads the chain only; no signing key is needed with --provider or --node."""
    if node and provider:
        raise click.UsageError("pass --node or --provider, not both")
    node_addr = ops.checksum(node, "node") if node else None
    provider_addr = ops.checksum(provider, "provider") if provider else None
    signer = None
    if not node_addr and not provider_addr:
        # A keystore that fails to open is an error; a missing key is explained below.
        acct = s.account(required=bool(s.keystore or os.environ.get(keys.PRIVATE_KEY_ENV)))
        if acct is None:
            raise ConfigError(
                "no provider to show: no --provider, no --node and no signing key",
                "pass --provider ADDR or --node ADDR, or a key with --keystore FILE / INTELLECT_PRIVATE_KEY",
            )
        signer = acct.address

    async def go() -> dict[str, Any]:
        async with await s.client(signer=False) as c:
            return await provider_status(c, pool_id, provider=provider_addr, node=node_addr, signer=signer)

    st = run(go)
    output(s, st, format_status(st))
