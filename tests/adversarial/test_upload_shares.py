"""Members against the coordinator's upload slots and disk (the real coordinator daemon, anvil with the
compiled contracts, libp2p on 127.0.0.1).

Found on main: 16 member nodes, 992 bytes in all, kept the 32 upload slots busy (a few bytes each, just
often enough not to go idle), and honest uploads were refused for 50 minutes; finished uploads that were
never submitted stayed until a 10-minute sweep, so disk use was bounded only by bandwidth x 600 s.

Now an upload needs an open task of the uploading node, a slot is kept only while its upload moves at
the rate floor, and a node keeps at most two finished uploads it did not submit."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import msgpack
import trio

from node import protocol
from node.p2p.blobs import UPLOAD_PROTOCOL, upload_blob
from node.p2p.host import P2PError
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from node.rollout.file import work_key
from pool.coordinator import Coordinator, CoordinatorConfig
from tests.adversarial.test_coordinator_intake import _file_for
from tests.conftest import World
from tests.integration.test_coordinator import _pool_with_two_members


async def _send(net: PoolNetwork, peer: str, key: str, offset: int, total: int, chunk: bytes) -> list[Any]:
    raw = await net.node.request(peer, UPLOAD_PROTOCOL, msgpack.packb([key, offset, total, chunk]), timeout=20)
    return msgpack.unpackb(raw)


async def test_members_cannot_hold_the_upload_slots_or_the_disk(chain: World, tmp_path: Path, vllm_engine: Any) -> None:
    pid = await _pool_with_two_members(chain, tmp_path)
    cfg = CoordinatorConfig(
        pool_id=pid, data_dir=tmp_path / "coord", rpc_url=chain.url, deployment=chain.deployment,
        listen="/ip4/127.0.0.1/tcp/0", model="tiny", record_every=1.0,
        max_uploads=1, upload_grace=1.0,  # one slot: a trickler that keeps it locks every honest upload out
    )  # fmt: skip
    coord = Coordinator(cfg, chain.coordinator)
    uploads_dir = cfg.data_dir / "blobs" / ".uploads"

    def members() -> Membership:
        return Membership(
            pid, chain.coordinator.address, frozenset(), frozenset({chain.node.address, chain.node2.address})
        )

    def stored() -> set[str]:
        return {p.name for p in (cfg.data_dir / "blobs").iterdir() if p.is_file()}

    async with trio.open_nursery() as nursery:
        peer = (await nursery.start(coord.run))[0]
        assert coord.tools is not None
        async with (
            PoolNetwork(private_key=bytes(chain.node2.key), pool=pid, membership=members) as bad,
            PoolNetwork(private_key=bytes(chain.node.key), pool=pid, membership=members) as good,
        ):
            await bad.connect(peer)
            await good.connect(peer)

            async def task_for(net: PoolNetwork) -> protocol.Task:
                raw = await net.node.request(peer, protocol.TASK_PROTOCOL, protocol.pack({}), timeout=30)
                return protocol.Task.from_wire(protocol.reply_body(raw, "task")["task"])

            # a member with no open task gets no slot and writes nothing
            junk = os.urandom(4096)
            junk_key = "0x" + hashlib.sha256(junk).hexdigest()
            try:
                await _send(bad, peer, junk_key, 0, len(junk), junk[:100])
                refused = ""
            except P2PError as exc:
                refused = str(exc)
            assert "no open task" in refused, refused
            assert not any(uploads_dir.iterdir()) and not stored()

            # with a task, it takes the one slot and trickles 100 bytes a second into a 1 MiB upload
            await task_for(bad)
            big = os.urandom(1 << 20)
            big_key = "0x" + hashlib.sha256(big).hexdigest()
            sent = [0]

            async def trickle() -> None:
                with contextlib.suppress(P2PError):
                    while sent[0] < len(big):
                        got, _ = await _send(bad, peer, big_key, sent[0], len(big), big[sent[0] : sent[0] + 100])
                        sent[0] = got
                        await trio.sleep(1.0)

            nursery.start_soon(trickle)
            await trio.sleep(3.0)
            assert sent[0] >= 200  # it holds the slot

            # the honest member's real file goes through within its deadline, and is accepted
            task = await task_for(good)
            data = _file_for(task, chain.node.address, vllm_engine, coord.tools)
            with trio.fail_after(60):
                key = await upload_blob(good.node, peer, data)
            assert key == work_key(data)
            claim = coord.claim(key).sign(chain.node)
            raw = await good.node.request(
                peer, protocol.SUBMIT_PROTOCOL,
                protocol.pack({"work_key": key, "task_id": task.task_id, "signature": claim}), timeout=60,
            )  # fmt: skip
            assert protocol.reply_body(raw, "submission")["status"] == "accepted"
            assert coord.upload_state is not None and coord.upload_state.evicted >= 1

            # finished uploads it never submits: its oldest goes as it uploads more (at most two are kept)
            keys = []
            for _ in range(4):
                blob = os.urandom(3000)
                keys.append(await upload_blob(bad.node, peer, blob))
            names = stored()
            kept = [k for k in keys if k[2:] in "".join(names)]
            assert kept == keys[-2:], (keys, names)
            assert key[2:] in "".join(names)  # the accepted file is nobody's junk
        nursery.cancel_scope.cancel()
