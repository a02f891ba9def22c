"""Chaos: one member runs several of issue 36's attacks at once against a live coordinator (the real daemon,
anvil with the compiled contracts, libp2p on 127.0.0.1, its weight server and explorer up) while an honest
member keeps generating real files with vLLM on the tiny model and submitting them.

The pool must keep accepting honest work (files accepted per minute at least 80 % of the same run without
the attack), the coordinator's memory must stay within a stated bound, and no daemon may exit. The attacker
runs in a process of its own at the lowest CPU priority, as on a machine of its own: on these 2 cores it
would otherwise take a core from the pool whatever the coordinator did. Its attacks, all at once, from one
member node:
- rollout files whose header JSON nests 100,000 levels deep (a SIGSEGV of the coordinator on the old code);
- parse bombs: well-formed rows far beyond the task's shape (every row became Python objects first);
- uploads trickled a few bytes a second to hold upload slots;
- submissions for tasks never issued, with 60 KiB task ids, four at a time, as fast as it can;
- clients of the explorer that reset after a few bytes, and 16 idle sockets from each of 4 addresses.
(The weight server runs only where the coordinator trains; its attacks are in test_weight_server_clients.py.)
Found with it: junk submissions (each one read, decoded and recorded) cut the honest member's accepted files
by two thirds; the coordinator now budgets each member's requests and refuses big frames unread.
"""

from __future__ import annotations

import io
import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trio

from node import protocol
from node.p2p.blobs import upload_blob
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from node.rollout.file import FORMAT, SCHEMA
from pool.coordinator import Coordinator, CoordinatorConfig
from tests.adversarial.test_coordinator_intake import _file_for
from tests.adversarial.test_parse_bombs import _bomb
from tests.conftest import World
from tests.integration.test_coordinator import _pool_with_two_members

ROOT = Path(__file__).resolve().parents[2]

PHASE = 45.0  # seconds of honest work measured with and without the attack
#: What the attack may add to the process's peak memory (the coordinator shares it with the test's engine).
MEMORY_BOUND_MB = 600


def _header_bomb(salt: bytes) -> bytes:
    """A rollout file (no rows) whose header nests 100,000 deep, in a footer of about 200 KB."""
    nest = "[" * 100_000 + "]" * 100_000
    meta = json.dumps({"format": FORMAT, "header": {"pool_id": 1, "salt": salt.hex()}})[:-2]
    meta += ', "extra": ' + nest + "}}"
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, SCHEMA, compression="zstd", write_statistics=False, store_schema=False) as w:
        w.write_table(pa.Table.from_pydict({n: [] for n in SCHEMA.names}, schema=SCHEMA))
        w.add_key_value_metadata({"intellect": meta})
    return buf.getvalue()


@pytest.mark.slow
async def test_one_member_attacking_cannot_stop_a_live_pool(chain: World, tmp_path: Path, vllm_engine: Any) -> None:
    pid = await _pool_with_two_members(chain, tmp_path)
    explorer_port = _free_port()
    cfg = CoordinatorConfig(
        pool_id=pid, data_dir=tmp_path / "coord", rpc_url=chain.url, deployment=chain.deployment,
        listen="/ip4/127.0.0.1/tcp/0", model="tiny", record_every=1.0, prompts=2,
        explorer=("127.0.0.1", explorer_port),
    )  # fmt: skip
    coord = Coordinator(cfg, chain.coordinator)
    members = frozenset({chain.node.address, chain.node2.address})
    parse_bomb = _bomb(rows=300, tokens=3000, proofs=True, every=2)  # well-formed, 300 rows for a task of 8

    def membership() -> Membership:
        return Membership(pid, chain.coordinator.address, frozenset(), members)

    async with trio.open_nursery() as nursery:
        peer = (await nursery.start(coord.run))[0]
        assert coord.tools is not None
        tools = coord.tools
        async with (
            PoolNetwork(private_key=bytes(chain.node.key), pool=pid, membership=membership) as good,
            PoolNetwork(private_key=bytes(chain.node2.key), pool=pid, membership=membership) as bad,
        ):
            await good.connect(peer)
            await bad.connect(peer)

            async def task_for(net: PoolNetwork) -> protocol.Task:
                raw = await net.node.request(peer, protocol.TASK_PROTOCOL, protocol.pack({}), timeout=60)
                return protocol.Task.from_wire(protocol.reply_body(raw, "task")["task"])

            async def submit(net: PoolNetwork, who: Any, task: protocol.Task, data: bytes) -> dict[str, Any]:
                key = await upload_blob(net.node, peer, data)
                sig = coord.claim(key).sign(who)
                body = protocol.pack({"work_key": key, "task_id": task.task_id, "signature": sig})
                return protocol.unpack(await net.node.request(peer, protocol.SUBMIT_PROTOCOL, body, timeout=90), "r")

            async def honest_phase() -> int:
                accepted = 0
                with trio.move_on_after(PHASE):
                    while True:
                        task = await task_for(good)
                        data = await trio.to_thread.run_sync(_file_for, task, chain.node.address, vllm_engine, tools)
                        reply = await submit(good, chain.node, task, data)
                        assert reply.get("status") == "accepted", reply
                        accepted += 1
                return accepted

            calm = await honest_phase()
            assert calm >= 3, calm

            # ------------------------------------------ the attack, all at once, from a process of its own
            counts = tmp_path / "attacks.json"
            bomb_path = tmp_path / "parse-bomb.parquet"
            bomb_path.write_bytes(parse_bomb)
            claim = coord.claim("0x" + "00" * 32)
            args = {
                "peer": peer, "pool": pid, "key": bytes(chain.node2.key).hex(), "coordinator": chain.coordinator.address,
                "members": sorted(members), "chain_id": claim.chain_id, "ledger": claim.ledger,
                "explorer_port": explorer_port, "parse_bomb": str(bomb_path), "counts": str(counts),
            }  # fmt: skip
            log_file = (tmp_path / "attacker.log").open("wb")
            attacker = subprocess.Popen(
                [sys.executable, "-m", "tests.adversarial.chaos_attacker", json.dumps(args)],
                cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=log_file,
                preexec_fn=lambda: os.nice(19),  # as on a machine of its own: it takes no CPU the pool needs
            )  # fmt: skip
            try:
                peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                await trio.sleep(5.0)  # the attack under way before the honest member is measured
                under_attack = await honest_phase()
                assert attacker.poll() is None, (tmp_path / "attacker.log").read_text()[-3000:]
            finally:
                attacker.kill()
                attacker.wait(10)
                log_file.close()
            refused = json.loads(counts.read_text())
            rise_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
            print(f"chaos: honest files accepted {calm} calm, {under_attack} under attack; attacks {refused}; "
                  f"peak memory +{rise_mb:.0f} MB")  # fmt: skip
            assert refused.get("bomb", 0) >= 2 and refused.get("junk", 0) >= 20, refused
            assert under_attack >= 0.8 * calm, (calm, under_attack, refused)
            assert rise_mb < MEMORY_BOUND_MB, rise_mb
            # the coordinator is alive and serving: a task, and its status page
            await task_for(good)
            assert coord.status()["rollouts"]["accepted"] + coord.status()["rollouts"]["recorded"] >= calm
        nursery.cancel_scope.cancel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
