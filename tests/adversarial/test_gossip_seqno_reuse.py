"""A member re-signs other bytes under the id of a message it sent earlier (issue 36, found in review).

GossipSub names a message by its author and seqno. py-libp2p forgets a message id after 120 s (the seen
cache) but kept the validator's "valid" answer for that id for 300 s, and answered from it without
running the validator. So a member could, between the two, send new bytes under an old seqno, signed
with its own libp2p key (the transport signature is then valid), and a node delivered them unchecked:
here an envelope that claims to be the coordinator's task, which the envelope check refuses. Now a
cached "valid" is never taken on trust: each new message is validated (a cached refusal still saves the
work). The seen cache's expiry is simulated by clearing it."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio
from eth_account import Account
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX

from node.p2p.envelope import Envelope, RejectReason, encode, seal
from node.p2p.network import PoolNetwork, pool_topic
from node.p2p.rules import Membership

POOL = 5


def _forget_seen(net: PoolNetwork) -> None:
    seen = net.node._pubsub.seen_messages  # type: ignore[union-attr]
    with seen.lock:
        seen.cache.clear()


async def test_a_reused_seqno_with_other_bytes_is_validated_again() -> None:
    keys = [bytes(Account.create().key) for _ in range(3)]
    coordinator, member, victim = (Account.from_key(k) for k in keys)
    snapshot = Membership(
        pool=POOL,
        coordinator=coordinator.address,
        validators=frozenset(),
        members=frozenset({member.address, victim.address}),
    )
    tasks: list[Envelope] = []
    beats: list[Envelope] = []

    async def collect(chan: trio.MemoryReceiveChannel[Envelope], out: list[Envelope]) -> None:
        async for env in chan:
            out.append(env)

    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        b = await stack.enter_async_context(PoolNetwork(private_key=keys[1], pool=POOL, membership=lambda: snapshot))
        c = await stack.enter_async_context(PoolNetwork(private_key=keys[2], pool=POOL, membership=lambda: snapshot))
        nursery.start_soon(collect, c.subscribe("task"), tasks)
        nursery.start_soon(collect, c.subscribe("heartbeat"), beats)
        await c.connect(b.listen_addrs[0])
        for net in (b, c):
            for topic in net.topics.values():
                await net.node.wait_for_mesh(topic, 1, timeout=10)

        await b.publish("heartbeat", b"honest")
        with trio.fail_after(5):
            while not beats:
                await trio.sleep(0.01)
        pubsub = b.node._pubsub
        assert pubsub is not None
        seqno = pubsub.counter.to_bytes(8, "big")  # the seqno of the heartbeat just sent
        _forget_seen(c)  # as 120 s later

        # New bytes under the old id: a task "from the coordinator", signed by the member's own key.
        forged = seal(member, kind="task", pool=POOL, seq=b.next_seq(), time=c.clock(), body=b"do my bidding")
        forged = Envelope(
            *(coordinator.address if f == "sender" else getattr(forged, f) for f in Envelope.__dataclass_fields__)
        )
        msg = rpc_pb2.Message(
            from_id=b.node.peer_id.to_bytes(), seqno=seqno, data=encode(forged), topicIDs=[pool_topic(POOL, "task")]
        )
        msg.signature = pubsub.sign_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
        msg.key = pubsub.host.get_public_key().serialize()
        b.node._gossipsub.send_rpc(c.node.peer_id, rpc_pb2.RPC(publish=[msg]))  # type: ignore[union-attr]

        with trio.fail_after(5):
            while not c.rejected[RejectReason.BAD_SIGNATURE] and not tasks:
                await trio.sleep(0.01)
        await trio.sleep(0.3)
        assert tasks == [], "a forged task was delivered without the envelope check"
        assert c.rejected[RejectReason.BAD_SIGNATURE] == 1
        assert c.node.bad_signatures == 0  # the transport signature was valid: the envelope check refused it
        nursery.cancel_scope.cancel()
