"""`chain` (inspect, move a local chain's time) and `audit` (rebuild a pool's ledger from events)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from node import ops
from node.audit_read import audit as run_audit
from node.chain import Deployment, RpcClient
from node.chain.anvil import advance_time
from node.chain.messages import tokens

from ._common import Settings, common, output, run


@click.group("chain")
def chain_group() -> None:
    """Inspect the chain; move time on local chains."""


@chain_group.command("advance-time")
@click.argument("seconds", type=click.IntRange(min=1))
@common
def chain_advance(s: Settings, seconds: int) -> None:
    """Move a local chain's clock forward by SECONDS and mine a block."""

    async def go() -> int:
        dep = Deployment.load(s.deployment_path) if Path(s.deployment_path).exists() else None
        async with RpcClient(s.url_for(dep)) as rpc:
            return await advance_time(rpc, seconds)

    ts = run(go)
    output(s, {"timestamp": ts}, f"chain time is now {ts}")


@chain_group.command("info")
@common
def chain_info(s: Settings) -> None:
    """Chain id, head block and the deployment's addresses."""

    async def go() -> dict[str, Any]:
        async with await s.client(signer=False) as c:
            head = await c.rpc.block_number()
            return {
                "chain_id": c.deployment.chain_id,
                "block": head,
                "timestamp": await c.timestamp(),
                "contracts": c.deployment.contracts,
            }

    info = run(go)
    output(
        s,
        info,
        [f"chain {info['chain_id']} at block {info['block']}"]
        + [f"  {k}: {v}" for k, v in sorted(info["contracts"].items())],
    )


@click.command("audit")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--node", help="Only this node's ledger (all checks still run).")
@common
def audit_cmd(s: Settings, pool_id: int, node: str | None) -> None:
    """Rebuild every node's ledger from events alone and check it against contract state.

    Exits 1 if anything disagrees."""

    async def go() -> Any:
        async with await s.client(signer=False) as c:
            return await run_audit(c, pool_id, ops.checksum(node, "node") if node else None)

    rep = run(go)
    lines = [f"pool {pool_id} at block {rep.block}: {'consistent' if rep.consistent else 'INCONSISTENT'}"]
    for addr, n in sorted(rep.nodes.items()):
        lines.append(
            f"  node {addr}: {n['records']} records, units recorded {n['recorded_units']}, pending {n['pending_units']}"
            f" (final {n['finalized_units']}), invalidated {n['invalidated_units']}, claimed {n['claimed_units']}"
            f" = {tokens(n['claimed_tokens'])}, slashed {tokens(n['slashed_tokens'])}"
        )
        for sl in n["slashes"]:
            lines.append(f"    slash {tokens(sl['amount'])} for {sl['work_key']} by {sl['validator']} (tx {sl['tx']})")
        for d in n.get("disputes", []):
            lines.append(f"    {d['kind']} of {d['work_key']} by {d['by']}: {d['verdict']} (txs {', '.join(d['txs'])})")
    lines += [f"  MISMATCH: {m}" for m in rep.mismatches]
    output(s, rep.to_dict(), lines)
    if not rep.consistent:
        sys.exit(1)
