"""Connection churn against one libp2p host: connect/close cycles from fresh identities.

A child process runs a `node.p2p.host.P2PNode` (the patched inbound handler, `--serve`); the parent
dials it from fresh libp2p hosts (a new key each cycle, `--dialers` at once) for `--cycles` cycles, then
checks that a new peer is still served. Prints the connections accepted per second and the server's
resident memory, open file descriptors and inbound slots in use, at the start, after the churn, and
after the churn has settled; ends with one JSON line (`rss_growth_mb`, `fd_growth`, `slots_in_use`).

    .venv/bin/python bench/churn.py [--cycles 10000] [--dialers 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import multiaddr
import trio

PROTO = "/intellect/bench-echo/1"


def _proc(pid: int) -> dict[str, float]:
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = float(line.split()[1]) / 1024
    return {"rss_mb": round(rss, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


async def _serve() -> None:
    from eth_account import Account

    from node.p2p.host import P2PNode

    async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as node:

        async def echo(request: bytes, sender: str) -> bytes:
            return request

        node.set_handler(PROTO, echo)
        limiter = node._host.get_network()._inbound_limiter  # type: ignore[union-attr]
        print(json.dumps({"addr": node.listen_addrs[0]}), flush=True)
        while True:  # answer "slots?" on stdin with the inbound slots in use
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return
            peers = len(node._host.get_peerstore().peer_ids())  # type: ignore[union-attr]
            print(json.dumps({"slots": limiter.borrowed_tokens, "peerstore": peers}), flush=True)


async def fresh_peer_cycle(addr: str) -> None:
    """One connect and disconnect to `addr` from a new libp2p host with a new key (the churn tests use it)."""
    from libp2p import new_host
    from libp2p.crypto.secp256k1 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr

    host = new_host(key_pair=create_new_key_pair(), muxer_preference="YAMUX")
    async with host.run(listen_addrs=[]):
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        with trio.fail_after(20):
            await host.connect(info)
        await host.disconnect(info.peer_id)


async def _churn(addr: str, cycles: int, dialers: int) -> tuple[int, float]:
    failed = 0
    done = 0

    async def dialer(n: int) -> None:
        nonlocal failed, done
        for _ in range(n):
            try:
                await fresh_peer_cycle(addr)
            except Exception:
                failed += 1
            done += 1
            if done % 500 == 0:
                print(f"  {done}/{cycles} cycles", file=sys.stderr)

    t0 = time.monotonic()
    async with trio.open_nursery() as nursery:
        for i in range(dialers):
            nursery.start_soon(dialer, cycles // dialers + (1 if i < cycles % dialers else 0))
    return failed, time.monotonic() - t0


async def _honest(addr: str) -> bool:
    from eth_account import Account

    from node.p2p.host import P2PNode

    async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as node:
        with trio.fail_after(20):
            await node.connect(addr)
            return await node.request(addr, PROTO, b"hello", timeout=10) == b"hello"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10_000)
    ap.add_argument("--dialers", type=int, default=20)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        trio.run(_serve)
        return
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        addr = json.loads(child.stdout.readline())["addr"]

        def slots() -> dict[str, int]:
            child.stdin.write("slots?\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            return dict(json.loads(child.stdout.readline()))  # type: ignore[union-attr]

        time.sleep(1.0)
        base = _proc(child.pid)
        failed, took = trio.run(_churn, addr, args.cycles, args.dialers)
        after = _proc(child.pid)
        time.sleep(5.0)  # closed connections wind down
        settled = _proc(child.pid)
        state = slots()
        in_use = state["slots"]
        served = trio.run(_honest, addr)
    finally:
        child.kill()
        child.wait()
    print(
        f"{args.cycles} cycles in {took:.1f} s ({args.cycles / took:.0f}/s), {failed} failed; new peer served: {served}"
    )
    print(f"server: start {base}, after churn {after}, settled {settled}; inbound slots in use {in_use}")
    print(
        json.dumps(
            {
                "cycles": args.cycles,
                "failed": failed,
                "conn_per_s": round(args.cycles / took, 1),
                "rss_growth_mb": round(settled["rss_mb"] - base["rss_mb"], 1),
                "fd_growth": int(settled["fds"] - base["fds"]),
                "slots_in_use": in_use,
                "peerstore_entries": state["peerstore"],
                "new_peer_served": served,
            }
        )
    )


if __name__ == "__main__":
    main()
