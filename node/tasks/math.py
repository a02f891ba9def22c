"""GSM8K-style arithmetic generated locally, and its thinking-budget variant."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Problem:
    """One task: the prompt text and what the verifier needs to score an answer."""

    task_id: str
    prompt: str
    answer: int
    meta: dict[str, Any] = field(default_factory=dict)


def extract_answer(text: str) -> int | None:
    """The last integer in the text after an 'Answer' marker if there is one, else the last integer."""
    tail = text.rsplit("Answer", 1)[-1] if "Answer" in text else text
    found = _INT.findall(tail)
    if not found:
        return None
    try:
        return int(found[-1])
    except ValueError:
        return None


_NAMES = ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana")
_ITEMS = ("apples", "books", "coins", "marbles", "pens", "shells", "stamps", "tickets")


class MathEnv:
    """Word problems over + - x with small integers; reward 1 for the right final integer, else 0."""

    name = "math"
    version = "1"

    def prepare(self) -> None:
        """Nothing to set up: arithmetic is scored in-process."""

    def problem(self, seed: int, index: int) -> Problem:
        rng = random.Random(f"{self.name}:{seed}:{index}")
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        op = rng.choice(("+", "-", "*"))
        if op == "-" and b > a:
            a, b = b, a
        if op == "*":
            b = rng.randint(2, 9)
        who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        verb = {"+": f"gets {b} more", "-": f"gives away {b}", "*": f"ends up with {b} times as many"}[op]
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        # Plain question text: the model's chat template (see tasks.prompts) adds its own framing.
        prompt = f"{who} has {a} {item} and {verb}. How many {item} does {who} have now?"
        return Problem(
            task_id=f"{self.name}-{seed}-{index}", prompt=prompt, answer=answer, meta={"a": a, "b": b, "op": op}
        )

    def problems(self, seed: int, count: int, start: int = 0) -> list[Problem]:
        return [self.problem(seed, i) for i in range(start, start + count)]

    def reward(self, problem: Problem, completion_text: str, completion_tokens: int) -> float:
        return 1.0 if extract_answer(completion_text) == problem.answer else 0.0

    def rewards(self, items: Sequence[tuple[Problem, str, int]]) -> list[float]:
        """`reward` of many `(problem, completion text, completion tokens)` at once (an environment whose
        rewards run code runs them in parallel)."""
        return [self.reward(p, text, n) for p, text, n in items]

    def rewards_firm(self, items: Sequence[tuple[Problem, str, int]]) -> list[tuple[float, bool]]:
        """`rewards`, each with whether every machine gets it (False: it depended on timing, e.g. code
        that ran into a time limit; a validator does not slash over such a reward)."""
        return [(r, True) for r in self.rewards(items)]


class ThinkingBudgetEnv(MathEnv):
    """The same problems with a target length in the prompt; the reward subtracts a length penalty.

    reward = correct - penalty * min(1, |length - target| / target): a model learns to control its
    length even before it learns arithmetic, which gives small models a learnable signal.
    """

    name = "thinking-budget"

    def __init__(self, targets: tuple[int, ...] = (8, 16, 32), penalty: float = 0.5) -> None:
        self.targets = targets
        self.penalty = penalty

    def problem(self, seed: int, index: int) -> Problem:
        base = super().problem(seed, index)
        target = random.Random(f"budget:{seed}:{index}").choice(self.targets)
        prompt = f"Think for about {target} tokens. {base.prompt}"
        return Problem(base.task_id, prompt, base.answer, {**base.meta, "target": target})

    def reward(self, problem: Problem, completion_text: str, completion_tokens: int) -> float:
        target = int(problem.meta["target"])
        correct = 1.0 if extract_answer(completion_text) == problem.answer else 0.0
        off = min(1.0, abs(completion_tokens - target) / target)
        return correct - self.penalty * off
