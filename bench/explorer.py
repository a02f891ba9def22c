"""The explorer on a large pool: how long its chain read takes and how fast its pages load.

A fresh anvil with the contracts, a pool (the devnet's set-up: one provider, one node), `--records` work
records (10,000 by default) and one of them slashed by a pool validator. The explorer
(`pool.explorer.server`) reads the chain once; then its pages are fetched over HTTP (`--loads` times
each: the pool's first and last page of records, the node's page) and, where Debian's Chromium is
installed, loaded in headless Chromium (navigation timing: request to load event). `--screenshot FILE`
saves Chromium's picture of the pool page (the README's). Ends with one JSON line: `read_s`,
`page_p50_ms`, `page_p99_ms`, `chromium_load_ms` (target: a page of a 10,000-record pool loads in
under a second).

`--grow-members N` then grows the pool's view in memory (recording that many on anvil takes minutes) to N
members with ten records each, one in ten slashed, and loads its pages again, each drawn afresh (the
cache emptied before every load): `grown_page_bytes` (the pool page), `grown_page_p50_ms`,
`grown_page_p99_ms`, and `loop_stall_ms`, the longest the event loop went without running a 10 ms
heartbeat meanwhile (the loop a coordinator shares with the explorer it hosts).

    .venv/bin/python bench/explorer.py [--records 10000] [--loads 20] [--screenshot docs/explorer.png]
    .venv/bin/python bench/explorer.py --records 100 --grow-members 5000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from node import ops
from node.audit import Rec
from node.chain import ChainClient, RpcClient
from node.chain.anvil import Anvil
from pool.devnet.setup import DevnetOptions, Roles, create_pool, join_one_node
from pool.explorer import view
from pool.explorer.server import Explorer, serve_explorer


async def _setup(url: str, workdir: Path, records: int) -> tuple[int, Any, Roles]:
    roles = Roles.default()
    opts = DevnetOptions(workdir=workdir, window=3600, model="tiny", env="math")
    made = await create_pool(url, opts, roles, lambda m: None, "")
    pid, dep = made["pool"], made["deployment"]
    await join_one_node(url, dep, roles, pid, lambda m: None)
    keys = ["0x" + f"{i + 1:064x}" for i in range(records)]
    async with await ChainClient.connect(url, dep, roles.coordinator) as co:
        items = [ops.WorkItem(roles.node.address, k, 10 + i % 50, i % 4, "0x" + "ab" * 32) for i, k in enumerate(keys)]
        await ops.record_work(co, pid, items)
    async with await ChainClient.connect(url, dep, roles.validators[0]) as v:
        sig = ops.rollout_claim(v, pid, keys[-1]).sign(roles.node)
        accused = (await ops.invalidate(v, pid, keys[-1], "0x" + "ee" * 32, signature=sig)).event("WorkAccused").args
        async with RpcClient(url) as rpc:
            await rpc.request("evm_increaseTime", [int(accused["appealEnd"]) - await v.timestamp() + 1])
            await rpc.request("evm_mine", [])
        await ops.finalize_invalidation(v, pid, keys[-1])
    return pid, dep, roles


def _grown(v: view.PoolView, members: int) -> view.PoolView:
    """`v` with `members` members, ten records each (newest first), one record in ten slashed."""
    nodes = [f"0x01{i:038x}" for i in range(members)]
    recs = []
    for i in range(10 * members):
        r = Rec(f"0x{i:064x}", nodes[i % members], f"0x02{i % members:038x}", 10, i % 4, "0x", 10**12, "0x" + "ab" * 32)
        if i % 10 == 0:
            r.status, r.slashed, r.evidence, r.settled_tx = "invalidated", 10**18, "0xee", "0x" + "cd" * 32
        recs.append(r)
    ledger = dict(next(iter(v.nodes.values())))
    return dataclasses.replace(
        v,
        records=recs[::-1],
        members={n: f"0x02{i:038x}" for i, n in enumerate(nodes)},
        nodes={n: ledger | {"node": n} for n in nodes},
    )


async def _grown_loads(ex: Explorer, base: str, pid: int, members: int, loads: int) -> dict[str, Any]:
    grown = await trio.to_thread.run_sync(_grown, ex.views[pid], members)
    ex.views = ex.views | {pid: grown}
    node = grown.records[0].node
    paths = [f"/pool/{pid}", f"/pool/{pid}?page={len(grown.records) // 100}", f"/pool/{pid}/members?page=7",
             f"/pool/{pid}/node/{node}"]  # fmt: skip
    stall = 0.0
    ms: list[float] = []
    size = 0
    async with trio.open_nursery() as nursery:

        async def heartbeat() -> None:
            nonlocal stall
            last = time.perf_counter()
            while True:
                await trio.sleep(0.01)
                now = time.perf_counter()
                stall = max(stall, now - last - 0.01)
                last = now

        nursery.start_soon(heartbeat)
        async with httpx.AsyncClient() as http:
            for _ in range(loads):
                for p in paths:
                    ex.generation += 1  # drawn afresh, not from the cache
                    t = time.perf_counter()
                    r = await http.get(base + p, timeout=60)
                    ms.append((time.perf_counter() - t) * 1000)
                    assert r.status_code == 200, (p, r.status_code)
                    if p == paths[0]:
                        size = len(r.content)
        nursery.cancel_scope.cancel()
    ms.sort()
    print(f"grown to {members:,} members and {len(grown.records):,} records: pool page {size:,} bytes, "
          f"p50 {statistics.median(ms):.1f} ms, p99 {ms[min(len(ms) - 1, int(0.99 * len(ms)))]:.1f} ms, "
          f"longest event-loop stall {stall * 1000:.0f} ms")  # fmt: skip
    return {
        "grown_members": members,
        "grown_page_bytes": size,
        "grown_page_p50_ms": round(statistics.median(ms), 1),
        "grown_page_p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
        "loop_stall_ms": round(stall * 1000, 1),
    }


def _chromium(url: str, screenshot: Path | None, profile: Path) -> float | None:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,1800",
                 f"--user-data-dir={profile}"):  # fmt: skip
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        times = []
        for _ in range(3):
            driver.get(url)
            t = driver.execute_script("const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd;")
            times.append(float(t))
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.set_window_size(1280, 1500)
            screenshot.write_bytes(driver.get_screenshot_as_png())
        return min(times)
    finally:
        driver.quit()


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with Anvil() as anvil:
        t0 = time.monotonic()
        pid, dep, roles = await _setup(anvil.url, workdir, args.records)
        print(f"pool {pid}: {args.records:,} records on chain in {time.monotonic() - t0:.1f} s")
        async with await ChainClient.connect(anvil.url, dep) as reader, trio.open_nursery() as nursery:
            ex = Explorer(reader, refresh=3600.0)
            t0 = time.monotonic()
            port = await nursery.start(serve_explorer, ex, "127.0.0.1", 0)
            with trio.fail_after(600):
                while pid not in ex.views:
                    await trio.sleep(0.05)
            read_s = time.monotonic() - t0
            print(f"explorer read the chain in {read_s:.1f} s")
            base = f"http://127.0.0.1:{port}"
            last = -(-args.records // 100)
            paths = [f"/pool/{pid}", f"/pool/{pid}?page={last}", f"/pool/{pid}/node/{roles.node.address}"]
            ms: list[float] = []
            async with httpx.AsyncClient() as http:
                for _ in range(args.loads):
                    for p in paths:
                        t = time.perf_counter()
                        r = await http.get(base + p, timeout=30)
                        ms.append((time.perf_counter() - t) * 1000)
                        assert r.status_code == 200, (p, r.status_code)
            ms.sort()
            shot = Path(args.screenshot) if args.screenshot else None
            browser_ms = await trio.to_thread.run_sync(_chromium, base + f"/pool/{pid}", shot, workdir / "chromium")
            grown = await _grown_loads(ex, base, pid, args.grow_members, args.loads) if args.grow_members else {}
            nursery.cancel_scope.cancel()
    return grown | {
        "records": args.records,
        "read_s": round(read_s, 2),
        "page_p50_ms": round(statistics.median(ms), 1),
        "page_p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
        "chromium_load_ms": None if browser_ms is None else round(browser_ms, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--loads", type=int, default=20)
    ap.add_argument("--screenshot", default="")
    ap.add_argument("--grow-members", type=int, default=0, help="then grow the pool to this many members (in memory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="explorer-bench-") as d:
        out = trio.run(run, args, Path(d))
    print(f"page loads over HTTP: p50 {out['page_p50_ms']} ms, p99 {out['page_p99_ms']} ms; "
          f"in Chromium: {out['chromium_load_ms']} ms")  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
