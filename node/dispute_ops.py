"""The protocol's dispute calls: accusations (hard and soft invalidations), appeals, challenges,
committee draws and votes, and the reads of a record and its dispute. Re-exported by `node.ops`."""

from __future__ import annotations

from typing import Any

from .chain.client import ChainClient
from .chain.errors import ChainError
from .chain.messages import RECORD_STATUS
from .chain.tx import Receipt
from .chain.values import bytes32, check_balance, checksum, fixed_bytes


async def _bond(c: ChainClient, pool_id: int, what: str) -> int:
    """The pool's dispute bond, with the balance checked and the ledger approved to take it."""
    bond = int((await c.call("PoolManager", "disputeTerms", pool_id))["bond"])
    if bond:
        await check_balance(c, bond, what)
        await c.ensure_allowance("WorkLedger", bond)
    return bond


def _signature(signature: str | None, work_key: str) -> bytes:
    """The node's `RolloutClaim` signature as bytes, required for anything that can slash."""
    if not signature:
        raise ChainError(
            f"no signature of the node over work {work_key}",
            "a slash needs the node's own signature over the work (its file's RolloutClaim, served on "
            "/intellect/signature/1); without it, revoke softly",
        )
    return fixed_bytes(signature, 65, f"the node signature for work {work_key}")


async def invalidate(
    c: ChainClient, pool_id: int, work_key: str, evidence: str, hard: bool = True, signature: str | None = None
) -> Receipt:
    """Accuse a record as one of the pool's validators; it stays frozen for the pool's appeal period,
    then anyone makes it final (`finalize_invalidation`): revoked, its reward to the treasury. Hard (the
    default): with the pool's bond and the node's `signature` over the work, and a slash at the end.
    Soft: no bond, no signature, no slash."""
    if not await c.call("PoolManager", "isPoolValidator", pool_id, c.address):
        raise ChainError(
            f"{c.address} is not a validator of pool {pool_id}",
            "the pool's owner names validators with `intellect-node validator add --pool ID ADDRESS`",
        )
    sig = _signature(signature, work_key) if hard else b""
    if hard:
        await _bond(c, pool_id, "the accusation bond")
    return await c.transact(
        "WorkLedger",
        "invalidateWork",
        pool_id,
        bytes32(work_key, "work key"),
        bytes32(evidence, "evidence hash"),
        hard,
        sig,
        what="invalidation" if hard else "soft invalidation",
    )


async def finalize_invalidation(c: ChainClient, pool_id: int, work_key: str) -> Receipt:
    return await c.transact(
        "WorkLedger", "finalizeInvalidation", pool_id, bytes32(work_key, "work key"), what="finalizing an invalidation"
    )


async def appeal(c: ChainClient, pool_id: int, work_key: str) -> Receipt:
    rec, d = await record(c, pool_id, work_key), await dispute(c, pool_id, work_key)
    if d["kindName"] != "accusation" or d["verdictName"] != "open":  # hard or soft
        raise ChainError(f"work {work_key} has no open accusation to appeal (dispute: {d['kindName']})")
    if checksum(str(rec["provider"])) != checksum(c.address):
        raise ChainError(f"work {work_key} belongs to provider {rec['provider']}", "appeal with that provider's key")
    await _bond(c, pool_id, "the appeal bond")
    return await c.transact("WorkLedger", "appeal", pool_id, bytes32(work_key, "work key"), what="appeal")


async def challenge(c: ChainClient, pool_id: int, work_key: str, evidence: str, signature: str | None) -> Receipt:
    """Challenge a record as a staked provider, with the pool's bond and the node's `signature` over the
    work. A lapsed challenge costs `LAPSE_FEE_BPS` of the bond."""
    sig = _signature(signature, work_key)
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
        sig,
        what="challenge",
    )


def draw_gas(validators: int, committee_size: int) -> int:
    """The gas limit a committee draw gets at least: a bound on the whole draw for a set of `validators`
    and a committee of up to `committee_size` (each member a fresh storage slot)."""
    return 70_000 + 3_000 * validators + 30_000 * min(committee_size, validators)


async def draw_committee(c: ChainClient, pool_id: int, work_key: str) -> Receipt:
    """Draw the committee of an appeal or a challenge, from the pool's validators as they were when the
    dispute opened (`validatorEntries` read at the dispute's `openedBlock`; the contract checks them
    against the hash it kept). The draw needs the hash of the block the vote opened in; sent while
    that block is the newest, it is mined in a later one and draws there, but a gas estimate at the
    newest block (geth's default) sees the contract's early return, so the limit is at least
    `draw_gas`."""
    d = await dispute(c, pool_id, work_key)
    validators, since = await c.call("PoolManager", "validatorEntries", pool_id, block=hex(int(d["openedBlock"])))
    size = int((await c.call("PoolManager", "disputeTerms", pool_id))["committeeSize"])
    key = bytes32(work_key, "work key")
    # past 256 blocks the seed is gone and every eligible validator sits (a margin for the blocks to come)
    stale = await c.rpc.block_number() - int(d["drawBlock"]) >= 240
    floor = draw_gas(len(validators), len(validators) if stale else size)
    return await c.transact(
        "WorkLedger", "drawCommittee", pool_id, key, list(validators), list(since), what="committee draw",
        min_gas=floor,
    )  # fmt: skip


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
