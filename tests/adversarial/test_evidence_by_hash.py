"""Evidence documents by hash, over real libp2p hosts on 127.0.0.1.

An accused worker that was offline while a verdict went round on gossip must still get the accuser's
evidence before it decides to appeal: the coordinator keeps what the pool's validators publish and the
accuser keeps its own, and both serve them by the hash on chain (`EVIDENCE_PROTOCOL`). Attacks tried:
a peer that answers with other bytes under the asked hash, a member (not a validator) that tries to
fill the coordinator's disk with documents, an outsider that asks for them, and requests that are not
hashes (a path out of the folder)."""

from __future__ import annotations

import hashlib
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from eth_account import Account

from node import protocol
from node.chain.deployment import Deployment
from node.daemon import fetch_evidence, serve_evidence
from node.evidence import MAX_EVIDENCE_BYTES, MAX_EVIDENCE_PER_KEY, MAX_SERVED_EVIDENCE_BYTES, encode_evidence
from node.p2p.blobs import EVIDENCE_PROTOCOL, BlobStore, fetch_blob
from node.p2p.host import P2PError
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from node.store import write_evidence
from node.worker import Worker, WorkerConfig
from pool.coordinator import Coordinator, CoordinatorConfig

POOL = 7


class _Roles:
    """The pool's on-chain roles as the daemons' membership follower hands them out (a fixed snapshot)."""

    def __init__(self, snapshot: Membership) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> Membership:
        return self._snapshot


def _record(key: str, reason: str = "toploc-mismatch", **extra: Any) -> dict[str, Any]:
    return {
        "work_key": key, "pool": POOL, "ok": False, "verdict": {"reason": reason, "detail": "chunk 3"},
        "samples": [{"group": 0, "sample": 1, "reason": reason}], **extra,
    }  # fmt: skip


def _verdict(key: str, doc: bytes, digest: str) -> bytes:
    return protocol.pack({"work_key": key, "ok": False, "reason": "x", "evidence": digest, "doc": doc})


def _setup(tmp_path: Path) -> tuple[Worker, Coordinator, Any, Any, str]:
    """A worker holding one rollout (key returned), the coordinator that accepted it, the pool's
    validator key and an outsider's; the coordinator's view of the roles is fixed."""
    dep = Deployment(31337, {}, 0)
    w = Worker(WorkerConfig(POOL, tmp_path / "w", "http://127.0.0.1:1", dep), Account.create(), Account.create())
    coord_key, validator, outsider = Account.create(), Account.create(), Account.create()
    c = Coordinator(CoordinatorConfig(POOL, tmp_path / "c", "http://127.0.0.1:1", dep), coord_key)
    c.membership = _Roles(  # type: ignore[assignment]
        Membership(POOL, coord_key.address, frozenset({validator.address}), frozenset({w.node.address}))
    )
    data = b"one of the worker's rollout files"
    key = "0x" + hashlib.sha256(data).hexdigest()
    path = w.cfg.data_dir / "rollouts" / f"{key[2:]}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    w.store.execute(
        "INSERT INTO rollouts(work_key, task_id, path, units, mean_reward, status, created) VALUES(?, ?, ?, ?, ?, ?, ?)",
        (key, "t", str(path), 1, 0.0, "accepted", time.time()),
    )
    c.store.execute(
        "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, mean_reward, "
        "accepted_at) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
        (key, "t", w.node.address, 1, 0, "0x", 0.0, time.time()),
    )
    return w, c, validator, outsider, key


async def test_the_coordinator_keeps_only_its_validators_documents_on_its_own_rollouts(tmp_path: Path) -> None:
    w, c, validator, _, key = _setup(tmp_path)
    doc, digest = encode_evidence(_record(key))
    other_key = "0x" + "44" * 32
    other_doc, other_digest = encode_evidence(_record(other_key))
    big_doc, big_digest = encode_evidence(_record(key, pad="x" * MAX_EVIDENCE_BYTES))
    hostile = {
        # a member is no validator: its "evidence" would cost the coordinator disk for nothing
        "from a member": (w.node.address, _verdict(key, doc, digest)),
        "from the coordinator's own address": (c.key.address, _verdict(key, doc, digest)),
        "not a rollout it accepted": (validator.address, _verdict(other_key, other_doc, other_digest)),
        "hash of another document": (validator.address, _verdict(key, doc, other_digest)),
        "oversized": (validator.address, _verdict(key, big_doc, big_digest)),
        "garbage": (validator.address, b"\xc1" * 64),
        "a passing verdict": (validator.address, protocol.pack({"work_key": key, "ok": True, "evidence": digest})),
    }
    for name, (sender, body) in hostile.items():
        assert not await c.keep_evidence(sender, body), name
    assert list((tmp_path / "c" / "evidence").iterdir()) == []
    assert await c.keep_evidence(validator.address, _verdict(key, doc, digest))
    assert c.evidence.get(digest) == doc
    assert not await c.keep_evidence(validator.address, _verdict(key, doc, digest))  # once
    # a validator flooding documents on one record keeps its first, and crowds out no other validator
    for i in range(3):
        d, h = encode_evidence(_record(key, n=i))
        assert not await c.keep_evidence(validator.address, _verdict(key, d, h))
    others = [Account.create().address for _ in range(2 * MAX_EVIDENCE_PER_KEY)]
    roles = c.membership.snapshot()  # type: ignore[union-attr]
    c.membership = _Roles(Membership(POOL, roles.coordinator, frozenset({validator.address, *others}), roles.members))  # type: ignore[assignment]
    for i, other in enumerate(others):  # the pool's validators together fill a few slots, no more
        d, h = encode_evidence(_record(key, n=100 + i))
        await c.keep_evidence(other, _verdict(key, d, h))
    assert len(list((tmp_path / "c" / "evidence").iterdir())) == MAX_EVIDENCE_PER_KEY


async def test_an_accused_worker_that_missed_the_gossip_gets_the_evidence_by_hash(tmp_path: Path) -> None:
    w, c, validator, outsider, key = _setup(tmp_path)
    snapshot = c.membership.snapshot()  # type: ignore[union-attr]
    doc, digest = encode_evidence(_record(key))
    assert await c.keep_evidence(validator.address, _verdict(key, doc, digest))  # the coordinator saw the gossip
    # the accuser's own documents: one it published, one too large for gossip, one whose file holds other bytes
    vdir = tmp_path / "v" / "evidence"
    vdir.mkdir(parents=True)
    big = _record(key, "reward-mismatch", pad="y" * (2 * MAX_EVIDENCE_BYTES))
    big_digest = write_evidence(vdir, big)
    liar_doc, liar_digest = encode_evidence(_record(key, "made-up"))
    (vdir / f"{liar_digest[2:]}.json").write_bytes(encode_evidence(_record(key, "another"))[0])
    async with AsyncExitStack() as stack:

        async def net(k: Any) -> PoolNetwork:
            n = PoolNetwork(private_key=bytes(k.key), pool=POOL, membership=lambda: snapshot)
            return await stack.enter_async_context(n)

        cnet, wnet, vnet, onet = [await net(k) for k in (c.key, w.node, validator, outsider)]
        serve_evidence(cnet, c.evidence)
        serve_evidence(vnet, BlobStore(vdir, MAX_SERVED_EVIDENCE_BYTES, suffix=".json"))
        w.net, w.coordinator_peer = wnet, cnet.listen_addrs[0]
        with trio.fail_after(30):
            # the worker never saw the verdict: the coordinator serves it by the hash on chain
            claims = await w.evidence_of(key, digest, validator.address)
            assert claims is not None and claims["verdict"]["reason"] == "toploc-mismatch"
            assert w.store.scalar("SELECT doc FROM evidence WHERE hash = ?", (digest,)) == doc
            # an accusation of another record of ours naming that same document: no evidence for it, no crash
            assert await w.evidence_of("0x" + "55" * 32, digest, validator.address) is None
            # a document only its author holds (too large for gossip), from the accuser once connected
            assert await w.evidence_of(key, big_digest, validator.address) is None
            await wnet.connect(vnet.listen_addrs[0])
            got = await w.evidence_of(key, big_digest, validator.address)
            assert got is not None and got["verdict"]["reason"] == "reward-mismatch"
            # other bytes under the asked hash are refused, never kept; nobody else has it: None, no crash
            assert await w.evidence_of(key, liar_digest, validator.address) is None
            assert w.store.scalar("SELECT COUNT(*) FROM evidence WHERE hash = ?", (liar_digest,)) == 0
            with pytest.raises(P2PError, match="hash mismatch"):
                await fetch_blob(
                    wnet.node, vnet.listen_addrs[0], liar_digest, max_bytes=1 << 20, protocol=EVIDENCE_PROTOCOL
                )
            # an outsider is refused; requests that are not hashes are refused and change nothing
            with pytest.raises(P2PError, match="refused"):
                await fetch_blob(onet.node, cnet.listen_addrs[0], digest, max_bytes=1 << 20, protocol=EVIDENCE_PROTOCOL)
            (tmp_path / "c" / "coordinator.db.json").write_bytes(b"not to be served")
            for bad in (["../coordinator.db", 0], ["0x" + "zz" * 32, 0], [digest, -1], "x"):
                with pytest.raises(P2PError, match="handler error: ValueError"):
                    await wnet.node.request(cnet.listen_addrs[0], EVIDENCE_PROTOCOL, msgpack.packb(bad))
            with pytest.raises(P2PError, match="handler error: KeyError"):  # a hash nobody holds
                await wnet.node.request(cnet.listen_addrs[0], EVIDENCE_PROTOCOL, msgpack.packb(["0x" + "00" * 32, 0]))
            again = await fetch_blob(
                wnet.node, cnet.listen_addrs[0], digest, max_bytes=1 << 20, protocol=EVIDENCE_PROTOCOL
            )
            assert again == doc
    assert liar_doc != (vdir / f"{liar_digest[2:]}.json").read_bytes()
    # serving wrote nothing into the folders served: they hold the documents alone
    assert all(p.suffix == ".json" for d in (vdir, tmp_path / "c" / "evidence") for p in d.iterdir())


async def test_an_accuser_that_dribbles_its_document_holds_the_worker_back_for_the_deadline_only(
    tmp_path: Path,
) -> None:
    """A lying validator answers each chunk request just inside the per-request timeout with the least
    it may send: without a deadline on the whole document, fetching it would take minutes per
    accusation and the worker's appeals would queue behind it until their periods ran out."""
    w, c, validator, _, key = _setup(tmp_path)
    snapshot = c.membership.snapshot()  # type: ignore[union-attr]
    doc, digest = encode_evidence(_record(key, pad="z" * (40 * 1024)))
    assert await c.keep_evidence(validator.address, _verdict(key, doc, digest))  # the coordinator saw the gossip
    served = []

    async def dribble(request: bytes, sender: str) -> bytes:
        _, offset = msgpack.unpackb(request)
        served.append(offset)
        await trio.sleep(0.5)  # 10 chunks of 4 KiB: 5 s for the whole document
        return msgpack.packb([len(doc), doc[offset : offset + 4096]], use_bin_type=True)

    async with AsyncExitStack() as stack:
        nets = [
            await stack.enter_async_context(
                PoolNetwork(private_key=bytes(k.key), pool=POOL, membership=lambda: snapshot)
            )
            for k in (c.key, w.node, validator)
        ]
        cnet, wnet, vnet = nets
        serve_evidence(cnet, c.evidence)
        vnet.node.set_handler(EVIDENCE_PROTOCOL, dribble)
        await wnet.connect(vnet.listen_addrs[0])
        with trio.fail_after(20):
            got = await fetch_evidence(wnet, cnet.listen_addrs[0], validator.address, digest, key, timeout=2.0)
    assert got is not None and got[1] == doc  # from the coordinator, once the accuser's time was up
    assert 1 <= len(served) < 10, served  # the accuser was asked, and dropped before it had sent it all
