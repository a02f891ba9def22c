"""The protocol's dispute calls: accusations (hard and soft invalidations), appeals, challenges,
committee draws and votes, and the reads of a record and its dispute. Re-exported by `node.ops`."""

from __future__ import annotations

from typing import Any

from .chain.client import ChainClient
from .chain.errors import ChainError
from .chain.messages import RECORD_STATUS
from .chain.tx import Receipt
from .chain.values import bytes32, check_balance, checksum


async def _bond(c: ChainClient, pool_id: int, what: str) -> int:
    """The pool's dispute bond, with the balance checked and the ledger approved to take it."""
    bond = int((await c.call("PoolManager", "disputeTerms", pool_id))["bond"])
    if bond:
        await check_balance(c, bond, what)
        await c.ensure_allowance("WorkLedger", bond)
    return bond


async def invalidate(c: ChainClient, pool_id: int, work_key: str, evidence: str, hard: bool = True) -> Receipt:
    """Invalidate a record as one of the pool's validators. Hard (the default): an accusation with the
    pool's bond, final (slash) after the appeal period unless appealed. Soft: revoked, no slash."""
    if not await c.call("PoolManager", "isPoolValidator", pool_id, c.address):
        raise ChainError(
            f"{c.address} is not a validator of pool {pool_id}",
            "the pool's owner names validators with `intellect-node validator add --pool ID ADDRESS`",
        )
    if hard:
        await _bond(c, pool_id, "the accusation bond")
    return await c.transact(
        "WorkLedger",
        "invalidateWork",
        pool_id,
        bytes32(work_key, "work key"),
        bytes32(evidence, "evidence hash"),
        hard,
        what="invalidation" if hard else "soft invalidation",
    )


async def finalize_invalidation(c: ChainClient, pool_id: int, work_key: str) -> Receipt:
    return await c.transact(
        "WorkLedger", "finalizeInvalidation", pool_id, bytes32(work_key, "work key"), what="finalizing an invalidation"
    )


async def appeal(c: ChainClient, pool_id: int, work_key: str) -> Receipt:
    rec, d = await record(c, pool_id, work_key), await dispute(c, pool_id, work_key)
    if d["kindName"] != "accusation" or d["verdictName"] != "open":
        raise ChainError(f"work {work_key} has no open accusation to appeal (dispute: {d['kindName']})")
    if checksum(str(rec["provider"])) != checksum(c.address):
        raise ChainError(f"work {work_key} belongs to provider {rec['provider']}", "appeal with that provider's key")
    await _bond(c, pool_id, "the appeal bond")
    return await c.transact("WorkLedger", "appeal", pool_id, bytes32(work_key, "work key"), what="appeal")


async def challenge(c: ChainClient, pool_id: int, work_key: str, evidence: str) -> Receipt:
    need = max(int((await c.call("PoolManager", "poolTerms", pool_id))["minStake"]), 1)
    if int(await c.call("ProviderRegistry", "stakeOf", c.address)) < need:
        raise ChainError(f"{c.address} stakes less than pool {pool_id}'s minimum", "stake at least that to challenge")
    await _bond(c, pool_id, "the challenge bond")
    return await c.transact(
        "WorkLedger",
        "challenge",
        pool_id,
        bytes32(work_key, "work key"),
        bytes32(evidence, "evidence hash"),
        what="challenge",
    )


def draw_gas(validators: int, committee_size: int) -> int:
    """The gas limit a committee draw gets at least: a bound on the whole draw for a set of `validators`
    and a committee of up to `committee_size` (each member a fresh storage slot)."""
    return 60_000 + 2_000 * validators + 30_000 * min(committee_size, validators)


async def draw_committee(c: ChainClient, pool_id: int, work_key: str, opened_at: int | None = None) -> Receipt:
    """Draw the committee of an appeal or a challenge, from the pool's validators as they were when it
    opened (read at block `opened_at`, the block of its `WorkAppealed` / `WorkChallenged` event; None:
    the current set, right when nothing changed since). The draw needs the hash of the block the
    dispute opened in; sent while that block is the newest, it is mined in a later one and draws
    there, but a gas estimate at the newest block (geth's default) sees the contract's early return,
    so the limit is at least `draw_gas`."""
    tag = hex(opened_at) if opened_at is not None else "latest"
    validators = list(await c.call("PoolManager", "validatorsOf", pool_id, block=tag))
    size = int((await c.call("PoolManager", "disputeTerms", pool_id))["committeeSize"])
    key = bytes32(work_key, "work key")
    floor = draw_gas(len(validators), size)
    return await c.transact(
        "WorkLedger", "drawCommittee", pool_id, key, validators, what="committee draw", min_gas=floor
    )


#: The gas limit a committee vote gets at least: enough for the vote that decides the dispute (the
#: slash, the bonds, the bounty: about 225k gas, four times a vote that does not). Its estimate sees
#: the votes mined so far; another juror's vote mined before ours makes ours the deciding one.
VOTE_GAS = 350_000


async def vote(c: ChainClient, pool_id: int, work_key: str, uphold: bool) -> Receipt:
    key = bytes32(work_key, "work key")
    return await c.transact("WorkLedger", "vote", pool_id, key, uphold, what="committee vote", min_gas=VOTE_GAS)


async def resolve_lapsed(c: ChainClient, pool_id: int, work_key: str) -> Receipt:
    return await c.transact(
        "WorkLedger", "resolveLapsed", pool_id, bytes32(work_key, "work key"), what="closing a lapsed dispute"
    )


DISPUTE_KIND = ("none", "accusation", "appeal", "challenge")
VERDICT = ("open", "upheld", "overturned", "lapsed")


async def dispute(c: ChainClient, pool_id: int, work_key: str) -> dict[str, Any]:
    d = dict(await c.call("WorkLedger", "getDispute", pool_id, bytes32(work_key, "work key")))
    d["kindName"] = DISPUTE_KIND[int(d["kind"])]
    d["verdictName"] = VERDICT[int(d["verdict"])]
    return d


async def record(c: ChainClient, pool_id: int, work_key: str) -> dict[str, Any]:
    r = dict(await c.call("WorkLedger", "getRecord", pool_id, bytes32(work_key, "work key")))
    r["statusName"] = RECORD_STATUS[r["status"]]
    return r
