"""Readable messages and fixes for the protocol contracts' custom errors. Pure."""

from __future__ import annotations

import time
from typing import Any

from .abi import DecodedError

POOL_STATUS = ("none", "created", "active", "ended")
RECORD_STATUS = ("none", "pending", "invalidated", "claimed", "disputed")


def tokens(amount: int) -> str:
    """Base units (18 decimals) as a short decimal string with the token symbol."""
    whole, frac = divmod(int(amount), 10**18)
    text = f"{whole}" if frac == 0 else f"{whole}.{frac:018d}".rstrip("0")
    return f"{text} INTL"


def when(ts: int) -> str:
    """A unix time as the UTC date and time every message prints."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(ts)))


def explain(err: DecodedError) -> tuple[str, str]:
    """(message, hint) for a decoded revert."""
    a: dict[str, Any] = err.args
    n = err.name
    table: dict[str, tuple[str, str]] = {
        "StakeTooLow": (
            f"stake too low: {tokens(a.get('have', 0))} staked, {tokens(a.get('need', 0))} needed",
            "stake more with `intellect-node provider stake N`",
        ),
        "InsufficientStake": (
            f"cannot unstake {tokens(a.get('requested', 0))}: only {tokens(a.get('staked', 0))} staked",
            "unstake less",
        ),
        "AlreadyRegistered": (
            f"provider {a.get('provider')} is already registered",
            "use `provider stake N` to add stake",
        ),
        "NotRegistered": (
            f"{a.get('provider')} is not a registered provider",
            "run `intellect-node provider register --stake N` first",
        ),
        "NothingUnbonding": ("nothing is unbonding", "unstake first with `intellect-node provider unstake N`"),
        "StakeLocked": (
            f"stake is locked until {when(a.get('lockedUntil', 0))}: recorded work can be invalidated until then",
            "withdraw (or remove the node) after that time",
        ),
        "StakeLockAlreadySet": ("the registry's stake lock is already set", ""),
        "StillUnbonding": (
            f"stake is still unbonding until {when(a.get('unbondingEnd', 0))}",
            "withdraw after that time",
        ),
        "NodeAlreadyRegistered": (
            f"node {a.get('node')} is already bound to provider {a.get('provider')}",
            "use another node key",
        ),
        "UnknownNode": (f"node {a.get('node')} is not registered", "add it with `intellect-node node add`"),
        "NotNodeProvider": (
            f"{a.get('caller')} is not the provider of node {a.get('node')}",
            "send this with the provider's key",
        ),
        "NodeInPool": (f"node {a.get('node')} is still in pool {a.get('poolId')}", "leave the pool first"),
        "BadNodeSignature": (
            f"the node binding signature is not from node {a.get('node')}",
            "sign it with that node's key",
        ),
        "ZeroComputeUnits": ("compute units must be positive", "pass --units N with N >= 1"),
        "ZeroAmount": ("the amount must be positive", ""),
        "ZeroAddress": ("an address argument is the zero address", ""),
        "BountyTooHigh": (f"bounty share {a.get('bountyBps')} bps is above the maximum", "use at most 5000 bps"),
        "PoolManagerAlreadySet": ("the registry's pool manager is already set", ""),
        "UnknownPool": (f"pool {a.get('poolId')} does not exist", "check the pool id (`intellect-node pool info ID`)"),
        "NotPoolOwner": (
            f"{a.get('caller')} is not the owner of pool {a.get('poolId')}",
            "send this with the pool owner's key",
        ),
        "NotPoolAdmin": (
            f"{a.get('caller')} is neither owner nor coordinator of pool {a.get('poolId')}",
            "send this with the owner's or coordinator's key",
        ),
        "WrongPoolStatus": (
            f"pool {a.get('poolId')} is {_status(a.get('have'))}, needs to be {_status(a.get('need'))}",
            "start it with `intellect-node pool start ID`" if a.get("need") == 2 else "",
        ),
        "InviteExpired": (f"the invite expired at {when(a.get('expiry', 0))}", "ask the coordinator for a new invite"),
        "InviteAlreadyUsed": (
            f"invite nonce {a.get('nonce')} of pool {a.get('poolId')} was already used",
            "ask the coordinator for a new invite",
        ),
        "BadInviteSignature": (
            f"the invite is signed by {a.get('signer')}, not by the pool's coordinator {a.get('coordinator')}",
            "ask the pool's coordinator for an invite for this pool and node",
        ),
        "AlreadyInPool": (f"node {a.get('node')} is already in pool {a.get('poolId')}", "leave that pool first"),
        "NotInPool": (f"node {a.get('node')} is not in pool {a.get('poolId')}", ""),
        "Blacklisted": (f"node {a.get('node')} is blacklisted in pool {a.get('poolId')}", ""),
        "NotCoordinator": (
            f"{a.get('caller')} is not the coordinator of pool {a.get('poolId')}",
            "only the pool's coordinator key can record work",
        ),
        "PoolNotActive": (
            f"pool {a.get('poolId')} is {_status(a.get('status'))}, not active",
            "the owner starts it with `pool start`",
        ),
        "EmptyBatch": ("the batch is empty", "pass at least one record"),
        "BatchTooLarge": (f"the batch has {a.get('size')} entries, at most {a.get('max')} are allowed", "split it"),
        "ZeroUnits": (f"work {a.get('workKey')} has zero units", ""),
        "NotMember": (f"node {a.get('node')} is not a member of pool {a.get('poolId')}", "it must join the pool first"),
        "DuplicateWork": (
            f"work {a.get('workKey')} is already recorded in pool {a.get('poolId')}",
            "each work key is recorded once",
        ),
        "UnknownWork": (
            f"no work {a.get('workKey')} is recorded in pool {a.get('poolId')}",
            "check the pool id and work key",
        ),
        "NotValidator": (
            f"{a.get('caller')} is not a validator of pool {a.get('poolId')}",
            "the pool's owner names validators with `intellect-node pool add-validator`",
        ),
        "SoftAccusedBefore": (
            f"a soft accusation of work {a.get('workKey')} was overturned already",
            "only a hard accusation (or a challenge) can dispute it again",
        ),
        "NamedAfterWork": (
            f"work {a.get('workKey')} was recorded at {when(a.get('recordedAt', 0))}, before this validator was "
            f"named ({when(a.get('validatorSince', 0))})",
            "work is judged by the validators named when it was recorded",
        ),
        "NotProvidersWork": (
            f"the signature over work {a.get('workKey')} is by {a.get('signer')}, not a node of provider "
            f"{a.get('provider')}",
            "a slash needs the recorded node's own signature over the work (its RolloutClaim)",
        ),
        "NotDisputed": (f"work {a.get('workKey')} has no open dispute of that kind", ""),
        "AppealPeriodOver": (
            f"the appeal period of work {a.get('workKey')} ended at {when(a.get('appealEnd', 0))}",
            "",
        ),
        "AppealPeriodNotOver": (
            f"work {a.get('workKey')} can be appealed until {when(a.get('appealEnd', 0))}",
            "finalize after that time",
        ),
        "VotePeriodOver": (f"the vote on work {a.get('workKey')} ended at {when(a.get('voteEnd', 0))}", ""),
        "VotePeriodNotOver": (
            f"the vote on work {a.get('workKey')} runs until {when(a.get('voteEnd', 0))}",
            "close it after that time",
        ),
        "WrongValidatorSet": (
            f"that is not the validator set the dispute of work {a.get('workKey')} opened under",
            "pass the pool's validatorEntries as of the dispute's openedBlock",
        ),
        "CommitteeNotDrawn": (
            f"the committee of work {a.get('workKey')} is not drawn yet",
            "draw it first (`drawCommittee`, one block after the appeal or challenge)",
        ),
        "NotJuror": (f"{a.get('caller')} is not on the committee of work {a.get('workKey')}", ""),
        "NotChallenger": (
            f"{a.get('caller')} stakes less than the pool's minimum",
            "only providers staked at least the pool's minimum may challenge work",
        ),
        "OwnWork": (f"work {a.get('workKey')} is the caller's own", ""),
        "AlreadyValidator": (f"{a.get('validator')} is already a validator of pool {a.get('poolId')}", ""),
        "NotPoolValidator": (f"{a.get('validator')} is not a validator of pool {a.get('poolId')}", ""),
        "TooManyValidators": (f"pool {a.get('poolId')} already has {a.get('max')} validators", "remove one first"),
        "BadDisputeTerms": ("dispute terms need positive periods and a committee of 1 to 32", ""),
        "AlreadySettled": (f"work {a.get('workKey')} is already {_record(a.get('status'))}", ""),
        "DeadlinePassed": (
            f"the validation window of work {a.get('workKey')} closed at {when(a.get('deadline', 0))}",
            "work is final after its deadline and can no longer be invalidated",
        ),
        "NotRecordProvider": (
            f"work {a.get('workKey')} belongs to provider {a.get('provider')}, not {a.get('caller')}",
            "send this with the provider's key",
        ),
        "NothingToClaim": (
            f"none of the named work in pool {a.get('poolId')} is claimable by this key now",
            "work is claimable by its provider after its deadline, once, unless it was invalidated",
        ),
        "InsufficientPoolFunds": (
            f"pool {a.get('poolId')} holds {tokens(a.get('budget', 0))} but would owe {tokens(a.get('need', 0))}",
            "recording reserves each reward: the pool owner must fund it with `intellect-node pool fund`",
        ),
        "StakeBelowMinimum": (
            f"the provider of node {a.get('node')} stakes {tokens(a.get('stake', 0))}, "
            f"pool {a.get('poolId')} needs {tokens(a.get('need', 0))}",
            "no work is recorded under the pool's minimum stake: the provider must stake more",
        ),
        "BudgetOverflow": (f"funding {tokens(a.get('amount', 0))} would overflow the pool budget", "fund less"),
        "SurplusTooLow": (f"only {tokens(a.get('surplus', 0))} is not owed to pending work", "withdraw less"),
        "ERC20InsufficientBalance": (
            f"token balance too low: {tokens(a.get('balance', 0))} held, {tokens(a.get('needed', 0))} needed",
            "get tokens first (on the devnet: `intellect-node token mint`)",
        ),
        "ERC20InsufficientAllowance": (
            f"token allowance too low: {tokens(a.get('allowance', 0))} approved",
            "approve more",
        ),
        "AccessControlUnauthorizedAccount": (
            f"{a.get('account')} lacks the required role",
            "ask governance for the role",
        ),
        "OwnableUnauthorizedAccount": (f"{a.get('account')} is not the owner", "send this with the owner's key"),
        "ECDSAInvalidSignature": ("the signature is invalid", "sign again with the right key"),
        "ECDSAInvalidSignatureLength": ("the signature has the wrong length", "a signature is 65 bytes"),
        "ECDSAInvalidSignatureS": ("the signature is malleable (high s)", "sign again"),
    }
    if n in table:
        return table[n]
    if n == "Error":
        return str(a.get("message")), ""
    if n == "Panic":
        return f"contract panic: {a.get('message')}", ""
    args = ", ".join(f"{k}={v}" for k, v in a.items())
    return f"{n}({args})", ""


def _status(v: Any) -> str:
    try:
        return POOL_STATUS[int(v)]
    except (TypeError, ValueError, IndexError):
        return str(v)


def _record(v: Any) -> str:
    try:
        return RECORD_STATUS[int(v)]
    except (TypeError, ValueError, IndexError):
        return str(v)
