"""The validator's rules for one recorded piece of work, as pure functions: where a check goes next.

A record's status in the validator's state (`node.validator.state`):

    pending --not sampled, no suspicion--> skipped --the trainer refused it--> pending
    pending --checked, passed--> ok
    pending --checked, failed--> invalid --node signed it--> accused (hard) | invalidated (soft: never served,
                                                                    or every failure near its threshold)
                                        --no node signature--> unsigned (reported, never slashed; asked again)
    pending | invalid | unsigned --record left the window (claimed, disputed, invalidated)--> see `after_record_left`
                                 (another party's open challenge: unchanged, looked at again once it ends)
    pending | invalid | unsigned --deadline within the margin--> settled
    pending --internal error, `max_internal_errors` times--> error (given up, reported loudly)
    accused --appeal period over, unappealed / committee decided--> invalidated | overturned | settled

A committee duty (an appeal or a challenge of the pool) is open until we voted, were not drawn, or it
closed.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..rollout.checks import invalidation_is_hard, stored_reason

__all__ = ["invalidation_is_hard", "stored_reason"]  # the verdict rules the validator's shell uses from here

OPEN = ("pending", "invalid", "unsigned")
"""Statuses checked again every round."""

ALREADY_DONE = ("AlreadySettled", "DeadlinePassed", "NamedAfterWork")
"""Contract errors that mean an invalidation is moot now: the record is settled or disputed by someone
else (the next round reads which), or it was recorded before we were named."""

#: Seconds between the pool's validators' turns to invalidate one record (`invalidation_turn`).
INVALIDATION_STAGGER = 4.0


def invalidation_turn(work_key: str, me: str, validators: frozenset[str]) -> int:
    """This validator's turn (0: first) to invalidate `work_key`, in an order drawn from the key that every
    validator of the pool computes alike. A trainer's hint reaches all of them at once: without turns two
    accusations passed their estimate before either was mined, and the second was mined as a revert (its
    gas lost). Waiting `turn * INVALIDATION_STAGGER` lets the first be mined, so the next one's estimate
    sees it (`ALREADY_DONE`) and nothing is sent. Pure."""
    me = me.lower()
    everyone = {v.lower() for v in validators} | {me}
    salt = work_key.lower().encode()
    order = sorted(everyone, key=lambda a: hashlib.sha256(salt + a.encode()).digest())
    return order.index(me)


VOTE_MOOT = ("NotDisputed", "VotePeriodOver", "NotJuror")
"""Contract errors that mean a committee vote is moot: the duty is closed."""


def after_record_left(status: str, ours: bool, dispute_kind: str, record_status: str) -> str:
    """The status of a record the ledger no longer holds as pending: `ours` says whether the open or
    last dispute is our own accusation (sent before a restart, say). Another party's open challenge
    leaves our status as it is: one that does not stand reopens the record with the time it had left,
    and we look at it again then (another validator's accusation is the validators' turn: settled)."""
    if ours and dispute_kind in ("accusation", "appeal"):
        return "accused"
    if record_status == "disputed" and not ours and dispute_kind == "challenge":
        return status
    if ours or (status == "invalid" and record_status == "invalidated"):
        return "invalidated"
    return "settled"


def too_late(now: int, margin: int, deadline: int) -> bool:
    """Whether a record is past checking: its deadline is within `margin` seconds (a transaction
    might not land in time)."""
    return now + margin >= deadline


def last_chance(now: int, margin: int, deadline: int) -> bool:
    """Whether this round is the last one that can still act on the record (unavailable now is the
    verdict, instead of asking again later)."""
    return now + 2 * margin >= deadline


def after_check(ok: bool) -> str:
    return "ok" if ok else "invalid"


def after_internal_error(errors: int, max_errors: int, status: str) -> str:
    """A check that failed on our side keeps its status (retried) until `max_errors` failures."""
    return "error" if errors >= max_errors else status


def vote_upholds(verdict: dict[str, Any]) -> bool:
    """A committee member's vote on a disputed invalidation from its own check of the file: uphold only
    what it would have invalidated hard itself (a failure near its threshold is no ground for a slash,
    whatever the accuser sent)."""
    return not verdict["ok"] and invalidation_is_hard(stored_reason(verdict))


def after_dispute(verdict: str) -> str | None:
    """The status of our accusation once its dispute has a verdict (None while it is open)."""
    if verdict == "open":
        return None
    return {"upheld": "invalidated", "overturned": "overturned"}.get(verdict, "settled")


def duty_after_juror_state(state: int) -> str | None:
    """A duty's status from our juror state on chain (1: drawn, still to vote: None)."""
    if state == 1:
        return None
    return "voted" if state == 2 else "not-drawn"
