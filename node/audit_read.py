"""The reward audit's chain reads: one snapshot at the latest block (pool state, the pool's and its
providers' events, the block times the rules need, every record's and provider's state), handed to
`node.audit.report`, which rebuilds every node's ledger from events alone and checks it against state."""

from __future__ import annotations

from typing import Any

import trio

from .audit import AuditReport, AuditSnapshot, rebuild, report
from .chain.abi import DecodedEvent, topic
from .chain.client import ChainClient
from .chain.errors import ChainError


async def audit(c: ChainClient, pool_id: int, node: str | None = None, *, concurrency: int = 16) -> AuditReport:
    """Fetch a snapshot at the latest confirmed block (`c.confirmations` under the head: a shallow
    reorganisation cannot split it), rebuild from events, compare with state."""
    return (await audit_snapshot(c, pool_id, node, concurrency=concurrency)).report


async def audit_snapshot(
    c: ChainClient, pool_id: int, node: str | None = None, *, concurrency: int = 16
) -> AuditSnapshot:
    """`audit`, keeping what it read (the explorer shows the records and events behind the report)."""
    block = max(0, await c.rpc.block_number() - c.confirmations)
    tag = hex(block)
    pool = await c.call("PoolManager", "getPool", pool_id, block=tag)
    if int(pool["status"]) == 0:
        raise ChainError(f"pool {pool_id} does not exist", "check the pool id")
    pool_events = await c.events(["PoolManager", "WorkLedger"], to_block=block, topics=[None, topic(pool_id)])
    providers = sorted({e.args["provider"] for e in pool_events if "provider" in e.args})
    registry_events: list[DecodedEvent] = []
    for p in providers:
        registry_events += await c.events(["ProviderRegistry"], to_block=block, topics=[None, topic(p)])
    registry_events.sort(key=lambda e: (e.block_number, e.log_index))

    times: dict[int, int] = {}
    wanted = sorted({e.block_number for e in pool_events if e.name in ("WorkInvalidated", "WorkClaimed")} | {block})
    limiter = trio.CapacityLimiter(concurrency)

    async def fetch_time(b: int) -> None:
        async with limiter:
            times[b] = await c.timestamp(b)

    async with trio.open_nursery() as nursery:
        for b in wanted:
            nursery.start_soon(fetch_time, b)

    rebuilt = rebuild(pool_id, pool_events, registry_events, times)

    record_state: dict[str, dict[str, Any]] = {}
    provider_state: dict[str, dict[str, Any]] = {}

    async def fetch_record(k: str) -> None:
        async with limiter:
            record_state[k] = await c.call("WorkLedger", "getRecord", pool_id, k, block=tag)

    async def fetch_provider(p: str) -> None:
        async with limiter:
            provider_state[p] = await c.call("ProviderRegistry", "getProvider", p, block=tag)

    async with trio.open_nursery() as nursery:
        for k in rebuilt.records:
            nursery.start_soon(fetch_record, k)
        for p in rebuilt.providers:
            nursery.start_soon(fetch_provider, p)
    account = await c.call("WorkLedger", "poolAccount", pool_id, block=tag)

    rep = report(rebuilt, pool, block, times[block], record_state, account, provider_state, node)
    return AuditSnapshot(rep, rebuilt, pool, pool_events, account)
