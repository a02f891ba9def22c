"""A peer forwards gossip whose libp2p signature is wrong (a forged author, or garbage). The library drops
such a message before any topic validator runs, so our checks never saw it: it was never charged, and
each copy cost a signature check. Now the node checks signatures first and charges the forwarding peer
(the author field of a forged message cannot be trusted); a few forgeries get it banned, after which its
gossip is dropped unread. An honest member's messages keep arriving. Real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.pubsub.pb import rpc_pb2

from node.p2p.envelope import Envelope, RejectReason
from tests.adversarial.test_gossip_flood import _collect, pool_of

POOL = 11
FORGED = 40


def _forged(topic: str, author: bytes, seq: int, data: bytes) -> rpc_pb2.Message:
    """A message claiming `author` but signed with a random key."""
    msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=author, seqno=seq.to_bytes(8, "big"))
    wrong = create_new_key_pair()
    msg.signature = wrong.private_key.sign(b"libp2p-pubsub:" + msg.SerializeToString())
    msg.key = wrong.public_key.serialize()
    return msg


async def test_forged_gossip_is_charged_to_its_forwarder_and_gets_it_banned() -> None:
    got: list[Envelope] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        nets = await pool_of(stack, POOL, ("forger", "honest"))
        coord, forger, honest = nets["coord"], nets["forger"], nets["honest"]
        nursery.start_soon(_collect, coord.subscribe("heartbeat"), got)
        await forger.connect(coord.listen_addrs[0])
        await honest.connect(coord.listen_addrs[0])
        for net in (forger, honest):
            await net.wait_for_peers(1)
            await net.node.wait_for_mesh(net.topics["heartbeat"], 1, 10.0)

        topic = coord.topics["heartbeat"]
        router = forger.node._gossipsub
        assert router is not None
        honest_id = honest.node.peer_id.to_bytes()  # the forgeries claim to come from the honest member
        for i in range(FORGED):
            try:
                await router.publish(forger.node.peer_id, _forged(topic, honest_id, 10**6 + i, b"forged %d" % i))
            except Exception:
                break  # banned and disconnected: nothing to send to
            await trio.sleep(0.01)

        with trio.fail_after(10):
            while not coord.node.is_banned(forger.address):
                await trio.sleep(0.05)
        await honest.publish("heartbeat", b"still here")
        with trio.fail_after(10):
            while not any(e.body == b"still here" for e in got):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()

    print(f"\n[forged] bad signatures seen {coord.node.bad_signatures}, dropped unread {coord.node.dropped_banned}")
    assert coord.score.rejections(forger.address).get(RejectReason.BAD_SIGNATURE, 0) >= 2
    assert coord.node.rejections[forger.address] >= 2
    assert coord.score.rejections(honest.address) == {}  # the claimed author is not charged
    assert not any(e.body.startswith(b"forged") for e in got)
