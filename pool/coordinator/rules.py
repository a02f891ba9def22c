"""The coordinator's rules, pure: which problems a task draws, and which checkpoints stay served."""

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
