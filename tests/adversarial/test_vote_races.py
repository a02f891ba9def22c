"""Transactions whose cost depends on what lands just before them. A transaction's gas limit comes
from an estimate against the chain as it was; another party's transaction mined between that estimate
and the broadcast can put it on a dearer path, and if its limit does not cover that path it is mined,
runs out of gas and reverts: its sender pays for nothing and must try again. Against a real anvil
with the real contracts:

- two jurors of one committee vote at once: whichever lands second decides the dispute (the slash,
  the bonds, the bounty), about four times the gas of the first vote;
- a sybil challenges a record as the pool's validator accuses it: the accusation is then refused with a
  clear error (one dispute at a time; nobody takes over an open one), not mined as an out-of-gas
  revert, and once the challenge lapses the record is open to the validator again."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import trio

from node import ops
from node.chain import ChainClient, ChainError
from node.chain.anvil import advance_time
from node.chain.tx import Receipt
from pool.deploy import TOKEN
from tests.conftest import World, signed

TERMS = ops.DisputeTerms(appeal_period=600, vote_period=600, committee_size=2)
KEYS = ["0x" + f"{i:064x}" for i in (0x41, 0x42)]


async def _pool(chain: World, more_validators: int = 0, terms: ops.DisputeTerms = TERMS) -> int:
    """A pool whose validators are the checking one and two jurors (the outsider and the admin), and
    `more_validators` others; the provider's node has recorded work under `KEYS`; the outsider is a
    staked provider (may challenge)."""
    others = tuple("0x" + hashlib.sha256(f"validator {i}".encode()).hexdigest()[:40] for i in range(more_validators))
    async with (
        await chain.client(chain.admin) as admin,
        await chain.client(chain.provider) as prov,
        await chain.client(chain.coordinator) as coord,
        await chain.client(chain.outsider) as out,
    ):
        pid, _ = await ops.create_pool(
            admin,
            ops.PoolSpec(
                chain.coordinator.address, "ipfs://spec", "0x" + "12" * 32, 10**15, 100, TOKEN, 0,
                "/ip4/127.0.0.1/tcp/1",
                validators=(chain.validator.address, chain.outsider.address, chain.admin.address, *others),
                disputes=terms,
            ),
        )  # fmt: skip
        await admin.transact("PoolManager", "startPool", pid)
        await ops.fund_pool(admin, pid, 100 * TOKEN)
        await ops.register_provider(prov, 50 * TOKEN)
        await ops.stake(prov, 5 * TOKEN)
        await ops.register_provider(out, 10 * TOKEN)
        sig = await ops.node_signature(prov, chain.node, chain.provider.address)
        await ops.add_node(prov, chain.node.address, 1, sig)
        await ops.join_pool(prov, await ops.make_invite(coord, chain.coordinator, pid, chain.node.address, 600))
        items = [ops.WorkItem(chain.node.address, k, 10, 1, "0x" + "aa" * 32) for k in KEYS]
        await ops.record_work(coord, pid, items)
        return pid


@contextlib.contextmanager
def _then(c: ChainClient, other: Callable[[], Awaitable[Receipt]]) -> Iterator[list[Receipt]]:
    """`c`'s next transaction is estimated, then `other` is sent and mined, then `c`'s is sent: the
    other party's transaction reached the chain while `c`'s was being signed."""
    sender = c.sender
    assert sender is not None
    done: list[Receipt] = []
    estimate = sender.estimate

    async def estimate_then_other(*args: Any) -> int:
        gas = await estimate(*args)
        if not done:
            done.append(await other())
        return gas

    sender.estimate = estimate_then_other  # type: ignore[method-assign]
    try:
        yield done
    finally:
        sender.estimate = estimate  # type: ignore[method-assign]
    assert done, "the other transaction was never sent"


def test_two_jurors_voting_at_once_both_land(chain: World) -> None:
    key = KEYS[0]

    async def go() -> None:
        pid = await _pool(chain)
        async with await chain.client(chain.validator) as val, await chain.client(chain.provider) as prov:
            await ops.invalidate(val, pid, key, "0x" + "bb" * 32, signature=signed(val, pid, key, chain.node))
            await ops.appeal(prov, pid, key)
            await prov.rpc.request("evm_mine", [])
            await ops.draw_committee(prov, pid, key)
            assert int((await ops.dispute(prov, pid, key))["size"]) == 2
        async with await chain.client(chain.outsider) as j1, await chain.client(chain.admin) as j2:
            with _then(j1, lambda: ops.vote(j2, pid, key, True)) as first:
                second = await ops.vote(j1, pid, key, True)
            d = await ops.dispute(j1, pid, key)
        assert d["verdictName"] == "upheld", d
        assert second.gas_used > 3 * first[0].gas_used  # the race is real: the deciding vote is dearer
        assert second.gas_used * 1.25 <= ops.VOTE_GAS, "the vote's gas floor no longer covers the deciding vote"

    trio.run(go)


def test_an_accusation_racing_a_sybils_challenge_is_refused_then_lands_once_it_lapses(chain: World) -> None:
    key = KEYS[1]

    async def go() -> None:
        pid = await _pool(chain)
        async with await chain.client(chain.outsider) as sybil, await chain.client(chain.validator) as val:
            sig = signed(val, pid, key, chain.node)
            await sybil.ensure_allowance("WorkLedger", 100 * TOKEN)  # the sybil's bond approved up front
            with (
                pytest.raises(ChainError) as refused,
                _then(val, lambda: ops.challenge(sybil, pid, key, "0x" + "cc" * 32, sig)) as challenged,
            ):
                await ops.invalidate(val, pid, key, "0x" + "bb" * 32, signature=sig)
            assert challenged[0].event("WorkChallenged") is not None
            assert getattr(refused.value, "name", None) == "AlreadySettled", refused.value
            await advance_time(val.rpc, 601)  # nobody votes: the challenge lapses
            lapsed = await ops.resolve_lapsed(val, pid, key)
            assert lapsed.event("WorkReopened") is not None
            accused = await ops.invalidate(val, pid, key, "0x" + "bb" * 32, signature=sig)
            d = await ops.dispute(val, pid, key)
        assert d["kindName"] == "accusation" and d["verdictName"] == "open", d
        assert accused.event("WorkAccused") is not None

    trio.run(go)


@contextlib.contextmanager
def _estimates_at_latest(c: ChainClient) -> Iterator[None]:
    """`c`'s gas estimates run at the newest block, as geth's `eth_estimateGas` does by default (anvil
    runs them on the pending block): `block.number` in the estimate is one less than where it is mined."""
    sender = c.sender
    assert sender is not None
    request = sender.rpc.request

    async def at_latest(method: str, params: list[Any] | None = None, **kw: Any) -> Any:
        if method == "eth_estimateGas" and params is not None and len(params) == 1:
            params = [*params, "latest"]
        return await request(method, params, **kw)

    sender.rpc.request = at_latest  # type: ignore[method-assign]
    try:
        yield
    finally:
        sender.rpc.request = request  # type: ignore[method-assign]


@pytest.mark.parametrize(("more", "size"), [(0, 2), (29, 15)])
def test_a_committee_is_drawn_the_block_after_its_appeal(chain: World, more: int, size: int) -> None:
    """The draw needs the hash of the appeal's block: an estimate made while that block is the newest
    sees the early return (`its hash is not known yet`), a fraction of the draw's gas, but the
    transaction is mined in a later block where the whole draw runs. A juror polling a real chain sees
    the appeal in exactly that block. For a set of 3 validators and of 32."""
    key = KEYS[0]

    async def go() -> None:
        terms = ops.DisputeTerms(appeal_period=600, vote_period=600, committee_size=size)
        pid = await _pool(chain, more, terms)
        async with await chain.client(chain.validator) as val, await chain.client(chain.provider) as prov:
            await ops.invalidate(val, pid, key, "0x" + "bb" * 32, signature=signed(val, pid, key, chain.node))
            await ops.appeal(prov, pid, key)
        async with await chain.client(chain.admin) as juror:
            with _estimates_at_latest(juror):
                rc = await ops.draw_committee(juror, pid, key)
            d = await ops.dispute(juror, pid, key)
        assert rc.event("CommitteeDrawn") is not None
        assert d["drawn"] and int(d["size"]) == size, d
        floor = ops.draw_gas(3 + more, size)
        assert rc.gas_used * 1.25 <= floor, f"the draw's gas floor {floor} no longer covers {rc.gas_used}"

    trio.run(go)
