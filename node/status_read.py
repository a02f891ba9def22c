"""A provider's standing in one pool: the chain reads (`provider_status`), every call and event query
pinned to one block; `node.status` explains what they return. No loop walks an on-chain array; per-item
calls are per node or per slash only."""

from __future__ import annotations

from typing import Any

import trio

from .chain.abi import DecodedEvent, topic
from .chain.client import ChainClient
from .chain.errors import ChainError
from .errors import ConfigError
from .ops import checksum
from .status import ZERO_ADDRESS, Snapshot, explain, node_row, plan, slash_pool

CONCURRENCY = 16


async def resolve_provider(c: ChainClient, provider: str | None, node: str | None, signer: str | None) -> str:
    """The provider to explain: --provider, else the provider --node is bound to, else the signing key."""
    if provider:
        return checksum(provider, "provider")
    if node:
        bound = checksum(await c.call("ProviderRegistry", "providerOf", checksum(node, "node")))
        if bound == checksum(ZERO_ADDRESS):
            raise ChainError(
                f"node {checksum(node)} is not bound to any provider",
                "pass --provider ADDR to see a removed node's history",
            )
        return bound
    if signer:
        return checksum(signer)
    raise ConfigError("no provider to show", "pass --provider ADDR or --node ADDR, or a signing key (--keystore)")


async def provider_status(
    c: ChainClient,
    pool_id: int,
    *,
    provider: str | None = None,
    node: str | None = None,
    signer: str | None = None,
) -> dict[str, Any]:
    """Everything `intellect-node status` shows, as a JSON-able dict (amounts in base units), at the
    latest confirmed block."""
    block = max(0, await c.rpc.block_number() - c.confirmations)
    tag = hex(block)
    now = await c.timestamp(block)
    pool = await c.call("PoolManager", "getPool", pool_id, block=tag)
    if int(pool["status"]) == 0:
        raise ChainError(f"pool {pool_id} does not exist", "check the pool id (`intellect-node pool info ID`)")
    who = await resolve_provider(c, provider, node, signer)
    reg_events = await c.events(["ProviderRegistry"], to_block=block, topics=[None, topic(who)])
    s = Snapshot(
        pool_id=pool_id,
        block=block,
        now=now,
        pool=pool,
        who=who,
        only_node=checksum(node, "node") if node else None,
        info=await c.call("ProviderRegistry", "getProvider", who, block=tag),
        required=int(await c.call("ProviderRegistry", "requiredStake", who, block=tag)),
        locked_until=int(await c.call("WorkLedger", "lockedUntil", who, block=tag)),
        balance=int(await c.call("IntellectToken", "balanceOf", who, block=tag)),
        reg_events=[e for e in reg_events if e.args.get("provider") == who],
        pool_events=await c.events(["WorkLedger"], to_block=block, topics=[None, topic(pool_id)]),
    )
    p = plan(s)
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async def fetch_node(n: str) -> None:
        async with limiter:
            member = bool(await c.call("PoolManager", "isMember", pool_id, n, block=tag))
            ms = await c.call("PoolManager", "membershipOf", n, block=tag)
            black = bool(await c.call("PoolManager", "isBlacklisted", pool_id, n, block=tag))
            owner = await c.call("ProviderRegistry", "providerOf", n, block=tag)
        s.nodes[n] = node_row(n, who, p.bound.get(n, 0), member, ms, black, owner)

    async def fetch_slash_pool(e: DecodedEvent) -> None:
        async with limiter:
            receipt = await c.rpc.request("eth_getTransactionReceipt", [e.tx_hash])
        logs = c.decode_logs(list((receipt or {}).get("logs", [])))
        s.slash_pools[e.tx_hash + e.args["reason"]] = slash_pool(logs, e.args["reason"])

    async with trio.open_nursery() as nursery:
        for n in p.nodes:
            nursery.start_soon(fetch_node, n)
        for e in p.slashes_elsewhere:
            nursery.start_soon(fetch_slash_pool, e)
    return explain(s, p)
