"""Request-response handlers against a peer that abuses frames (real libp2p hosts on 127.0.0.1): a 4 MiB
length prefix on a protocol that takes 64 KiB is refused from the prefix alone, before any body is
buffered; stalled half-sent requests are cut off after the read deadline; one peer holds at most
`MAX_STREAMS_PER_PEER` requests in progress; an honest peer is served all along."""

from __future__ import annotations

import os
import struct
import time
from contextlib import AsyncExitStack, suppress

import pytest
import trio
from eth_account import Account
from libp2p.custom_types import TProtocol

from node.p2p.host import MAX_REQUEST_BYTES_PER_IP, MAX_STREAMS_PER_PEER, P2PError, P2PNode

PROTO = "/intellect/test-small/1"
UPLOAD = "/intellect/test-upload/1"


def _key() -> bytes:
    return bytes(Account.create().key)


async def test_oversized_stalled_and_too_many_requests_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="node.p2p.reqresp")
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(P2PNode(private_key=_key()))
        attacker = await stack.enter_async_context(P2PNode(private_key=_key()))
        honest = await stack.enter_async_context(P2PNode(private_key=_key()))

        async def echo(request: bytes, sender: str) -> bytes:
            return b"ok " + request

        server.set_handler(PROTO, echo, read_timeout=2.0)
        addr = server.listen_addrs[0]
        await attacker.connect(addr)
        await honest.connect(addr)
        host = attacker._require_host()

        # a 4 MiB frame announced: refused at once, from its prefix
        s = await host.new_stream(server.peer_id, [TProtocol(PROTO)])
        t = time.monotonic()
        await s.write(struct.pack(">I", 4 << 20) + b"x" * 1024)
        with trio.fail_after(5):
            reply = await s.read(1024)
        assert reply[:1] == b"\x01" and b"exceeds limit" in reply, reply
        assert time.monotonic() - t < 2

        # many stalled requests: only MAX_STREAMS_PER_PEER are served at once, and all are dropped after
        # the read deadline; the honest peer is answered meanwhile
        streams = []
        for _ in range(3 * MAX_STREAMS_PER_PEER):
            with suppress(Exception):
                st = await host.new_stream(server.peer_id, [TProtocol(PROTO)])
                await st.write(b"\x00\x00")  # half a length prefix, then nothing
                streams.append(st)
        await trio.sleep(0.5)
        assert 0 < server._streams_in_progress[attacker.address] <= MAX_STREAMS_PER_PEER
        assert await honest.request(server.peer_id, PROTO, b"hi", timeout=5) == b"ok hi"
        with trio.fail_after(10):
            while server._streams_in_progress.get(attacker.address):
                await trio.sleep(0.2)
        assert await attacker.request(server.peer_id, PROTO, b"again", timeout=5) == b"ok again"
        # each stalled request is counted, and none costs a log line: anyone can stall as many as it likes
        assert 0 < server.requests_refused["slow"] <= MAX_STREAMS_PER_PEER, server.requests_refused
        assert [r.getMessage() for r in caplog.records if r.levelno >= 20 and r.name == "node.p2p.reqresp"] == []


def _rss_mib() -> float:
    """Resident memory once freed heap pages are handed back (what is pinned, not the allocator's
    high-water mark: a refused stream's buffered bytes are freed at its reset)."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _dial_from(node: P2PNode, source_ip: str) -> None:
    """Make `node` dial from `source_ip` (another loopback address: another host, to the server)."""
    for transport in node._require_host().get_network().transport_manager.get_transports():  # type: ignore[attr-defined]
        if hasattr(transport, "dial_with_source"):
            transport.dial = lambda maddr, t=transport: t.dial_with_source(maddr, (source_ip, 0))


# The attacker, in a process of its own (so that only the server's memory is measured here): 16 identities
# dialing from 127.0.0.2, 16 streams each announcing 4 MiB (refused from the prefix), then 16 each that
# announce the largest upload chunk and send all of it but the last byte, and stall.
_ATTACKER = """
import struct, sys
from contextlib import AsyncExitStack, suppress
import trio
from eth_account import Account
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from node.p2p.host import MAX_STREAMS_PER_PEER, P2PNode

addr, small, upload, big = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

from tests.adversarial.test_request_frames import _dial_from as dial_from

async def main():
    server = ID.from_base58(addr.split("/p2p/")[1])
    oversized = struct.pack(">I", 4 << 20) + b"x" * 4096
    stalled = struct.pack(">I", big) + b"x" * (big - 1)
    async with AsyncExitStack() as stack:
        nodes = []
        for _ in range(16):
            n = await stack.enter_async_context(P2PNode(private_key=bytes(Account.create().key)))
            dial_from(n, "127.0.0.2")
            await n.connect(addr)
            nodes.append(n)

        async def send(n, proto, payload):
            with suppress(Exception), trio.move_on_after(6):
                st = await n._require_host().new_stream(server, [TProtocol(proto)])
                await st.write(payload)
                await trio.sleep(30)

        async with trio.open_nursery() as nursery:
            for n in nodes:
                for _ in range(MAX_STREAMS_PER_PEER):
                    nursery.start_soon(send, n, small, oversized)
            await trio.sleep(2.0)
            for n in nodes:
                for _ in range(MAX_STREAMS_PER_PEER):
                    nursery.start_soon(send, n, upload, stalled)
            await trio.sleep(3.0)
            print("stalled", flush=True)
            await trio.sleep(30)

trio.run(main)
"""


async def test_stalled_frames_pin_a_bounded_amount_of_memory() -> None:
    """512 hostile requests from 16 identities on one host (127.0.0.2; see `_ATTACKER`): 256 that
    announce 4 MiB frames and 256 stalled just short of the largest upload chunk. The server reserves each
    frame's bytes against its per-address budget (`MAX_REQUEST_BYTES_PER_IP`) before reading it and resets
    what it refuses (dropping what the muxer buffered for it), so the stall pins about that budget, not
    256 x 260 KiB (+80 MiB measured without the budget, +48 MiB with it but buffers kept); an honest peer
    on 127.0.0.1 uploads meanwhile."""
    import subprocess
    import sys

    from node.p2p.blobs import DEFAULT_CHUNK

    big = DEFAULT_CHUNK + 4096
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(P2PNode(private_key=_key()))

        async def echo(request: bytes, sender: str) -> bytes:
            return b"ok %d" % len(request)

        server.set_handler(PROTO, echo, read_timeout=15.0)
        server.set_handler(UPLOAD, echo, read_timeout=15.0, max_request=big)
        addr = server.listen_addrs[0]
        honest = await stack.enter_async_context(P2PNode(private_key=_key()))
        await honest.connect(addr)
        assert await honest.request(server.peer_id, UPLOAD, b"y" * DEFAULT_CHUNK, timeout=5) == b"ok %d" % DEFAULT_CHUNK
        baseline = _rss_mib()
        attacker = await trio.lowlevel.open_process(
            [sys.executable, "-c", _ATTACKER, addr, PROTO, UPLOAD, str(big)], stdout=subprocess.PIPE
        )
        try:
            assert attacker.stdout is not None
            with trio.fail_after(60):
                out = b""
                while b"stalled" not in out:
                    chunk = await attacker.stdout.receive_some()
                    assert chunk, "the attacker process ended early"
                    out += chunk
            pinned = server._request_bytes.get("ip:127.0.0.2", 0)
            grown = _rss_mib() - baseline
            reply = await honest.request(server.peer_id, UPLOAD, b"y" * DEFAULT_CHUNK, timeout=5)
        finally:
            attacker.kill()
            await attacker.wait()
    print(f"\n[frames] 512 hostile requests: {pinned / 2**20:.1f} MiB reserved for 127.0.0.2, RSS +{grown:.1f} MiB, "
          f"refused {dict(server.requests_refused)}")  # fmt: skip
    assert reply == b"ok %d" % DEFAULT_CHUNK
    assert 0 < pinned <= MAX_REQUEST_BYTES_PER_IP
    assert server.requests_refused["busy"] > 0
    assert grown < MAX_REQUEST_BYTES_PER_IP / 2**20 + 16  # the budget and some slack, no more


async def _overrun(stream: object, total: int) -> None:
    """Write `total` bytes on `stream` as raw yamux DATA frames, ignoring the window the server granted."""
    muxed = stream.muxed_stream  # type: ignore[attr-defined]
    piece = b"z" * (64 << 10)
    for _ in range(total // len(piece)):
        header = struct.pack("!BBHII", 0, 0, 0, muxed.stream_id, len(piece))
        await muxed.conn._write_frame(header + piece)


async def test_a_peer_that_overruns_its_window_is_not_buffered() -> None:
    """py-libp2p's yamux only logs a peer that sends past its receive window and keeps appending: after its
    request was answered (or while it is being read), an attacker kept writing 16 MiB on a stream nobody
    reads and the server held all of it. Now a stream this node is done with drops what still arrives, and
    a window overrun closes the stream for receiving; the connection keeps serving."""
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(P2PNode(private_key=_key()))
        attacker = await stack.enter_async_context(P2PNode(private_key=_key()))

        async def echo(request: bytes, sender: str) -> bytes:
            return b"ok " + request

        server.set_handler(PROTO, echo, read_timeout=5.0)
        await attacker.connect(server.listen_addrs[0])
        host = attacker._require_host()
        conn = next(iter(server._require_host().get_network().get_connections()))  # type: ignore[attr-defined]
        muxed_server = conn.muxed_conn

        def buffered() -> int:
            return sum(len(b) for b in muxed_server.stream_buffers.values())

        # 1. after its answer
        s = await host.new_stream(server.peer_id, [TProtocol(PROTO)])
        await s.write(struct.pack(">I", 2) + b"hi")
        with trio.fail_after(5):
            assert await s.read(1024) == b"\x00" + struct.pack(">I", 5) + b"ok hi"
        await _overrun(s, 16 << 20)
        await trio.sleep(0.5)
        after_answer = buffered()

        # 2. in the middle of its request: a 60 KiB frame announced, 16 MiB sent at once
        s2 = await host.new_stream(server.peer_id, [TProtocol(PROTO)])
        await s2.write(struct.pack(">I", 60_000))
        await _overrun(s2, 16 << 20)
        await trio.sleep(0.5)
        mid_request = buffered()
        print(f"\n[overrun] buffered after 16 MiB past the answer: {after_answer} B, mid-request: {mid_request} B")
        assert after_answer < 1 << 20
        assert mid_request < 1 << 20
        assert await attacker.request(server.peer_id, PROTO, b"again", timeout=5) == b"ok again"


async def test_outsiders_cannot_crowd_a_member_out() -> None:
    """32 outsider identities on two addresses of one /24 announce 64 KiB requests, 16 each, and stall
    after the length prefix: 32 MiB reserved, the whole network's budget (`MAX_REQUEST_BYTES_PER_NETWORK`).
    Another outsider of that network is told "busy"; a pool member on the same network is served, its
    requests drawing on the members' budget."""
    from node.p2p.host import MAX_REQUEST_BYTES_PER_NETWORK, SMALL_REQUEST

    async with AsyncExitStack() as stack:
        member_key, outsider_key = _key(), _key()
        member_address = P2PNode(private_key=member_key).address
        server = await stack.enter_async_context(P2PNode(private_key=_key(), is_member=lambda a: a == member_address))

        async def echo(request: bytes, sender: str) -> bytes:
            return b"ok " + request

        server.set_handler(PROTO, echo, read_timeout=20.0, timeout=30.0)
        addr = server.listen_addrs[0]
        attackers = []
        for i in range(32):
            a = await stack.enter_async_context(P2PNode(private_key=_key()))
            _dial_from(a, f"127.0.1.{1 + i % 2}")
            await a.connect(addr)
            attackers.append(a)
        member = await stack.enter_async_context(P2PNode(private_key=member_key))
        outsider = await stack.enter_async_context(P2PNode(private_key=outsider_key))
        for node in (member, outsider):
            _dial_from(node, "127.0.1.3")
            await node.connect(addr)

        held = []
        for a in attackers:
            for _ in range(MAX_STREAMS_PER_PEER):
                st = await a._require_host().new_stream(server.peer_id, [TProtocol(PROTO)])
                await st.write(struct.pack(">I", SMALL_REQUEST))  # the prefix, then nothing
                held.append(st)
        with trio.fail_after(10):
            while server._request_bytes.get("net:127.0.1.0/24", 0) + SMALL_REQUEST <= MAX_REQUEST_BYTES_PER_NETWORK:
                await trio.sleep(0.1)
        with pytest.raises(P2PError, match="busy"):
            await outsider.request(server.peer_id, PROTO, b"me too", timeout=5)
        assert await member.request(server.peer_id, PROTO, b"member", timeout=5) == b"ok member"
