"""Gossip delivery on N node processes over 127.0.0.1: latency p50/p99/max, loss, aggregate throughput.

The bench (parent) generates one key per node, starts N child processes (``--child``), each running one
`PoolNetwork` on 127.0.0.1 with a random port, all members of one pool (node 0 is the coordinator).
It wires them in a sparse topology (node i dials 2-3 earlier nodes), waits until every node has heard
a warm-up heartbeat from every other node (bounded), then the publishers send ``heartbeat`` envelopes
whose body is ``[publisher, message number, time.time() at send]`` on one shared schedule (message g at
``t0 + g / rate``). Every node records the receive time of each message. Children write their records
to a JSON file and exit when told (or when stdin closes); the parent kills stragglers. The per-sender
budgets (`node.p2p.rules.DEFAULT_BUDGETS`) are off here: this measures what the network carries, and a
publisher's share of the schedule is far above an honest node's heartbeat rate.

Per-phase figures go to stderr; stdout gets ONE JSON line. Exit status 1 if anything was lost or the
run did not complete.

    .venv/bin/python bench/gossip.py [--nodes 12] [--rate R] [--messages M] [--seconds-limit 120]
        [--runs 5] [--profile node1.pstats]

Each of the ``--runs`` runs (default 5) starts fresh processes on a fresh topology; the JSON line has the
spread over them (``p50_ms_spread``, ``p99_ms_spread``: min, median, max), how many runs held p99 under
250 ms, and each run's figures with the 1-minute load average at its end (``per_run``). ``cpu_ms_per_delivery``
is the CPU all nodes spent from "go" to stop per delivery: the cost figure a loaded machine changes least.

By default the publish rate offers 10 % more deliveries per second than the 500/s target (550 / (N - 1)
messages per second, every message reaching N - 1 receivers) for 50 s, so one run checks all three
targets (0 lost, p99 < 250 ms, >= 500 deliveries/s) at a load the network must sustain.

Parent/child protocol: JSON lines. Parent -> child stdin: the config (keys, addresses, schedule), then
``{"connect": [multiaddr, ...]}``, ``{"go": t0}``, ``{"stop": true}``. Child -> parent stdout:
``{"ready": multiaddr}``, ``{"connected": n}``, ``{"mesh": true}``, ``{"progress": n}``, ``{"sent": n}``,
``{"result": path}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from node.p2p.envelope import Envelope

POOL = 1
KIND = "heartbeat"
SHUTDOWN_S = 10.0  # a child's bound on its own shutdown once its results are written
WARMUP = -1  # message number of warm-up heartbeats (not measured)
TARGET_P99_MS = 250.0
TARGET_DELIVERED_PER_S = 500.0


def _log(msg: str) -> None:
    sys.stderr.write(f"[gossip-bench] {msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------- child


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


_PROFILER: Any = None  # the child's cProfile.Profile with ``GOSSIP_BENCH_PROFILE``


def child_main() -> None:
    """One node: the first stdin line is its config, the next ones the parent's commands.

    With ``GOSSIP_BENCH_PROFILE=path`` in its environment the node's measured phase runs under cProfile
    (CPU time) and it writes the stats to ``path`` (the parent sets it for node 1 when given ``--profile``)."""
    global _PROFILER
    profile_path = os.environ.get("GOSSIP_BENCH_PROFILE")
    if not profile_path:
        trio.run(_child)
        return
    import cProfile

    # CPU time, not wall time (on a loaded machine wall time is mostly waiting for a core), and from the
    # measured publishing on (started by `_node`), not the imports and the warm-up
    _PROFILER = cProfile.Profile(time.process_time)
    try:
        trio.run(_child)
    finally:
        _PROFILER.disable()
        _PROFILER.dump_stats(profile_path)


async def _child() -> None:
    commands, command_recv = trio.open_memory_channel[dict[str, Any]](64)

    async def read_stdin() -> None:
        """Parent lines, one JSON object each; EOF (parent gone) means stop."""
        stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        buf = b""
        async with stream:
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        await commands.send(json.loads(line))
        await commands.send({"stop": True})

    async with trio.open_nursery() as outer:
        outer.start_soon(read_stdin)
        config = await command_recv.receive()
        if "stop" not in config:
            await _node(config, command_recv)
        outer.cancel_scope.cancel()


async def _node(config: dict[str, Any], command_recv: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
    from node.p2p.network import PoolNetwork
    from node.p2p.rules import Membership

    index: int = config["index"]
    n_nodes: int = len(config["addresses"])
    snapshot = Membership(
        pool=POOL,
        coordinator=config["addresses"][0],
        validators=frozenset(),
        members=frozenset(config["addresses"]),
    )
    # (publisher, number) -> list of (send time, receive time); duplicates show up as longer lists.
    received: dict[tuple[int, int], list[tuple[float, float]]] = {}
    warm_from: set[int] = set()
    sent = 0
    cpu_at_go: float | None = None  # process CPU seconds when measured publishing began
    copies_at_go = spared_at_go = 0  # gossip copies received (and not sent) before it (warm-up)

    async def collect(chan: trio.MemoryReceiveChannel[Envelope]) -> None:
        async for env in chan:
            now = time.time()
            pub, num, sent_at = json.loads(env.body)
            if num == WARMUP:
                warm_from.add(pub)
                continue
            received.setdefault((pub, num), []).append((sent_at, now))

    async def report_progress() -> None:
        while True:
            await trio.sleep(0.5)
            _emit({"progress": len(received)})

    # Shutdown (flush, closing the swarm) is bounded too: `lifetime` gets a deadline once results are out.
    with trio.CancelScope() as lifetime:
        async with (
            PoolNetwork(
                private_key=bytes.fromhex(config["key"]), pool=POOL, membership=lambda: snapshot, budgets=None
            ) as net,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(collect, net.subscribe(KIND))
            _emit({"ready": net.listen_addrs[0], "address": net.address})
            commands: dict[str, Any] = {}
            arrived = {"connect": trio.Event(), "go": trio.Event()}

            async def dispatch(work: trio.CancelScope) -> None:
                """Parent commands; a stop (or EOF) cancels whatever the node is doing."""
                async for cmd in command_recv:
                    if "stop" in cmd:
                        break
                    for key, event in arrived.items():
                        if key in cmd:
                            commands[key] = cmd[key]
                            event.set()
                work.cancel()

            try:
                with trio.CancelScope() as work:
                    nursery.start_soon(dispatch, work)
                    await arrived["connect"].wait()
                    for addr in commands["connect"]:
                        for attempt in range(5):
                            try:
                                with trio.fail_after(5.0):
                                    await net.connect(addr)
                                break
                            except Exception:
                                if attempt == 4:
                                    raise
                                await trio.sleep(0.2)
                    with contextlib.suppress(Exception):
                        await net.wait_for_peers(1, timeout=10.0, kinds=[KIND])
                    _emit({"connected": len(net.node.peers)})

                    # Warm-up: heartbeat until told to go; report once every other node was heard from.
                    announced = False
                    while not arrived["go"].is_set():
                        await net.publish(KIND, json.dumps([index, WARMUP, time.time()]).encode())
                        if not announced and len(warm_from) >= n_nodes - 1:
                            _emit({"mesh": True})
                            announced = True
                        # ~10 warm-up msg/s in all: more would leave a backlog the measurement starts on
                        with trio.move_on_after(max(0.25, 0.1 * n_nodes)):
                            await arrived["go"].wait()

                    # Publish on the shared schedule: global message g at t0 + g / rate, g = index mod publishers.
                    t0: float = commands["go"]
                    cpu_at_go = time.process_time()
                    copies_at_go = net.node.copies_received
                    spared_at_go = net.node.copies_spared
                    if _PROFILER is not None:
                        _PROFILER.enable()
                    rate: float = config["rate"]
                    offset = trio.current_time() - time.time()  # wall clock -> trio clock
                    nursery.start_soon(report_progress)
                    for g in config["numbers"]:
                        await trio.sleep_until(t0 + g / rate + offset)
                        await net.publish(KIND, json.dumps([index, g, time.time()]).encode())
                        sent += 1
                    _emit({"sent": sent})
                    await trio.sleep_forever()  # until the parent's stop cancels `work`
            finally:
                stopped = work.cancelled_caught
                path = Path(config["result"])
                tmp = path.with_suffix(".tmp")
                tmp.write_text(
                    json.dumps(
                        {
                            "index": index,
                            "sent": sent,
                            "received": [[p, g, ts] for (p, g), ts in received.items()],
                            "rejected": int(sum(net.rejected.values())),
                            "rejected_by_reason": {str(k): v for k, v in net.rejected.items()},
                            "dropped": int(sum(net.dropped.values()) + sum(net.node.dropped.values())),
                            "dropped_outbound_rpcs": net.node.dropped_outbound,
                            "peers": len(net.node.peers),
                            "copies_received": net.node.copies_received - copies_at_go,
                            "copies_spared": net.node.copies_spared - spared_at_go,
                            "cpu_s": time.process_time() - cpu_at_go if cpu_at_go is not None else 0.0,
                        }
                    )
                )
                tmp.replace(path)
                _emit({"result": str(path), "stopped": stopped})
                lifetime.deadline = trio.current_time() + SHUTDOWN_S
                nursery.cancel_scope.cancel()

    if lifetime.cancelled_caught:
        sys.stderr.write(f"[gossip-bench node {index}] shutdown cut short after {SHUTDOWN_S:g} s\n")


# --------------------------------------------------------------------------------------------- parent


class Child:
    """One node process and a thread turning its stdout lines into (index, message) queue items."""

    def __init__(
        self,
        index: int,
        config: dict[str, Any],
        events: queue.Queue[tuple[int, dict[str, Any]]],
        profile: str | None = None,
    ) -> None:
        self.index = index
        env = dict(os.environ)
        env.pop("GOSSIP_BENCH_PROFILE", None)
        if profile:
            env["GOSSIP_BENCH_PROFILE"] = profile
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the parent only; it stops the children itself
        )
        self.send(config)
        self._thread = threading.Thread(target=self._read, args=(events,), daemon=True)
        self._thread.start()

    def _read(self, events: queue.Queue[tuple[int, dict[str, Any]]]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                events.put((self.index, json.loads(line)))
        events.put((self.index, {"exit": True}))

    def send(self, obj: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(json.dumps(obj) + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def close_stdin(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in [0, 100])."""
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def _topology(n: int, rng: random.Random) -> list[list[int]]:
    """Node i dials 2-3 distinct earlier nodes (node 1 only node 0): connected, sparse, not a mesh."""
    out: list[list[int]] = [[]]
    for i in range(1, n):
        k = min(i, rng.choice((2, 3)))
        out.append(sorted(rng.sample(range(i), k)))
    return out


class _Deadline(Exception):
    pass


def run(args: argparse.Namespace) -> dict[str, Any]:
    from eth_account import Account

    start = time.monotonic()
    deadline = start + args.seconds_limit
    rng = random.Random(args.seed)
    n = args.nodes
    n_pub = n if args.publishers <= 0 else min(args.publishers, n)
    keys = [bytes(Account.create().key) for _ in range(n)]
    addresses = [Account.from_key(k).address for k in keys]
    events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
    state: list[dict[str, Any]] = [{} for _ in range(n)]
    progress = [0] * n
    exited: set[int] = set()
    children: list[Child] = []
    phase_times: dict[str, float] = {}
    error: str | None = None

    def pump(until: Callable[[], bool], budget: float, what: str) -> None:
        """Consume child events until `until()` holds; raise _Deadline after `budget` s or at the limit."""
        end = min(time.monotonic() + budget, deadline)
        while not until():
            left = end - time.monotonic()
            if left <= 0:
                raise _Deadline(what)
            try:
                idx, msg = events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if "progress" in msg:
                progress[idx] = msg["progress"]
            if "exit" in msg:
                exited.add(idx)
                if "result" not in state[idx] and what != "exit":
                    raise _Deadline(f"{what}: node {idx} exited early (code {children[idx].proc.poll()})")
            state[idx].update(msg)

    with tempfile.TemporaryDirectory(prefix="gossip-bench-") as tmp:
        try:
            numbers = [list(range(p, args.messages, n_pub)) if p < n_pub else [] for p in range(n)]
            for i in range(n):
                config = {
                    "index": i,
                    "key": keys[i].hex(),
                    "addresses": addresses,
                    "rate": args.rate,
                    "numbers": numbers[i],
                    "result": str(Path(tmp) / f"node{i}.json"),
                }
                children.append(Child(i, config, events, args.profile if i == 1 else None))
            pump(lambda: all("ready" in s for s in state), args.seconds_limit, "start")
            phase_times["start_s"] = time.monotonic() - start
            _log(f"{n} nodes listening after {phase_times['start_s']:.1f} s")

            topo = _topology(n, rng)
            for i, child in enumerate(children):
                child.send({"connect": [state[j]["ready"] for j in topo[i]]})
            pump(lambda: all("connected" in s for s in state), 60.0, "connect")
            links = sum(len(t) for t in topo)
            _log(f"connected: {links} links (full mesh would be {n * (n - 1) // 2})")

            t_mesh = time.monotonic()
            pump(lambda: all("mesh" in s for s in state), args.mesh_timeout, "mesh")
            time.sleep(1.5)  # one more GossipSub heartbeat with warm-up traffic, so meshes settle
            phase_times["mesh_s"] = time.monotonic() - t_mesh
            _log(f"every node heard every other after {phase_times['mesh_s']:.1f} s")

            t0 = time.time() + 2.0  # warm-ups stop at "go": let their last ones drain first
            for child in children:
                child.send({"go": t0})
            _log(f"publishing {args.messages} messages from {n_pub} publishers at {args.rate:g} msg/s")
            pump(lambda: all("sent" in state[i] for i in range(n_pub)), args.seconds_limit, "publish")
            publish_end = time.time()
            _log(f"published in {publish_end - t0:.2f} s (schedule {args.messages / args.rate:.2f} s)")

            expected = args.messages * (n - 1)
            last_total, last_change = -1, time.monotonic()

            def drained() -> bool:
                nonlocal last_total, last_change
                total = sum(progress)
                if total != last_total:
                    last_total, last_change = total, time.monotonic()
                return total >= expected or time.monotonic() - last_change > args.drain_timeout

            pump(drained, args.seconds_limit, "drain")
            _log(f"drained {sum(progress)}/{expected} deliveries {time.time() - publish_end:.2f} s after publishing")
        except _Deadline as exc:
            error = f"did not finish: {exc}"
            _log(error)
        except KeyboardInterrupt:
            error = "interrupted"
            _log(error)
        finally:
            for child in children:
                child.send({"stop": True})
                child.close_stdin()
            with contextlib.suppress(_Deadline, KeyboardInterrupt):
                # Grace for writing results and a clean exit: up to 20 s, at least 5 s past the limit.
                deadline = time.monotonic() + max(5.0, min(20.0, deadline - time.monotonic()))
                pump(lambda: len(exited) == len(children), 20.0, "exit")
            for child in children:
                if child.proc.poll() is None:
                    _log(f"killing straggler node {child.index}")
                    child.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=5.0)
        results = []
        for i in range(n):
            path = Path(tmp) / f"node{i}.json"
            if path.exists():
                results.append(json.loads(path.read_text()))
            else:
                error = error or f"node {i} wrote no result"
    return summarize(args, n, n_pub, results, error, phase_times)


def summarize(
    args: argparse.Namespace,
    n: int,
    n_pub: int,
    results: list[dict[str, Any]],
    error: str | None,
    phase_times: dict[str, float],
) -> dict[str, Any]:
    sent = {r["index"]: r["sent"] for r in results}
    published = {g for i in range(n_pub) for g in range(i, i + n_pub * sent.get(i, 0), n_pub)}
    messages_published = len(published)
    latencies: list[float] = []
    records: list[tuple[int, int, int, float, float]] = []  # receiver, publisher, number, send, receive
    deliveries = duplicates = 0
    first_send = last_recv = None
    for r in results:
        for pub, g, times in r["received"]:
            if g not in published or pub == r["index"]:
                continue
            deliveries += 1
            duplicates += len(times) - 1
            send_t, recv_t = times[0]
            latencies.append((recv_t - send_t) * 1000.0)
            records.append((r["index"], pub, g, send_t, recv_t))
            first_send = send_t if first_send is None else min(first_send, send_t)
            last_recv = recv_t if last_recv is None else max(last_recv, recv_t)
    latencies.sort()
    if args.dump:
        Path(args.dump).write_text(json.dumps(sorted(records, key=lambda rec: rec[3])))
    expected = messages_published * (n - 1)
    window = (last_recv - first_send) if first_send is not None and last_recv is not None else 0.0
    out: dict[str, Any] = {
        "nodes": n,
        "publishers": n_pub,
        "messages_published": messages_published,
        "rate_target": args.rate,
        "expected_deliveries": expected,
        "deliveries": deliveries,
        "lost": expected - deliveries,
        "duplicates": duplicates,
        "latency_p50_ms": round(_percentile(latencies, 50), 2) if latencies else None,
        "latency_p99_ms": round(_percentile(latencies, 99), 2) if latencies else None,
        "latency_max_ms": round(latencies[-1], 2) if latencies else None,
        "delivered_per_s": round(deliveries / window, 1) if window > 0 else 0.0,
        "window_s": round(window, 3),
        "rejected": sum(r["rejected"] for r in results),
        "dropped": sum(r["dropped"] for r in results),
        "dropped_outbound_rpcs": sum(r["dropped_outbound_rpcs"] for r in results),
        "copies_per_delivery": round(sum(r.get("copies_received", 0) for r in results) / max(1, deliveries), 2),
        "copies_spared_per_delivery": round(sum(r.get("copies_spared", 0) for r in results) / max(1, deliveries), 2),
        "peers_mean": round(statistics.mean(r.get("peers", 0) for r in results), 1) if results else 0,
        "cpus": os.cpu_count(),
        # CPU of all nodes from "go" to stop (publishing, forwarding, validating), per delivery: the cost
        # figure that a loaded machine changes least
        "cpu_s": round(sum(r.get("cpu_s", 0.0) for r in results), 2),
        "cpu_ms_per_delivery": round(1000.0 * sum(r.get("cpu_s", 0.0) for r in results) / deliveries, 3)
        if deliveries
        else None,
        **{k: round(v, 2) for k, v in phase_times.items()},
    }
    reasons: dict[str, int] = {}
    for r in results:
        for k, v in r["rejected_by_reason"].items():
            reasons[k] = reasons.get(k, 0) + v
    if reasons:
        out["rejected_by_reason"] = reasons
    out["targets_met"] = {
        "lost_0": out["lost"] == 0,
        "p99_lt_250ms": bool(latencies) and _percentile(latencies, 99) < TARGET_P99_MS,
        "delivered_ge_500_per_s": out["delivered_per_s"] >= TARGET_DELIVERED_PER_S,
    }
    if error:
        out["error"] = error
    return out


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    if "--child" in sys.argv[1:]:
        child_main()
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument(
        "--messages", type=int, default=0, help="total messages, all publishers together (default: 50 s of --rate)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="aggregate publish rate, msg/s (default: 10%% over the delivery target, 550 / (nodes - 1));"
        " a high rate such as 600 measures the saturation throughput instead",
    )
    parser.add_argument("--publishers", type=int, default=0, help="nodes 0..P-1 publish (default: all)")
    parser.add_argument("--seconds-limit", type=float, default=120.0, help="hard limit for the whole run")
    parser.add_argument("--mesh-timeout", type=float, default=60.0)
    parser.add_argument("--drain-timeout", type=float, default=10.0, help="stop after this long without progress")
    parser.add_argument("--dump", help="write every delivery [receiver, publisher, number, sent, received] here")
    parser.add_argument("--seed", type=int, default=0, help="topology seed (run i uses seed + i)")
    parser.add_argument(
        "--runs",
        type=int,
        default=5,
        help="independent runs (fresh processes and topology each); the JSON"
        " line gives the spread of p50 and p99 over them",
    )
    parser.add_argument("--profile", help="run node 1 under cProfile and write its pstats file here")
    args = parser.parse_args()
    if args.nodes < 2 or args.messages < 0 or args.rate < 0 or args.runs < 1:
        parser.error("need --nodes >= 2, --messages >= 1, --rate > 0")
    if not args.rate:  # every message reaches nodes - 1 receivers
        args.rate = round(1.1 * TARGET_DELIVERED_PER_S / (args.nodes - 1), 1)
    if not args.messages:
        args.messages = max(1, round(50 * args.rate))
    # Ctrl-C and SIGTERM both end the run the same way: children stopped, partial results reported.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    outs = []
    base_seed = args.seed
    for i in range(args.runs):
        args.seed = base_seed + i  # a fresh topology (and fresh processes, keys, ports) per run
        if args.runs > 1:
            _log(f"run {i + 1} of {args.runs} (load average {os.getloadavg()[0]:.1f})")
        out = run(args)
        out["load_avg_1m"] = round(os.getloadavg()[0], 2)
        _log(
            f"p50 {out['latency_p50_ms']} ms, p99 {out['latency_p99_ms']} ms, max {out['latency_max_ms']} ms; "
            f"{out['deliveries']}/{out['expected_deliveries']} delivered ({out['lost']} lost, "
            f"{out['duplicates']} duplicates), {out['delivered_per_s']} deliveries/s, "
            f"{out['cpu_ms_per_delivery']} CPU ms per delivery, load {out['load_avg_1m']}"
        )
        outs.append(out)
        if "error" in out:
            break
    final = combine(outs)
    print(json.dumps(final), flush=True)
    sys.exit(0 if final["lost"] == 0 and "error" not in final else 1)


def _spread(values: list[float | None]) -> dict[str, float | None]:
    present = sorted(v for v in values if v is not None)
    if not present:
        return {"min": None, "median": None, "max": None}
    return {"min": present[0], "median": round(statistics.median(present), 2), "max": present[-1]}


def combine(outs: list[dict[str, Any]]) -> dict[str, Any]:
    """One JSON line for all runs: counts summed, latencies as the median run's with the spread over runs
    (min / median / max of each run's p50 and p99), each run's figures under ``per_run``."""
    if len(outs) == 1:
        return {**outs[0], "runs": 1}
    summed = ("messages_published", "expected_deliveries", "deliveries", "lost", "duplicates", "rejected", "dropped")
    final: dict[str, Any] = {k: v for k, v in outs[-1].items() if k not in ("targets_met", "rejected_by_reason")}
    for key in summed:
        final[key] = sum(o[key] for o in outs)
    p50s = [o["latency_p50_ms"] for o in outs]
    p99s = [o["latency_p99_ms"] for o in outs]
    final["runs"] = len(outs)
    final["latency_p50_ms"] = _spread(p50s)["median"]
    final["latency_p99_ms"] = _spread(p99s)["median"]
    final["latency_max_ms"] = max((o["latency_max_ms"] for o in outs if o["latency_max_ms"] is not None), default=None)
    final["p50_ms_spread"] = _spread(p50s)
    final["p99_ms_spread"] = _spread(p99s)
    final["delivered_per_s"] = _spread([o["delivered_per_s"] for o in outs])["median"]
    final["cpu_ms_per_delivery"] = _spread([o["cpu_ms_per_delivery"] for o in outs])["median"]
    final["runs_p99_lt_250ms"] = sum(1 for o in outs if o["targets_met"]["p99_lt_250ms"])
    final["per_run"] = [
        {
            k: o.get(k)
            for k in (
                "latency_p50_ms",
                "latency_p99_ms",
                "latency_max_ms",
                "lost",
                "delivered_per_s",
                "cpu_ms_per_delivery",
                "load_avg_1m",
                "error",
            )
            if k in o
        }
        for o in outs
    ]
    final["targets_met"] = {
        "lost_0": final["lost"] == 0,
        "p99_lt_250ms_every_run": final["runs_p99_lt_250ms"] == len(outs),
        "delivered_ge_500_per_s_every_run": all(o["targets_met"]["delivered_ge_500_per_s"] for o in outs),
    }
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        final["error"] = errors[0]
    return final


if __name__ == "__main__":
    main()
