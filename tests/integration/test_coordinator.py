"""The coordinator daemon against real anvil and real libp2p hosts: a member that heartbeats on gossip
stays, a member that goes silent is ejected on chain."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from eth_account import Account

from node import ops, protocol
from node.chain.deployment import Deployment
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from pool.coordinator import Coordinator, CoordinatorConfig
from pool.deploy import TOKEN
from tests.conftest import World, file_size_limit, write_spec


async def _pool_with_two_members(chain: World, folder: Path, fund: int = 10 * TOKEN) -> int:
    uri, digest = write_spec(folder)
    async with await chain.client(chain.admin) as admin, await chain.client(chain.provider) as prov:
        spec = ops.PoolSpec(
            chain.coordinator.address, uri, digest, 10**15, 3600, TOKEN, TOKEN, validators=(chain.validator.address,)
        )
        pid, _ = await ops.create_pool(admin, spec)
        await admin.transact("PoolManager", "startPool", pid)
        if fund:
            await ops.fund_pool(admin, pid, fund)
        await ops.register_provider(prov, 100 * TOKEN)
        async with await chain.client(chain.coordinator) as coord:
            for node in (chain.node, chain.node2):
                await ops.add_node(prov, node.address, 1, await ops.node_signature(prov, node, chain.provider.address))
                await ops.join_pool(prov, await ops.make_invite(coord, chain.coordinator, pid, node.address, 600))
        return pid


def _coordinator(chain: World, pid: int, tmp_path: Path, **kw: Any) -> Coordinator:
    cfg = CoordinatorConfig(
        pool_id=pid,
        data_dir=tmp_path / "coord",
        rpc_url=chain.url,
        deployment=chain.deployment,
        listen="/ip4/127.0.0.1/tcp/0",
        model="tiny",
        **kw,
    )
    return Coordinator(cfg, chain.coordinator)


async def test_silent_member_is_ejected_and_heartbeating_one_stays(chain: World, tmp_path: Path) -> None:
    pid = await _pool_with_two_members(chain, tmp_path)
    coord = _coordinator(chain, pid, tmp_path, eject_after=6.0, heartbeat_grace=0.0)
    async with await chain.client(None) as reader, trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)

        def members() -> Membership:
            return Membership(pid, chain.coordinator.address, frozenset(), frozenset({chain.node2.address}))

        async with PoolNetwork(private_key=bytes(chain.node2.key), pool=pid, membership=members) as net:
            await net.connect(addrs[0])

            async def beat() -> None:
                while True:
                    await net.publish("heartbeat", protocol.pack({"accepted": 0}))
                    await trio.sleep(0.5)

            nursery.start_soon(beat)
            with trio.fail_after(60):
                while await reader.call("PoolManager", "isMember", pid, chain.node.address):
                    await trio.sleep(0.5)
            assert await reader.call("PoolManager", "isMember", pid, chain.node2.address)
            assert coord.heartbeats.get(chain.node2.address) is not None
        nursery.cancel_scope.cancel()
    async with await chain.client(None) as reader:
        ejected = [e for e in await reader.events(["PoolManager"]) if e.name == "NodeEjected"]
    assert [(e.args["node"], e.args["by"]) for e in ejected] == [(chain.node.address, chain.coordinator.address)]


async def test_an_ejection_records_the_nodes_accepted_work_first(chain: World, tmp_path: Path) -> None:
    """Work the coordinator accepted from a node is recorded before the node is ejected (a non-member's
    work can no longer be recorded): the ejection costs the node its place, never its pay."""
    pid = await _pool_with_two_members(chain, tmp_path)
    # the record loop is made idle: only the ejection can record this rollout
    coord = _coordinator(chain, pid, tmp_path, eject_after=4.0, heartbeat_grace=0.0, record_every=3600.0)
    key = "0x" + hashlib.sha256(b"accepted before going silent").hexdigest()
    coord.store.execute(
        "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, mean_reward, "
        "accepted_at) VALUES(?, 't1', ?, 640, 0, ?, 0.0, ?)",
        (key, chain.node.address, "0x" + "11" * 32, time.time()),
    )
    async with await chain.client(None) as reader, trio.open_nursery() as nursery:
        await nursery.start(coord.run)
        with trio.fail_after(60):
            while await reader.call("PoolManager", "isMember", pid, chain.node.address):
                await trio.sleep(0.5)
        status = coord.store.scalar("SELECT status FROM rollouts WHERE work_key = ?", (key,))
        nursery.cancel_scope.cancel()
    async with await chain.client(None) as reader:
        rec = await ops.record(reader, pid, key)
        events = [
            e for e in await reader.events(["PoolManager", "WorkLedger"]) if e.name in ("NodeEjected", "WorkRecorded")
        ]
    assert rec["statusName"] == "pending" and int(rec["units"]) == 640
    assert [e.name for e in events if e.name == "WorkRecorded" or e.args["node"] == chain.node.address] == [
        "WorkRecorded",
        "NodeEjected",
    ]
    assert status == "recorded"


async def test_work_waits_for_the_budget_and_is_recorded_once_funded(chain: World, tmp_path: Path) -> None:
    """Recording reserves each reward, so the ledger refuses a batch the pool cannot pay. The
    coordinator holds such work back (accepted, counted, not lost), refuses to eject its node (its
    work could no longer be recorded), and records it as soon as the owner funds the pool."""
    pid = await _pool_with_two_members(chain, tmp_path, fund=0)
    coord = _coordinator(chain, pid, tmp_path, record_every=0.5, eject_after=2.0, heartbeat_grace=0.0)
    key = "0x" + hashlib.sha256(b"accepted while the pool is broke").hexdigest()
    coord.store.execute(
        "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, mean_reward, "
        "accepted_at) VALUES(?, 't1', ?, 640, 0, ?, 0.0, ?)",
        (key, chain.node.address, "0x" + "11" * 32, time.time()),
    )
    async with await chain.client(chain.admin) as admin, trio.open_nursery() as nursery:
        await nursery.start(coord.run)
        await trio.sleep(6.0)  # several record rounds and ejection attempts
        assert coord.store.scalar("SELECT status FROM rollouts WHERE work_key = ?", (key,)) == "accepted"
        assert (await ops.record(admin, pid, key))["statusName"] == "none"
        assert await admin.call("PoolManager", "isMember", pid, chain.node.address), "ejected with unrecorded work"
        await ops.fund_pool(admin, pid, 640 * 10**15)  # exactly the reward
        with trio.fail_after(30):
            while coord.store.scalar("SELECT status FROM rollouts WHERE work_key = ?", (key,)) != "recorded":
                await trio.sleep(0.3)
        assert int((await ops.record(admin, pid, key))["units"]) == 640
        assert int(await admin.call("WorkLedger", "surplus", pid)) == 0
        nursery.cancel_scope.cancel()


async def test_an_open_task_is_reissued_until_the_policy_moves_past_it(chain: World, tmp_path: Path) -> None:
    """Asking again returns the same open task (no second seed to pick from) while its policy version is
    still usable; once the policy moved more than `async_level` versions on (the worker was down), the
    task is superseded by a fresh one and a late submission for it is refused with its own reason."""
    pid = await _pool_with_two_members(chain, tmp_path)
    coord = _coordinator(chain, pid, tmp_path, async_level=2)
    async with trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)
        peer = str(addrs[0]).rsplit("/p2p/", 1)[1]

        def members() -> Membership:
            return Membership(pid, chain.coordinator.address, frozenset(), frozenset({chain.node.address}))

        async with PoolNetwork(private_key=bytes(chain.node.key), pool=pid, membership=members) as net:
            await net.connect(addrs[0])

            async def ask(proto: str, body: dict[str, object]) -> dict[str, object]:
                return protocol.reply_body(await net.node.request(peer, proto, protocol.pack(body), timeout=30), "t")

            first = protocol.Task.from_wire((await ask(protocol.TASK_PROTOCOL, {}))["task"])
            assert first.policy_version == 0
            assert protocol.Task.from_wire((await ask(protocol.TASK_PROTOCOL, {}))["task"]) == first
            coord.cfg.policy_version = 2  # still within async_level: the same task
            assert protocol.Task.from_wire((await ask(protocol.TASK_PROTOCOL, {}))["task"]) == first
            coord.cfg.policy_version = 3  # the task's rollouts would be stale: a fresh task
            second = protocol.Task.from_wire((await ask(protocol.TASK_PROTOCOL, {}))["task"])
            assert second.task_id != first.task_id
            assert (second.policy_version, second.min_policy_version) == (3, 3)  # bound to the current one
            assert protocol.Task.from_wire((await ask(protocol.TASK_PROTOCOL, {}))["task"]) == second
            with pytest.raises(protocol.ProtocolError, match="replaced after the policy moved on"):
                await ask(protocol.SUBMIT_PROTOCOL, {"work_key": "0x" + "11" * 32, "task_id": first.task_id})
        nursery.cancel_scope.cancel()
    assert coord.rejected["task-superseded"] == 1


def test_checkpoints_current_within_the_retention_time_stay_served(tmp_path: Path) -> None:
    """A version stays served while it was current within `keep_checkpoint_seconds` (a validator that
    fell behind still needs the weights a rollout claims), whatever `keep_checkpoints` says."""
    cfg = CoordinatorConfig(
        pool_id=1,
        data_dir=tmp_path,
        rpc_url="http://127.0.0.1:1",
        deployment=Deployment(chain_id=31337, contracts={}, block=0),
        keep_checkpoint_seconds=600.0,
    )
    coord = Coordinator(cfg, Account.create())
    now = 10_000.0
    # version n was produced at `now - 100 * (8 - n)`: v8 now-0, v7 now-100, ..., v1 now-700
    for n in range(1, 9):
        coord.store.execute(
            "INSERT INTO steps(version, mean_reward, files, samples, stale, versions, seconds, manifest_hash, at) "
            "VALUES(?, 0, 1, 1, 0, '[]', 0, '', ?)",
            (n, now - 100.0 * (8 - n)),
        )
    # v2 was produced at now-600 and v1 was current until then: both kept; v0 (superseded at now-700) not
    assert coord.retained_versions(9, now) == set(range(1, 10))
    assert coord.retained_versions(9, now + 250) == set(range(4, 10))  # v3 superseded at now-400
    coord.cfg.keep_checkpoint_seconds = 0.0
    assert coord.retained_versions(9, now + 10_000) == {8, 9}


async def test_a_step_that_is_not_committed_is_trained_once(tmp_path: Path, vllm_engine: Any, tiny_model: Path) -> None:
    """A version published by an attempt that died before its commit is replaced, not a dead end; a step
    whose checkpoint cannot be written (a full disk) leaves the trainer at the last committed version, so
    the retry trains on those rollouts once."""
    import torch
    from safetensors.torch import load_file

    from node.inference.engine import SamplingSpec
    from node.inference.tools import model_tools
    from node.rollout.build import build_rollout_file
    from node.rollout.file import RolloutHeader
    from node.tasks.math import ThinkingBudgetEnv

    tools = model_tools(str(tiny_model))
    cfg = CoordinatorConfig(
        pool_id=1,
        data_dir=tmp_path,
        rpc_url="http://127.0.0.1:1",
        deployment=Deployment(chain_id=31337, contracts={}, block=0),
        model="tiny",
        async_level=2,
        train_files=1,
    )
    coord = Coordinator(cfg, Account.create())
    coord.tools = tools
    coord.trainer = coord._load_trainer()
    env = ThinkingBudgetEnv()
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}  # as in the devnet: some stop early

    def add_rollout(seed: int) -> str:
        problems = env.problems(seed, 4)
        spec = SamplingSpec(1.0, 1.0, 64, seed=seed, stop_token_ids=tuple(sorted(tools.stop_ids)))
        groups = vllm_engine.generate([tools.encode(p.prompt) for p in problems], spec, n=8)
        header = RolloutHeader(1, "0x" + "ab" * 20, cfg.policy_version, env.name, seed, sampling, "tiny")
        key = coord.blobs.put(build_rollout_file(header, problems, groups, env=env, decode=tools.decode).to_bytes())
        coord.store.execute(
            "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, mean_reward, "
            "accepted_at) VALUES(?, ?, ?, 1, ?, '0x', 0, ?)",
            (key, f"task-{seed}", "0x" + "ab" * 20, cfg.policy_version, time.time()),
        )
        return key

    def samples(version: int) -> int:  # a step that trained on nothing would prove nothing here
        return int(coord.store.query("SELECT samples FROM steps WHERE version = ?", (version,))[0][0])

    def trained(key: str) -> int:
        return int(coord.store.query("SELECT trained FROM rollouts WHERE work_key = ?", (key,))[0][0])

    # a coordinator killed between publishing version 1 and committing it left this behind
    coord.weights.publish(tiny_model / "model.safetensors", 1)
    first = add_rollout(1)
    assert await coord.train_step()
    assert cfg.policy_version == 1 and trained(first) == 1 and samples(1) > 0
    ckpt1 = tmp_path / "checkpoints" / "v1" / "model.safetensors"
    m1 = coord.weights.manifest(1)
    assert m1 is not None and m1.sha256 == hashlib.sha256(ckpt1.read_bytes()).hexdigest()
    assert coord.history()[1] == m1.manifest_hash()

    second = add_rollout(2)
    with file_size_limit(64 * 1024), pytest.raises(Exception, match="File too large"):
        await coord.train_step()  # the checkpoint (10 MB) cannot be written
    assert cfg.policy_version == 1 and coord.store.get("policy_version") == "1" and trained(second) == 0
    assert coord.weights.versions()[-1] == 1 and 2 not in coord.history()
    saved = load_file(str(ckpt1))
    now = coord.trainer.state_dict_for_inference()
    assert saved.keys() == now.keys() and all(torch.equal(saved[k], now[k]) for k in saved)

    assert await coord.train_step()  # room again: the same rollouts, trained once
    assert cfg.policy_version == 2 and trained(second) == 1 and samples(2) > 0
