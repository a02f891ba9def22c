"""Real libp2p hosts on 127.0.0.1: gossip delivery, validator rejection, request-response, churn,
and several processes.  Every wait is bounded; the nursery sits outside the hosts' exit stack
(py-libp2p pitfall 7)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio
from eth_account import Account

from node.p2p.host import P2PError, P2PNode, eth_address_from_peer_id, identity_from_eth_key

TOPIC = "test/gossip"
REPO = Path(__file__).resolve().parents[2]


def new_key() -> bytes:
    return bytes(Account.create().key)


async def start(stack: AsyncExitStack, n: int, **kw: object) -> list[P2PNode]:
    return [await stack.enter_async_context(P2PNode(private_key=new_key(), topics=[TOPIC], **kw)) for _ in range(n)]


async def collect(
    chan: trio.MemoryReceiveChannel[tuple[bytes, str]], out: list[tuple[bytes, str, float]], limit: int
) -> None:
    async for data, sender in chan:
        out.append((data, sender, time.monotonic()))
        if len(out) >= limit:
            return


def test_identity_matches_eth_account() -> None:
    key = new_key()
    pair = identity_from_eth_key(key)
    from libp2p.peer.id import ID

    pid = ID.from_pubkey(pair.public_key)
    assert eth_address_from_peer_id(pid) == Account.from_key(key).address
    assert eth_address_from_peer_id(pid.to_base58()) == Account.from_key(key).address


async def test_three_hosts_deliver_all_with_sender() -> None:
    n_msgs = 50
    got: dict[int, list[tuple[bytes, str, float]]] = {1: [], 2: []}
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, b, c = await start(stack, 3)
        await b.connect(a.listen_addrs[0])
        await c.connect(a.listen_addrs[0])
        await c.connect(b.listen_addrs[0])
        await a.wait_for_topic_peers(TOPIC, 2)
        await b.wait_for_topic_peers(TOPIC, 2)
        await c.wait_for_topic_peers(TOPIC, 2)
        nursery.start_soon(collect, b.subscribe(TOPIC), got[1], n_msgs)
        nursery.start_soon(collect, c.subscribe(TOPIC), got[2], n_msgs)
        await trio.sleep(0.05)
        t0 = time.monotonic()
        for i in range(n_msgs):
            await a.publish(TOPIC, struct.pack(">Id", i, time.monotonic()))
        with trio.fail_after(5):
            while len(got[1]) < n_msgs or len(got[2]) < n_msgs:
                await trio.sleep(0.01)
        elapsed = max(r[-1][2] for r in got.values()) - t0
        for rows in got.values():
            assert {struct.unpack(">Id", d)[0] for d, _, _ in rows} == set(range(n_msgs))
            assert {s for _, s, _ in rows} == {a.address}
        lat = sorted((t - struct.unpack(">Id", d)[1]) * 1000 for rows in got.values() for d, _, t in rows)
        print(
            f"\n[p2p] 3 hosts: {n_msgs} msgs x2 receivers in {elapsed * 1000:.1f} ms "
            f"({2 * n_msgs / elapsed:.0f} deliveries/s), latency p50 {statistics.median(lat):.1f} ms "
            f"max {lat[-1]:.1f} ms; drops={a.dropped_outbound + b.dropped_outbound + c.dropped_outbound}"
        )
        assert a.dropped_outbound == 0 and not b.dropped and not c.dropped

        # Paced: one message every 20 ms, so latency is the network path, not the burst's queue.
        got[1].clear()
        got[2].clear()
        nursery.start_soon(collect, b.subscribe(TOPIC), got[1], 20)
        nursery.start_soon(collect, c.subscribe(TOPIC), got[2], 20)
        await trio.sleep(0.05)
        for i in range(20):
            await a.publish(TOPIC, struct.pack(">Id", i, time.monotonic()))
            await trio.sleep(0.02)
        with trio.fail_after(5):
            while len(got[1]) < 20 or len(got[2]) < 20:
                await trio.sleep(0.01)
        lat = sorted((t - struct.unpack(">Id", d)[1]) * 1000 for rows in got.values() for d, _, t in rows)
        print(f"[p2p] paced 50 msg/s: latency p50 {statistics.median(lat):.1f} ms max {lat[-1]:.1f} ms")


async def test_validator_rejects_at_first_hop_line_topology() -> None:
    def reject_bad(topic: str, data: bytes, sender: str) -> bool:
        assert topic == TOPIC
        return not data.startswith(b"bad")

    got_b: list[tuple[bytes, str, float]] = []
    got_c: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a = await stack.enter_async_context(P2PNode(private_key=new_key(), topics=[TOPIC]))
        b = await stack.enter_async_context(P2PNode(private_key=new_key(), topics=[TOPIC], validator=reject_bad))
        c = await stack.enter_async_context(P2PNode(private_key=new_key(), topics=[TOPIC]))
        await b.connect(a.listen_addrs[0])
        await c.connect(b.listen_addrs[0])
        await a.wait_for_topic_peers(TOPIC, 1)
        await b.wait_for_topic_peers(TOPIC, 2)
        await c.wait_for_topic_peers(TOPIC, 1)
        assert a.peer_id not in c.peers
        nursery.start_soon(collect, b.subscribe(TOPIC), got_b, 100)
        nursery.start_soon(collect, c.subscribe(TOPIC), got_c, 100)
        for i in range(5):
            await a.publish(TOPIC, b"bad %d" % i)
            await a.publish(TOPIC, b"good %d" % i)
        with trio.fail_after(5):
            while len(got_c) < 5 or len(got_b) < 5:
                await trio.sleep(0.01)
        await trio.sleep(1.5)  # a heartbeat: IHAVE/IWANT gossip would surface a leaked message
        assert sorted(d for d, _, _ in got_b) == [b"good %d" % i for i in range(5)]
        assert sorted(d for d, _, _ in got_c) == [b"good %d" % i for i in range(5)]
        assert b.rejections[a.address] == 5
        assert not c.rejections and not a.rejections
        nursery.cancel_scope.cancel()


async def test_request_response() -> None:
    async def echo(request: bytes, sender: str) -> bytes:
        return sender.encode() + b"|" + request

    async def slow(request: bytes, sender: str) -> bytes:
        await trio.sleep(5)
        return b"late"

    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(P2PNode(private_key=new_key(), max_request_size=1024))
        b = await stack.enter_async_context(P2PNode(private_key=new_key(), max_request_size=4096))
        a.set_handler("/test/echo/1", echo)
        a.set_handler("/test/slow/1", slow)

        assert await b.request(a.listen_addrs[0], "/test/echo/1", b"hi") == b.address.encode() + b"|hi"
        # By peer id once connected; time a few round trips.
        times = []
        for i in range(20):
            t = time.monotonic()
            assert await b.request(a.peer_id, "/test/echo/1", b"%d" % i) == b.address.encode() + b"|%d" % i
            times.append((time.monotonic() - t) * 1000)
        print(f"\n[p2p] request-response p50 {statistics.median(times):.1f} ms max {max(times):.1f} ms")

        with pytest.raises(P2PError, match="exceeds"):  # refused locally, nothing sent
            await b.request(a.peer_id, "/test/echo/1", b"x" * 5000)
        with pytest.raises(P2PError, match="remote refused"):  # a's cap is smaller than b's
            await b.request(a.peer_id, "/test/echo/1", b"x" * 2000)
        with pytest.raises(P2PError, match="exceeds"):  # response over the caller's cap
            await b.request(a.peer_id, "/test/echo/1", b"x" * 1000, max_response=100)
        t = time.monotonic()
        with pytest.raises(P2PError, match="timed out"):
            await b.request(a.peer_id, "/test/slow/1", b"", timeout=0.5)
        assert time.monotonic() - t < 2
        with pytest.raises(P2PError):
            await b.request(a.peer_id, "/test/none/1", b"")
        # Still healthy after the failures.
        assert await b.request(a.peer_id, "/test/echo/1", b"ok") == b.address.encode() + b"|ok"


async def test_peer_leaving_is_dropped_and_gossip_continues() -> None:
    got: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, b = await start(stack, 2)
        await b.connect(a.listen_addrs[0])
        async with P2PNode(private_key=new_key(), topics=[TOPIC]) as c:
            await c.connect(a.listen_addrs[0])
            await c.connect(b.listen_addrs[0])
            await a.wait_for_topic_peers(TOPIC, 2)
            c_id = c.peer_id
        t0 = time.monotonic()
        with trio.fail_after(5):
            while c_id in a.peers or c_id in b.peers or c_id in a.gossip_peers:
                await trio.sleep(0.02)
        print(f"\n[p2p] departed peer dropped after {(time.monotonic() - t0) * 1000:.0f} ms")
        nursery.start_soon(collect, b.subscribe(TOPIC), got, 10)
        for i in range(10):
            await a.publish(TOPIC, b"m%d" % i)
        with trio.fail_after(5):
            while len(got) < 10:
                await trio.sleep(0.01)
        assert {d for d, _, _ in got} == {b"m%d" % i for i in range(10)}


async def run_node_until(
    stop: trio.Event, key: bytes, listen: str, *, task_status: trio.TaskStatus[P2PNode] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a node in its own task so it can leave while others stay (no manual __aexit__: pitfall 7)."""
    async with P2PNode(private_key=key, listen=listen, topics=[TOPIC]) as node:
        task_status.started(node)
        await stop.wait()


async def test_bootstrap_reconnects_to_restarted_peer() -> None:
    key = new_key()
    got: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery:
        stop_a = trio.Event()
        a: P2PNode = await nursery.start(run_node_until, stop_a, key, "/ip4/127.0.0.1/tcp/0")
        addr = a.listen_addrs[0]
        port = addr.split("/tcp/")[1].split("/")[0]
        async with P2PNode(private_key=new_key(), topics=[TOPIC], bootstrap=[addr]) as b:
            with trio.fail_after(5):
                while a.peer_id not in b.peers:
                    await trio.sleep(0.02)
            stop_a.set()  # the bootstrap peer goes away...
            with trio.fail_after(5):
                while a.peer_id in b.peers:
                    await trio.sleep(0.02)
            # ...and comes back with the same key on the same port.
            stop_a2 = trio.Event()
            a2: P2PNode = await nursery.start(run_node_until, stop_a2, key, f"/ip4/127.0.0.1/tcp/{port}")
            t0 = time.monotonic()
            await a2.wait_for_topic_peers(TOPIC, 1, timeout=8)
            print(f"\n[p2p] bootstrap peer rejoined after {(time.monotonic() - t0) * 1000:.0f} ms")
            nursery.start_soon(collect, b.subscribe(TOPIC), got, 5)
            await trio.sleep(0.05)
            for i in range(5):
                await a2.publish(TOPIC, b"r%d" % i)
            with trio.fail_after(5):
                while len(got) < 5:
                    await trio.sleep(0.01)
            assert {s for _, s, _ in got} == {a2.address}
            stop_a2.set()


async def test_shutdown_flushes_queued_publishes() -> None:
    """Publish a burst and exit at once: every message still arrives (pitfall 5)."""
    n_msgs = 200
    got: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery, P2PNode(private_key=new_key(), topics=[TOPIC]) as b:
        nursery.start_soon(collect, b.subscribe(TOPIC), got, n_msgs)
        async with P2PNode(private_key=new_key(), topics=[TOPIC]) as a:
            await a.connect(b.listen_addrs[0])
            await a.wait_for_topic_peers(TOPIC, 1)
            await a.wait_for_mesh(TOPIC, 1)
            for i in range(n_msgs):
                await a.publish(TOPIC, b"%d" % i)
        with trio.fail_after(5):
            while len(got) < n_msgs:
                await trio.sleep(0.01)
        assert {d for d, _, _ in got} == {b"%d" % i for i in range(n_msgs)}, len(got)


class PeerProcess:
    """A p2p_peer.py subprocess whose JSON stdout lines are followed by a trio task."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.ready: str | None = None
        self.address: str | None = None
        self.count = 0

    async def follow(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        async for chunk in self.proc.stdout:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                obj = json.loads(line)
                if "ready" in obj:
                    self.ready, self.address = obj["ready"], obj["address"]
                elif "count" in obj:
                    self.count = obj["count"]


@pytest.mark.slow
async def test_multiple_processes_and_sigkill() -> None:
    async with trio.open_nursery() as nursery, P2PNode(private_key=new_key(), topics=[TOPIC]) as hub:
        peers: list[PeerProcess] = []
        try:
            for _ in range(2):
                proc = await trio.lowlevel.open_process(
                    [
                        sys.executable,
                        "-m",
                        "tests.integration.p2p_peer",
                        "--topic",
                        TOPIC,
                        "--bootstrap",
                        hub.listen_addrs[0],
                    ],
                    cwd=REPO,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
                peers.append(PeerProcess(proc))
                nursery.start_soon(peers[-1].follow)
            with trio.fail_after(15):  # interpreter + libp2p import dominate
                await hub.wait_for_topic_peers(TOPIC, 2, timeout=15)
            assert {p.address for p in peers} == {eth_address_from_peer_id(i) for i in hub.topic_peers(TOPIC)}

            for i in range(20):
                await hub.publish(TOPIC, b"a%d" % i)
            with trio.fail_after(5):
                while any(p.count < 20 for p in peers):
                    await trio.sleep(0.02)

            victim, survivor = peers
            victim.proc.send_signal(signal.SIGKILL)
            with trio.fail_after(5):
                await victim.proc.wait()
                while len(hub.topic_peers(TOPIC)) > 1:
                    await trio.sleep(0.02)
            for i in range(20):
                await hub.publish(TOPIC, b"b%d" % i)
            with trio.fail_after(5):
                while survivor.count < 40:
                    await trio.sleep(0.02)
            assert victim.count == 20
        finally:
            for p in peers:
                if p.proc.returncode is None:
                    assert p.proc.stdin is not None
                    await p.proc.stdin.aclose()  # graceful stop; SIGKILL if it lingers
            with trio.move_on_after(5):
                for p in peers:
                    await p.proc.wait()
            for p in peers:
                if p.proc.returncode is None:
                    p.proc.kill()
                    await p.proc.wait()
            nursery.cancel_scope.cancel()


async def test_mesh_peers_and_wait_for_mesh() -> None:
    async with AsyncExitStack() as stack:
        a, b = await start(stack, 2)
        assert a.mesh_peers(TOPIC) == set() and a.mesh_peers("not/joined") == set()
        with pytest.raises(P2PError):
            await a.wait_for_mesh(TOPIC, 1, timeout=0.1)
        await b.connect(a.listen_addrs[0])
        await a.wait_for_mesh(TOPIC, 1)
        await b.wait_for_mesh(TOPIC, 1)
        assert a.mesh_peers(TOPIC) == {str(b.peer_id)}
        assert b.mesh_peers(TOPIC) == {str(a.peer_id)}


async def test_signed_peer_records_are_cached_yet_still_exchanged() -> None:
    """The per-RPC signed peer record is built once a second and a repeated one is not re-verified, but
    each side still ends up with the other's certified record (what the caches must not break)."""
    from node.p2p import patches as host_module

    got: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, b = await start(stack, 2)
        await b.connect(a.listen_addrs[0])
        await a.wait_for_mesh(TOPIC, 1)
        nursery.start_soon(collect, b.subscribe(TOPIC), got, 20)
        for i in range(20):
            await a.publish(TOPIC, b"m%d" % i)
        with trio.fail_after(10):
            while len(got) < 20:
                await trio.sleep(0.02)
        host_a = a._require_host()
        cached, _ = host_module._cached_env_to_send_in_rpc(host_a)
        assert cached == host_module._original_env_to_send(host_a)[0]
        record = b._require_host().get_peerstore().get_peer_record(a.peer_id)
        assert record is not None and record.marshal_envelope() == cached
        assert any(key[:2] == (b.peer_id.to_bytes(), a.peer_id.to_bytes()) for key in host_module._spr_seen)
        assert len(host_module._spr_seen) <= host_module._SPR_SEEN_MAX
        nursery.cancel_scope.cancel()


async def test_yamux_credit_goes_back_in_batches_not_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Receiving a stream of small gossip messages costs few WINDOW_UPDATE frames (go-yamux batching:
    credit returns once half the window was consumed), not one per read as py-libp2p's default does;
    and a bulk transfer larger than the window still flows (no stall)."""
    from libp2p.stream_muxer.yamux.yamux import YamuxStream

    updates = 0
    original = YamuxStream.send_window_update

    async def counting(self: YamuxStream, *args: object, **kw: object) -> None:
        nonlocal updates
        updates += 1
        await original(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(YamuxStream, "send_window_update", counting)
    n_msgs = 300
    got: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, b = await start(stack, 2, max_request_size=8 * 1024 * 1024)
        await b.connect(a.listen_addrs[0])
        await a.wait_for_topic_peers(TOPIC, 1)
        await b.wait_for_topic_peers(TOPIC, 1)
        nursery.start_soon(collect, b.subscribe(TOPIC), got, n_msgs)
        await trio.sleep(0.05)
        before = updates
        for i in range(n_msgs):
            await a.publish(TOPIC, struct.pack(">I", i) + bytes(200))
        with trio.fail_after(10):
            while len(got) < n_msgs:
                await trio.sleep(0.01)
        assert len({d[:4] for d, _, _ in got}) == n_msgs
        per_message = (updates - before) / n_msgs
        print(f"\n[p2p] {updates - before} window updates for {n_msgs} gossip messages")
        assert per_message < 0.1, per_message

        # 4 MB request/response body: many times the initial 256 KiB window, so credit must come back
        big = os.urandom(4 * 1024 * 1024)

        async def echo_len(data: bytes, sender: str) -> bytes:
            return struct.pack(">I", len(data)) + data[-16:]

        b.set_handler("/test/bulk/1", echo_len, max_request=len(big))
        with trio.fail_after(30):
            reply = await a.request(b.peer_id, "/test/bulk/1", big, timeout=30)
        assert reply == struct.pack(">I", len(big)) + big[-16:]
        nursery.cancel_scope.cancel()


async def test_peer_ips_names_where_chosen_peers_connect_from() -> None:
    async with AsyncExitStack() as stack:
        a, b, c = await start(stack, 3)
        await b.connect(a.listen_addrs[0])
        await c.connect(a.listen_addrs[0])
        assert a.peer_ips(lambda address: address == b.address) == {"127.0.0.1"}
        assert a.peer_ips(lambda address: False) == set()
        assert a.peer_ips(lambda address: 1 / 0 > 0) == set()  # a predicate that raises selects nobody


async def test_a_request_cancelled_by_its_caller_resets_its_stream() -> None:
    """A caller's own deadline (a cancel scope around `request`, not its `timeout`) must not leave the
    stream open on the connection: each one would hold muxer state and a buffered reply until the
    connection closes."""

    async def slow(request: bytes, sender: str) -> bytes:
        await trio.sleep(3)
        return b"late"

    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(P2PNode(private_key=new_key()))
        b = await stack.enter_async_context(P2PNode(private_key=new_key()))
        a.set_handler("/test/slow/1", slow)
        await b.connect(a.listen_addrs[0])
        conns = b._require_host().get_network().connections[a.peer_id]
        muxed = (conns[0] if isinstance(conns, list) else conns).muxed_conn
        await trio.sleep(0.5)  # the hosts' own streams (identify and the like) open meanwhile
        before = len(muxed.streams)
        for _ in range(8):
            with trio.move_on_after(0.3) as scope:
                await b.request(a.peer_id, "/test/slow/1", b"")
            assert scope.cancelled_caught
        # left open, each would still be there (8 more); a host stream or two may come and go meanwhile
        assert len(muxed.streams) - before < 3, (before, len(muxed.streams))


async def test_a_task_scheduled_while_the_host_stops_is_dropped() -> None:
    """py-libp2p 0.8.1 schedules a task per incoming pubsub message; one arriving while its service stops
    (still running, task nursery closed) raised "Nursery is closed to new arrivals" out of the host's exit
    (seen once in CI). The patch drops it; any other error still propagates."""
    from libp2p.tools.anyio_service.trio_manager import TrioManager

    async with trio.open_nursery() as closed:
        pass

    class Stopping:
        _task_nursery = closed
        is_running = True

        async def _run_and_manage_task(self, task: object) -> None:
            raise AssertionError("never runs")

    TrioManager._schedule_task(Stopping(), "a late pubsub task")  # type: ignore[arg-type]
    Stopping._task_nursery = None  # type: ignore[assignment]
    with pytest.raises(Exception, match="before service is running"):
        TrioManager._schedule_task(Stopping(), "too early")  # type: ignore[arg-type]


async def test_one_peers_messages_are_delivered_in_the_order_it_sent_them() -> None:
    """Each message is handled in its peer's reader, one after another (not in a task of its own, which
    let a burst come out in any order): B, which hears only A, delivers A's burst in A's order."""
    n_msgs = 300
    got: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, b = await start(stack, 2)
        await b.connect(a.listen_addrs[0])
        for node in (a, b):
            await node.wait_for_mesh(TOPIC, 1, timeout=10)
        nursery.start_soon(collect, b.subscribe(TOPIC), got, n_msgs)
        await trio.sleep(0.05)
        for i in range(n_msgs):
            await a.publish(TOPIC, struct.pack(">I", i) + bytes(50))
        with trio.fail_after(20):
            while len(got) < n_msgs:
                await trio.sleep(0.01)
        assert [struct.unpack(">I", d[:4])[0] for d, _, _ in got] == list(range(n_msgs))
        nursery.cancel_scope.cancel()


async def test_queued_gossip_is_coalesced_and_copies_start_no_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst published faster than the writer sends goes out in fewer RPCs than messages (queued
    messages merged, `gossip.coalesce`), and a copy of a message already handled (C hears each message
    from A and again from B) is dropped by the reader before `push_msg`."""
    from libp2p.pubsub import pubsub as pubsub_module

    from node.p2p.gossip import NodePubsub

    reads = 0
    original_read = pubsub_module.read_varint_prefixed_bytes_limited

    async def counting_read(reader: object, max_length: int) -> bytes:
        nonlocal reads
        reads += 1
        return await original_read(reader, max_length)  # type: ignore[arg-type]

    pushes: dict[str, int] = {}
    original_push = NodePubsub.push_msg

    async def counting_push(self: NodePubsub, forwarder: object, msg: object) -> None:
        me = str(self.my_id)
        pushes[me] = pushes.get(me, 0) + 1
        await original_push(self, forwarder, msg)  # type: ignore[arg-type]

    monkeypatch.setattr(pubsub_module, "read_varint_prefixed_bytes_limited", counting_read)
    monkeypatch.setattr(NodePubsub, "push_msg", counting_push)
    n_msgs = 200
    got_b: list[tuple[bytes, str, float]] = []
    got_c: list[tuple[bytes, str, float]] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, b, c = await start(stack, 3)
        await b.connect(a.listen_addrs[0])
        await c.connect(a.listen_addrs[0])
        await c.connect(b.listen_addrs[0])
        for node in (a, b, c):
            await node.wait_for_mesh(TOPIC, 2, timeout=10)
        nursery.start_soon(collect, b.subscribe(TOPIC), got_b, n_msgs)
        nursery.start_soon(collect, c.subscribe(TOPIC), got_c, n_msgs)
        await trio.sleep(0.05)
        reads, pushes = 0, {}
        for i in range(n_msgs):
            await a.publish(TOPIC, struct.pack(">I", i) + bytes(100))
        with trio.fail_after(20):
            while len(got_b) < n_msgs or len(got_c) < n_msgs:
                await trio.sleep(0.01)
        await trio.sleep(0.5)  # B's forwards of the last messages reach C too
        for rows in (got_b, got_c):
            assert sorted(struct.unpack(">I", d[:4])[0] for d, _, _ in rows) == list(range(n_msgs))
        print(f"\n[p2p] {n_msgs} messages, 3 hosts: {reads} RPCs read, push_msg tasks {sorted(pushes.values())}")
        # each message reaches B once and C twice (from A and B): 3 reads each without coalescing
        assert reads < n_msgs, reads
        # C's push_msg calls: one per message, not one per copy (2 per message before)
        assert pushes[str(c.peer_id)] <= n_msgs + n_msgs // 5, pushes
        nursery.cancel_scope.cancel()
