"""Exact sampling's pure rules: the seeded noise, the sampler's allowed set and draw, and the replay."""

from __future__ import annotations

import math

import pytest
import torch

from node.rollout.checks import Reason, SamplingParams, check_sampling, sampling_distribution
from node.rollout.checks import SamplingTolerances as Tol
from node.rollout.exact import (
    G_MAX,
    _log,
    allowed,
    check_replay,
    choose,
    choose_rows,
    gumbel,
    noise_bits,
    replay,
    replay_many,
    runner_up,
    sample_seed,
)
from node.taskspec import TaskSpecError, parse_spec


def test_the_noise_is_pinned() -> None:
    """Workers and validators of different releases must draw the same noise: these values are the
    definition (changing them is a protocol change, not a refactor)."""
    assert sample_seed(7, 0, 0) == sample_seed(7, 0, 0) != sample_seed(7, 0, 1) != sample_seed(7, 1, 0)
    assert noise_bits(123, [0, 1], 4).tolist() == [
        [3515475774, 1890704048, 4242890708, 1855466692],
        [3140711338, 2784051257, 566617168, 14530275],
    ]
    bits = noise_bits(2**64 - 1, range(64), 512)
    assert int(bits.min()) >= 0 and int(bits.max()) < 2**32
    assert len(set(bits.flatten().tolist())) > 0.99 * bits.numel()  # no short cycles or stuck lanes


def test_the_log_is_exact_enough_and_the_noise_is_gumbel() -> None:
    x = torch.cat([torch.rand(10000, dtype=torch.float64) * 50 + 1e-12, torch.tensor([2.0**-33, 1 - 2.0**-33, 1.0])])
    assert float(((_log(x) - torch.log(x)).abs() / torch.log(x).abs().clamp_min(1e-300)).max()) < 1e-13
    g = gumbel(11, range(4000), 256)
    assert abs(float(g.mean()) - 0.5772156649) < 0.01  # Euler-Mascheroni: the Gumbel(0, 1) mean
    assert abs(float(g.std()) - math.pi / math.sqrt(6)) < 0.01
    assert torch.equal(g, gumbel(11, range(4000), 256)) and not torch.equal(g, gumbel(12, range(4000), 256))


def test_draws_follow_the_tempered_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]]).repeat(40000, 1)
    for params in (SamplingParams(0.7), SamplingParams(1.3, top_p=0.8), SamplingParams(1.0, top_k=2)):
        want = sampling_distribution(torch.log_softmax(logits[:1], -1), params).exp()[0]
        got = torch.bincount(choose(logits, params, 99, range(40000)), minlength=5).double() / 40000
        assert float((got - want).abs().max()) < 0.01, (params, got, want)


def test_the_allowed_set_is_the_samplers() -> None:
    scaled = torch.log_softmax(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), -1)
    p = scaled.exp()[0].tolist()  # about 0.64, 0.24, 0.09, 0.03
    assert allowed(scaled, -1, 0.5).tolist() == [[True, False, False, False]]
    assert allowed(scaled, -1, p[0] + 0.01).tolist() == [[True, True, False, False]]  # the crossing token stays
    assert allowed(scaled, 3, 1.0).tolist() == [[True, True, True, False]]
    assert allowed(scaled, 2, 0.7).tolist() == [[True, False, False, False]]  # 0.73 of the top 2
    assert allowed(scaled, 2, 0.8).tolist() == [[True, True, False, False]]


@pytest.fixture
def rows() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.log_softmax(torch.randn(48, 300) * 2.5, dim=-1)


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.6, top_p=0.9), SamplingParams(1.2, top_k=40)])
def test_an_honest_completion_replays_and_every_lie_is_found(rows: torch.Tensor, params: SamplingParams) -> None:
    seed = sample_seed(5, 2, 3)
    tokens = choose(rows, params, seed, range(len(rows))).tolist()
    honest = check_replay(rows, tokens, params, seed, 0.1)
    assert honest.ok and honest.figures["replay_gap_max"] <= 0.0

    # a little numerical noise on the validator's side (another kernel) is within the margin
    wobble = rows + (torch.rand_like(rows) - 0.5) * 0.02
    assert check_replay(wobble, tokens, params, seed, 0.1).ok

    edited = list(tokens)
    edited[17] = (edited[17] + 1) % rows.shape[1]
    v = check_replay(rows, edited, params, seed, 0.1)
    assert v.reason is Reason.REPLAY_MISMATCH and v.detail.startswith("position 17:"), v

    other = check_replay(rows, tokens, params, sample_seed(5, 2, 4), 0.1)  # kept under another sample's index
    assert other.reason is Reason.REPLAY_MISMATCH and other.figures["near_threshold"] == 0.0

    hotter = choose(rows, SamplingParams(params.temperature * 2, params.top_p, params.top_k), seed, range(len(rows)))
    assert not check_replay(rows, hotter.tolist(), params, seed, 0.1).ok


def test_a_top_p_lie_is_found_by_the_support_check_the_replay_leaves_to_it(rows: torch.Tensor) -> None:
    claimed = SamplingParams(1.0, top_p=0.5)
    seed = sample_seed(1, 0, 0)
    wide = choose(rows, SamplingParams(1.0), seed, range(len(rows))).tolist()
    verdict, _ = check_sampling(
        rows, wide, rows.gather(1, torch.tensor(wide)[:, None]).squeeze(1).tolist(), claimed, Tol()
    )
    assert verdict.reason is Reason.TOKEN_OUTSIDE_TOP_P


def test_near_the_edges_of_the_allowed_set_only_clear_competitors_count() -> None:
    """A competitor the worker's numbers may have left out (just past top-k's k-th value or top-p's
    mass) cannot fail an honest file: the replay ignores tokens within the margin of either edge."""
    row = torch.log_softmax(torch.tensor([[5.0, 4.0, 3.0, 2.999]]), -1)
    params = SamplingParams(1.0, top_k=3)
    r = replay(row, [0], params, 1, 0.1)
    assert torch.isfinite(r.gap).all()
    # whatever the noise, token 3 (a hair below the k-th) is never the competitor that beats the draw
    for seed in range(200):
        assert int(replay(row, [0], params, seed, 0.1).best[0]) != 3


def test_a_gap_just_past_the_margin_is_reported_as_near_the_threshold(rows: torch.Tensor) -> None:
    params = SamplingParams(1.0)
    seed = 3
    tokens = choose(rows, params, seed, range(len(rows))).tolist()
    r = replay(rows, tokens, params, seed, 0.0)
    # push the validator's view of one sampled token down by 0.15: past a 0.1 margin, within twice it
    shifted = rows.clone()
    score_gap = 0.15
    j = 5
    second = (rows[j] / params.temperature + gumbel(seed, [j], rows.shape[1])[0]).double()
    second[tokens[j]] = -math.inf
    margin_now = float((rows[j, tokens[j]] + gumbel(seed, [j], rows.shape[1])[0, tokens[j]]) - second.max())
    shifted[j, tokens[j]] -= margin_now + score_gap
    v = check_replay(shifted, tokens, params, seed, 0.1)
    assert v.reason is Reason.REPLAY_MISMATCH and v.figures["near_threshold"] == 1.0, (v, r.gap[j])


def test_specs_say_exact_sampling_plainly() -> None:
    base = b'{"model": "tiny", "environment": "math", "sampling": {"temperature": 1.0, "max_tokens": 8%s}}'
    assert parse_spec(base % b', "exact": true').sampling_params().exact
    assert not parse_spec(base % b"").sampling_params().exact  # pools without it keep the statistical checks
    with pytest.raises(TaskSpecError, match="true or false"):
        parse_spec(base % b', "exact": 1')
    with pytest.raises(TaskSpecError, match="positive temperature"):
        parse_spec(base.replace(b"1.0", b"0") % b', "exact": true')


def test_the_replay_skips_only_tokens_that_cannot_reach_the_draw(rows: torch.Tensor) -> None:
    """The replay computes noise only for tokens whose score could come near the sampled one's; its gaps
    are the brute-force ones (every token's noise) wherever a competitor is within reach."""
    assert float(gumbel(1, [0], 1).max()) < G_MAX < 23.0
    for params in (SamplingParams(1.0), SamplingParams(0.5, top_k=30), SamplingParams(2.0, top_p=0.8)):
        seed = 17
        tokens = choose(rows + 0.3 * torch.randn_like(rows), params, seed, range(len(rows))).tolist()  # some off
        r = replay(rows, tokens, params, seed, 0.1)
        scaled = rows.double() / params.temperature
        score = scaled + gumbel(seed, range(len(rows)), rows.shape[1])
        competitors = allowed(scaled, -1, params.top_p - 0.02) if params.top_p < 1 else scaled == scaled
        if params.top_k > 0:
            first_out = torch.topk(scaled, params.top_k + 1, -1).values[:, -1:]
            competitors &= scaled >= first_out + 0.1 / params.temperature
        brute = score.masked_fill(~competitors, -math.inf).max(-1).values - score[range(len(rows)), tokens]
        brute = brute * params.temperature
        near = torch.isfinite(r.gap)
        assert torch.allclose(r.gap[near], brute[near]) and bool((brute[~near] < 0).all()), params
        assert bool((r.gap > 0.1).any())  # the perturbed draws really are off somewhere


def test_the_sampler_draws_what_every_tokens_noise_would_draw() -> None:
    """The sampler computes exact noise only for tokens that can reach the most likely allowed token's
    score; its draws are the dense argmax (every token's noise), masks included, for flat and for peaked
    distributions and for tokens tied in logit."""
    torch.manual_seed(3)
    flat = torch.log_softmax(torch.randn(40, 512), -1)
    peaked = torch.log_softmax(torch.randn(40, 4096) * 6.0, -1)
    tied = flat.clone()
    tied[:, 7] = tied[:, 9] = tied.max(-1).values + 30.0  # two tokens far ahead with equal logits
    for rows in (flat, peaked, tied):
        for params in (
            SamplingParams(1.0),
            SamplingParams(0.7, top_k=20),
            SamplingParams(1.3, top_p=0.9),
            SamplingParams(1e-9),  # scores near 1e10: the filters' slack must scale with them
        ):
            seeds, positions = [11 + i % 3 for i in range(len(rows))], list(range(len(rows)))
            scaled = rows.double() / params.temperature
            dense = torch.stack(
                [scaled[i] + gumbel(seeds[i], [positions[i]], rows.shape[1])[0] for i in range(len(rows))]
            )
            want = dense.masked_fill(~allowed(scaled, params.top_k, params.top_p), -math.inf).argmax(-1)
            assert torch.equal(choose_rows(rows, params, seeds, positions), want), params


def test_a_file_whose_every_failure_is_near_the_margin_says_so() -> None:
    from node.rollout.checks import OK, Verdict
    from node.rollout.file import RolloutSample
    from node.verify import FileChecks, SampleCheck, SampleVerdict

    fc = FileChecks(SamplingParams(1.0, exact=True), None, None, None, set(), None)  # type: ignore[arg-type]
    samples = [RolloutSample(0, j, "t", [1], [2 + j], [-1.0], 0.0, "length", []) for j in range(3)]

    def check(j: int, v: Verdict) -> SampleCheck:
        return SampleCheck(SampleVerdict(0, j, v))

    near = Verdict(Reason.REPLAY_MISMATCH, "position 3", {"near_threshold": 1.0})
    far = Verdict(Reason.REPLAY_MISMATCH, "position 0", {"near_threshold": 0.0})
    only_near = fc.conclude(samples, [check(0, OK), check(1, near), check(2, near)])
    assert only_near.verdict.figures["near_threshold"] == 1.0 and "outlier" in only_near.verdict.detail
    mixed = fc.conclude(samples, [check(0, near), check(1, far), check(2, OK)])
    assert mixed.verdict.figures["near_threshold"] == 0.0


def test_the_runner_up_measures_what_a_margin_leaves_open(rows: torch.Tensor) -> None:
    params = SamplingParams(1.0)
    tokens = choose(rows, params, 4, range(len(rows))).tolist()
    lead = runner_up(rows, tokens, params, 4)
    assert bool((lead >= 0).all())  # an honest draw is the argmax: it leads every other token
    # a margin as wide as a lead lets the runner-up through unseen at that position
    j = int(lead.argmin())
    other = choose(rows[j : j + 1].scatter(1, torch.tensor([[tokens[j]]]), -math.inf), params, 4, [j])
    swapped = [*tokens[:j], int(other[0]), *tokens[j + 1 :]]
    assert check_replay(rows, swapped, params, 4, float(lead[j]) + 1e-9).ok
    assert not check_replay(rows, swapped, params, 4, float(lead[j]) * 0.5).ok


def test_a_top_k_whose_values_crowd_together_still_has_competitors() -> None:
    """When the whole top-k lies within the margin of its k-th value, its tokens still compete (they are
    clearly inside: far above the first value top-k leaves out); a worker cannot pick among them freely.
    And a draw a hair below the k-th value (the worker's numbers ordered it in) is not 'outside top-k'."""
    row = torch.log_softmax(torch.tensor([[3.0, 2.95, 2.9, 2.85, 2.8, -5.0, -6.0]]), -1).repeat(40, 1)
    params = SamplingParams(1.0, top_k=5)
    honest = choose(row, params, 8, range(40)).tolist()
    assert check_replay(row, honest, params, 8, 0.28).ok
    assert not check_replay(row, [4] * 40, params, 8, 0.28).ok
    edge = torch.log_softmax(torch.tensor([[3.0, 2.0, 1.0, 0.5, 0.5 - 1e-4, -5.0]]), -1)
    lp = [float(edge[0, 4])]
    verdict, _ = check_sampling(edge, [4], lp, SamplingParams(1.0, top_k=4), Tol())
    assert verdict.ok, verdict
    verdict, _ = check_sampling(edge, [5], [float(edge[0, 5])], SamplingParams(1.0, top_k=4), Tol())
    assert verdict.reason is Reason.TOKEN_OUTSIDE_TOP_K


def test_many_small_gaps_are_not_near_the_threshold(rows: torch.Tensor) -> None:
    """Steering many tokens by gaps just past the margin is a cheat, not a numerical outlier: only one
    or two positions past the margin count as near it (and are invalidated softly)."""
    params = SamplingParams(1.0)
    tokens = choose(rows, params, 6, range(len(rows))).tolist()
    lead = runner_up(rows, tokens, params, 6)
    order = lead.argsort().tolist()  # the positions with the closest runner-up first

    def swap(positions: list[int]) -> list[int]:
        out = list(tokens)
        for j in positions:
            masked = rows[j : j + 1].scatter(1, torch.tensor([[tokens[j]]]), -math.inf)
            out[j] = int(choose(masked, params, 6, [j])[0])
        return out

    margin = float(lead[order[0]]) * 0.9
    one = check_replay(rows, swap(order[:1]), params, 6, margin)
    assert not one.ok and one.figures["near_threshold"] == 1.0
    few = [j for j in order if float(lead[j]) <= 2 * margin][:3]
    assert len(few) == 3, lead[order[:4]]
    many = check_replay(rows, swap(few), params, 6, margin)
    assert not many.ok and many.figures["near_threshold"] == 0.0, many


def test_replaying_a_files_completions_together_gives_each_ones_own_replay(rows: torch.Tensor) -> None:
    """`replay_many` packs rows of several completions into shared passes (cutting completions across
    pass boundaries); every completion gets exactly the replay it gets alone."""
    params = SamplingParams(0.8, top_p=0.9)
    items = []
    for k, length in enumerate((5, 1, 13, 8)):
        part = rows[:length] + 0.05 * k
        tokens = choose(part + 0.2 * torch.randn_like(part), params, 100 + k, range(length)).tolist()
        items.append((part, tokens, 100 + k))
    alone = [replay(raw, tokens, params, seed, 0.1) for raw, tokens, seed in items]
    for pass_values in (1, 7 * rows.shape[1], 1 << 20):  # a row a pass, passes across completions, one pass
        together = replay_many(items, params, 0.1, pass_values=pass_values)
        for a, b in zip(alone, together, strict=True):
            assert torch.equal(a.gap, b.gap) and torch.equal(a.best, b.best)
    assert replay_many([], params, 0.1) == []
    with pytest.raises(ValueError, match="do not match"):
        replay_many([(rows[:3], [1, 2], 5)], params, 0.1)
