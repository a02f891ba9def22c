"""The worker's rules (`node.worker.rules`): policy versions for a task, and answers to accusations."""

from __future__ import annotations

from node.worker import rules


def test_the_newest_downloaded_version_the_task_allows() -> None:
    assert rules.best_downloaded({1: "a", 3: "b", 5: "c"}, 2, 4) == 3
    assert rules.best_downloaded([1, 3, 5], 6, 9) is None
    assert rules.best_downloaded([], 0, 0) is None


def test_a_newer_version_is_coming_while_downloading_or_announced_by_the_task_only() -> None:
    assert rules.newer_coming(loaded=2, downloading={3}, latest_announced=3, max_version=3)
    assert not rules.newer_coming(loaded=2, downloading={5}, latest_announced=5, max_version=3)  # beyond the task
    # the task names version 4 before its announcement reached us
    assert rules.newer_coming(loaded=3, downloading=set(), latest_announced=3, max_version=4)
    assert not rules.newer_coming(loaded=3, downloading=set(), latest_announced=3, max_version=3)


def test_which_version_to_fetch() -> None:
    announced = [0, 1, 2, 3]
    assert rules.version_to_fetch(announced, set(), set(), 1, 3) == 3
    assert rules.version_to_fetch(announced, {3}, set(), 1, 3) == 2
    assert rules.version_to_fetch(announced, set(), {2}, 1, 3) is None  # one already on its way
    assert rules.version_to_fetch(announced, set(), set(), 0, 0) is None  # the base model is held
    assert rules.version_to_fetch(announced, set(), set(), 4, 6) is None


def test_an_honest_worker_appeals_only_work_that_stands_and_only_when_told() -> None:
    assert rules.answer("the file is gone", cheater=False, yes=True) == "failed-self-check"
    assert rules.answer(None, cheater=False, yes=True) == "appealed"
    assert rules.answer(None, cheater=False, yes=False) == "declined"
    assert rules.answer("fails our re-check", cheater=True, yes=True) == "appealed"


def test_a_task_off_the_pools_spec_is_refused() -> None:
    from node.taskspec import TaskSpec

    spec = TaskSpec("tiny", "math", {"temperature": 1.0, "max_tokens": 64, "exact": True}, group_size=8)
    ok = {"temperature": 1, "max_tokens": 64, "exact": True}  # 1 and 1.0 are the same number
    assert rules.task_against_spec("math", "tiny", ok, 8, spec, 3, 3) is None
    assert "pool 4" in (rules.task_against_spec("math", "tiny", ok, 8, spec, 4, 3) or "")  # another pool's task
    for env, model, sampling, group in [
        ("math", "tiny", {**ok, "exact": False}, 8),  # exact sampling switched off by the coordinator
        ("math", "tiny", {"temperature": 1.0, "max_tokens": 64}, 8),  # ... or left out
        ("math", "tiny", {**ok, "temperature": 0.7}, 8),
        ("math", "tiny", {**ok, "top_p": 0.9}, 8),  # a key the spec never set
        ("math", "tiny", ok, 4),
        ("thinking-budget", "tiny", ok, 8),
        ("math", "smollm2", ok, 8),
    ]:
        assert rules.task_against_spec(env, model, sampling, group, spec, 3, 3) is not None, (
            env,
            model,
            sampling,
            group,
        )
    assert rules.task_against_spec("math", "tiny", {**ok, "exact": 1}, 8, spec, 3, 3) is not None  # 1 is not true


def test_a_worker_follows_the_current_version_while_its_downloads_are_quick() -> None:
    assert rules.follows_current(None, fresh_wait=20.0)  # nothing downloaded yet
    assert rules.follows_current(0.2, fresh_wait=20.0) and rules.follows_current(20.0, fresh_wait=20.0)
    assert not rules.follows_current(95.0, fresh_wait=20.0)  # a big checkpoint over a slow link
    assert not rules.follows_current(float("inf"), fresh_wait=20.0)  # the last download failed
