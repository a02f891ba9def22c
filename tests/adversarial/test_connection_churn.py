"""Connection churn against a real libp2p host on 127.0.0.1: hundreds of connect/close cycles from fresh
identities (each a new libp2p host with a new key: an attacker, or workers restarting). py-libp2p 0.8.1
kept an inbound slot, a handler task and the socket object of every connection until the host stopped,
so after 250 connections in total every new peer was refused. With `node.p2p.patches` the slots come
back as connections close and a new honest peer is served. (Run with INTELLECT_LIBP2P_UNPATCHED=1 to see
the library's behaviour: the last step fails.)"""

from __future__ import annotations

import contextlib
import time
from contextlib import AsyncExitStack

import pytest
import trio
from eth_account import Account

from bench.churn import fresh_peer_cycle
from node.p2p.host import P2PNode

CYCLES = 1000  # four times the library's 250 inbound slots
DIALERS = 20  # fresh identities dialing at once, each connect / close / next identity


async def test_inbound_slots_come_back_after_hundreds_of_fresh_peers() -> None:
    async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as server:

        async def echo(request: bytes, sender: str) -> bytes:
            return b"served " + request

        server.set_handler("/intellect/test-echo/1", echo)
        addr = server.listen_addrs[0]
        limiter = server._host.get_network()._inbound_limiter  # type: ignore[union-attr]
        failures = 0
        started = time.monotonic()

        async def dialer(n: int) -> None:
            nonlocal failures
            for _ in range(n):
                try:
                    await fresh_peer_cycle(addr)
                except Exception:
                    failures += 1

        async with trio.open_nursery() as nursery:
            for _ in range(DIALERS):
                nursery.start_soon(dialer, CYCLES // DIALERS)
        took = time.monotonic() - started
        with trio.fail_after(20):  # every closed connection gives its slot back
            while limiter.borrowed_tokens > 0:
                await trio.sleep(0.1)
        print(
            f"\n[churn] {CYCLES} fresh peers in {took:.1f} s, {failures} failed; slots in use {limiter.borrowed_tokens}"
        )
        assert failures == 0

        async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as honest:
            with trio.fail_after(20):
                await honest.connect(addr)
                assert await honest.request(addr, "/intellect/test-echo/1", b"hello", timeout=10) == b"served hello"


async def test_a_connection_flood_from_one_address_leaves_room_for_others() -> None:
    """300 TCP connections from 127.0.0.2 that never finish their handshake (each would hold an inbound
    slot for the 10 s upgrade timeout: the library has 250) are capped at `MAX_INBOUND_PER_IP`; an honest
    peer from 127.0.0.1 connects and is served meanwhile."""
    import socket

    from node.p2p.patches import MAX_INBOUND_PER_IP

    async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as server:

        async def echo(request: bytes, sender: str) -> bytes:
            return b"served " + request

        server.set_handler("/intellect/test-echo/1", echo)
        addr = server.listen_addrs[0]
        port = int(addr.split("/tcp/")[1].split("/")[0])
        held = []
        for _ in range(300):
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            await sock.bind(("127.0.0.2", 0))
            try:
                await sock.connect(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        await trio.sleep(0.5)
        limiter = server._host.get_network()._inbound_limiter  # type: ignore[union-attr]
        assert limiter.borrowed_tokens <= MAX_INBOUND_PER_IP + 2
        async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as honest:
            with trio.fail_after(8):  # inside the flood's 10 s
                await honest.connect(addr)
                assert await honest.request(addr, "/intellect/test-echo/1", b"hi", timeout=5) == b"served hi"
        for sock in held:
            sock.close()


async def _raw_connections(
    port: int, source_ips: list[str], per_ip: int, *, hold: bool
) -> list[trio.socket.SocketType]:
    """TCP connections to `port` that never start a handshake: held open, or closed at once."""
    import socket

    held = []
    for ip in source_ips:
        for _ in range(per_ip):
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            await sock.bind((ip, 0))
            try:
                await sock.connect(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            if hold:
                held.append(sock)
            else:
                sock.close()
    return held


async def _served(addr: str) -> bool:
    async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as honest:
        with trio.fail_after(8):
            await honest.connect(addr)
            return await honest.request(addr, "/intellect/test-echo/1", b"hi", timeout=5) == b"served hi"


async def _echo(request: bytes, sender: str) -> bytes:
    return b"served " + request


async def test_new_connections_from_one_address_are_rate_limited() -> None:
    """1,500 connect-and-close cycles from 127.0.1.1 as fast as it can: past the per-address bucket
    (`NEW_INBOUND_BURST`, refilled at `NEW_INBOUND_PER_SECOND`) they are refused before any handshake
    work; a peer from another address is served."""
    from node.p2p.patches import NEW_INBOUND_BURST

    async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as server:
        server.set_handler("/intellect/test-echo/1", _echo)
        addr = server.listen_addrs[0]
        port = int(addr.split("/tcp/")[1].split("/")[0])
        t = time.monotonic()
        await _raw_connections(port, ["127.0.1.1"], 1500, hold=False)
        took = time.monotonic() - t
        await trio.sleep(0.5)
        refused = server.inbound_refused.get("rate", 0)
        print(f"\n[rate] 1500 connections in {took:.1f} s, {refused} refused by the per-address rate limit")
        assert refused > 0
        assert 1500 - refused <= NEW_INBOUND_BURST + 100 * (took + 1)
        assert await _served(addr)


async def test_a_flood_from_one_network_is_capped_per_network() -> None:
    """Five addresses of one /24 (127.0.1.1-5), 60 handshake-less connections each: under the per-address
    cap each, 300 together, over `MAX_INBOUND_PER_PREFIX`; a peer from another network is served."""
    from node.p2p.patches import MAX_INBOUND_PER_PREFIX

    async with P2PNode(
        private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0", max_connections=1000
    ) as server:
        server.set_handler("/intellect/test-echo/1", _echo)
        addr = server.listen_addrs[0]
        port = int(addr.split("/tcp/")[1].split("/")[0])
        held = await _raw_connections(port, [f"127.0.1.{i}" for i in range(1, 6)], 60, hold=True)
        await trio.sleep(0.5)
        limiter = server._host.get_network()._inbound_limiter  # type: ignore[union-attr]
        assert server.inbound_refused.get("per-network", 0) >= 300 - MAX_INBOUND_PER_PREFIX
        assert limiter.borrowed_tokens <= MAX_INBOUND_PER_PREFIX + 2
        assert await _served(addr)
        for sock in held:
            sock.close()


async def test_one_network_cannot_take_every_slot_of_a_worker() -> None:
    """A worker or validator has 250 inbound slots. Four addresses of one /24, 64 handshake-less
    connections each (each address under the old per-address cap of 64, the network at the old 256),
    took all 250 and locked every peer out, members too (who is a member is known only after the
    handshake). The caps scale with the slots (`inbound_caps`): the network gets a quarter of them, and
    a peer from elsewhere connects and is served."""
    from node.p2p.patches import inbound_caps

    async with P2PNode(private_key=bytes(Account.create().key), listen="/ip4/127.0.0.1/tcp/0") as server:
        server.set_handler("/intellect/test-echo/1", _echo)
        addr = server.listen_addrs[0]
        port = int(addr.split("/tcp/")[1].split("/")[0])
        limiter = server._host.get_network()._inbound_limiter  # type: ignore[union-attr]
        slots = int(limiter.total_tokens)
        per_ip, per_network = inbound_caps(slots)
        assert per_network <= slots // 4 and per_ip <= slots // 8
        held = await _raw_connections(port, [f"127.0.2.{i}" for i in range(1, 5)], 64, hold=True)
        await trio.sleep(0.5)
        assert limiter.borrowed_tokens <= per_network + 2, (limiter.borrowed_tokens, slots)
        assert server.inbound_refused.get("per-ip", 0) + server.inbound_refused.get("per-network", 0) > 0
        assert await _served(addr)
        for sock in held:
            sock.close()


def test_inbound_caps_and_hosts() -> None:
    from node.p2p.patches import MAX_INBOUND_PER_IP, MAX_INBOUND_PER_PREFIX, host_of, inbound_caps, prefix_of

    assert inbound_caps(250) == (31, 62)
    assert inbound_caps(4046) == (MAX_INBOUND_PER_IP, MAX_INBOUND_PER_PREFIX)  # the coordinator's
    assert inbound_caps(10) == (4, 4)
    assert host_of("10.1.2.3") == "10.1.2.3" and host_of("::ffff:10.1.2.3") == "10.1.2.3"
    assert host_of("2001:db8::1") == host_of("2001:db8::ffff:2") == "2001:db8::/64"  # one host's /64
    assert host_of("2001:db8:0:1::1") != host_of("2001:db8::1")
    assert prefix_of("10.1.2.3") == "10.1.2.0/24" and prefix_of("2001:db8::1") == "2001:db8::/56"


async def test_outsiders_that_connect_and_idle_cannot_take_the_members_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """60 fresh non-member identities connect (a full handshake each) and stay; a node with 200 connections
    takes at most 25 of them (`max_outsider_connections`), and a member still connects and is served.
    Every peer here connects from 127.0.0.1, so the per-address caps (tested above) are set aside."""
    from node.p2p import patches
    from node.p2p.network import PoolNetwork
    from node.p2p.rules import Membership

    monkeypatch.setattr(
        patches, "inbound_caps", lambda slots: (patches.MAX_INBOUND_PER_IP, patches.MAX_INBOUND_PER_PREFIX)
    )

    keys = {n: bytes(Account.create().key) for n in ("coord", "member")}
    addr = {n: Account.from_key(k).address for n, k in keys.items()}
    snapshot = Membership(5, addr["coord"], frozenset(), frozenset({addr["member"]}))
    async with PoolNetwork(
        private_key=keys["coord"], pool=5, membership=lambda: snapshot, max_connections=200
    ) as coord:
        coord.node.set_handler("/intellect/test-echo/1", _echo)
        target = coord.listen_addrs[0]
        assert coord.node.max_outsider_connections == 25
        async with AsyncExitStack() as stack:
            connected = 0
            for _ in range(60):
                out = await stack.enter_async_context(P2PNode(private_key=bytes(Account.create().key)))
                with contextlib.suppress(Exception), trio.fail_after(5):
                    await out.connect(target)
                    connected += 1
            await trio.sleep(0.5)
            print(f"\n[outsiders] {len(coord.node.peers)} of 60 idle outsiders hold a connection")
            assert len(coord.node.peers) <= 25
            assert coord.node.inbound_outsiders_refused >= 60 - 25
            async with P2PNode(private_key=keys["member"]) as member:
                with trio.fail_after(8):
                    await member.connect(target)
                    assert await member.request(target, "/intellect/test-echo/1", b"hi", timeout=5) == b"served hi"
