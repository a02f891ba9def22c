"""Crash safety of the three daemons: `kill -9` at random moments, restart, and check that nothing was
lost or done twice.

A real devnet (anvil, coordinator, validator, two honest workers and a cheater, every one its own
process) runs while a seeded schedule kills a role with SIGKILL at a random moment and restarts it, 12
times in all (each role at least twice). Then the devnet is left to finish, and:

- no accepted rollout is lost: every rollout a worker was told "accepted" is in the coordinator's state
  and recorded on chain, and every rollout the coordinator accepted is recorded on chain;
- no work is recorded twice, and no transaction is duplicated: every transaction any role ever sent is
  mined successfully (a repeat of a recordWork, invalidateWork, claim, registerProvider, addNode or
  joinPool would revert), the one-time set-up calls appear once per account, and each work key is in
  exactly one recordWork, at most one invalidateWork and at most one claim;
- the outcome is still right: honest work claimed, cheating invalidated and slashed, audit consistent.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

from node.chain import abi
from node.chain.anvil import Anvil, free_port
from node.chain.rpc import RpcClient
from pool.devnet import (
    DevnetOptions,
    Proc,
    Roles,
    check_outcome,
    create_pool,
    make_procs,
    orchestrate,
    peer_id_of,
    stop_all,
)

KILLS = 12
SEED = 20261130


def _rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(con.execute(sql, params).fetchall())
    finally:
        con.close()


async def _all_txs(url: str) -> list[dict[str, Any]]:
    out = []
    async with RpcClient(url) as rpc:
        head = await rpc.block_number()
        for n in range(head + 1):
            block = await rpc.request("eth_getBlockByNumber", [hex(n), True])
            for tx in block["transactions"]:
                rc = await rpc.request("eth_getTransactionReceipt", [tx["hash"]])
                out.append({"from": tx["from"].lower(), "input": tx["input"], "to": tx.get("to"), "receipt": rc})
    return out


def _selectors() -> dict[str, str]:
    sel = {}
    for contract, names in {
        "WorkLedger": ("recordWork", "invalidateWork", "claim"),
        "ProviderRegistry": ("registerProvider", "addNode"),
        "PoolManager": ("joinPool", "ejectNode"),
    }.items():
        for name in names:
            sel["0x" + abi.load(contract).fn(name).selector.hex()] = name
    return sel


@pytest.mark.slow
def test_kill9_each_role_at_random_points_loses_and_repeats_nothing(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    opts = DevnetOptions(workdir=tmp_path, model="tiny", steps=4, workers=2, adversary=True, timeout=600, live=False)
    roles = Roles.default()
    rng = random.Random(SEED)
    say = print
    coord_port = free_port()
    bootstrap = f"/ip4/127.0.0.1/tcp/{coord_port}/p2p/{peer_id_of(roles.coordinator)}"
    with Anvil(port=free_port(), log_file=str(tmp_path / "anvil.log")) as anvil:
        pool_id = trio.run(create_pool, anvil.url, opts, roles, say, bootstrap)["pool"]
        procs = make_procs(opts, anvil.url, roles, pool_id, coord_port)
        by_name = {p.name: p for p in procs}
        schedule = ["coordinator"] * 4 + ["validator"] * 3 + ["worker1", "worker1", "worker2", "worker2", "cheater"]
        assert len(schedule) == KILLS
        rng.shuffle(schedule)
        kills: Counter[str] = Counter()
        try:
            for p in procs:
                p.start()
            time.sleep(8)
            for name in schedule:
                time.sleep(rng.uniform(2.0, 9.0))
                victim: Proc = by_name[name]
                victim.kill9()
                kills[name] += 1
                victim.start()
            say(f"killed and restarted: {dict(kills)}")
            report = trio.run(orchestrate, anvil.url, opts, roles, pool_id, procs, say)
        finally:
            stop_all(procs)
        txs = trio.run(_all_txs, anvil.url)

    assert sum(kills.values()) == KILLS and all(kills[n] >= 1 for n in set(schedule))
    assert check_outcome(report) == [], report

    coord_db = tmp_path / "coordinator" / "coordinator.db"
    coord_rows = dict(_rows(coord_db, "SELECT work_key, status FROM rollouts"))
    # every rollout the coordinator accepted is on chain, except the cheater's once slashing took its
    # provider's stake below the pool's minimum (the ledger records no work then)
    cheater_node = roles.workers[opts.workers][1].address
    under = {
        k for (k,) in _rows(coord_db, "SELECT work_key FROM rollouts WHERE status = 'dropped' AND node = ? "
                            "AND note = 'provider''s stake is below the minimum'", (cheater_node,))
    }  # fmt: skip
    assert coord_rows and all(s == "recorded" or k in under for k, s in coord_rows.items()), coord_rows
    for name in ("worker1", "worker2", "cheater"):
        told = {
            k for (k,) in _rows(tmp_path / name / "worker.db", "SELECT work_key FROM rollouts WHERE status='accepted'")
        }
        assert len(told) >= opts.steps, (name, told)
        assert told <= set(coord_rows), f"{name}: accepted rollouts missing at the coordinator"

    sel = _selectors()
    per_call: Counter[tuple[str, str]] = Counter()
    recorded: Counter[str] = Counter()
    invalidated: Counter[str] = Counter()
    for tx in txs:
        rc = tx["receipt"]
        assert int(rc["status"], 16) == 1, f"a reverted transaction from {tx['from']}: {tx['input'][:10]}"
        name = sel.get(tx["input"][:10])
        if name is None:
            continue
        per_call[(tx["from"], name)] += 1
        for log in rc["logs"]:
            if name == "recordWork" and len(log["topics"]) == 4:  # WorkRecorded(pool, node, workKey)
                recorded[log["topics"][3]] += 1
        if name == "invalidateWork":
            invalidated["0x" + tx["input"][10 + 64 : 10 + 128]] += 1
    for (who, name), n in per_call.items():
        if name in ("registerProvider", "addNode", "joinPool"):
            assert n == 1, f"{who} sent {name} {n} times"
    assert all(c == 1 for c in recorded.values()), recorded
    # (the cheater's rollouts dropped once a slash took its stake under the minimum were never recorded)
    assert set(recorded) == set(coord_rows) - under, "the chain and the coordinator disagree on what was recorded"
    assert all(c == 1 for c in invalidated.values()), invalidated
    assert len(invalidated) == report["nodes"]["cheater"]["rollouts_invalidated"] == opts.steps - len(under)
