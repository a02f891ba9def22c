"""CPU per gossip hop: a chain of N `PoolNetwork` nodes in ONE process on 127.0.0.1; node 0 publishes M
signed heartbeats at R msg/s and each message crosses N - 1 links (received, validated, forwarded).

One process and a paced rate below saturation make the figure comparable between code versions on a
noisy machine (no queueing between processes, no coalescing of a backlog); `bench/gossip.py` measures
the network as deployed (one process per node). With ``--sample FILE`` the measured phase runs under a
CPU-time sampler (SIGPROF every 2 ms of process CPU; one folded stack per line, ``stack count``): unlike a
wall-clock sampler it does not put the time a process waits for a core on whatever call it was in.

    .venv/bin/python bench/gossip_hop.py [--nodes 8] [--messages 500] [--rate 50] [--sample stacks.txt]

Prints one JSON line: ``cpu_ms_per_hop`` (process CPU / (messages x hops)), ``received`` by the last node.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from types import FrameType

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KIND = "heartbeat"


class Sampler:
    """Folded Python stacks of the main thread, one sample per 2 ms of process CPU time."""

    def __init__(self) -> None:
        self.stacks: dict[str, int] = {}

    def _on_tick(self, _sig: int, frame: FrameType | None) -> None:
        names = []
        while frame is not None:
            code = frame.f_code
            names.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
            frame = frame.f_back
        key = ";".join(reversed(names))
        self.stacks[key] = self.stacks.get(key, 0) + 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._on_tick)
        signal.setitimer(signal.ITIMER_PROF, 0.002, 0.002)

    def stop(self, path: str) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        Path(path).write_text("".join(f"{k} {v}\n" for k, v in self.stacks.items()))


async def run(args: argparse.Namespace) -> dict[str, object]:
    from eth_account import Account

    from node.p2p.network import PoolNetwork
    from node.p2p.rules import Membership

    keys = [bytes(Account.create().key) for _ in range(args.nodes)]
    addresses = [Account.from_key(k).address for k in keys]
    snapshot = Membership(pool=1, coordinator=addresses[0], validators=frozenset(), members=frozenset(addresses))
    got = [0] * args.nodes
    async with AsyncExitStack() as stack:
        nets = [
            await stack.enter_async_context(
                PoolNetwork(private_key=k, pool=1, membership=lambda: snapshot, budgets=None)
            )
            for k in keys
        ]
        channels = [net.subscribe(KIND) for net in nets]
        for i in range(1, args.nodes):
            await nets[i].connect(nets[i - 1].listen_addrs[0])
        for net in nets:
            await net.wait_for_peers(1, timeout=10.0, kinds=[KIND])
        await trio.sleep(2.0)  # a heartbeat or two: the meshes graft

        async def count(i: int, chan: trio.MemoryReceiveChannel[object]) -> None:
            async for _ in chan:
                got[i] += 1

        async with trio.open_nursery() as nursery:
            for i in range(1, args.nodes):
                nursery.start_soon(count, i, channels[i])
            for _ in range(20):  # warm-up
                await nets[0].publish(KIND, json.dumps([0, -1, time.time()]).encode())
                await trio.sleep(0.01)
            await trio.sleep(1.0)
            base = got[-1]
            sampler = Sampler() if args.sample else None
            if sampler:
                sampler.start()
            cpu0, t0 = time.process_time(), trio.current_time()
            for g in range(args.messages):
                await trio.sleep_until(t0 + g / args.rate)
                await nets[0].publish(KIND, json.dumps([0, g, time.time()]).encode())
            with trio.move_on_after(30.0):
                while got[-1] - base < args.messages:
                    await trio.sleep(0.01)
            cpu = time.process_time() - cpu0
            if sampler:
                sampler.stop(args.sample)
            nursery.cancel_scope.cancel()
    hops = args.messages * (args.nodes - 1)
    return {
        "nodes": args.nodes,
        "messages": args.messages,
        "rate": args.rate,
        "received": got[-1] - base,
        "lost": args.messages - (got[-1] - base),
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_hop": round(1000 * cpu / hops, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rate", type=float, default=50.0, help="msg/s published by node 0")
    parser.add_argument("--sample", default="", help="write CPU-time stack samples here")
    args = parser.parse_args()
    if args.nodes < 2 or args.messages < 1 or args.rate <= 0:
        parser.error("need --nodes >= 2, --messages >= 1, --rate > 0")
    result = trio.run(run, args)
    print(json.dumps(result))
    sys.exit(0 if result["lost"] == 0 else 1)


if __name__ == "__main__":
    main()
