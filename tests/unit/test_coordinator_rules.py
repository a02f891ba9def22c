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


def test_which_task_a_worker_gets() -> None:
    # its open task again, while the policy is within async_level of it
    assert rules.task_to_hand_out(5, policy=6, async_level=1, training=True, backlog=99, train_files=1) == "resend"
    assert rules.task_to_hand_out(4, policy=6, async_level=1, training=True, backlog=0, train_files=1) == "supersede"
    # no open task: wait while the trainer has enough to consume, else a new one
    assert rules.task_to_hand_out(None, 6, 2, True, backlog=12, train_files=4) == "wait"
    assert rules.task_to_hand_out(None, 6, 2, True, backlog=11, train_files=4) == "new"
    assert rules.task_to_hand_out(None, 6, 2, False, backlog=999, train_files=4) == "new"  # no trainer, no limit
