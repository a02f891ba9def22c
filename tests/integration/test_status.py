"""`intellect-node status` against a real anvil with the real contracts: a provider with a node in a
pool shows its pending work, then the slash of an invalidation with that transaction's hash, then,
after the validation window and a claim, the claimed reward."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from cli.main import entry
from node import ops
from node.chain.anvil import ANVIL_KEYS
from node.chain.tx import Receipt
from tests.conftest import World, advance_time_sync, slash_now

TOKEN = 10**18
RATE = 10**16  # 0.01 token per unit
WINDOW = 86_400
SLASH = 5 * TOKEN


class Status:
    def __init__(self, world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self.mp = monkeypatch
        self.capsys = capsys
        monkeypatch.setenv("INTELLECT_RPC_URL", world.url)
        monkeypatch.setenv("INTELLECT_DEPLOYMENT", str(world.deployment_path))
        monkeypatch.delenv("INTELLECT_KEYSTORE", raising=False)
        monkeypatch.delenv("INTELLECT_PRIVATE_KEY", raising=False)

    def __call__(self, *args: str, key: str | None = None, expect: int = 0) -> tuple[str, str]:
        if key is None:
            self.mp.delenv("INTELLECT_PRIVATE_KEY", raising=False)
        else:
            self.mp.setenv("INTELLECT_PRIVATE_KEY", key)
        self.capsys.readouterr()
        code = entry(["status", *args])
        out, err = self.capsys.readouterr()
        assert code == expect, f"`status {' '.join(args)}` exited {code}, expected {expect}\n{out}\n{err}"
        return out, err

    def json(self, *args: str, key: str | None = None) -> dict[str, Any]:
        out, _ = self(*args, "--json", key=key)
        return dict(json.loads(out))


def _setup(w: World, keys: list[str]) -> int:
    async def go() -> int:
        async with await w.client(w.provider) as p:
            await ops.register_provider(p, 100 * TOKEN)
            await ops.add_node(p, w.node.address, 2, await ops.node_signature(p, w.node, w.provider.address))
        async with await w.client(w.admin) as a:
            pid, _ = await ops.create_pool(
                a,
                ops.PoolSpec(
                    coordinator=w.coordinator.address,
                    spec_uri="file:///spec.json",
                    spec_hash="0x" + "ab" * 32,
                    reward_rate=RATE,
                    validation_window=WINDOW,
                    slash_amount=SLASH,
                    min_stake=50 * TOKEN,
                    validators=(w.validator.address,),
                    disputes=ops.DisputeTerms(appeal_period=60, vote_period=60),
                ),
            )
            await a.transact("PoolManager", "startPool", pid)
            await ops.fund_pool(a, pid, 1000 * TOKEN)
        async with await w.client(w.coordinator) as co:
            invite = await ops.make_invite(co, w.coordinator, pid, w.node.address, ttl=3600)
        async with await w.client(w.provider) as p:
            await ops.join_pool(p, invite, pid)
        async with await w.client(w.coordinator) as co:
            items = [ops.WorkItem(w.node.address, k, 100 * (i + 1), 3, "0x" + "cd" * 32) for i, k in enumerate(keys)]
            await ops.record_work(co, pid, items)
        return pid

    return trio.run(go)


def _invalidate(w: World, pid: int, key: str) -> Receipt:
    return trio.run(slash_now, w, pid, key)


def _claim(w: World, pid: int) -> tuple[int, list[Receipt]]:
    async def go() -> tuple[int, list[Receipt]]:
        async with await w.client(w.provider) as p:
            return await ops.claim(p, pid)

    return trio.run(go)


def test_status_pending_slash_and_claim(chain: World, monkeypatch, capsys):
    w = chain
    provider_key = ANVIL_KEYS[1]
    assert ops.checksum(w.provider.address) == w.provider.address
    keys = ["0x" + f"{i:064x}" for i in range(0xA1, 0xA4)]
    status = Status(w, monkeypatch, capsys)

    # No provider, no node, no key: one clear error line.
    _, err = status("--pool", "1", expect=1)
    assert err.startswith("error: no provider to show") and "--provider" in err and err.count("\n") == 1

    pid = _setup(w, keys)
    p = str(pid)

    # Unknown pool.
    _, err = status("--pool", "999", "--provider", w.provider.address, expect=1)
    assert "pool 999 does not exist" in err

    # 1. Everything pending, read with the provider's own key.
    st = status.json("--pool", p, key=provider_key)
    prov = st["provider"]
    assert prov["address"] == w.provider.address and prov["registered"]
    assert prov["staked"] == 100 * TOKEN and prov["unbonding"] == 0
    assert st["timestamp"] < prov["locked_until"] <= st["timestamp"] + WINDOW  # the recorded work's deadline
    # the pool's minimum is the floor of what must stay staked
    assert prov["required"] == 50 * TOKEN and prov["meets_required"] and prov["meets_pool_minimum"]
    assert prov["token_balance"] == 9_900 * TOKEN
    assert [n["node"] for n in st["nodes"]] == [w.node.address]
    node = st["nodes"][0]
    assert node["member"] and node["bound"] and node["compute_units"] == 2 and node["joined_at"] > 0
    pending = st["work"]["pending"]
    assert [r["work_key"] for r in pending] == keys
    assert [r["units"] for r in pending] == [100, 200, 300]
    for r in pending:
        assert r["deadline"] == st["timestamp"] + r["time_left"]
        assert 0 < r["time_left"] <= WINDOW
        assert r["expected_reward"] == r["units"] * RATE
    assert st["work"]["claimable"] == st["work"]["claimed"] == st["work"]["invalidated"] == []
    assert st["slashes"] == [] and st["totals"]["pending"] == {"records": 3, "units": 600, "expected_reward": 6 * TOKEN}

    out, _ = status("--pool", p, key=provider_key)
    assert f"provider {w.provider.address} in pool {pid} (active)" in out
    assert f"node {w.node.address}: member of pool {pid}" in out
    assert "3 pending (600 units)" in out and f"pending     {keys[0]}" in out and "left" in out
    assert "slashes: 0" in out

    # 2. An invalidation: the slash with its tx hash, read without any key (--provider).
    inv = _invalidate(w, pid, keys[0])
    st = status.json("--pool", p, "--provider", w.provider.address)
    assert len(st["slashes"]) == 1
    s = st["slashes"][0]
    assert s["tx"] == inv.tx_hash and s["block"] == inv.block_number
    assert s["amount"] == SLASH and s["work_key"] == keys[0] and s["reason"] == keys[0]
    assert s["pool"] == pid and s["node"] == w.node.address and s["validator"] == w.validator.address
    assert s["evidence"] == "0x" + "ee" * 32
    assert [r["work_key"] for r in st["work"]["invalidated"]] == [keys[0]]
    assert st["work"]["invalidated"][0]["slashed"] == SLASH and st["work"]["invalidated"][0]["tx"] == inv.tx_hash
    assert [r["work_key"] for r in st["work"]["pending"]] == keys[1:]
    assert st["provider"]["staked"] == 95 * TOKEN and st["provider"]["slashed"] == SLASH
    out, _ = status("--pool", p, "--provider", w.provider.address)
    assert f"slash 5 INTL for work {keys[0]} in pool {pid}" in out and inv.tx_hash in out
    assert "slashes: 1, 5 INTL in all" in out and "1 invalidated (100 units)" in out

    # 3. After the window: claimable; then claimed with its reward, looked up via --node.
    advance_time_sync(w.url, WINDOW + 1)
    st = status.json("--pool", p, "--node", w.node.address)
    assert [r["work_key"] for r in st["work"]["claimable"]] == keys[1:]
    assert st["totals"]["claimable"]["reward"] == 500 * RATE and st["work"]["pending"] == []
    out, _ = status("--pool", p, "--node", w.node.address)
    assert "2 claimable (500 units, 5 INTL)" in out

    total, receipts = _claim(w, pid)
    assert total == 500 * RATE
    st = status.json("--pool", p, "--node", w.node.address)
    claimed = st["work"]["claimed"]
    assert [r["work_key"] for r in claimed] == keys[1:]
    assert [r["reward"] for r in claimed] == [200 * RATE, 300 * RATE]
    assert {r["tx"] for r in claimed} == {receipts[0].tx_hash}
    assert st["totals"]["claimed"] == {"records": 2, "units": 500, "reward": 5 * TOKEN}
    assert st["work"]["claimable"] == [] and st["work"]["pending"] == []
    assert st["provider"]["token_balance"] == 9_900 * TOKEN + 5 * TOKEN
    assert st["slashes"][0]["tx"] == inv.tx_hash  # history stays
    out, _ = status("--pool", p, "--node", w.node.address)
    assert "2 claimed (500 units, 5 INTL)" in out and receipts[0].tx_hash in out

    # --node and --provider together is a usage error.
    status("--pool", p, "--node", w.node.address, "--provider", w.provider.address, expect=2)


def test_status_lists_slashes_from_other_pools(chain: World, monkeypatch, capsys):
    """A slash in another pool (another node of the same provider) is listed with that pool's id,
    found from the slash transaction's receipt."""
    w = chain
    keys = ["0x" + f"{i:064x}" for i in range(0xB1, 0xB3)]
    pid = _setup(w, keys)
    other_key = "0x" + "0f" * 32

    async def second_pool() -> tuple[int, Receipt]:
        async with await w.client(w.provider) as p:
            await ops.add_node(p, w.node2.address, 1, await ops.node_signature(p, w.node2, w.provider.address))
        async with await w.client(w.admin) as a:
            pid2, _ = await ops.create_pool(
                a,
                ops.PoolSpec(
                    w.coordinator.address,
                    "file:///b.json",
                    "0x" + "ab" * 32,
                    RATE,
                    WINDOW,
                    3 * TOKEN,
                    validators=(w.validator.address,),
                    disputes=ops.DisputeTerms(appeal_period=60, vote_period=60),
                ),
            )
            await a.transact("PoolManager", "startPool", pid2)
            await ops.fund_pool(a, pid2, TOKEN)
        async with await w.client(w.coordinator) as co:
            invite = await ops.make_invite(co, w.coordinator, pid2, w.node2.address, ttl=3600)
        async with await w.client(w.provider) as p:
            await ops.join_pool(p, invite, pid2)
        async with await w.client(w.coordinator) as co:
            await ops.record_work(co, pid2, [ops.WorkItem(w.node2.address, other_key, 7, 1, "0x" + "cd" * 32)])
        r = await slash_now(w, pid2, other_key)
        return pid2, r

    pid2, inv2 = trio.run(second_pool)
    inv1 = _invalidate(w, pid, keys[0])
    status = Status(w, monkeypatch, capsys)

    st = status.json("--pool", str(pid), "--provider", w.provider.address)
    assert [(s["pool"], s["work_key"], s["amount"], s["tx"]) for s in st["slashes"]] == [
        (pid2, other_key, 3 * TOKEN, inv2.tx_hash),
        (pid, keys[0], SLASH, inv1.tx_hash),
    ]
    assert st["slashed_total"] == 8 * TOKEN
    # Both nodes are listed; only one is a member of this pool. Work is this pool's only.
    by_node = {n["node"]: n for n in st["nodes"]}
    assert by_node[w.node.address]["member"] and not by_node[w.node2.address]["member"]
    assert by_node[w.node2.address]["in_pool"] == pid2
    assert [r["work_key"] for r in st["work"]["invalidated"]] == [keys[0]]
    out, _ = status("--pool", str(pid), "--provider", w.provider.address)
    assert f"NOT a member of pool {pid} (member of pool {pid2})" in out
    assert f"slash 3 INTL for work {other_key} in pool {pid2}" in out and inv2.tx_hash in out
