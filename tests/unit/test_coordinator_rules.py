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


def test_a_dropped_rollout_keeps_why_when_its_node_is_invalidated(tmp_path) -> None:
    """A rollout dropped because its provider's stake fell below the minimum keeps that reason when the
    node's work is invalidated afterwards (the crash test found the note overwritten)."""
    import time

    from pool.coordinator.state import CoordinatorState

    st = CoordinatorState(tmp_path / "c.db")
    node = "0x" + "ab" * 20
    for k in ("0x01", "0x02"):
        st.store.execute(
            "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, mean_reward, "
            "accepted_at) VALUES(?, ?, ?, 100, 0, ?, 0.0, ?)",
            (k, k, node, "0x" + "33" * 32, time.time()),
        )
    st.set_dropped("0x01", "provider's stake is below the minimum")
    st.add_invalidations([("0x99", node, 5)], [])
    notes = {r["work_key"]: r["note"] for r in st.store.query("SELECT work_key, note FROM rollouts")}
    assert notes == {"0x01": "provider's stake is below the minimum", "0x02": "node had work invalidated"}


def test_a_task_is_bound_to_the_version_its_worker_holds_when_fresh_enough() -> None:
    assert rules.bound_version(4, policy=6, async_level=2) == 4
    assert rules.bound_version(6, policy=6, async_level=2) == 6
    assert rules.bound_version(3, policy=6, async_level=2) == 6  # too old: the current one
    assert rules.bound_version(7, policy=6, async_level=2) == 6  # not published yet
    for junk in (None, "5", 5.0, True, [5]):
        assert rules.bound_version(junk, policy=6, async_level=2) == 6
    # a seeded pool's next seed is known ahead: naming a version would be choosing it for that seed
    assert rules.bound_version(4, policy=6, async_level=2, seeded=True) == 6


def test_lapsed_tasks_beyond_the_limit_hold_new_tasks_back() -> None:
    now = 10_000.0
    assert rules.lapse_wait([], now, window=3600, limit=2) == 0.0
    assert rules.lapse_wait([now - 10, now - 20], now, window=3600, limit=2) == 0.0
    # a third lapse within the hour: wait until the oldest of the three is an hour old
    assert rules.lapse_wait([now - 10, now - 20, now - 100], now, window=3600, limit=2) == 3500.0
    # lapses older than the window, or not yet expired, do not count
    assert rules.lapse_wait([now - 10, now - 20, now - 4000, now + 5], now, window=3600, limit=2) == 0.0
    assert rules.lapse_wait([now - 1] * 5, now, window=3600, limit=0) == 3599.0
    assert rules.lapse_wait([now - 1] * 5, now, window=3600, limit=-1) == 0.0  # no limit


def test_lapses_count_expired_and_superseded_tasks_but_not_an_outage() -> None:
    lives = [(100.0, 200.0), (300.0, 400.0), (None, 500.0), (600.0, 700.0)]
    assert rules.counted_lapses(lives, []) == [200.0, 400.0, 500.0, 700.0]
    # the coordinator was down 350-450: the task alive then is excused, the others still count
    assert rules.counted_lapses(lives, [(350.0, 450.0)]) == [200.0, 500.0, 700.0]
    # an outage touching a life's either end excuses it; a life of unknown start is judged by its end
    assert rules.counted_lapses(lives, [(50.0, 100.0), (500.0, 520.0)]) == [400.0, 700.0]
    assert rules.counted_lapses(lives, [(201.0, 299.0)]) == [200.0, 400.0, 500.0, 700.0]


def test_outages_kept_are_the_recent_ones() -> None:
    assert rules.recent_downtimes([], 1000.0) == []
    assert rules.recent_downtimes([(10.0, 20.0), (900.0, 1100.0)], 1000.0, (1200.0, 1260.0)) == [
        (900.0, 1100.0), (1200.0, 1260.0),
    ]  # fmt: skip
    assert rules.recent_downtimes([], 0.0, (5.0, 5.0)) == []  # an empty span is no outage


def test_a_stale_tasks_replacement_version_depends_on_the_task_alone() -> None:
    """Bound to 0 with async level 2: stale from version 3 on. Its replacement is bound to 3 wherever
    the policy is in 3..5, to 6 in 6..8 (two versions let pass), and so on: whenever the worker asks,
    the version is the one fresh chain point, and a later one costs a lapse more."""
    for policy in (3, 4, 5):
        assert rules.replacement(0, policy, 2) == (3, 1)
    for policy in (6, 7, 8):
        assert rules.replacement(0, policy, 2) == (6, 2)
    assert rules.replacement(0, 9, 2) == (9, 3)
    assert rules.replacement(4, 6, 0) == (6, 2)  # no asynchrony: every version is a chain point
    for bound in range(4):
        for policy in range(bound + 3, bound + 20):
            version, hops = rules.replacement(bound, policy, 2)
            assert policy - 2 <= version <= policy and version == bound + 3 * hops  # fresh, on the chain
