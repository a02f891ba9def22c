"""A worker's chain reads at steady state, against chains with a short and a long history, in one run.

For each history length a fresh anvil is started whose first block is numbered past that history (anvil
mines 10,000 blocks in minutes, 100,000 in hours, so the past is made cheaply: `--number`), the
contracts are deployed there and the deployment file dates them from `history` blocks back, so every
follower that starts from the deployment reads the whole range, exactly as on a chain where the pool
has run that long. A pool is created, one provider's node joins and has work recorded.

Then one worker (`node.worker.Worker`, its own chain client and state) catches up once (its first
claim scan, accusation follow and membership load) and runs a simulated minute of steady state: 30
blocks (Base's 2 s blocks), 12 claim scans and accusation follows (every 5 s) and 30 membership
refreshes (every 2 s), each between the blocks that fall before it. Every JSON-RPC call the worker makes
is counted. The same minute of the old claim scan (all the pool's events from the deployment, every
5 s: `node.ops.claimable_keys`) is counted for comparison.

Prints calls per minute at each history length and their ratio (target: 1.0, independent of the
history), the claim scan's share next to the old scan's, and the catch-up's calls; ends with one JSON
line.

    .venv/bin/python bench/chain.py [--histories 1000,100000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from node import ops
from node.chain import ChainClient, RpcClient
from node.chain.anvil import Anvil
from node.chain.deployment import Deployment
from node.p2p.membership import ChainMembership
from pool.devnet.setup import DevnetOptions, Roles, create_pool, join_one_node

BLOCKS_PER_MIN = 30
CLAIM_POLLS_PER_MIN = 12
MEMBERSHIP_POLLS_PER_MIN = 30


def _crosses(i: int, n: int, steps: int) -> bool:
    """Whether step `i` of `steps` is one of `n` evenly spread ones."""
    return (i * n) // steps != ((i + 1) * n) // steps


def count_calls(c: ChainClient) -> dict[str, int]:
    """Count every JSON-RPC call `c` makes, per method (its endpoints' one `_post`)."""
    counts: dict[str, int] = {}
    post = c.rpc._post

    async def counted(e: Any, method: str, params: list[Any]) -> Any:
        counts[method] = counts.get(method, 0) + 1
        return await post(e, method, params)

    c.rpc._post = counted  # type: ignore[method-assign]
    return counts


async def one_history(history: int, workdir: Path) -> dict[str, Any]:
    from node.worker import Worker, WorkerConfig

    roles = Roles.default()
    with Anvil(genesis_number=history + 1) as anvil:
        opts = DevnetOptions(workdir=workdir, window=3600, model="tiny", env="math")
        made = await create_pool(anvil.url, opts, roles, lambda m: None, "")
        pid, dep = made["pool"], made["deployment"]
        await join_one_node(anvil.url, dep, roles, pid, lambda m: None)
        async with await ChainClient.connect(anvil.url, dep, roles.coordinator) as co:
            items = [
                ops.WorkItem(roles.node.address, "0x" + f"{i + 1:064x}", 10, 0, "0x" + "ab" * 32) for i in range(8)
            ]
            await ops.record_work(co, pid, items)
        old = replace(dep, block=dep.block - history)  # the contracts "date from" `history` blocks back
        old_path = workdir / "deployment-old.json"
        old.save(old_path)
        dep = Deployment.load(old_path)

        cfg = WorkerConfig(pool_id=pid, data_dir=workdir / "worker", rpc_url=anvil.url, deployment=dep)
        w = Worker(cfg, roles.provider, roles.node)
        w.chain = await ChainClient.connect(anvil.url, dep, roles.provider)
        counts = count_calls(w.chain)
        membership = ChainMembership(w.chain, pid)
        try:
            head = await w.chain.rpc.block_number()
            while membership.block < head:  # membership reads at most 50,000 blocks per poll
                await membership.refresh()
            await w.claim_final()
            await w.appeal_accusations()
            catch_up = sum(counts.values())
            counts.clear()
            claim_calls = 0
            mined = 0
            async with RpcClient(anvil.url) as miner:  # the bench's own calls, not counted
                for i in range(MEMBERSHIP_POLLS_PER_MIN):  # one simulated minute, a membership poll each step
                    due = (i + 1) * BLOCKS_PER_MIN // MEMBERSHIP_POLLS_PER_MIN - mined
                    if due:
                        await miner.request("anvil_mine", [hex(due)])
                        mined += due
                    await membership.refresh()
                    if _crosses(i, CLAIM_POLLS_PER_MIN, MEMBERSHIP_POLLS_PER_MIN):
                        before = sum(counts.values())
                        await w.claim_final()
                        claim_calls += sum(counts.values()) - before
                        await w.appeal_accusations()
            steady = {k: v for k, v in counts.items() if v}
            counts.clear()
            for _ in range(CLAIM_POLLS_PER_MIN):
                await ops.claimable_keys(w.chain, pid, roles.provider.address)
            legacy = sum(counts.values())
        finally:
            await w.chain.aclose()
            w.store.close()
    return {
        "calls_per_min": sum(steady.values()),
        "by_method": steady,
        "claim_scan_calls_per_min": claim_calls,
        "catch_up_calls": catch_up,
        "legacy": legacy,
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    histories = [int(h) for h in args.histories.split(",")]
    results = {}
    for h in histories:
        with tempfile.TemporaryDirectory(prefix="intellect-bench-chain-") as d:
            r = trio.run(one_history, h, Path(d))
        results[h] = r
        print(
            f"history {h:>7} blocks: {r['calls_per_min']:>4} calls/min at steady state {r['by_method']}; "
            f"of which the claim scan {r['claim_scan_calls_per_min']} (the old full scan: {r['legacy']}); "
            f"catch-up {r['catch_up_calls']} calls",
            flush=True,
        )
    lo, hi = results[histories[0]], results[histories[-1]]
    out = {
        "histories": histories,
        "calls_per_min": [results[h]["calls_per_min"] for h in histories],
        "steady_ratio_long_vs_short": round(hi["calls_per_min"] / lo["calls_per_min"], 3),
        "claim_scan_calls_per_min": [results[h]["claim_scan_calls_per_min"] for h in histories],
        "old_claim_scan_calls_per_min": [results[h]["legacy"] for h in histories],
        "catch_up_calls": [results[h]["catch_up_calls"] for h in histories],
    }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", default="1000,100000", help="comma-separated chain history lengths, in blocks")
    print(json.dumps(main(ap.parse_args())))
