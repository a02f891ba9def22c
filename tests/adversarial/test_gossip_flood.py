"""A member floods the pool's gossip with validly signed heartbeats (it is a member: everything it
sends passes the signature and role checks). Its per-kind budget caps what the others accept and
forward of it; the other members' heartbeats keep arriving, all of them. Real libp2p hosts on
127.0.0.1, the default budgets."""

from __future__ import annotations

import contextlib
import time
from contextlib import AsyncExitStack

import trio
from eth_account import Account

from node.p2p.envelope import Envelope, RejectReason
from node.p2p.network import PoolNetwork
from node.p2p.rules import DEFAULT_BUDGETS, Membership

POOL = 9
HONEST = 15  # heartbeats of the honest member, one every 0.2 s, while the flood runs


async def _collect(chan: trio.MemoryReceiveChannel[Envelope], out: list[Envelope]) -> None:
    async for env in chan:
        out.append(env)


async def pool_of(stack: AsyncExitStack, pool: int, members: tuple[str, ...]) -> dict[str, PoolNetwork]:
    """A coordinator ("coord") and `members`, each a PoolNetwork with a fresh key on 127.0.0.1, entered on
    `stack`, all with the same membership snapshot; not yet connected."""
    keys = {name: bytes(Account.create().key) for name in ("coord", *members)}
    addr = {name: Account.from_key(k).address for name, k in keys.items()}
    snapshot = Membership(pool, addr["coord"], frozenset(), frozenset(addr[m] for m in members))
    return {
        n: await stack.enter_async_context(PoolNetwork(private_key=k, pool=pool, membership=lambda: snapshot))
        for n, k in keys.items()
    }


async def test_a_flooding_member_cannot_crowd_out_the_others_heartbeats() -> None:
    got: list[Envelope] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        nets = await pool_of(stack, POOL, ("flooder", "honest"))
        coord, flooder, honest = nets["coord"], nets["flooder"], nets["honest"]
        nursery.start_soon(_collect, coord.subscribe("heartbeat"), got)
        await flooder.connect(coord.listen_addrs[0])
        await honest.connect(coord.listen_addrs[0])
        await honest.connect(flooder.listen_addrs[0])
        for net in nets.values():
            await net.wait_for_peers(2)
            await net.node.wait_for_mesh(net.topics["heartbeat"], 2, 10.0)

        sent = 0

        async def flood() -> None:
            nonlocal sent
            while True:
                with contextlib.suppress(Exception):  # once banned, its publishes may fail
                    await flooder.publish("heartbeat", b"me again %d" % sent)
                    sent += 1
                await trio.sleep(0)

        t0 = time.monotonic()
        nursery.start_soon(flood)
        for i in range(HONEST):
            await honest.publish("heartbeat", b"alive %d" % i)
            await trio.sleep(0.2)
        with trio.fail_after(10):
            while sum(1 for e in got if e.sender == honest.address) < HONEST:
                await trio.sleep(0.05)
        elapsed = time.monotonic() - t0
        nursery.cancel_scope.cancel()

    from_honest = [e.body for e in got if e.sender == honest.address]
    from_flooder = sum(1 for e in got if e.sender == flooder.address)
    rate, burst = DEFAULT_BUDGETS["heartbeat"]
    print(f"\n[flood] {sent} flood msgs in {elapsed:.1f} s; coordinator accepted {from_flooder}, all {HONEST} honest")
    assert from_honest == [b"alive %d" % i for i in range(HONEST)]  # every one, in order
    assert sent > 5 * (burst + rate * elapsed)  # it really flooded
    assert from_flooder <= burst + rate * elapsed + 1
    assert coord.rejected[RejectReason.RATE] > 0
    assert coord.score.rejections(flooder.address).get(RejectReason.RATE, 0) > 0
    assert coord.score.rejections(honest.address) == {}  # nothing of the honest member was refused
