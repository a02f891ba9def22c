"""Weight broadcast benchmark: origin-only vs origin -> relays -> clients, every node's upload capped.

Each node (origin, relays, clients) runs in its own process on 127.0.0.1; every server's upload is
capped at ``--cap-mb-s`` (one token bucket per node, shared by its connections). Both phases run in
one invocation on a fresh origin with the same random checkpoint:

1. origin only: ``--clients`` clients download from the origin alone;
2. tree: ``--relays`` relays are announced the version at the same moment the clients start; each client
   fetches from the relays and the origin (the client's scheduler spreads shards by measured throughput).

Each client connects from its own loopback address (127.0.0.10, .11, ...), as if it were another host:
a server gives one address a share of its connections. The relays connect from 127.0.0.1, which the
origin knows as its relays' address (as the coordinator knows its relays').

The time of a phase runs from the announcement to the last client's verified, assembled file. Prints one
JSON line: ``{"size_mb", "clients", "cap_mb_s", "origin_only_s", "tree_s", "speedup", "bytes_verified", ...}``.

    python bench/broadcast.py                      # 200 MB, 8 clients, 4 relays, 10 MB/s caps
    python bench/broadcast.py --size-mb 16 --clients 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trio

from node.weights.client import DownloadStats, download, make_http_client
from node.weights.relay import Relay
from node.weights.serve import serve_weights
from node.weights.store import WeightStore

MB = 1024 * 1024
VERSION = 1
RELAY_IP = "127.0.0.1"  # where the relays connect from: the origin's relay_hosts


def _client_ip(c: int) -> str:
    return f"127.0.0.{10 + c}"


async def _wait_event(ev: Event) -> None:
    while not ev.is_set():
        await trio.sleep(0.002)


def _origin_proc(root: str, checkpoint: str, cap: float, shard_size: int, conn: Connection) -> None:
    async def main() -> None:
        store = WeightStore(Path(root))
        manifest = store.publish(Path(checkpoint), VERSION, shard_size=shard_size)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(
                lambda task_status: serve_weights(
                    store, "127.0.0.1", 0, rate_limit_bytes_per_s=cap, relay_hosts=lambda: {RELAY_IP},
                    task_status=task_status,
                )
            )  # fmt: skip
            conn.send((port, manifest.manifest_hash()))

    trio.run(main)


def _relay_proc(root: str, upstream: str, cap: float, mhash: str, prefetch: bool, go: Event, conn: Connection) -> None:
    async def main() -> None:
        store = WeightStore(Path(root))
        relay = Relay(store, [upstream], prefetch=prefetch, parallel=8)
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            port = await nursery.start(
                lambda task_status: serve_weights(
                    store, "127.0.0.1", 0, rate_limit_bytes_per_s=cap, task_status=task_status
                )
            )
            conn.send(port)
            await _wait_event(go)
            relay.announce(VERSION, mhash)

    trio.run(main)


def _client_proc(
    dest: str, ip: str, sources: list[str], mhash: str, parallel: int, go: Event, conn: Connection
) -> None:
    async def main() -> None:
        conn.send("ready")
        await _wait_event(go)
        started = time.time()
        stats = DownloadStats()
        async with make_http_client(max_connections=max(8, parallel * 2), local_address=ip) as http:
            path = await download(
                VERSION, mhash, sources, Path(dest), parallel=parallel, stats=stats, timeout=900, client=http
            )
        finished = time.time()
        size = path.stat().st_size  # download() checked the whole-file sha256 before returning
        per_source = {u: s.bytes for u, s in stats.sources.items()}
        if os.environ.get("BENCH_DEBUG"):
            rates = {u[-5:]: (s.shards, round((s.rate or 0) / MB, 2)) for u, s in stats.sources.items()}
            print(f"client {dest[-2:]}: start {started:.3f} took {finished - started:.2f} s {rates}", file=sys.stderr)
        conn.send((finished, size, per_source, stats.corrupt))
        shutil.rmtree(dest, ignore_errors=True)

    trio.run(main)


def _phase(
    ctx: Any,
    work: Path,
    checkpoint: Path,
    *,
    clients: int,
    relays: int,
    cap: float,
    shard_size: int,
    parallel: int,
    prefetch: bool,
) -> tuple[float, int, dict[str, int]]:
    procs: list[Any] = []
    try:
        parent, child = ctx.Pipe()
        origin = ctx.Process(target=_origin_proc, args=(str(work / "origin"), str(checkpoint), cap, shard_size, child))
        origin.start()
        procs.append(origin)
        if not parent.poll(300):
            raise RuntimeError("origin did not start")
        port, mhash = parent.recv()
        origin_url = f"http://127.0.0.1:{port}"
        go = ctx.Event()
        relay_urls = []
        for r in range(relays):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_relay_proc, args=(str(work / f"relay{r}"), origin_url, cap, mhash, prefetch, go, child)
            )
            p.start()
            procs.append(p)
            if not parent.poll(60):
                raise RuntimeError("relay did not start")
            relay_urls.append(f"http://127.0.0.1:{parent.recv()}")
        sources = [*relay_urls, origin_url]
        pipes = []
        for c in range(clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_client_proc,
                args=(str(work / f"client{c}"), _client_ip(c), sources, mhash, parallel, go, child),
            )
            p.start()
            procs.append(p)
            pipes.append(parent)
        for pipe in pipes:  # every client process imported and waits at the start line
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise RuntimeError("a client did not start")
        t0 = time.time()
        go.set()
        if os.environ.get("BENCH_DEBUG"):
            print(f"go {t0:.3f}", file=sys.stderr)
        finish, verified = t0, 0
        by_source: dict[str, int] = {}
        names = {u: f"relay{i}" for i, u in enumerate(relay_urls)} | {origin_url: "origin"}
        for pipe in pipes:
            if not pipe.poll(900):
                raise RuntimeError("a client did not finish")
            done, size, per_source, _corrupt = pipe.recv()
            finish = max(finish, done)
            verified += size
            for u, b in per_source.items():
                by_source[names[u]] = by_source.get(names[u], 0) + b
        return finish - t0, verified, by_source
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(10)
        for d in work.iterdir():
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200, help="checkpoint size in MiB (random bytes)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--relays", type=int, default=4)
    ap.add_argument("--cap-mb-s", type=float, default=10.0, help="every node's upload cap, MiB/s")
    ap.add_argument("--shard-mb", type=float, default=0.0, help="shard size in MiB (default: size/32, at most 4)")
    ap.add_argument(
        "--parallel", type=int, default=0, help="concurrent shard fetches per client (default 2 per source)"
    )
    ap.add_argument(
        "--relay-mode",
        choices=["on-demand", "prefetch"],
        default="on-demand",
        help="relays fetch what is asked, or all",
    )
    args = ap.parse_args(argv)
    if not 0 < args.clients <= 240:
        ap.error("--clients must be 1..240 (one loopback address each)")
    size = args.size_mb * MB
    shard = int(args.shard_mb * MB) if args.shard_mb else min(4 * MB, max(64 * 1024, size // 32 // 65536 * 65536))
    cap = args.cap_mb_s * MB
    parallel = args.parallel or 2 * (args.relays + 1)
    # forked children start at once; spawned ones import the node package again, each (seconds of CPU: on a
    # loaded machine the processes took minutes to start)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with tempfile.TemporaryDirectory(prefix="broadcast-bench-") as tmp:
        work = Path(tmp)
        checkpoint = work / "model.safetensors"
        with checkpoint.open("wb") as fh:
            for off in range(0, size, 16 * MB):
                fh.write(os.urandom(min(16 * MB, size - off)))
        (work / "run").mkdir()
        common = {"clients": args.clients, "cap": cap, "shard_size": shard, "parallel": parallel}
        origin_s, v1, _ = _phase(ctx, work / "run", checkpoint, relays=0, prefetch=False, **common)
        tree_s, v2, by_source = _phase(
            ctx, work / "run", checkpoint, relays=args.relays, prefetch=args.relay_mode == "prefetch", **common
        )
    out = {
        "size_mb": args.size_mb,
        "clients": args.clients,
        "cap_mb_s": args.cap_mb_s,
        "origin_only_s": round(origin_s, 3),
        "tree_s": round(tree_s, 3),
        "speedup": round(origin_s / tree_s, 3),
        "bytes_verified": v1 + v2,
        "relays": args.relays,
        "relay_mode": args.relay_mode,
        "shard_mb": round(shard / MB, 3),
        "tree_mb_from": {k: round(v / MB, 1) for k, v in sorted(by_source.items())},
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
