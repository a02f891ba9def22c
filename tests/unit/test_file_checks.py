"""The file-wide checks of a rollout file that are pure arithmetic: the termination test (statistical
pools), the steering test (exact pools), and which calibration a pool's spec selects (issue 37)."""

from __future__ import annotations

import math


def test_the_termination_test_fails_banned_and_forced_stops_and_passes_their_expected_count() -> None:
    from node.rollout.checks import Reason, StopStats, termination_test

    # 64 completions that each could have stopped about once, with stop chances of a few percent a token
    def stats(stopped: int, per: float = 1.0) -> list[StopStats]:
        return [StopStats(int(i < stopped), per, per * 0.97) for i in range(64)]

    assert termination_test(stats(64)).ok and termination_test(stats(58)).ok and termination_test(stats(64, 1.1)).ok
    banned = termination_test(stats(0))
    assert banned.reason == Reason.BAD_TERMINATION and "suppressed" in banned.detail
    forced = termination_test(stats(64, 0.1))  # stops where the model expects 6.4
    assert forced.reason == Reason.BAD_TERMINATION and "forced" in forced.detail
    assert termination_test([]).ok


def test_the_steering_test_allows_honest_near_ties_and_fails_a_worker_that_uses_the_margin() -> None:
    from node.rollout.checks import Reason, binomial_tail_log_bound, steering_test

    assert binomial_tail_log_bound(10, 1000, 0.02) == 0.0  # below the mean: no bound
    assert binomial_tail_log_bound(60, 1000, 0.02) < binomial_tail_log_bound(40, 1000, 0.02) < 0
    assert binomial_tail_log_bound(1, 1000, 0.0) == -math.inf
    assert steering_test(20, 1000, 0.02).ok and steering_test(45, 1000, 0.02).ok
    v = steering_test(120, 1000, 0.02)
    assert v.reason == Reason.REPLAY_MISMATCH and "steered" in v.detail
    assert steering_test(0, 0, 0.02).ok


def test_a_pool_that_mandates_one_precision_gets_its_near_zero_margin() -> None:
    from node.taskspec import TaskSpec
    from node.verify import Calibrated

    any_precision = Calibrated.for_spec(TaskSpec("tiny", "math", {"temperature": 1.0, "max_tokens": 8}))
    fp32 = Calibrated.for_spec(
        TaskSpec("tiny", "math", {"temperature": 1.0, "max_tokens": 8}, extra={"precision": "fp32"})
    )
    assert fp32.sampling.margin <= 0.01 < any_precision.sampling.margin
    assert fp32.sampling.disagree_rate(1.0) < any_precision.sampling.disagree_rate(1.0) < 0.05
    assert fp32.prefill_dtypes() == ("float32",)
    # no shipped calibration for a mandated precision: the model's own
    bf16 = Calibrated.for_spec(
        TaskSpec("tiny", "math", {"temperature": 1.0, "max_tokens": 8}, extra={"precision": "bf16"})
    )
    assert bf16.sampling.margin == any_precision.sampling.margin


def test_the_cumulative_termination_test_sees_a_deficit_no_single_file_shows() -> None:
    from node.rollout.checks import Reason, StopStats, cumulative_termination, termination_test

    # one file of 64 completions: 48 honest ones (each expected to stop about once, and stopping) and 16
    # with stops banned, which run to max_tokens where the model expected about 3 stops each
    file = [StopStats(1, 1.0, 0.97) for _ in range(48)] + [StopStats(0, 3.0, 2.9) for _ in range(16)]
    assert termination_test(file).ok  # within the per-file bound, paid for the longer completions
    s = e = v = 0.0
    failed_at = None
    for n in range(1, 40):
        s, e, v = s + 48, e + 96, v + 48 * 0.97 + 16 * 2.9
        t = cumulative_termination(s, e, v)
        if not t.ok and failed_at is None:
            failed_at = n
            assert t.reason == Reason.BAD_TERMINATION and t.figures["near_threshold"] == 1.0
    assert failed_at is not None and failed_at <= 4
    # an honest node a little short of its expectation, within the slack for numerics: never
    assert cumulative_termination(0.97 * 64_000, 64_000, 62_000).ok
    assert cumulative_termination(70_000, 64_000, 62_000).ok  # more stops than expected: not the paid cheat
