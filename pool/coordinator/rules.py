"""The coordinator's rules, pure: which task a worker gets, which problems it draws, and which checkpoints
stay served."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def seeded_task_seed(seed: int, issued: int) -> int:
    """The problem seed of the task issued after `issued` others, for a pool run with a fixed `seed`:
    sha256(seed, n), the same sequence on every run and across restarts."""
    digest = hashlib.sha256(f"intellect-node task seed {seed} {issued}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def retained_versions(new: int, recent: Iterable[int]) -> set[int]:
    """Versions whose checkpoints stay served once `new` is published, from the versions that were
    current lately (`recent`): those, `new`, and the version before each of them."""
    kept = set(recent) | {new}
    return kept | {w - 1 for w in kept if w > 0}


def task_to_hand_out(
    open_task_version: int | None, policy: int, async_level: int, training: bool, backlog: int, train_files: int
) -> str:
    """What a worker asking for work gets: "resend" its open task (asking twice never yields a second
    seed to pick from) while the policy has not moved more than `async_level` versions past it;
    "supersede" it otherwise (its rollouts could never be trained on) and decide again without it;
    "wait" while the trainer has `train_files * (async_level + 1)` rollouts or open tasks to consume
    (asynchrony is bounded: nothing generated now would be too stale to train on); else "new"."""
    if open_task_version is not None:
        return "resend" if open_task_version >= policy - async_level else "supersede"
    if training and backlog >= train_files * (async_level + 1):
        return "wait"
    return "new"


def bound_version(named: object, policy: int, async_level: int, seeded: bool = False) -> int:
    """The one policy version a new task's rollouts must be generated with: the version the worker says
    it holds (`named`, sent before it knows the task's seed) where that is fresh enough, else the current
    one. A task open to every fresh version would let a worker generate it under each and keep the file
    it likes best (exact sampling fixes every token once seed and weights are fixed, so the version is
    the one choice left). In a `seeded` pool the next task's seed is known in advance (the pool's seed
    and the count of tasks issued), so naming a version would be choosing it for a known seed: such a
    pool binds every task to the current version."""
    if not seeded and type(named) is int and policy - async_level <= named <= policy:
        return named
    return policy


def replacement(bound: int, policy: int, async_level: int) -> tuple[int, int]:
    """The version a stale task's replacement (same seed) is bound to, and how many supersessions that
    makes, from the version the task was bound to: the task bound to `bound` went stale when the policy
    reached bound + async_level + 1, so its replacement is bound to that version; if that is stale too
    by now, to the next such version, and so on (one per `async_level + 1`: exactly one of them is fresh
    at any policy). The version depends on the task and the current policy only, never on when the
    worker asks, so a worker cannot pick which version its seed is generated under by waiting; each
    version it lets pass is one supersession, counted as a lapse."""
    span = async_level + 1
    hops = max(1, -(-(policy - async_level - bound) // span))
    return bound + hops * span, hops


def counted_lapses(
    lives: Iterable[tuple[float | None, float]], downtimes: Iterable[tuple[float, float]]
) -> list[float]:
    """The end times of a node's tasks that count as lapsed, from each unsubmitted task's life
    (issued, ended: expired, or superseded because the node held it while the policy moved past it):
    every one, except those whose life overlapped a time the coordinator was down (`downtimes`,
    (from, to) pairs): the node could not submit then, so an outage is no node's lapse."""
    down = list(downtimes)
    return [
        end for start, end in lives
        if not any((start if start is not None else end) <= to and frm <= end for frm, to in down)
    ]  # fmt: skip


def lapse_wait(lapsed_at: Iterable[float], now: float, window: float, limit: int) -> float:
    """Seconds before a node may be given a new task, from the times its tasks lapsed unsubmitted
    (`counted_lapses`): 0 while at most `limit` of them lapsed within `window`, else until enough have
    aged out. A worker can only draw a new outcome by letting its task lapse (a new seed) or holding it
    until it is superseded (the same seed under newer weights), so this bounds how often it can pick
    which tasks' outcomes it submits (an honest worker lapses a task when it is down longer than a task
    lives)."""
    recent = sorted((t for t in lapsed_at if now - window < t <= now), reverse=True)
    if limit < 0 or len(recent) <= limit:
        return 0.0
    return recent[limit] + window - now


def recent_downtimes(
    downtimes: Iterable[tuple[float, float]], since: float, new: tuple[float, float] | None = None
) -> list[tuple[float, float]]:
    """The coordinator's outages worth keeping: those ending after `since` (older ones can excuse no
    lapse still counted), with `new` added, oldest first."""
    kept = [(float(a), float(b)) for a, b in downtimes if b > since]
    if new is not None and new[1] > new[0]:
        kept.append(new)
    return sorted(kept)
