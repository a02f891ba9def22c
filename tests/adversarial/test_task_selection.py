"""Whole-file selection against the real coordinator (anvil with the compiled contracts, libp2p on
127.0.0.1): a member that generates one task more than once and keeps the file it likes best.

Exact sampling fixes every token of a task once its seed and policy version are fixed, so the freedom
left to a worker is in the whole file: which allowed policy version to generate with (it could run the
task under each and submit the best), and which tasks to let lapse so as to draw new seeds. The first is
closed by binding each task to one version, named before the seed is known; the second is bounded by
a budget of lapsed tasks per node."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from node import ops, protocol
from node.p2p.blobs import upload_blob
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from node.rollout.file import work_key
from pool.coordinator import Coordinator, CoordinatorConfig, rules
from tests.adversarial.test_coordinator_intake import _file_for
from tests.conftest import World
from tests.integration.test_coordinator import _pool_with_two_members


def _config(chain: World, pid: int, tmp_path: Path, **kw: Any) -> CoordinatorConfig:
    return CoordinatorConfig(
        pool_id=pid, data_dir=tmp_path / "coord", rpc_url=chain.url, deployment=chain.deployment,
        listen="/ip4/127.0.0.1/tcp/0", eject_after=0, model="tiny", **kw,
    )  # fmt: skip


def _members(pid: int, chain: World) -> Any:
    return lambda: Membership(
        pid, chain.coordinator.address, frozenset(), frozenset({chain.node.address, chain.node2.address})
    )


async def test_a_task_is_bound_to_the_one_policy_version_its_worker_named(
    chain: World, tmp_path: Path, vllm_engine: Any
) -> None:
    """Policy 2 with async level 2: versions 0, 1 and 2 are all fresh enough. A worker that names
    version 1 gets a task bound to 1; the same task's file under version 2 (generated again with the
    newer weights and kept because it scored better) is refused, the file under version 1 is accepted.
    A worker naming no version, or one outside the window, is bound to the current version."""
    pid = await _pool_with_two_members(chain, tmp_path)
    coord = Coordinator(_config(chain, pid, tmp_path, async_level=2), chain.coordinator)
    async with trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)
        coord.cfg.policy_version = 2  # as if two steps were trained (the daemon starts from its state's)
        peer = str(addrs[0]).rsplit("/p2p/", 1)[1]
        assert coord.tools is not None
        async with (
            PoolNetwork(private_key=bytes(chain.node.key), pool=pid, membership=_members(pid, chain)) as net,
            PoolNetwork(private_key=bytes(chain.node2.key), pool=pid, membership=_members(pid, chain)) as net2,
        ):
            await net.connect(addrs[0])
            await net2.connect(addrs[0])

            async def ask(n: PoolNetwork, proto: str, body: dict[str, Any]) -> dict[str, Any]:
                return protocol.unpack(await n.node.request(peer, proto, protocol.pack(body), timeout=30), "reply")

            task = protocol.Task.from_wire((await ask(net, protocol.TASK_PROTOCOL, {"version": 1}))["task"])
            assert (task.min_policy_version, task.policy_version) == (1, 1)
            # asking again, naming another version, gives the same task: no second binding to pick from
            again = protocol.Task.from_wire((await ask(net, protocol.TASK_PROTOCOL, {"version": 2}))["task"])
            assert again == task

            claim_of = lambda key: ops.rollout_claim(coord.chain, pid, key)  # type: ignore[arg-type]  # noqa: E731
            newer = _file_for(task, chain.node.address, vllm_engine, coord.tools, version=2)
            key = work_key(newer)
            assert await upload_blob(net.node, peer, newer) == key
            reply = await ask(
                net, protocol.SUBMIT_PROTOCOL,
                {"work_key": key, "task_id": task.task_id, "signature": claim_of(key).sign(chain.node)},
            )  # fmt: skip
            assert reply["ok"] is False and "version 2" in reply["error"], reply
            assert coord.rejected["wrong-version"] == 1

            bound = _file_for(task, chain.node.address, vllm_engine, coord.tools, version=1)
            key = work_key(bound)
            assert await upload_blob(net.node, peer, bound) == key
            reply = await ask(
                net, protocol.SUBMIT_PROTOCOL,
                {"work_key": key, "task_id": task.task_id, "signature": claim_of(key).sign(chain.node)},
            )  # fmt: skip
            assert reply["ok"] is True and reply["status"] == "accepted", reply

            def close_node2_tasks() -> None:
                coord.state.store.execute("UPDATE tasks SET status = 'submitted' WHERE node = ?", (
                    chain.node2.address,))  # fmt: skip

            for body in ({}, {"version": 7}, {"version": -1}, {"version": "1"}, {"version": True}):
                close_node2_tasks()
                t = protocol.Task.from_wire((await ask(net2, protocol.TASK_PROTOCOL, body))["task"])
                assert (t.min_policy_version, t.policy_version) == (2, 2), body
            # a pool run with a fixed seed: the next task's seed is known ahead, so no version is chosen for it
            coord.cfg.seed = 5
            close_node2_tasks()
            t = protocol.Task.from_wire((await ask(net2, protocol.TASK_PROTOCOL, {"version": 1}))["task"])
            assert (t.min_policy_version, t.policy_version) == (2, 2)
        nursery.cancel_scope.cancel()


async def test_letting_tasks_lapse_to_draw_new_seeds_is_cut_off(chain: World, tmp_path: Path) -> None:
    """A worker that dislikes its task's outcome can only get a new seed once the task has (nearly)
    expired. Each task let lapse unsubmitted counts against its node: past `lapse_limit` lapses within
    `lapse_window`, it gets no new task (a clear wait, with the time left) while a node that lapses
    nothing is served as before."""
    pid = await _pool_with_two_members(chain, tmp_path)
    cfg = _config(chain, pid, tmp_path, task_ttl=1.5, resend_margin=0.2, lapse_limit=2, lapse_window=600.0)
    coord = Coordinator(cfg, chain.coordinator)
    async with trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)
        peer = str(addrs[0]).rsplit("/p2p/", 1)[1]
        async with (
            PoolNetwork(private_key=bytes(chain.node.key), pool=pid, membership=_members(pid, chain)) as net,
            PoolNetwork(private_key=bytes(chain.node2.key), pool=pid, membership=_members(pid, chain)) as net2,
        ):
            await net.connect(addrs[0])
            await net2.connect(addrs[0])

            async def ask(n: PoolNetwork) -> dict[str, Any]:
                raw = await n.node.request(peer, protocol.TASK_PROTOCOL, protocol.pack({}), timeout=30)
                return protocol.reply_body(raw, "task")

            seeds = []
            for _ in range(3):  # three tasks drawn and let lapse: each a fresh seed to choose from
                first = await ask(net)
                assert "task" in first, first
                assert (await ask(net))["task"] == first["task"]  # asking again within the task's life
                seeds.append(first["task"]["seed"])
                await trio.sleep(cfg.task_ttl + 0.1)
            assert len(set(seeds)) == 3
            refused = await ask(net)
            assert "task" not in refused and refused["lapsed"] == 3, refused
            assert "lapsed" in refused["reason"] and 500 < float(refused["retry_after"]) <= cfg.lapse_window
            assert "task" in await ask(net2)  # the other node lapsed nothing
            t = time.time()
            assert len(coord.state.lapsed(chain.node.address, t - cfg.lapse_window, t, t)) == 3
        nursery.cancel_scope.cancel()


async def test_waiting_for_the_policy_to_move_past_a_task_draws_no_new_seed_nor_a_version(
    chain: World, tmp_path: Path
) -> None:
    """The other way to a new outcome: name the oldest fresh version, so the task is soon superseded as
    the policy moves on, and ask again. The replacement keeps the superseded task's seed and is handed
    out at once (even while new work waits for the trainer, and past the lapse limit: it is no new
    seed). Its version is fixed by the task alone, not by when the worker asks: a task bound to v is
    replaced by one bound to v + async_level + 1 (the version at which v went stale), that one by the
    next such version, and so on, each supersession counted as a lapse. A worker that waits for a later
    version to bind its seed to pays one lapse per version skipped."""
    pid = await _pool_with_two_members(chain, tmp_path)
    coord = Coordinator(_config(chain, pid, tmp_path, async_level=2, lapse_limit=2), chain.coordinator)
    async with trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)
        coord.cfg.policy_version = 2
        peer = str(addrs[0]).rsplit("/p2p/", 1)[1]
        async with (
            PoolNetwork(private_key=bytes(chain.node.key), pool=pid, membership=_members(pid, chain)) as net,
            PoolNetwork(private_key=bytes(chain.node2.key), pool=pid, membership=_members(pid, chain)) as net2,
        ):
            await net.connect(addrs[0])
            await net2.connect(addrs[0])

            async def ask(n: PoolNetwork, version: int) -> dict[str, Any]:
                raw = await n.node.request(
                    peer, protocol.TASK_PROTOCOL, protocol.pack({"version": version}), timeout=30
                )
                return protocol.reply_body(raw, "task")

            async def task(n: PoolNetwork, version: int) -> protocol.Task:
                return protocol.Task.from_wire((await ask(n, version))["task"])

            def lapses(node: str) -> int:
                return len(rules.counted_lapses(coord.state.lapsed(node, 0.0, time.time(), time.time()), []))

            first = await task(net, 0)
            first2 = await task(net2, 0)
            assert (first.min_policy_version, first.policy_version) == (0, 0) and first2.policy_version == 0
            coord.cfg.policy_version = 4  # version 0 went stale at 3: the task is superseded
            coord.cfg.train, coord.cfg.train_files = True, 0  # and new work waits for the trainer
            second = await task(net, 4)
            assert second.task_id != first.task_id and second.seed == first.seed
            assert (second.min_policy_version, second.policy_version) == (3, 3)  # not 4: when it asked is no choice
            assert await task(net, 4) == second
            coord.cfg.policy_version = 5  # within the async level of the replacement: the same task again
            assert await task(net, 5) == second
            assert lapses(chain.node.address) == 1
            lives = coord.state.lapsed(chain.node.address, 0.0, time.time(), time.time())
            assert lives[0][0] == pytest.approx(first.issued_at, abs=1)  # the life of the superseded task
            # the other worker held its task at 0 until version 7: bound to 6, past 3 and 6, two lapses
            coord.cfg.policy_version = 7
            later = await task(net2, 7)
            assert later.seed == first2.seed and later.policy_version == 6
            assert lapses(chain.node2.address) == 2
            # the first worker's task at 3 is stale at 6 too: replaced at 6, then at 9 (past the limit of
            # 2 lapses, still handed out: the same seed), and no new seed until the lapses age out
            assert (await task(net, 7)).policy_version == 6
            coord.cfg.policy_version = 9
            third = await task(net, 9)
            assert third.seed == first.seed and third.policy_version == 9 and lapses(chain.node.address) == 3
            coord.cfg.train = False
            coord.state.store.execute("UPDATE tasks SET status = 'submitted' WHERE task_id = ?", (third.task_id,))
            held = await ask(net, 9)
            assert "task" not in held and held["lapsed"] == 3 and float(held["retry_after"]) > 3600, held
        nursery.cancel_scope.cancel()


async def test_concurrent_submissions_for_one_task_are_paid_once(
    chain: World, tmp_path: Path, vllm_engine: Any
) -> None:
    """Two different files for one task submitted at once: both pass every check before either is
    kept, so both were accepted (two rewards for one task, and the node keeps the better file). The task
    is closed in the same transaction that keeps a file, only if it is still open: one is accepted.
    (A node's files are parsed one at a time: the second is told to submit again, as a worker does, and
    meets the task closed under it or already closed, by how the threads interleave.)"""
    pid = await _pool_with_two_members(chain, tmp_path)
    coord = Coordinator(_config(chain, pid, tmp_path), chain.coordinator)
    async with trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)
        peer = str(addrs[0]).rsplit("/p2p/", 1)[1]
        assert coord.tools is not None
        async with PoolNetwork(private_key=bytes(chain.node.key), pool=pid, membership=_members(pid, chain)) as net:
            await net.connect(addrs[0])
            raw = await net.node.request(peer, protocol.TASK_PROTOCOL, protocol.pack({}), timeout=30)
            task = protocol.Task.from_wire(protocol.reply_body(raw, "task")["task"])
            files = [_file_for(task, chain.node.address, vllm_engine, coord.tools, sample_seed=s) for s in (1, 2)]
            keys = [work_key(f) for f in files]
            assert keys[0] != keys[1]
            for f, k in zip(files, keys, strict=True):
                assert await upload_blob(net.node, peer, f) == k
            replies: list[dict[str, Any]] = []

            async def submit(k: str) -> None:
                claim = ops.rollout_claim(coord.chain, pid, k)  # type: ignore[arg-type]
                body = protocol.pack({"work_key": k, "task_id": task.task_id, "signature": claim.sign(chain.node)})
                for _ in range(600):  # a passing refusal ("another file of this node is being checked")
                    reply = protocol.unpack(await coord._on_submit(body, chain.node.address), "reply")
                    if not reply.get("retry"):
                        break
                    await trio.sleep(0.05)
                replies.append(reply)

            async with trio.open_nursery() as both:  # the coordinator's own handler, twice at once
                for k in keys:
                    both.start_soon(submit, k)
            accepted = [r for r in replies if r.get("status") == "accepted"]
            assert len(accepted) == 1, replies
            refused = next(r for r in replies if r.get("status") != "accepted")
            assert refused["ok"] is False and not refused.get("retry"), refused
            assert re.search(r"closed while this submission was checked|already has rollout", refused["error"])
            rows = coord.store.query("SELECT work_key FROM rollouts WHERE task_id = ?", (task.task_id,))
            assert [r["work_key"] for r in rows] == [accepted[0]["work_key"]]
            assert coord.blobs.get(accepted[0]["work_key"]) is not None
        nursery.cancel_scope.cancel()


def test_an_outage_is_no_lapse_but_a_task_left_to_expire_is(chain: World, tmp_path: Path) -> None:
    """Tasks whose life overlapped a coordinator outage (the worker could not submit) are not counted
    against their node; one that expired while the coordinator was up is; and a task within the resend
    margin of its expiry counts at once (the node is given a new one while it still holds it: two live
    tasks to pick from)."""
    node = chain.node.address
    cfg = _config(chain, 1, tmp_path, task_ttl=600.0, resend_margin=30.0)
    coord = Coordinator(cfg, chain.coordinator)
    now = time.time()
    coord.store.put("alive_at", str(now - 3000))  # it was last seen alive 50 minutes ago
    for i, (issued, expires) in enumerate([(now - 5000, now - 4400), (now - 3300, now - 2700), (now - 590, now + 10)]):
        coord.state.add_task(f"t-{i}", node, b"\x80", expires)
        coord.store.execute("UPDATE tasks SET issued_at = ? WHERE task_id = ?", (issued, f"t-{i}"))
    coord.note_downtime(now)
    assert coord.state.downtimes() == [(now - 3000, now + 60.0)]
    lives = coord.state.lapsed(node, now - cfg.lapse_window, now, now + cfg.resend_margin)
    # t-2 is about to expire: counted now
    assert sorted(end - now for _, end in lives) == pytest.approx([-4400, -2700, 0])
    counted = rules.counted_lapses(lives, coord.state.downtimes())
    assert counted == [now - 4400]  # before the outage: the node's; t-1 and t-2 lived through it
    coord.store.close()
