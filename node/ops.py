"""Protocol operations shared by the CLI and the daemons: each one a few contract calls with the
checks that make its failure readable before any gas is spent."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from eth_account.signers.local import LocalAccount

from .chain.abi import topic
from .chain.client import ChainClient
from .chain.errors import ChainError
from .chain.messages import POOL_STATUS, RECORD_STATUS, tokens, when
from .chain.signing import Invite, RolloutClaim, sign_node_binding
from .chain.tx import Receipt
from .chain.values import bytes32 as bytes32
from .chain.values import check_balance as _check_balance
from .chain.values import checksum as checksum
from .dispute_ops import DISPUTE_KIND as DISPUTE_KIND
from .dispute_ops import VERDICT as VERDICT
from .dispute_ops import VOTE_GAS as VOTE_GAS
from .dispute_ops import appeal as appeal
from .dispute_ops import challenge as challenge
from .dispute_ops import dispute as dispute
from .dispute_ops import draw_committee as draw_committee
from .dispute_ops import draw_gas as draw_gas
from .dispute_ops import finalize_invalidation as finalize_invalidation
from .dispute_ops import invalidate as invalidate
from .dispute_ops import record as record
from .dispute_ops import resolve_lapsed as resolve_lapsed
from .dispute_ops import vote as vote
from .errors import ConfigError

log = logging.getLogger(__name__)

MAX_BATCH = 512


# ---------------------------------------------------------------------- provider


async def register_provider(c: ChainClient, amount: int) -> Receipt:
    """Approve and register. Checked before anything is sent: not yet registered, the minimum
    stake, the token balance; so a refused registration leaves no approval behind."""
    info = await c.call("ProviderRegistry", "getProvider", c.address)
    if info["registered"]:
        raise ChainError(f"provider {c.address} is already registered", "use `provider stake N` to add stake")
    minimum = max(int(await c.call("ProviderRegistry", "minProviderStake")), 1)
    if amount < minimum:
        raise ChainError(
            f"stake too low: {tokens(amount)} staked, {tokens(minimum)} needed", "register with a larger --stake"
        )
    await _check_balance(c, amount, "provider registration")
    await c.ensure_allowance("ProviderRegistry", amount)
    return await c.transact("ProviderRegistry", "registerProvider", amount, what="provider registration")


async def stake(c: ChainClient, amount: int) -> Receipt:
    await _check_balance(c, amount, "stake")
    await c.ensure_allowance("ProviderRegistry", amount)
    return await c.transact("ProviderRegistry", "stake", amount, what="stake")


async def unstake(c: ChainClient, amount: int) -> Receipt:
    return await c.transact("ProviderRegistry", "unstake", amount, what="unstake")


async def withdraw(c: ChainClient) -> Receipt:
    return await c.transact("ProviderRegistry", "withdraw", what="withdraw")


async def provider_info(c: ChainClient, provider: str) -> dict[str, Any]:
    info = dict(await c.call("ProviderRegistry", "getProvider", checksum(provider)))
    info["required"] = await c.call("ProviderRegistry", "requiredStake", checksum(provider))
    info["tokenBalance"] = await c.token_balance(provider)
    return info


async def add_node(c: ChainClient, node: str, units: int, signature: str) -> Receipt:
    return await c.transact(
        "ProviderRegistry", "addNode", checksum(node, "node"), units, signature, what="node binding"
    )


async def node_signature(c: ChainClient, node_key: LocalAccount, provider: str) -> str:
    """The node key's binding signature for `provider`, with the node's current binding nonce."""
    nonce = int(await c.call("ProviderRegistry", "bindingNonce", node_key.address))
    return sign_node_binding(node_key, checksum(provider), nonce, c.deployment.chain_id, c.contract("ProviderRegistry"))


# ---------------------------------------------------------------------- pools


ZERO_ADDRESS = "0x" + "00" * 20


@dataclass(frozen=True)
class DisputeTerms:
    """How a pool settles disputed work (fixed once it starts): seconds to appeal a hard invalidation,
    seconds for the committee (or the arbiter) to decide, committee size, the bond each party puts up
    (None: the pool's slash amount) and an optional arbiter who decides alone."""

    appeal_period: int = 86_400
    vote_period: int = 86_400
    committee_size: int = 3
    bond: int | None = None
    arbiter: str = ZERO_ADDRESS

    def as_params(self, slash_amount: int) -> dict[str, Any]:
        return {
            "appealPeriod": self.appeal_period,
            "votePeriod": self.vote_period,
            "committeeSize": self.committee_size,
            "bond": slash_amount if self.bond is None else self.bond,
            "arbiter": checksum(self.arbiter, "arbiter"),
        }


@dataclass(frozen=True)
class PoolSpec:
    coordinator: str
    spec_uri: str
    spec_hash: str
    reward_rate: int
    validation_window: int = 0
    slash_amount: int = 0
    min_stake: int = 0
    bootstrap: str = ""
    validators: tuple[str, ...] = ()
    disputes: DisputeTerms | None = None

    def as_params(self) -> dict[str, Any]:
        return {
            "coordinator": checksum(self.coordinator, "coordinator"),
            "specURI": self.spec_uri,
            "specHash": bytes32(self.spec_hash, "spec hash"),
            "rewardRate": self.reward_rate,
            "validationWindow": self.validation_window,
            "slashAmount": self.slash_amount,
            "minStake": self.min_stake,
            "bootstrap": self.bootstrap,
        }


async def create_pool(c: ChainClient, spec: PoolSpec) -> tuple[int, Receipt]:
    """Create the pool, then (before it starts) set its dispute terms and name its validators."""
    r = await c.transact("PoolManager", "createPool", spec.as_params(), what="pool creation")
    pool_id = int(r.event("PoolCreated").args["poolId"])
    if spec.disputes is not None:
        terms = spec.disputes.as_params(spec.slash_amount)
        await c.transact("PoolManager", "setDisputeTerms", pool_id, terms, what="dispute terms")
    for v in spec.validators:
        await add_validator(c, pool_id, v)
    return pool_id, r


async def add_validator(c: ChainClient, pool_id: int, validator: str) -> Receipt:
    v = checksum(validator, "validator")
    return await c.transact("PoolManager", "addValidator", pool_id, v, what=f"naming validator {v}")


async def remove_validator(c: ChainClient, pool_id: int, validator: str) -> Receipt:
    v = checksum(validator, "validator")
    return await c.transact("PoolManager", "removeValidator", pool_id, v, what=f"removing validator {v}")


async def pool_info(c: ChainClient, pool_id: int) -> dict[str, Any]:
    p = dict(await c.call("PoolManager", "getPool", pool_id))
    if p["status"] == 0:
        raise ChainError(f"pool {pool_id} does not exist", "check the pool id")
    p["statusName"] = POOL_STATUS[p["status"]]
    p["poolId"] = pool_id
    p["account"] = await c.call("WorkLedger", "poolAccount", pool_id)
    return p


async def fund_pool(c: ChainClient, pool_id: int, amount: int) -> Receipt:
    await _check_balance(c, amount, "pool funding")
    await c.ensure_allowance("WorkLedger", amount)
    return await c.transact("WorkLedger", "fundPool", pool_id, amount, what="pool funding")


async def make_invite(
    c: ChainClient, coordinator: LocalAccount, pool_id: int, node: str, ttl: int, nonce: int | None = None
) -> Invite:
    """An invite signed by the coordinator key, expiring `ttl` seconds after the chain's current time."""
    now = await c.timestamp()
    inv = Invite(
        pool_id=pool_id,
        node=checksum(node, "node"),
        nonce=secrets.randbits(64) if nonce is None else nonce,
        expiry=now + ttl,
        chain_id=c.deployment.chain_id,
        pool_manager=c.contract("PoolManager"),
    )
    return inv.signed_by(coordinator)


async def join_pool(c: ChainClient, invite: Invite, pool_id: int | None = None) -> Receipt:
    if pool_id is not None and invite.pool_id != pool_id:
        raise ChainError(f"the invite is for pool {invite.pool_id}, not pool {pool_id}", "use the invite for this pool")
    if invite.chain_id != c.deployment.chain_id or invite.pool_manager.lower() != c.contract("PoolManager").lower():
        raise ChainError(
            f"the invite is for chain {invite.chain_id} / pool manager {invite.pool_manager}, not this deployment",
            "ask the coordinator of this deployment for an invite",
        )
    return await c.transact(
        "PoolManager",
        "joinPool",
        invite.pool_id,
        invite.node,
        invite.nonce,
        invite.expiry,
        invite.signature,
        what="pool join",
    )


# ---------------------------------------------------------------------- work


@dataclass(frozen=True)
class WorkItem:
    node: str
    work_key: str
    units: int
    policy_version: int
    proof_commitment: str

    def as_input(self) -> dict[str, Any]:
        if not 0 < self.units < 2**48:
            raise ChainError(f"work {self.work_key}: units {self.units} out of range", "units must be in 1..2^48-1")
        return {
            "node": checksum(self.node, "node"),
            "workKey": bytes32(self.work_key, "work key"),
            "units": self.units,
            "policyVersion": self.policy_version,
            "proofCommitment": bytes32(self.proof_commitment, "proof commitment"),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkItem:
        try:
            return cls(
                node=str(d["node"]),
                work_key=str(d["work_key"]),
                units=int(d["units"]),
                policy_version=int(d.get("policy_version", 0)),
                proof_commitment=str(d.get("proof_commitment", "0x" + "00" * 32)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"malformed work record {d!r}: {exc}", "each record needs node, work_key and units"
            ) from None


def chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def record_work(c: ChainClient, pool_id: int, items: Sequence[WorkItem]) -> list[Receipt]:
    if not items:
        raise ChainError("no work records to submit", "pass at least one record")
    inputs = [w.as_input() for w in items]
    keys = [i["workKey"] for i in inputs]
    if len(set(keys)) != len(keys):
        raise ChainError("the batch contains the same work key twice", "each work key is recorded once")
    return [
        await c.transact("WorkLedger", "recordWork", pool_id, list(part), what="work record batch")
        for part in chunks(inputs, MAX_BATCH)
    ]


async def claimable_keys(c: ChainClient, pool_id: int, provider: str) -> list[str]:
    """`provider`'s final, unclaimed work in `pool_id`, from all the pool's events (the audit's replay, in
    bounded pages): for one-off commands; the worker's daemon scans incrementally (`Worker.claimable`)."""
    from .audit import rebuild

    ledger = rebuild(pool_id, await c.events(["WorkLedger"], topics=[None, topic(pool_id)]), [], {})
    now, provider = await c.timestamp(), checksum(provider)
    return [r.work_key for r in ledger.records.values() if r.provider == provider and r.final(now)]


def why_not_claimable(work_key: str, rec: dict[str, Any], provider: str, now: int) -> str | None:
    """Why `provider` cannot claim the record `rec` at chain time `now` (None: it can). Pure."""
    status = RECORD_STATUS[int(rec["status"])]
    if status == "none":
        return f"no work {work_key} is recorded in this pool"
    if status != "pending":
        return f"work {work_key} is already {status}"
    if checksum(str(rec["provider"])) != checksum(provider):
        return f"work {work_key} belongs to provider {rec['provider']}"
    if now < int(rec["deadline"]):
        return f"work {work_key} is still in its validation window until {when(int(rec['deadline']))}"
    return None


async def claim(c: ChainClient, pool_id: int, keys: Sequence[str] | None = None) -> tuple[int, list[Receipt]]:
    """Claim `keys` (default: every claimable record of the caller). Returns (tokens, receipts).
    Named keys that cannot be claimed now are explained and left out (the ledger skips them too);
    it is an error only when none can."""
    if keys is None:
        todo = await claimable_keys(c, pool_id, c.address)
    else:
        now = await c.timestamp()
        todo, why = [], []
        for k in keys:
            reason = why_not_claimable(k, await record(c, pool_id, k), c.address, now)
            (why.append(reason) if reason else todo.append(k))
        if why and not todo:
            raise ChainError(f"nothing to claim: {why[0]}" + (f" (and {len(why) - 1} more)" if len(why) > 1 else ""),
                             "work is claimable by its provider once its validation window ends")  # fmt: skip
        for reason in why:
            log.warning("not claimed: %s", reason)
    if not todo:
        raise ChainError(f"nothing to claim in pool {pool_id}", "work becomes claimable when its validation window ends")  # fmt: skip
    return await claim_now(c, pool_id, todo)


async def claim_now(c: ChainClient, pool_id: int, todo: Sequence[str]) -> tuple[int, list[Receipt]]:
    """Claim `todo`, checked claimable by the caller (the ledger skips any that no longer are)."""
    total, receipts = 0, []
    for part in chunks([bytes32(k, "work key") for k in todo], MAX_BATCH):
        r = await c.transact("WorkLedger", "claim", pool_id, list(part), what="claim")
        total += sum(int(e.args["reward"]) for e in r.all("WorkClaimed"))
        receipts.append(r)
    return total, receipts


def rollout_claim(c: ChainClient, pool_id: int, work_key: str) -> RolloutClaim:
    """What a node signs for its rollout file `work_key` in `pool_id`, bound to this chain and ledger."""
    return RolloutClaim(work_key, pool_id, c.deployment.chain_id, c.contract("WorkLedger"))
