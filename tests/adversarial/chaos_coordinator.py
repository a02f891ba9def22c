"""The chaos test's coordinator, in a process of its own (as on a machine of its own): the real daemon for a
pool on the test's anvil, with its explorer. Every second it writes its listen address, its status and its
peak memory (VmHWM) to a JSON file, for the test to read.

Run by tests/adversarial/test_chaos.py: ``python -m tests.adversarial.chaos_coordinator '<json args>'``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import trio
from eth_account import Account

from node.chain.deployment import Deployment
from pool.coordinator import Coordinator, CoordinatorConfig


def peak_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


async def main(a: dict[str, Any]) -> None:
    cfg = CoordinatorConfig(
        pool_id=int(a["pool"]), data_dir=Path(a["data_dir"]), rpc_url=a["rpc"],
        deployment=Deployment.load(a["deployment"]), listen="/ip4/127.0.0.1/tcp/0", model="tiny",
        record_every=1.0, prompts=2, explorer=("127.0.0.1", int(a["explorer_port"])),
    )  # fmt: skip
    coord = Coordinator(cfg, Account.from_key(bytes.fromhex(a["key"])))
    out = Path(a["out"])
    async with trio.open_nursery() as nursery:
        peer = str((await nursery.start(coord.run))[0])
        while True:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps({"peer": peer, "status": coord.status(), "peak_kb": peak_kb()}, default=str))
            os.replace(tmp, out)
            await trio.sleep(1.0)


if __name__ == "__main__":
    trio.run(main, json.loads(sys.argv[1]))
