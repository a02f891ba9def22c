"""Held-out evaluation of policy versions: every version answers the same problems with the same
sampling seeds, so differences between versions are paired and the problem-to-problem noise cancels.

The training curve mixes learning with the luck of each step's problems (a step's mean reward moves by
a few hundredths just from which length targets its problems drew). Here each version is scored on one
fixed set of problems that no task used (drawn from the `eval` seed space), and a version's gain over
another is the mean of the per-problem differences, with its standard error over problems (a paired
t statistic). Generation is real vLLM with the pool's sampling settings; a checkpoint is hot-loaded
into one engine per version.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVAL_SEED_TAG = "intellect-node eval problems"


def eval_seed(seed: int) -> int:
    """The problem seed of evaluation set `seed`: a hash outside the task seed sequence, so no training
    task draws the same problems."""
    return int.from_bytes(hashlib.sha256(f"{EVAL_SEED_TAG} {seed}".encode()).digest()[:8], "big") >> 2


@dataclass
class Evaluation:
    env: str
    problems: int
    samples: int
    max_tokens: int
    seed: int
    per_problem: dict[str, list[float]] = field(default_factory=dict)  # label -> mean reward per problem
    seconds: float = 0.0

    def mean(self, label: str) -> float:
        return statistics.fmean(self.per_problem[label])

    def gain(self, before: str, after: str) -> tuple[float, float]:
        """Mean per-problem reward difference `after - before` and its standard error over problems."""
        diffs = [b - a for a, b in zip(self.per_problem[before], self.per_problem[after], strict=True)]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("inf")
        return statistics.fmean(diffs), se

    def to_dict(self, base: str = "base") -> dict[str, Any]:
        """The figures as JSON, with each other checkpoint's paired gain over `base` and its standard error."""
        gains = {k: dict(zip(("gain", "se"), self.gain(base, k), strict=True)) for k in self.per_problem if k != base}
        return {
            "env": self.env,
            "problems": self.problems,
            "samples": self.samples,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "mean_reward": {k: self.mean(k) for k in self.per_problem},
            "per_problem": self.per_problem,
            "gain_over_base": gains,
            "seconds": round(self.seconds, 1),
        }


def evaluate(
    model: str,
    checkpoints: dict[str, Path | None],
    *,
    env_name: str = "thinking-budget",
    problems: int = 32,
    samples: int = 8,
    max_tokens: int = 48,
    temperature: float = 1.0,
    seed: int = 0,
    progress: Any = None,
) -> Evaluation:
    """Score each checkpoint (label -> model folder; None: the pool's base model) on the same
    `problems` held-out problems, `samples` completions each, with the same sampling seeds."""
    from node.inference.engine import SamplingSpec, VllmEngine
    from node.inference.tools import model_tools
    from node.tasks import get_env

    if problems < 2 or samples < 1:
        raise ValueError("an evaluation needs at least 2 problems and 1 sample per problem")
    for label, folder in checkpoints.items():
        if folder is not None and not (Path(folder) / "model.safetensors").is_file():
            raise FileNotFoundError(f"checkpoint {label!r}: no model.safetensors in {folder}")
    started = time.perf_counter()
    tools = model_tools(model)
    env = get_env(env_name)
    env.prepare()  # the code sandbox, before the engine loads
    probs = env.problems(eval_seed(seed), problems)
    encoded = [tools.encode(p.prompt) for p in probs]
    spec = SamplingSpec(temperature, 1.0, max_tokens, seed=seed, stop_token_ids=tuple(sorted(tools.stop_ids)))
    out = Evaluation(env_name, problems, samples, max_tokens, seed)
    with VllmEngine(tools.path, seed=0) as engine:
        for label, folder in checkpoints.items():
            engine.reload_weights(folder if folder is not None else tools.path)
            groups = engine.generate(encoded, spec, n=samples)
            # every completion's reward in one batch (code runs in parallel sandboxes)
            rewards = env.rewards(
                [
                    (p, tools.decode(list(c.tokens)), len(c.tokens))
                    for p, g in zip(probs, groups, strict=True)
                    for c in g
                ]
            )
            out.per_problem[label] = [
                statistics.fmean(rewards[i * samples : (i + 1) * samples]) for i in range(len(probs))
            ]
            if progress is not None:
                progress(f"evaluated {label}: mean reward {out.mean(label):.3f}")
    out.seconds = time.perf_counter() - started
    return out
