"""Issue 37 (6): steering within the replay margin on an exact-sampling pool.

The replay allows each token to score up to the calibrated margin below the seeded argmax (honest
numerical noise between the worker's kernels and the validator's). Where another token scores within the
margin of the seeded draw, a worker can send that one instead, and the replay cannot tell: before, files
steered this way passed the coordinator and the validator. A worker that uses the freedom leaves many
tokens that are not the validator's seeded argmax, where honest near-ties leave few: the steering test
(`node.rollout.checks.steering_test`) fails a file whose share of them is beyond the calibrated honest
rate (`replay_disagree_rate`) by a binomial bound of 1e-9.

Real pieces: honest files from the real vLLM engine (exact sampling), the steered one from the real
transformers sampler with its draw replaced, the validator's real prefill and checks, the shipped
thresholds of the tiny model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import node.rollout.exact as exact
from node.inference.tools import model_tools
from node.rollout.build import build_rollout_file
from node.rollout.checks import Reason, SamplingParams, allowed
from node.rollout.file import RolloutFile, RolloutHeader
from node.tasks import get_env
from node.taskspec import TaskSpec
from node.verify import Calibrated, FileVerdict, pool_checks, verify_file

SEED = 77
PROMPTS = 6
GROUP = 8
MAX_TOKENS = 48
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": MAX_TOKENS, "exact": True}


@pytest.fixture(scope="module")
def checks() -> Any:
    return pool_checks(TaskSpec("tiny", "math", SAMPLING), model_tools("tiny"), Calibrated.load("tiny"))


def _file(groups: list[list[Any]], checks: Any) -> RolloutFile:
    env = get_env("math")
    header = RolloutHeader(1, "0x" + "ab" * 20, 0, "math", SEED, dict(SAMPLING), "tiny")
    f = build_rollout_file(header, env.problems(SEED, PROMPTS), groups, env=env, decode=checks.decode)
    return RolloutFile.from_bytes(f.to_bytes())


def _verify(f: RolloutFile, prefill: Any, checks: Any) -> FileVerdict:
    def fn(prompt: list[int], completion: list[int]) -> Any:
        p = prefill.prefill(prompt, completion)
        return p.hidden, p.logprobs

    return verify_file(f, fn, checks)


def _spec(checks: Any) -> Any:
    from node.inference.engine import SamplingSpec

    return SamplingSpec(1.0, 1.0, MAX_TOKENS, seed=SEED, stop_token_ids=tuple(sorted(checks.stop_ids)), exact=True)


def test_a_worker_that_takes_the_runner_up_inside_the_margin_is_caught(
    vllm_engine: Any, hf_prefill: Any, checks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    margin = checks.calibrated.sampling.margin
    prompts = [checks.encode_prompt(p.prompt) for p in get_env("math").problems(SEED, PROMPTS)]
    honest = _file(vllm_engine.generate(prompts, _spec(checks), n=GROUP), checks)
    v = _verify(honest, hf_prefill, checks)
    assert v.ok, v.verdict  # vLLM's honest draws, replayed by transformers: near-ties stay rare

    swaps = []
    plain = exact.choose

    def steer(logits: torch.Tensor, params: SamplingParams, seed: int, positions: Any) -> torch.Tensor:
        """The cheat: the seeded draw, unless another allowed token scores within the margin of it (the
        replay cannot tell them apart): then that one."""
        scaled = logits.to(torch.float64) / params.temperature
        score = scaled + exact.gumbel(seed, list(positions), scaled.shape[-1], scaled.device)
        score = score.masked_fill(~allowed(scaled, params.top_k, params.top_p), -torch.inf)
        top = torch.topk(score, 2, dim=-1)
        if float(top.values[0, 0] - top.values[0, 1]) * params.temperature < 0.9 * margin:
            swaps.append(1)
            return top.indices[:, 1]
        return plain(logits, params, seed, positions)

    monkeypatch.setattr(exact, "choose", steer)
    steered = _file(hf_prefill.generate_exact(prompts, _spec(checks), n=GROUP), checks)
    monkeypatch.setattr(exact, "choose", plain)
    tokens = sum(len(s.completion_tokens) for s in steered.samples)
    assert len(swaps) > tokens // 50, (len(swaps), tokens)  # the margin leaves that much freedom

    v = _verify(steered, hf_prefill, checks)
    assert not v.ok and v.verdict.reason == Reason.REPLAY_MISMATCH, v.verdict
    assert "steered" in v.verdict.detail
    # the cheat gains nothing: the file's units are revoked (here softly: 12 % of tokens off the draw is
    # within twice the calibrated any-precision rate of 4.3 %, which is kept for machines noisier than
    # any calibrated; a worker steering further is slashed)
    assert v.verdict.figures["replay_disagreements"] >= len(swaps) > 0
    assert all(s.verdict.ok for s in v.samples)  # every completion's own replay passed: the file test sees it

    # the same sampler without the cheat passes: it is the steering that fails, not transformers' draws
    fair = _file(hf_prefill.generate_exact(prompts, _spec(checks), n=GROUP), checks)
    v = _verify(fair, hf_prefill, checks)
    assert v.ok, v.verdict
