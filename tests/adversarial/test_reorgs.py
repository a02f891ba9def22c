"""Chain reorganisations against a real anvil (`anvil_reorg` replaces the last blocks with empty ones):
every follower reads only confirmed blocks, and a reorganisation deeper than that is seen (the block
at its cursor changed) and followed. A removed `NodeJoined` leaves the membership view, a removed
`WorkInvalidated` stops counting towards a blacklist, a removed `WorkRecorded` is settled by the
validator without a transaction, and a transaction of ours that a reorganisation took out is waited
for and mined again, once."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node import ops
from node.chain import ChainClient, abi
from node.chain.rpc import RpcClient
from node.chain.tx import TxSender
from node.daemon import new_ledger_events
from node.p2p.membership import ChainMembership
from pool.coordinator.state import CoordinatorState
from tests.conftest import World, rpc_sync, slash_now
from tests.integration.test_status import _setup


@pytest.fixture
def chain(own_chain: World) -> World:
    """Each test here on an anvil of its own: reorganisations and the session chain's revert do not mix."""
    return own_chain


def head(chain: World) -> int:
    return int(str(rpc_sync(chain.url, "eth_blockNumber")), 16)


def nonce(chain: World, who: str) -> int:
    return int(str(rpc_sync(chain.url, "eth_getTransactionCount", [who, "latest"])), 16)


async def test_membership_forgets_a_join_a_deep_reorg_removed(chain: World):
    keys = ["0x" + "c3" * 32]
    pid = await trio.to_thread.run_sync(_setup, chain, keys)  # ... join, then record: one block each
    async with await chain.client(None) as reader:
        assert reader.confirmations == 0  # the local network's default
        cm = ChainMembership(reader, pid, interval=0.1)
        assert chain.node.address.lower() in {m.lower() for m in (await cm.refresh()).members}
        rpc_sync(chain.url, "anvil_reorg", [2, []])  # the join's and the record's blocks are replaced
        assert not await reader.call("PoolManager", "isMember", pid, chain.node.address)
        snap = await cm.refresh()
        assert cm.reorgs == 1 and chain.node.address.lower() not in {m.lower() for m in snap.members}
        assert snap.coordinator.lower() == chain.coordinator.address.lower()  # the rest of the view stays


async def test_membership_never_sees_an_unconfirmed_join(chain: World):
    pid = await trio.to_thread.run_sync(_setup, chain, ["0x" + "c4" * 32])
    async with await chain.client(None) as reader:
        cm = ChainMembership(reader, pid, interval=0.1, confirmations=3)
        rpc_sync(chain.url, "anvil_mine", [hex(3)])
        before = await cm.refresh()
        assert chain.node.address.lower() in {m.lower() for m in before.members}
        # a node joins at the head; a shallow reorganisation takes the join out before it is confirmed
        async with await chain.client(chain.coordinator) as co:
            invite = await ops.make_invite(co, chain.coordinator, pid, chain.node2.address, ttl=3600)
        async with await chain.client(chain.provider) as p:
            sig = await ops.node_signature(p, chain.node2, chain.provider.address)
            await ops.add_node(p, chain.node2.address, 1, sig)
            await ops.join_pool(p, invite, pid)
        assert chain.node2.address.lower() not in {m.lower() for m in (await cm.refresh()).members}
        rpc_sync(chain.url, "anvil_reorg", [2, []])
        rpc_sync(chain.url, "anvil_mine", [hex(5)])
        after = await cm.refresh()
        assert chain.node2.address.lower() not in {m.lower() for m in after.members}
        assert cm.reorgs == 0  # never read, so nothing to undo


async def test_a_removed_invalidation_stops_counting(chain: World, tmp_path: Path):
    """The coordinator's invalidation follower: a `WorkInvalidated` read, then removed by a deep
    reorganisation, is dropped from the count that leads to a blacklist."""
    keys = ["0x" + "d5" * 32]
    pid = await trio.to_thread.run_sync(_setup, chain, keys)
    before = head(chain)
    await slash_now(chain, pid, keys[0])
    state = CoordinatorState(tmp_path / "coordinator.db")
    async with await chain.client(None) as reader:

        async def follow() -> int:
            got = await new_ledger_events(
                reader, state.store, "invalidation_cursor", pid, "WorkInvalidated",
                on_reorg=state.forget_invalidations_after,
            )  # fmt: skip
            if got is None:
                return 0
            events, move = got
            state.add_invalidations(
                [(str(e.args["workKey"]), chain.node.address, e.block_number) for e in events], move
            )
            return len(events)

        assert await follow() == 1 and state.invalidations(chain.node.address) == 1
        rpc_sync(chain.url, "anvil_reorg", [head(chain) - before, []])  # the slash never happened
        rpc_sync(chain.url, "anvil_mine", [hex(2)])
        assert await follow() == 0
        assert state.invalidations(chain.node.address) == 0
        assert (await ops.record(reader, pid, keys[0]))["statusName"] == "pending"
    state.store.close()


async def test_validator_settles_a_record_a_reorg_removed_without_a_transaction(chain: World, tmp_path: Path):
    from node.validator import Validator, ValidatorConfig

    before = head(chain)
    keys = ["0x" + "e6" * 32]
    pid = await trio.to_thread.run_sync(_setup, chain, keys)
    v = Validator(ValidatorConfig(pid, tmp_path / "v", chain.url, chain.deployment), chain.validator)
    v.chain = await ChainClient.connect(chain.url, chain.deployment, chain.validator)
    try:
        assert await v.follow() == 1
        (row,) = v.state.open_checks(("pending",))
        rpc_sync(chain.url, "anvil_reorg", [head(chain) - before, []])
        n0 = nonce(chain, chain.validator.address)
        await v.check_one(row)
        assert v.store.scalar("SELECT status FROM checks WHERE work_key = ?", (keys[0],)) == "settled"
        assert nonce(chain, chain.validator.address) == n0  # nothing sent against a record that is gone
    finally:
        await v.chain.aclose()
        v.store.close()


async def test_a_transaction_a_reorg_took_out_is_mined_again_once(chain: World):
    token = chain.deployment.address("IntellectToken")
    data = abi.load("IntellectToken").fn("mint").encode([chain.outsider.address, 13])
    async with RpcClient(chain.url) as rpc, await chain.client(None) as reader:
        b0 = await reader.token_balance(chain.outsider.address)
        n0 = nonce(chain, chain.admin.address)
        sender = TxSender(rpc, chain.admin, chain.deployment.chain_id, confirmations=3, rebroadcast_every=0.2)
        await rpc.request("evm_setAutomine", [False])
        out = {}
        try:
            async with trio.open_nursery() as n:

                async def send() -> None:
                    out["r"] = await sender.send(token, data, what="mint")

                n.start_soon(send)
                with trio.fail_after(10):
                    while nonce(chain, chain.admin.address) == n0:
                        await rpc.request("evm_mine", [])
                        await trio.sleep(0.05)
                assert "r" not in out  # mined, not yet buried under 3 blocks
                rpc_sync(chain.url, "anvil_reorg", [1, []])  # the block with it is replaced by an empty one
                assert await reader.token_balance(chain.outsider.address) == b0
                with trio.fail_after(20):
                    while "r" not in out:
                        await rpc.request("evm_mine", [])
                        await trio.sleep(0.1)
        finally:
            await rpc.request("evm_setAutomine", [True])
        assert out["r"].status == 1
        assert nonce(chain, chain.admin.address) == n0 + 1
        assert await reader.token_balance(chain.outsider.address) == b0 + 13
