"""The coordinator's rules (`pool.coordinator.rules`)."""

from __future__ import annotations

from pool.coordinator import rules


def test_a_seeded_pool_draws_the_same_tasks_on_every_run() -> None:
    first = [rules.seeded_task_seed(7, n) for n in range(50)]
    assert first == [rules.seeded_task_seed(7, n) for n in range(50)]
    assert len(set(first)) == 50 and all(0 <= s < 2**62 for s in first)
    assert first != [rules.seeded_task_seed(8, n) for n in range(50)]


def test_checkpoints_kept_are_the_recent_versions_and_their_predecessors() -> None:
    assert rules.retained_versions(5, []) == {4, 5}
    assert rules.retained_versions(5, [2, 3]) == {1, 2, 3, 4, 5}
    assert rules.retained_versions(0, []) == {0}
