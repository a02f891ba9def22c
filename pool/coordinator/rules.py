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
