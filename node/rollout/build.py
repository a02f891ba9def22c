"""The worker's side: turn generated completions into a scored, proved rollout file."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..tasks.math import MathEnv, Problem
from ..toploc import build_proofs
from .file import RolloutFile, RolloutHeader, RolloutSample


def build_rollout_file(
    header: RolloutHeader,
    problems: Sequence[Problem],
    groups: Sequence[Sequence[Any]],
    *,
    env: MathEnv,
    decode: Callable[[list[int]], str],
) -> RolloutFile:
    """`groups[i]` holds the completions (`node.inference.engine.Completion`) of `problems[i]`:
    each is scored with the task's verifier and proved with TOPLOC from its captured hidden states."""
    if len(problems) != len(groups):
        raise ValueError(f"{len(problems)} problems but {len(groups)} completion groups")
    flat = [(i, j, problem, c) for i, (problem, group) in enumerate(zip(problems, groups, strict=True))
            for j, c in enumerate(group)]  # fmt: skip
    # every reward at once: an environment that runs code runs them in parallel
    rewards = env.rewards([(problem, decode(list(c.tokens)), len(c.tokens)) for _, _, problem, c in flat])
    samples = [
        RolloutSample(
            group=i,
            sample=j,
            task_id=problem.task_id,
            prompt_tokens=list(c.prompt_tokens),
            completion_tokens=list(c.tokens),
            logprobs=[float(x) for x in c.logprobs],
            reward=reward,
            finish_reason=c.finish_reason,
            proofs=build_proofs(c.hidden),
        )
        for (i, j, problem, c), reward in zip(flat, rewards, strict=True)
    ]
    return RolloutFile(header, samples)
