"""`contracts` (deploy the protocol) and `token` (mint, balance)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from node import ops
from node.chain import Deployment, RpcClient, WrongChain
from node.chain.deployment import NETWORKS
from node.chain.messages import tokens
from node.errors import ConfigError
from pool.deploy import DeployParams, deploy

from ._common import AMOUNT, Settings, common, output, receipt, run


@click.group("contracts")
def contracts_group() -> None:
    """Deploy the protocol contracts."""


@contracts_group.command("deploy")
@click.option(
    "--network",
    type=click.Choice(sorted(NETWORKS)),
    default="local",
    show_default=True,
    help="Network preset: checks the chain id (local 31337, base-sepolia 84532).",
)
@click.option("--treasury", help="Receives slashed stake (required off the local chain; never the admin by default).")
@click.option("--unbonding-period", type=click.IntRange(min=0), default=7 * 86400, show_default=True, help="Seconds.")
@click.option("--stake-per-unit", type=AMOUNT, default="10", show_default=True, help="Stake per compute unit.")
@click.option(
    "--min-provider-stake", type=AMOUNT, default="10", show_default=True, help="Minimum stake at registration."
)
@click.option("--force", is_flag=True, help="Overwrite an existing deployment file.")
@common
def contracts_deploy(
    s: Settings,
    network: str,
    treasury: str | None,
    unbonding_period: int,
    stake_per_unit: int,
    min_provider_stake: int,
    force: bool,
) -> None:
    """Deploy token, registry, pool manager and work ledger; write the deployment file."""
    preset = NETWORKS[network]
    url = s.rpc_url or preset.default_rpc_url
    if not url:
        raise ConfigError(f"network {network} has no default RPC URL", "pass --rpc-url or set INTELLECT_RPC_URL")
    if Path(s.deployment_path).exists() and not force:
        raise ConfigError(f"{s.deployment_path} already exists", "pass --force to replace it or --deployment FILE")
    acct = s.account()
    assert acct is not None
    params = DeployParams(
        treasury=ops.checksum(treasury, "treasury") if treasury else None,
        unbonding_period=unbonding_period,
        stake_per_compute_unit=stake_per_unit,
        min_provider_stake=min_provider_stake,
    )
    if treasury is None and network != "local":
        raise click.UsageError(f"a deployment on {network} needs --treasury (slashed stake goes there)")
    lines: list[str] = []

    async def go() -> Deployment:
        async with RpcClient(url) as rpc:
            chain_id = await rpc.chain_id()
            if chain_id != preset.chain_id:
                raise WrongChain(
                    f"network {network} expects chain id {preset.chain_id}, the RPC endpoint serves {chain_id}",
                    "pass the matching --network or --rpc-url",
                )
            say = (lambda m: None) if s.as_json else (lambda m: click.echo(m, err=True))
            return await deploy(rpc, acct, params, network=network, rpc_url=s.rpc_url or "", progress=say)

    dep = run(go)
    dep.save(s.deployment_path)
    lines.append(f"deployment for chain {dep.chain_id} written to {s.deployment_path} (from block {dep.block})")
    output(s, json.loads(dep.to_json()), lines)


@click.group("token")
def token_group() -> None:
    """The stake and reward token."""


@token_group.command("mint")
@click.option("--to", "to", required=True, help="Recipient address.")
@click.argument("amount", type=AMOUNT)
@common
def token_mint(s: Settings, to: str, amount: int) -> None:
    """Mint tokens (token owner only; test networks)."""

    async def go() -> Any:
        async with await s.client() as c:
            return await c.transact("IntellectToken", "mint", ops.checksum(to, "recipient"), amount, what="mint")

    r = run(go)
    output(s, receipt(r) | {"to": to, "amount": amount}, f"minted {tokens(amount)} to {to} (tx {r.tx_hash})")


@token_group.command("balance")
@click.argument("address", required=False)
@common
def token_balance(s: Settings, address: str | None) -> None:
    """Token balance of ADDRESS (default: the signing key)."""

    async def go() -> tuple[str, int]:
        async with await s.client(signer=False) as c:
            who = ops.checksum(address) if address else s.account().address  # type: ignore[union-attr]
            return who, await c.token_balance(who)

    who, bal = run(go)
    output(s, {"address": who, "balance": bal}, f"{who}: {tokens(bal)}")
