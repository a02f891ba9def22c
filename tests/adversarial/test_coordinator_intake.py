"""The real coordinator daemon (anvil with the compiled contracts, libp2p on 127.0.0.1) against nodes that
try its intake: an outsider that uploads and asks for work, a member that submits without its signature
or with another node's, a member that uploads blobs it never submits. Nothing they send is written for
long, accepted or recorded; the honest submission in the same run is accepted."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from node import ops, protocol
from node.p2p.blobs import upload_blob
from node.p2p.host import P2PError
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from node.rollout.build import build_rollout_file
from node.rollout.file import RolloutHeader, work_key
from node.tasks import get_env
from pool.coordinator import Coordinator, CoordinatorConfig
from tests.conftest import World, slash_now
from tests.integration.test_coordinator import _pool_with_two_members


def _state_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


async def _many(net: PoolNetwork, peer: str, body: bytes, n: int, at_once: int = 8) -> None:
    """`n` submit requests with `body`, `at_once` in flight; answers (refusals) are not looked at."""

    async def some(k: int) -> None:
        for _ in range(k):
            with contextlib.suppress(P2PError):
                await net.node.request(peer, protocol.SUBMIT_PROTOCOL, body, timeout=20)

    async with trio.open_nursery() as nursery:
        for _ in range(at_once):
            nursery.start_soon(some, n // at_once)
        if n % at_once:
            nursery.start_soon(some, n % at_once)


def _file_for(task: protocol.Task, node: str, engine: Any, tools: Any) -> bytes:
    from node.inference.engine import SamplingSpec

    env = get_env(task.env)
    problems = env.problems(task.seed, task.prompts)
    s = task.sampling
    spec = SamplingSpec(float(s["temperature"]), float(s.get("top_p", 1.0)), int(s["max_tokens"]), seed=task.seed,
                        stop_token_ids=tuple(sorted(tools.stop_ids)))  # fmt: skip
    groups = engine.generate([tools.encode(p.prompt) for p in problems], spec, n=task.group_size)
    header = RolloutHeader(task.pool_id, node, task.policy_version, task.env, task.seed, dict(s), task.model)
    return build_rollout_file(header, problems, groups, env=env, decode=tools.decode).to_bytes()


async def test_outsiders_unsigned_and_foreign_signed_submissions_and_orphans(
    chain: World, tmp_path: Path, vllm_engine: Any
) -> None:
    pid = await _pool_with_two_members(chain, tmp_path)
    cfg = CoordinatorConfig(
        pool_id=pid, data_dir=tmp_path / "coord", rpc_url=chain.url, deployment=chain.deployment,
        listen="/ip4/127.0.0.1/tcp/0", eject_after=0, orphan_after=3.0, record_every=1.0,
    )  # fmt: skip
    coord = Coordinator(cfg, chain.coordinator)
    blobs_dir = cfg.data_dir / "blobs"

    def blob_files() -> list[str]:
        return sorted(p.name for p in blobs_dir.iterdir() if not p.name.startswith("."))

    def members() -> Membership:
        return Membership(pid, chain.coordinator.address, frozenset(), frozenset({chain.node.address}))

    async with trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)
        peer = addrs[0]
        assert coord.tools is not None

        async def net_of(who: LocalAccount) -> PoolNetwork:
            return PoolNetwork(private_key=bytes(who.key), pool=pid, membership=members)

        # an outsider: no task, no upload slot, nothing written
        async with await net_of(chain.outsider) as out:
            await out.connect(peer)
            reply = protocol.unpack(
                await out.node.request(peer, protocol.TASK_PROTOCOL, protocol.pack({}), timeout=20), "t"
            )
            assert reply["ok"] is False and "not a member" in reply["error"]
            for _ in range(3):
                with contextlib.suppress(P2PError):
                    await upload_blob(out.node, peer, os.urandom(5000))
            assert blob_files() == []
            # 2,000 submits with 60 KiB task ids: refused before anything is written
            state_before = _state_bytes(cfg.data_dir)
            junk_submit = protocol.pack({"work_key": "0x" + "ab" * 32, "task_id": "t" * 60_000, "signature": None})
            await _many(out, peer, junk_submit, 2000)
            assert _state_bytes(cfg.data_dir) - state_before < 256 * 1024
            assert coord.store.scalar("SELECT COUNT(*) FROM rejections") == 0

        async with await net_of(chain.node) as net:
            await net.connect(peer)

            async def ask(proto: str, body: dict[str, Any]) -> dict[str, Any]:
                raw = await net.node.request(peer, proto, protocol.pack(body), timeout=30)
                return protocol.unpack(raw, "reply")

            # a member's refused submits are counted, with bounded records
            state_before = _state_bytes(cfg.data_dir)
            junk_submit = protocol.pack({"work_key": "0x" + "cd" * 32, "task_id": "t" * 60_000, "signature": None})
            await _many(net, peer, junk_submit, 500)
            assert coord.rejected["unknown-task"] == 500
            # 500 x 60 KiB would be 30 MB; what grows is sqlite's write-ahead log, up to its 4 MB checkpoint
            assert _state_bytes(cfg.data_dir) - state_before < 5 * 1024 * 1024
            assert coord.store.scalar("SELECT SUM(LENGTH(detail)) FROM rejections") <= 500 * 300
            longest = coord.store.scalar("SELECT MAX(LENGTH(detail)) FROM rejections")
            assert longest is not None and longest <= 300

            task = protocol.Task.from_wire((await ask(protocol.TASK_PROTOCOL, {}))["task"])
            data = _file_for(task, chain.node.address, vllm_engine, coord.tools)
            key = work_key(data)
            assert await upload_blob(net.node, peer, data) == key
            claim = ops.rollout_claim(coord.chain, pid, key)  # type: ignore[arg-type]
            mine, theirs = claim.sign(chain.node), claim.sign(chain.node2)
            for sig in (None, "0x" + "00" * 65, theirs):
                reply = await ask(
                    protocol.SUBMIT_PROTOCOL, {"work_key": key, "task_id": task.task_id, "signature": sig}
                )
                assert reply["ok"] is False and "signature" in reply["error"], reply
            assert coord.store.one("SELECT 1 FROM rollouts WHERE work_key = ?", (key,)) is None
            reply = await ask(protocol.SUBMIT_PROTOCOL, {"work_key": key, "task_id": task.task_id, "signature": mine})
            assert reply["ok"] is True and reply["status"] == "accepted", reply

            # blobs a member uploads and never submits are deleted after orphan_after; accepted ones stay
            junk = await upload_blob(net.node, peer, os.urandom(3000))
            assert f"{junk[2:]}" in "".join(blob_files())
            with trio.fail_after(30):
                while any(junk[2:] in n for n in blob_files()):
                    coord.delete_orphans()
                    await trio.sleep(0.5)
            assert any(key[2:] in n for n in blob_files())
            with trio.fail_after(30):  # and the honest one is recorded on chain for its node
                while coord.store.scalar("SELECT status FROM rollouts WHERE work_key = ?", (key,)) != "recorded":
                    await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert coord.rejected["unsigned"] == 3 and coord.rejected["unknown-task"] == 500


async def test_a_node_with_invalidated_work_loses_its_untrained_rollouts_and_its_place(
    chain: World, tmp_path: Path
) -> None:
    """The coordinator follows `WorkInvalidated`: the node's rollouts not trained on yet are dropped from
    training, and with --blacklist-after 1 it is blacklisted on chain (its other accepted work recorded
    first, to be judged on its own)."""
    import hashlib
    import time as _time

    pid = await _pool_with_two_members(chain, tmp_path)
    cfg = CoordinatorConfig(
        pool_id=pid, data_dir=tmp_path / "coord", rpc_url=chain.url, deployment=chain.deployment,
        listen="/ip4/127.0.0.1/tcp/0", eject_after=0, record_every=0.5, blacklist_after=1,
    )  # fmt: skip
    coord = Coordinator(cfg, chain.coordinator)
    keys = ["0x" + hashlib.sha256(b"rollout %d" % i).hexdigest() for i in range(2)]
    for k in keys:
        coord.store.execute(
            "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, mean_reward, "
            "accepted_at) VALUES(?, ?, ?, 100, 0, ?, 0.0, ?)",
            (k, k[:10], chain.node.address, "0x" + "33" * 32, _time.time()),
        )

    def status(k: str) -> str:
        return str(coord.store.scalar("SELECT status FROM rollouts WHERE work_key = ?", (k,)))

    async with trio.open_nursery() as nursery, await chain.client(chain.validator) as val:
        await nursery.start(coord.run)
        with trio.fail_after(30):
            while status(keys[0]) != "recorded":
                await trio.sleep(0.3)
        await slash_now(chain, pid, keys[0], "0x" + "44" * 32)
        with trio.fail_after(30):
            while not await val.call("PoolManager", "isBlacklisted", pid, chain.node.address):
                await trio.sleep(0.3)
        trained = coord.store.scalar("SELECT trained FROM rollouts WHERE work_key = ?", (keys[1],))
        member = await val.call("PoolManager", "isMember", pid, chain.node.address)
        seen = coord.invalidations(chain.node.address)
        nursery.cancel_scope.cancel()
    assert trained == -1 and not member and seen == 1


def test_refusal_records_are_bounded(tmp_path: Path, monkeypatch: Any) -> None:
    from eth_account import Account

    import pool.coordinator.intake as coordinator_module
    from node.chain.deployment import Deployment

    monkeypatch.setattr(coordinator_module, "MAX_REJECTIONS", 5)
    coord = Coordinator(
        CoordinatorConfig(1, tmp_path, "http://127.0.0.1:1", Deployment(31337, {}, 0)), Account.create()
    )
    for i in range(40):
        reply = protocol.unpack(coord._reject("0x" + "ab" * 20, "unknown-task", f"task {'x' * 5000} {i}"), "r")
        assert len(reply["error"]) < 400
    assert coord.rejected["unknown-task"] == 40
    assert coord.store.scalar("SELECT COUNT(*) FROM rejections") <= 6
    assert coord.store.scalar("SELECT MAX(LENGTH(detail)) FROM rejections") == coordinator_module.REJECTION_DETAIL
