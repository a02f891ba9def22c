"""Request-response handlers against a peer that abuses frames (real libp2p hosts on 127.0.0.1): a 4 MiB
length prefix on a protocol that takes 64 KiB is refused from the prefix alone, before any body is
buffered; stalled half-sent requests are cut off after the read deadline; one peer holds at most
`MAX_STREAMS_PER_PEER` requests in progress; an honest peer is served all along."""

from __future__ import annotations

import struct
import time
from contextlib import AsyncExitStack, suppress

import trio
from eth_account import Account
from libp2p.custom_types import TProtocol

from node.p2p.host import MAX_STREAMS_PER_PEER, P2PNode

PROTO = "/intellect/test-small/1"


def _key() -> bytes:
    return bytes(Account.create().key)


async def test_oversized_stalled_and_too_many_requests_are_bounded() -> None:
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
