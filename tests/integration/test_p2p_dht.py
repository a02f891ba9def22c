"""Kademlia DHT discovery with real hosts on 127.0.0.1: B and C only know A, and find each other."""

from __future__ import annotations

import time

import pytest
import trio

from node.p2p.host import P2PError, P2PNode

FIND_WITHIN_S = 15.0


async def _until_connected(x: P2PNode, y: P2PNode, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while not (y.peer_id in x.peers and x.peer_id in y.peers):
            await trio.sleep(0.05)
        return True
    return False


async def test_nodes_that_only_know_a_bootstrap_peer_find_each_other_through_the_dht() -> None:
    async with P2PNode(private_key=b"\x21" * 32, dht=True, dht_interval=2.0) as a:
        boot = a.listen_addrs
        async with (
            P2PNode(private_key=b"\x22" * 32, bootstrap=boot, dht=True, dht_interval=2.0) as b,
            P2PNode(private_key=b"\x23" * 32, bootstrap=boot, dht=True, dht_interval=2.0) as c,
        ):
            t0 = time.monotonic()
            assert await _until_connected(b, c, FIND_WITHIN_S), (b.peers, c.peers)
            elapsed = time.monotonic() - t0
            assert elapsed < FIND_WITHIN_S
            # C learnt B's dialable address (from A's FIND_NODE answer), and B sits in C's routing table.
            assert any(
                str(addr).startswith("/ip4/127.0.0.1/tcp/")
                for addr in c._require_host().get_peerstore().addrs(b.peer_id)
            )
            with trio.fail_after(FIND_WITHIN_S):
                while b.peer_id not in c.dht_routing_table_peers:
                    await c.dht_round()
                    await trio.sleep(0.05)
            assert set(a.dht_routing_table_peers) >= {b.peer_id, c.peer_id}
            # A round is bounded and, with everyone connected, connects nobody new.
            with trio.fail_after(15.0):
                assert await c.dht_round() == 0


async def test_without_the_dht_bootstrap_only_peers_stay_apart() -> None:
    async with P2PNode(private_key=b"\x24" * 32) as a:
        boot = a.listen_addrs
        async with (
            P2PNode(private_key=b"\x25" * 32, bootstrap=boot) as b,
            P2PNode(private_key=b"\x26" * 32, bootstrap=boot) as c,
        ):
            with trio.fail_after(10.0):
                while a.peer_id not in b.peers or a.peer_id not in c.peers:
                    await trio.sleep(0.05)
            assert not await _until_connected(b, c, 2.0)
            assert b.dht_routing_table_peers == []
            with pytest.raises(P2PError, match="dht=True"):
                await b.dht_round()


async def test_discovery_respects_the_connection_cap() -> None:
    """Same layout as the first test, but B and C may hold one connection each (to A): no lookups, no dials."""
    async with P2PNode(private_key=b"\x27" * 32, dht=True, dht_interval=0.5) as a:
        boot = a.listen_addrs
        async with (
            P2PNode(private_key=b"\x28" * 32, bootstrap=boot, dht=True, dht_interval=0.5, dht_max_peers=1) as b,
            P2PNode(private_key=b"\x29" * 32, bootstrap=boot, dht=True, dht_interval=0.5, dht_max_peers=1) as c,
        ):
            with trio.fail_after(10.0):
                while a.peer_id not in b.peers or a.peer_id not in c.peers:
                    await trio.sleep(0.05)
            assert not await _until_connected(b, c, 3.0)  # several loop rounds on both sides
            assert await c.dht_round() == 0
    with pytest.raises(ValueError):
        P2PNode(private_key=b"\x2a" * 32, dht=True, dht_max_peers=0)
