"""Gas per recorded work record, measured on a real anvil with the real contracts.

Records batches of 100 with 1, 10 and 100 distinct nodes (cold storage reads cost more per node),
then again after 1,000 records are on the ledger (gas must not grow with history), and measures the
disputes (a hard invalidation, i.e. an accusation with its bond; a soft one; an appeal; the committee
draw; a vote and the deciding vote; a challenge; finalizing an unappealed invalidation, which slashes;
closing a lapsed vote) and a 100-record claim. Ends with one JSON line.

    .venv/bin/python bench/gas.py
"""

from __future__ import annotations

import json
import sys

import trio
from eth_account import Account

from node import ops
from node.chain import ChainClient
from node.chain.anvil import ANVIL_KEYS, Anvil, advance_time
from node.chain.rpc import RpcClient
from node.keys import from_hex
from pool.deploy import TOKEN, DeployParams, deploy

BATCH = 100
NODES = 100
TARGET = 30_000
TARGET_INVALIDATE = 250_000  # an accusation stores its opening time, the record time and the set it is judged by


async def main(url: str) -> dict[str, float]:
    admin, prov, coord, val, *jurors = (from_hex(k) for k in ANVIL_KEYS[:7])
    async with RpcClient(url) as rpc:
        dep = await deploy(rpc, admin, DeployParams())
    a = await ChainClient.connect(url, dep, admin)
    p = await ChainClient.connect(url, dep, prov)
    c = await ChainClient.connect(url, dep, coord)
    v = await ChainClient.connect(url, dep, val)
    await a.transact("IntellectToken", "mint", prov.address, 100_000 * TOKEN)
    await a.transact("IntellectToken", "mint", admin.address, 100_000 * TOKEN)
    await a.transact("IntellectToken", "mint", val.address, 100 * TOKEN)
    spec = ops.PoolSpec(
        coord.address, "bench", "0x" + "00" * 32, 1, 3600, TOKEN, 0,
        validators=(val.address, *(j.address for j in jurors)),
        disputes=ops.DisputeTerms(appeal_period=600, vote_period=600, committee_size=3, bond=TOKEN),
    )  # fmt: skip
    pid, _ = await ops.create_pool(a, spec)
    await a.transact("PoolManager", "startPool", pid)
    await ops.fund_pool(a, pid, 50_000 * TOKEN)
    await ops.register_provider(p, 20_000 * TOKEN)
    nodes = [Account.create() for _ in range(NODES)]
    for n in nodes:
        await ops.add_node(p, n.address, 1, await ops.node_signature(p, n, prov.address))
        await ops.join_pool(p, await ops.make_invite(c, coord, pid, n.address, 3600))

    counter = iter(range(1, 10**9))

    async def batch(distinct: int) -> float:
        items = [
            ops.WorkItem(nodes[i % distinct].address, "0x" + f"{next(counter):064x}", 1000 + i, 7, "0x" + "ab" * 32)
            for i in range(BATCH)
        ]
        (r,) = await ops.record_work(c, pid, items)
        return r.gas_used / BATCH

    # Each measurement uses nodes whose storage was never touched in that transaction before.
    out: dict[str, float] = {}
    out["gas_per_record_1_node"] = await batch(1)
    out["gas_per_record_10_nodes"] = await batch(10)
    out["gas_per_record_100_nodes"] = await batch(100)
    while next(counter) < 1_000:
        pass
    for _ in range(7):
        await batch(100)  # grow the ledger past 1,000 records
    out["gas_per_record_10_nodes_after_1000_records"] = await batch(10)

    def key(i: int) -> str:
        return "0x" + f"{i:064x}"

    await ops.register_provider(a, 100 * TOKEN)  # the admin, staked, may challenge
    js = [await ChainClient.connect(url, dep, j) for j in jurors]

    def sig(i: int) -> str:  # the node's signature over its work: what a slash needs
        return ops.rollout_claim(v, pid, key(i)).sign(nodes[0])

    r = await ops.invalidate(v, pid, key(1), "0x" + "ee" * 32, signature=sig(1))
    out["gas_invalidate"] = r.gas_used
    out["gas_soft_invalidate"] = (await ops.invalidate(v, pid, key(202), "0x" + "ee" * 32, hard=False)).gas_used
    await ops.invalidate(v, pid, key(200), "0x" + "ee" * 32, signature=sig(200))
    out["gas_appeal"] = (await ops.appeal(p, pid, key(200))).gas_used
    await a.rpc.request("evm_mine", [])
    out["gas_draw_committee"] = (await ops.draw_committee(a, pid, key(200))).gas_used
    drawn = [j for j in js if int(await a.call("WorkLedger", "jurorState", pid, key(200), j.address)) == 1]
    out["gas_vote"] = (await ops.vote(drawn[0], pid, key(200), False)).gas_used
    out["gas_vote_deciding"] = (await ops.vote(drawn[1], pid, key(200), False)).gas_used
    out["gas_challenge"] = (await ops.challenge(a, pid, key(201), "0x" + "cc" * 32, sig(201))).gas_used
    await a.rpc.request("anvil_mine", [hex(300)])  # the seed's hash is gone: every eligible validator sits
    out["gas_draw_committee_stale"] = (await ops.draw_committee(a, pid, key(201))).gas_used
    await advance_time(a.rpc, 3601)
    out["gas_finalize_invalidation"] = (await ops.finalize_invalidation(v, pid, key(1))).gas_used
    out["gas_finalize_soft"] = (await ops.finalize_invalidation(v, pid, key(202))).gas_used
    out["gas_resolve_lapsed"] = (await ops.resolve_lapsed(v, pid, key(201))).gas_used
    keys = ["0x" + f"{i:064x}" for i in range(2, 2 + BATCH)]
    _, rs = await ops.claim(p, pid, keys)
    out["gas_claim_per_record"] = rs[0].gas_used / BATCH
    out["target_gas_per_record"] = TARGET
    out["target_gas_invalidate"] = TARGET_INVALIDATE
    out["invalidate_to_target"] = out["gas_invalidate"] / TARGET_INVALIDATE
    out["growth_ratio_after_1000_records"] = (
        out["gas_per_record_10_nodes_after_1000_records"] / out["gas_per_record_10_nodes"]
    )
    for cl in (a, p, c, v, *js):
        await cl.aclose()
    return out


if __name__ == "__main__":
    with Anvil() as anvil:
        figures = trio.run(main, anvil.url)
    for k, val in figures.items():
        print(f"{k:45s} {val:12.1f}", file=sys.stderr)
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))
