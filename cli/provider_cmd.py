"""`provider` (register, stake, claim) and `node` (add, sign, remove compute nodes)."""

from __future__ import annotations

import os
from typing import Any

import click

from node import keys, ops
from node.chain.messages import tokens
from node.errors import ConfigError

from ._common import AMOUNT, Settings, common, output, receipt, run


@click.group("provider")
def provider_group() -> None:
    """Register as a compute provider, manage stake, claim rewards."""


@provider_group.command("register")
@click.option("--stake", "amount", type=AMOUNT, required=True, help="Initial stake.")
@common
def provider_register(s: Settings, amount: int) -> None:
    """Register the signing key as a provider with an initial stake."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.register_provider(c, amount)

    r = run(go)
    output(s, receipt(r) | {"stake": amount}, f"registered with {tokens(amount)} staked (tx {r.tx_hash})")


@provider_group.command("stake")
@click.argument("amount", type=AMOUNT)
@common
def provider_stake(s: Settings, amount: int) -> None:
    """Add AMOUNT to the provider's stake."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.stake(c, amount)

    r = run(go)
    staked = r.event("Staked").args["staked"]
    output(s, receipt(r) | {"staked": staked}, f"staked {tokens(amount)}; now {tokens(staked)} (tx {r.tx_hash})")


@provider_group.command("unstake")
@click.argument("amount", type=AMOUNT)
@common
def provider_unstake(s: Settings, amount: int) -> None:
    """Move AMOUNT of stake into unbonding."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.unstake(c, amount)

    r = run(go)
    end = r.event("UnstakeRequested").args["unbondingEnd"]
    output(s, receipt(r) | {"unbonding_end": end}, f"unbonding {tokens(amount)} until unix time {end} (tx {r.tx_hash})")


@provider_group.command("withdraw")
@common
def provider_withdraw(s: Settings) -> None:
    """Withdraw all stake whose unbonding period is over."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.withdraw(c)

    r = run(go)
    amount = r.event("Withdrawn").args["amount"]
    output(s, receipt(r) | {"amount": amount}, f"withdrew {tokens(amount)} (tx {r.tx_hash})")


@provider_group.command("claim")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_keys", multiple=True, help="Work key to claim (repeatable; default: all claimable).")
@common
def provider_claim(s: Settings, pool_id: int, work_keys: tuple[str, ...]) -> None:
    """Claim rewards of final work (validation window over, not invalidated)."""

    async def go() -> tuple[int, list[Any]]:
        async with await s.client() as c:
            return await ops.claim(c, pool_id, list(work_keys) or None)

    total, receipts = run(go)
    output(
        s,
        {"pool": pool_id, "reward": total, "txs": [receipt(r) for r in receipts]},
        f"claimed {tokens(total)} from pool {pool_id} in {len(receipts)} transaction(s)",
    )


@provider_group.command("info")
@click.argument("address", required=False)
@common
def provider_info(s: Settings, address: str | None) -> None:
    """Stake, unbonding and nodes of a provider (default: the signing key)."""

    async def go() -> dict[str, Any]:
        async with await s.client(signer=False) as c:
            who = ops.checksum(address) if address else s.account().address  # type: ignore[union-attr]
            return {"address": who} | await ops.provider_info(c, who)

    info = run(go)
    output(
        s,
        info,
        [
            f"provider {info['address']} ({'registered' if info['registered'] else 'not registered'})",
            f"  staked {tokens(info['staked'])} (required {tokens(info['required'])}), unbonding {tokens(info['unbonding'])}",
            f"  nodes {info['nodeCount']} with {info['computeUnits']} compute units; slashed {tokens(info['slashed'])}",
        ],
    )


@click.group("node")
def node_group() -> None:
    """Bind nodes (machines) to a provider."""


def node_account(node_keystore: str | None) -> Any:
    if node_keystore:
        return keys.load_keystore(node_keystore, password=os.environ.get("INTELLECT_NODE_PASSWORD"))
    if os.environ.get("INTELLECT_NODE_PRIVATE_KEY"):
        return keys.from_hex(os.environ["INTELLECT_NODE_PRIVATE_KEY"], "INTELLECT_NODE_PRIVATE_KEY")
    return None


@node_group.command("add")
@click.option("--units", type=click.IntRange(min=1), default=1, show_default=True, help="Compute units of the node.")
@click.option(
    "--node-keystore",
    type=click.Path(dir_okay=False),
    help="The node's keystore (password INTELLECT_NODE_PASSWORD); or INTELLECT_NODE_PRIVATE_KEY.",
)
@click.option("--node", "node_addr", help="Node address, with --signature made by `node sign` on the node.")
@click.option("--signature", help="The node's binding signature (from `intellect-node node sign`).")
@common
def node_add(s: Settings, units: int, node_keystore: str | None, node_addr: str | None, signature: str | None) -> None:
    """Bind a node to the signing provider. The node key signs (provider, node, binding nonce, chain id, registry)."""

    async def go() -> tuple[str, Any]:
        async with await s.client() as c:
            nk = node_account(node_keystore)
            if nk is not None:
                node, sig = nk.address, await ops.node_signature(c, nk, c.address)
            elif node_addr and signature:
                node, sig = ops.checksum(node_addr, "node"), signature
            else:
                raise ConfigError(
                    "no node key",
                    "pass --node-keystore, set INTELLECT_NODE_PRIVATE_KEY, or pass --node and --signature",
                )
            return node, await ops.add_node(c, node, units, sig)

    node, r = run(go)
    output(
        s,
        receipt(r) | {"node": node, "units": units},
        f"node {node} bound with {units} compute units (tx {r.tx_hash})",
    )


@node_group.command("sign")
@click.option("--provider", required=True, help="The provider the node binds to.")
@click.option(
    "--node-keystore", type=click.Path(dir_okay=False), help="The node's keystore; or INTELLECT_NODE_PRIVATE_KEY."
)
@common
def node_sign(s: Settings, provider: str, node_keystore: str | None) -> None:
    """Sign a node binding with the node key (for a provider key kept elsewhere)."""
    nk = node_account(node_keystore)
    if nk is None:
        raise ConfigError("no node key", "pass --node-keystore or set INTELLECT_NODE_PRIVATE_KEY")

    async def go() -> str:
        async with await s.client(signer=False) as c:
            return await ops.node_signature(c, nk, provider)

    sig = run(go)
    output(s, {"node": nk.address, "provider": provider, "signature": sig}, sig)


@node_group.command("remove")
@click.argument("node")
@common
def node_remove(s: Settings, node: str) -> None:
    """Unbind a node that is in no pool."""

    async def go() -> Any:
        async with await s.client() as c:
            return await c.transact("ProviderRegistry", "removeNode", ops.checksum(node, "node"), what="node removal")

    r = run(go)
    output(s, receipt(r), f"node {node} removed (tx {r.tx_hash})")
