"""`intellect-node devnet`: the whole protocol on one machine, on a local anvil chain.

Today it brings up the chain side (contracts, a funded and started pool, a staked provider whose node
joined with a coordinator's invite) and prints what it did; the daemons join it as they land.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import trio

from node import ops
from node.chain import ChainClient
from node.chain.anvil import ANVIL_KEYS, Anvil, free_port
from node.chain.messages import tokens
from node.chain.rpc import RpcClient
from node.keys import from_hex

from .deploy import TOKEN, DeployParams, deploy

TASK_SPEC = {
    "name": "devnet-arithmetic",
    "model": "tiny",
    "environment": "math",
    "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64},
    "group_size": 4,
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


@dataclass(frozen=True)
class Roles:
    """Keys of the devnet's parties: anvil's prefunded accounts (public, local only)."""

    owner: Any
    coordinator: Any
    validator: Any
    provider: Any
    node: Any

    @classmethod
    def default(cls) -> Roles:
        k = [from_hex(x) for x in ANVIL_KEYS]
        return cls(owner=k[0], coordinator=k[1], validator=k[2], provider=k[3], node=k[4])


async def bring_up(url: str, opts: DevnetOptions, roles: Roles, say: Any) -> dict[str, Any]:
    async with RpcClient(url) as rpc:
        dep = await deploy(
            rpc, roles.owner, DeployParams(validators=(roles.validator.address,)), rpc_url=url, progress=say
        )
    dep.save(opts.workdir / "deployment.json")
    spec_bytes = json.dumps(TASK_SPEC, sort_keys=True).encode()
    (opts.workdir / "task-spec.json").write_bytes(spec_bytes)
    spec_hash = "0x" + hashlib.sha256(spec_bytes).hexdigest()

    owner = await ChainClient.connect(url, dep, roles.owner)
    provider = await ChainClient.connect(url, dep, roles.provider)
    coord = await ChainClient.connect(url, dep, roles.coordinator)
    try:
        for who, amount in ((roles.owner.address, 100_000), (roles.provider.address, 1_000)):
            await owner.transact("IntellectToken", "mint", who, amount * TOKEN, what="mint")
        say("minted test tokens to the pool owner and the provider")
        spec = ops.PoolSpec(
            coordinator=roles.coordinator.address,
            spec_uri=(opts.workdir / "task-spec.json").resolve().as_uri(),
            spec_hash=spec_hash,
            reward_rate=10**15,
            validation_window=opts.window,
            slash_amount=5 * TOKEN,
            min_stake=20 * TOKEN,
        )
        pool_id, _ = await ops.create_pool(owner, spec)
        await owner.transact("PoolManager", "startPool", pool_id, what="pool start")
        await ops.fund_pool(owner, pool_id, 10_000 * TOKEN)
        say(
            f"created, started and funded pool {pool_id} (reward {tokens(spec.reward_rate)}/unit, window {opts.window} s)"
        )
        await ops.register_provider(provider, 100 * TOKEN)
        sig = ops.node_signature(provider, roles.node, roles.provider.address)
        await ops.add_node(provider, roles.node.address, 1, sig)
        say(
            f"registered provider {roles.provider.address} with {tokens(100 * TOKEN)} and bound node {roles.node.address}"
        )
        invite = await ops.make_invite(coord, roles.coordinator, pool_id, roles.node.address, 3600)
        await ops.join_pool(provider, invite)
        say(
            f"node {roles.node.address} joined pool {pool_id} with an invite signed by coordinator {roles.coordinator.address}"
        )
        info = await ops.pool_info(owner, pool_id)
    finally:
        for c in (owner, provider, coord):
            await c.aclose()
    return {
        "rpc_url": url,
        "chain_id": dep.chain_id,
        "deployment": str(opts.workdir / "deployment.json"),
        "contracts": dep.contracts,
        "pool": pool_id,
        "pool_status": info["statusName"],
        "members": info["members"],
        "roles": {
            "owner": roles.owner.address,
            "coordinator": roles.coordinator.address,
            "validator": roles.validator.address,
            "provider": roles.provider.address,
            "node": roles.node.address,
        },
    }


def run_devnet(opts: DevnetOptions) -> dict[str, Any]:
    opts.workdir.mkdir(parents=True, exist_ok=True)
    port = opts.port or free_port()
    say = (lambda m: None) if opts.as_json else (lambda m: click.echo(m))
    started = time.monotonic()
    with Anvil(port=port, chain_id=opts.chain_id, log_file=str(opts.workdir / "anvil.log")) as anvil:
        say(f"anvil running on {anvil.url} (chain id {opts.chain_id})")
        summary = trio.run(bring_up, anvil.url, opts, Roles.default(), say)
        summary["seconds"] = round(time.monotonic() - started, 2)
        (opts.workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if opts.as_json:
            click.echo(json.dumps(summary, indent=2))
        else:
            say(f"devnet ready in {summary['seconds']} s; summary in {opts.workdir / 'summary.json'}")
            if opts.keep_running:
                say(f"try: intellect-node audit --pool {summary['pool']} --deployment {summary['deployment']}")
            else:
                say("anvil stops now; `intellect-node devnet --keep-running` keeps the chain up to explore it")
        if opts.keep_running:
            say("anvil keeps running; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                say("stopping")
    return summary
