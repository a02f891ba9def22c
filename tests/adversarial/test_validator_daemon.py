"""The validator daemon on anvil against a coordinator that lies: it records on chain a file the node
never signed (so that an honest validator would slash the node for it), and a record whose file nobody
serves. The first must never be invalidated (the validator reports the coordinator instead); the second,
which the node did sign, is invalidated as `data_unavailable` close to its deadline (signed work had to be
kept), softly: its units are revoked, but nobody is slashed for a file nobody can show. Real pieces: the compiled contracts on anvil, the validator daemon with its transformers prefill,
libp2p on 127.0.0.1 (the lying coordinator is a PoolNetwork with the coordinator's key that serves a blob
and a signature handler)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import trio

from node import ops, protocol
from node.chain.anvil import advance_time
from node.p2p.blobs import BlobStore, serve_blobs
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from node.validator import Validator, ValidatorConfig
from tests.conftest import World
from tests.integration.test_coordinator import _pool_with_two_members

MARGIN = 30


async def test_unsigned_work_is_reported_not_slashed_and_unserved_signed_work_is_revoked(
    chain: World, tmp_path: Path
) -> None:
    pid = await _pool_with_two_members(chain, tmp_path)
    junk = b"not a rollout file at all"
    unsigned = "0x" + hashlib.sha256(junk).hexdigest()  # served, invalid, never signed by the node
    unserved = "0x" + hashlib.sha256(b"a file the node made and lost").hexdigest()  # signed, served by nobody
    blobs = BlobStore(tmp_path / "fake-coord-blobs", 1 << 20)
    assert blobs.put(junk) == unsigned

    async with await chain.client(chain.coordinator) as coord_chain:
        node_sig = ops.rollout_claim(coord_chain, pid, unserved).sign(chain.node)
        items = [ops.WorkItem(chain.node.address, k, 500, 0, "0x" + "22" * 32) for k in (unsigned, unserved)]
        await ops.record_work(coord_chain, pid, items)
        deadline = int((await ops.record(coord_chain, pid, unserved))["deadline"])
        stake_before = int(await coord_chain.call("ProviderRegistry", "stakeOf", chain.provider.address))
        # chain time close to the deadline: inside the validator's last chance (2 x margin), before its margin
        await advance_time(coord_chain.rpc, deadline - await coord_chain.timestamp() - 2 * MARGIN + 5)

    def members() -> Membership:
        return Membership(pid, chain.coordinator.address, frozenset({chain.validator.address}), frozenset())

    async def on_signature(request: bytes, sender: str) -> bytes:
        key = protocol.unpack(request, "signature request").get("work_key")
        return protocol.ok(signature=node_sig) if key == unserved else protocol.refuse("no signature")

    cfg_dir = tmp_path / "validator"
    async with (
        PoolNetwork(private_key=bytes(chain.coordinator.key), pool=pid, membership=members) as liar,
        trio.open_nursery() as nursery,
    ):
        serve_blobs(liar.node, blobs, allow=lambda s: True, accept_uploads=False)
        liar.node.set_handler(protocol.SIGNATURE_PROTOCOL, on_signature)
        cfg = ValidatorConfig(
            pid, cfg_dir, chain.url, chain.deployment, bootstrap=liar.listen_addrs[:1], margin=MARGIN,
            poll_every=0.5, refetch_every=1.0,
        )  # fmt: skip
        v = Validator(cfg, chain.validator)
        await nursery.start(v.run)

        def status(key: str) -> Any:
            return v.store.scalar("SELECT status FROM checks WHERE work_key = ?", (key,))

        with trio.fail_after(90):
            while status(unsigned) != "unsigned" or status(unserved) != "accused":
                await trio.sleep(0.5)
        reasons = {
            k: v.store.scalar("SELECT reason FROM checks WHERE work_key = ?", (k,)) for k in (unsigned, unserved)
        }
        # a soft accusation too waits out its appeal period; then the validator makes it final
        async with await chain.client(None) as reader:
            d = await ops.dispute(reader, pid, unserved)
            assert (d["kindName"], bool(d["hard"])) == ("accusation", False), d
            await advance_time(reader.rpc, int(d["appealEnd"]) - await reader.timestamp() + 1)
        with trio.fail_after(60):
            while status(unserved) != "invalidated":
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()

    assert reasons == {unsigned: "malformed_rollout", unserved: "data_unavailable"}, reasons
    async with await chain.client(None) as reader:
        assert (await ops.record(reader, pid, unsigned))["statusName"] == "pending"  # never invalidated
        assert (await ops.record(reader, pid, unserved))["statusName"] == "invalidated"
        events = await reader.events(["WorkLedger"])
        assert [str(e.args["workKey"]) for e in events if e.name == "WorkSoftInvalidated"] == [unserved]
        assert not [e for e in events if e.name in ("WorkAccused", "WorkInvalidated")]
        stake_after = int(await reader.call("ProviderRegistry", "stakeOf", chain.provider.address))
    assert stake_after == stake_before  # revoked, not slashed
