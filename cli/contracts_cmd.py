"""`contracts` (deploy the protocol) and `token` (mint, balance)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from node import ops
from node.chain import Deployment, RpcClient, WrongChain, verify
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
    """Deploy token, registry, pool manager and work ledger; write the deployment file and, beside it,
    the explorer verification inputs (deployment.json -> deployment.verify/, see `verify-info`)."""
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
    folder = verify.write(dep, s.deployment_path)
    lines.append(f"deployment for chain {dep.chain_id} written to {s.deployment_path} (from block {dep.block})")
    lines.append(f"explorer verification inputs written to {folder}/ (see `intellect-node contracts verify-info`)")
    output(s, json.loads(dep.to_json()) | {"verify_folder": str(folder)}, lines)


@contracts_group.command("verify-info")
@common
def contracts_verify_info(s: Settings) -> None:
    """What a block explorer needs to verify the deployed contracts: per contract its compiler, settings,
    constructor arguments, standard-JSON input file, `forge verify-contract` line and form fields.

    Reads the folder `contracts deploy` wrote beside the deployment file (deployment.json ->
    deployment.verify/); no chain access."""
    info = verify.load(s.deployment_path, s.deployment())
    output(s, verify.to_dict(info), _verify_lines(info))


def _verify_lines(info: verify.VerifyInfo) -> list[str]:
    explorers = {e.kind: e for e in verify.EXPLORERS.get(info.network, ())}
    lines = [
        f"verification data of chain {info.chain_id} ({info.network}) in {info.folder}/",
        "forge: run it from the root of this repository at the deployed version, with ETHERSCAN_API_KEY set "
        "for Etherscan (one Etherscan V2 key serves Basescan)",
    ]
    for c in info.contracts:
        optimizer = f"enabled, {info.optimizer_runs} runs" if info.optimizer else "disabled"
        lines += [
            "",
            f"{c.name} {c.address}",
            f"  contract          {c.target}",
            f"  compiler          {info.compiler}",
            f"  optimizer         {optimizer}",
            f"  EVM version       {info.evm_version}",
            f"  license           {c.license}",
            f"  constructor args  {c.constructor_args}",
            f"  standard JSON     {c.input_path}",
        ]
        lines += [f"  forge {kind:<11} {cmd}" for kind, cmd in verify.forge_commands(info, c).items()]
        for kind in verify.KINDS:
            e = explorers.get(kind)
            lines.append(f"  {e.name} form: {e.verify_page(c.address)}" if e else f"  {kind.capitalize()} form:")
            lines += [f"    {field}: {value}" for field, value in verify.form_fields(info, c, kind).items()]
    return lines


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
