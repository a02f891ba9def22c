"""The gossip wire shortcuts (issue 36, finding 7): RPCs queued for one peer are merged in order and
only when they carry nothing but messages, and pubsub RPCs are cut from a per-stream read buffer with
the same bounds as the library's byte-at-a-time reader."""

from __future__ import annotations

import pytest
import trio
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_uvarint

from node.p2p.gossip import GateScorer, coalesce
from node.p2p.patches import TCP_READ_AHEAD, read_ahead, read_varint_prefixed_buffered


def publish_rpc(*bodies: bytes) -> rpc_pb2.RPC:
    rpc = rpc_pb2.RPC()
    for body in bodies:
        msg = rpc.publish.add()
        msg.data = body
        msg.topicIDs.append("t")
    rpc.senderRecord = b"record"
    return rpc


def control_rpc() -> rpc_pb2.RPC:
    rpc = rpc_pb2.RPC()
    rpc.control.graft.add().topicID = "t"
    return rpc


def taker(items: list[rpc_pb2.RPC]):  # type: ignore[no-untyped-def]
    return lambda: items.pop(0) if items else None


def bodies(rpc: rpc_pb2.RPC) -> list[bytes]:
    return [m.data for m in rpc.publish]


def test_queued_messages_go_out_as_one_rpc_in_order() -> None:
    queued = [publish_rpc(b"b"), publish_rpc(b"c", b"d")]
    out, pending = coalesce(publish_rpc(b"a"), taker(queued))
    assert bodies(out) == [b"a", b"b", b"c", b"d"]
    assert pending is None and not queued
    assert out.senderRecord == b"record"


def test_control_is_never_merged_and_keeps_its_place() -> None:
    graft = control_rpc()
    queued = [publish_rpc(b"b"), graft, publish_rpc(b"c")]
    out, pending = coalesce(publish_rpc(b"a"), taker(queued))
    assert bodies(out) == [b"a", b"b"]
    assert pending is graft  # sent next, before "c"
    assert bodies(queued[0]) == [b"c"]
    # an RPC that carries control goes out alone
    first = control_rpc()
    out, pending = coalesce(first, taker([publish_rpc(b"x")]))
    assert out is first and pending is None


def test_merged_rpc_stays_within_its_bound() -> None:
    queued = [publish_rpc(bytes(400)) for _ in range(10)]
    out, pending = coalesce(publish_rpc(bytes(400)), taker(queued), max_bytes=2000)
    assert out.ByteSize() <= 2000
    assert 1 < len(out.publish) < 11
    assert pending is not None and len(out.publish) + 1 + len(queued) == 11  # nothing lost
    # a message larger than the bound is sent, alone
    rest = [publish_rpc(b"x")]
    out, pending = coalesce(publish_rpc(bytes(5000)), taker(rest), max_bytes=2000)
    assert bodies(out) == [bytes(5000)] and pending is None and bodies(rest[0]) == [b"x"]


class ChunkReader:
    """A stream handing out the given bytes in the given chunk sizes, then EOF (b"")."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data = data
        self.sizes = sizes
        self.reads = 0

    async def read(self, n: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        self.reads += 1
        size = self.sizes.pop(0) if self.sizes else len(self.data)
        size = min(size, n or len(self.data))
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


def frames(*payloads: bytes) -> bytes:
    return b"".join(encode_uvarint(len(p)) + p for p in payloads)


@pytest.mark.parametrize("sizes", [[1] * 400, [7, 300, 2], [10_000], [2, 1, 1, 150, 3]])
async def test_buffered_reader_cuts_the_same_rpcs_from_any_chunking(sizes: list[int]) -> None:
    payloads = [b"x" * 200, b"", b"y", b"z" * 130]
    reader = ChunkReader(frames(*payloads), list(sizes))
    got = [await read_varint_prefixed_buffered(reader, 1000) for _ in payloads]
    assert got == payloads
    with pytest.raises(IncompleteReadError):
        await read_varint_prefixed_buffered(reader, 1000)


async def test_rpcs_that_arrived_together_take_one_read() -> None:
    payloads = [bytes([i]) * 50 for i in range(20)]
    reader = ChunkReader(frames(*payloads), [])
    got = [await read_varint_prefixed_buffered(reader, 1000) for _ in payloads]
    assert got == payloads and reader.reads == 1


async def test_buffered_reader_keeps_the_bounds() -> None:
    # a length over the limit is refused before its body is read
    reader = ChunkReader(encode_uvarint(5000) + bytes(10), [len(encode_uvarint(5000))])
    with pytest.raises(MessageTooLarge):
        await read_varint_prefixed_buffered(reader, 4096)
    assert reader.data == bytes(10)
    # a prefix longer than 10 bytes is garbage
    with pytest.raises(ParseError):
        await read_varint_prefixed_buffered(ChunkReader(b"\xff" * 11, [1] * 11), 4096)
    # the stream ending inside a body
    with pytest.raises(IncompleteReadError):
        await read_varint_prefixed_buffered(ChunkReader(encode_uvarint(100) + bytes(40), []), 4096)


async def test_a_tasks_parent_is_remembered_and_still_right() -> None:
    """The service manager's parent lookup (walked the whole task tree per task started) is cached per
    trio task: tasks started from one task are its children, as with the walk, and a finished task's
    entry is never used."""
    from libp2p.tools.anyio_service import Service, background_trio_service

    from node.p2p import patches_pubsub as patches

    seen: dict[str, object] = {}

    class Spawner(Service):
        async def run(self) -> None:
            self.manager.run_task(self.parent)
            await trio.sleep_forever()

        async def parent(self) -> None:
            me = trio.lowlevel.current_task()
            for _ in range(3):
                self.manager.run_task(trio.sleep, 0.05)
            walked = patches._original_find_parent(self.manager, me)
            seen["walked"] = walked
            seen["cached"] = patches._find_parent_task_cached(self.manager, me)
            seen["children"] = len(walked.children)  # type: ignore[attr-defined]
            await trio.sleep(0.1)
            seen["done"] = True

    service = Spawner()
    async with background_trio_service(service) as manager:
        with trio.fail_after(5):
            while "done" not in seen:
                await trio.sleep(0.01)
        assert seen["walked"] is not None and seen["cached"] is seen["walked"]
        assert seen["children"] == 3
        await trio.sleep(0.05)
        parent = seen["walked"]
        assert parent.is_done  # type: ignore[attr-defined]
        # a trio task that runs none of the manager's tasks (pubsub's readers run in the swarm's stream
        # handlers): no parent, and the answer is remembered instead of walking the tree per message
        here = trio.lowlevel.current_task()
        assert patches._find_parent_task_cached(manager, here) is None
        walks = 0
        original = patches._original_find_parent

        def counting(self: object, trio_task: object) -> object:
            nonlocal walks
            walks += 1
            return original(self, trio_task)

        patches._original_find_parent = counting
        try:
            for _ in range(3):
                assert patches._find_parent_task_cached(manager, here) is None
        finally:
            patches._original_find_parent = original
        assert walks == 0
        assert not parent.is_done or patches._find_parent_task_cached(manager, here) is not parent
        manager.cancel()


def test_validation_cache_keeps_refusals_in_lru_order_within_ttl_and_never_answers_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from libp2p.pubsub.pubsub import ValidationResult

    from node.p2p import gossip_wire

    now = [1000.0]
    monkeypatch.setattr(gossip_wire.time, "time", lambda: now[0])
    cache = gossip_wire.ValidationCache(ttl=10, max_size=3)
    for i in range(3):
        cache.put(b"%d" % i, ValidationResult(False, now[0], f"bad {i}"))
    assert cache.get(b"0") is not None  # a hit becomes the newest ...
    cache.put(b"3", ValidationResult(False, now[0], "bad"))
    assert cache.get(b"1") is None  # ... so the full cache dropped "1", the oldest
    assert [cache.get(k) is not None for k in (b"0", b"2", b"3")] == [True, True, True]
    assert cache.get(b"3") == ValidationResult(False, 1000.0, "bad")
    cache.put(b"3", ValidationResult(True, now[0]))  # a put of a known id replaces it, no eviction ...
    assert len(cache.cache) == 3 and cache.get(b"3") is None  # ... and "valid" is never taken on trust
    now[0] += 11
    assert cache.get(b"0") is None and b"0" not in cache.cache  # expired on read
    cache.put(b"4", ValidationResult(False, now[0], "bad"))
    cache.clear_expired()
    assert list(cache.cache) == [b"4"]


def test_gate_scorer_passes_without_scoring_at_minus_infinity_and_scores_otherwise() -> None:
    """With the library's thresholds (minus infinity) the gates pass without computing a score, even for a
    peer with invalid messages on record; with a finite threshold that peer is refused as before."""
    import math

    from libp2p.peer.id import ID
    from libp2p.pubsub.score import ScoreParams, TopicScoreParams

    peer = ID(b"\x00\x25" + bytes(37))
    params = ScoreParams(p4_invalid_messages=TopicScoreParams(weight=10.0, cap=100.0, decay=1.0))
    assert params.publish_threshold == params.gossip_threshold == params.graylist_threshold == -math.inf
    lax = GateScorer(params)
    for _ in range(5):
        lax.on_invalid_message(peer, "t")
    lax.topic_score = None  # type: ignore[assignment,method-assign]  # a gate that scored would fail here
    assert lax.allow_publish(peer, ["t"]) and lax.allow_gossip(peer, ["t"]) and not lax.is_graylisted(peer, ["t"])
    assert not lax.allow_publish(peer, [])  # the library's answer for no topic stays

    strict = GateScorer(
        ScoreParams(
            p4_invalid_messages=TopicScoreParams(weight=10.0, cap=100.0, decay=1.0),
            publish_threshold=0.0,
            gossip_threshold=-1.0,
            graylist_threshold=-10.0,
        )
    )
    assert strict.allow_publish(peer, ["t"]) and not strict.is_graylisted(peer, ["t"])
    for _ in range(5):
        strict.on_invalid_message(peer, "t")
    assert not strict.allow_publish(peer, ["t"])
    assert not strict.allow_gossip(peer, ["t"])
    assert strict.is_graylisted(peer, ["t"])


async def _tcp_pair() -> tuple[object, trio.SocketStream]:
    """A `TrioTCPStream` (patched read) over one end of a real socket pair, and the raw other end."""
    from libp2p.io.trio import TrioTCPStream

    a, b = trio.socket.socketpair()
    return TrioTCPStream(trio.SocketStream(a)), trio.SocketStream(b)


async def test_tcp_read_ahead_serves_small_reads_from_one_recv() -> None:
    stream, peer = await _tcp_pair()
    data = bytes(range(256)) * 40  # 10 KiB: under one read-ahead chunk
    await peer.send_all(data)
    await trio.sleep(0.05)
    got = [await stream.read(2)]  # type: ignore[attr-defined]
    assert len(stream._read_ahead) == len(data) - 2  # type: ignore[attr-defined]  # one recv took it all
    while sum(map(len, got)) < len(data):
        got.append(await stream.read(100))  # type: ignore[attr-defined]
    assert b"".join(got) == data and all(len(c) <= 100 for c in got[1:])
    assert not stream._read_ahead  # type: ignore[attr-defined]
    await peer.send_all(b"abc")
    assert await stream.read(10) == b"abc"  # a short read, as recv gives
    big = b"q" * (3 * TCP_READ_AHEAD)
    await peer.send_all(big)
    await trio.sleep(0.05)
    first = await stream.read(len(big))  # type: ignore[attr-defined]  # larger than a chunk: passes through
    rest = b""
    while len(first) + len(rest) < len(big):
        rest += await stream.read(len(big))  # type: ignore[attr-defined]
    assert first + rest == big
    await peer.aclose()
    assert await stream.read(5) == b""  # type: ignore[attr-defined]  # EOF


async def test_tcp_read_ahead_keeps_a_cancellation() -> None:
    stream, peer = await _tcp_pair()
    await peer.send_all(b"0123456789")
    assert await stream.read(1) == b"0"  # type: ignore[attr-defined]
    with trio.CancelScope() as scope:
        scope.cancel()
        await stream.read(1)  # type: ignore[attr-defined]  # buffered, but the cancellation lands
    assert scope.cancelled_caught
    assert await stream.read(100) == b"123456789"  # type: ignore[attr-defined]  # nothing lost to it
    assert read_ahead is type(stream).read


def _router() -> object:
    from libp2p.pubsub.gossipsub import PROTOCOL_ID

    from node.p2p.gossip import CountingGossipSub

    return CountingGossipSub(protocols=[PROTOCOL_ID], degree=6, degree_low=4, degree_high=12)


async def test_send_rpc_queues_each_peer_its_own_copy_and_splits_what_does_not_fit() -> None:
    """The fast path queues a copy per peer (the writer merges into queued RPCs: a shared object would
    carry one peer's merge to the other); an RPC over the queue's message size still takes the
    library's split; control waiting for a retry still rides along."""
    from types import SimpleNamespace

    from libp2p.peer.id import ID
    from libp2p.pubsub.rpc_queue import RpcQueue

    router = _router()
    p1, p2 = ID(b"\x00\x25" + bytes(37)), ID(b"\x00\x25" + bytes([1]) * 37)
    queues = {p1: RpcQueue(max_message_size=1000), p2: RpcQueue(max_message_size=1000)}
    router.pubsub = SimpleNamespace(peer_queues=queues)  # type: ignore[attr-defined]
    rpc = publish_rpc(b"a" * 100)
    router.send_rpc(p1, rpc)  # type: ignore[attr-defined]
    router.send_rpc(p2, rpc)  # type: ignore[attr-defined]
    q1, q2 = queues[p1]._queue.pop(), queues[p2]._queue.pop()
    assert q1 == rpc and q2 == rpc and q1 is not rpc and q2 is not rpc and q1 is not q2
    q1.publish.add().data = b"merged"
    assert bodies(q2) == [b"a" * 100] and bodies(rpc) == [b"a" * 100]

    big = publish_rpc(*(bytes([i]) * 300 for i in range(6)))  # 1.8 KB: over the 1000-byte parts
    router.send_rpc(p1, big)  # type: ignore[attr-defined]
    parts = []
    while (part := queues[p1]._queue.pop()) is not None:
        parts.append(part)
    assert len(parts) > 1 and all(p.ByteSize() <= 1000 for p in parts)
    assert [m for p in parts for m in bodies(p)] == bodies(big)

    router._pending_control[p2].graft.add().topicID = "t"  # type: ignore[attr-defined]
    router.mesh["t"] = {p2}  # type: ignore[attr-defined]  # a graft is retried only while the peer is in the mesh
    router.send_rpc(p2, rpc)  # type: ignore[attr-defined]
    sent = []
    while (part := queues[p2]._queue.pop()) is not None:
        sent.append(part)
    assert [m for p in sent for m in bodies(p)] == [b"a" * 100]
    assert [g.topicID for p in sent for g in p.control.graft] == ["t"]
    assert p2 not in router._pending_control  # type: ignore[attr-defined]


def test_spam_protection_allows_the_limit_per_second_then_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    import time as time_module

    from libp2p.peer.id import ID

    router = _router()
    router.max_messages_per_topic_per_second = 3  # type: ignore[attr-defined]
    peer = ID(b"\x00\x25" + bytes(37))
    msg = publish_rpc(b"x").publish[0]
    clock = [1000.0]
    monkeypatch.setattr(time_module, "time", lambda: clock[0])
    assert [router._check_spam_protection(peer, msg) for _ in range(4)] == [True, True, True, False]  # type: ignore[attr-defined]
    clock[0] += 0.9
    assert not router._check_spam_protection(peer, msg)  # type: ignore[attr-defined]  # still the same second
    clock[0] += 0.2
    assert router._check_spam_protection(peer, msg)  # type: ignore[attr-defined]  # the first three expired
    assert len(router.message_rate_limits[peer]["t"]) == 1  # type: ignore[attr-defined]


def test_gossip_signature_check_with_cached_author_keys() -> None:
    """Same answers as the library's check: a valid signature passes (also from the cached key), a changed
    body, another author's signature, or none at all fail."""
    from libp2p.crypto.secp256k1 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX, signature_validator

    from node.p2p.patches import _check_gossip_signature

    def signed(pair: object, author: bytes, data: bytes) -> rpc_pb2.Message:
        msg = rpc_pb2.Message(data=data, topicIDs=["t"], from_id=author, seqno=b"\x00" * 7 + b"\x01")
        msg.signature = pair.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())  # type: ignore[attr-defined]
        return msg

    alice, mallory = create_new_key_pair(), create_new_key_pair()
    author = ID.from_pubkey(alice.public_key).to_bytes()
    good = signed(alice, author, b"hello")
    tampered = rpc_pb2.Message()
    tampered.CopyFrom(good)
    tampered.data = b"hellO"
    forged = signed(mallory, author, b"hello")
    unsigned = rpc_pb2.Message(data=b"hello", topicIDs=["t"], from_id=author, seqno=good.seqno)
    for msg, ok in [(good, True), (good, True), (tampered, False), (forged, False), (unsigned, False)]:
        assert _check_gossip_signature(msg) is ok
        assert bool(signature_validator(msg)) is ok


def test_copies_a_peer_sent_us_are_not_sent_back_to_it() -> None:
    """`drop_known` removes from a queued RPC the messages its peer already sent us (by message id) and
    leaves the rest, in order, and control as it was; `RecentIds` keeps the newest ids only."""
    from node.p2p.gossip import RecentIds, drop_known

    def mid(m: rpc_pb2.Message) -> bytes:
        return m.data[:1]

    rpc = publish_rpc(b"a1", b"b1", b"c1")
    rpc.control.graft.add().topicID = "t"
    known = RecentIds(limit=2)
    for msg_id in (b"z", b"b", b"c"):  # "z" falls out: the limit is 2
        known.add(msg_id)
    assert b"z" not in known and b"b" in known and len(known) == 2
    assert drop_known(rpc, known, mid) == 2
    assert bodies(rpc) == [b"a1"] and [g.topicID for g in rpc.control.graft] == ["t"]
    assert drop_known(rpc, known, mid) == 0 and bodies(rpc) == [b"a1"]
