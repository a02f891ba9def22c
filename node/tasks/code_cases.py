"""HumanEval's tests as questions the code under test answers and verdicts it cannot reach (for
`node.tasks.code`).

Whatever runs in a sandbox beside the code under test, and whatever that run prints, the code controls:
it can rewrite the harness, print report lines of its own, leave early, or return an object equal to
everything. So no verdict is made there. A problem's test is cut into steps (`split_cases`), then:

1. a reference run (trusted: no model code) executes HumanEval's own solution under the test, with a
   stand-in for `candidate` that records every call's arguments, in order, with the step making it
   (`reference_program`, once per problem and process);
2. the candidate run executes the completion and answers those calls, one report line each: the
   returned value as plain data, or that it raised (`candidate_program`). It holds no test code and no
   expected value;
3. the verdicts are made where the code cannot reach: a value case (`candidate(...) == <literal>`) by
   comparing its answer with the literal here; every other case by a replay run (trusted again) that
   executes the test once more with the reference solution, where each `candidate(...)` returns the
   answer the completion gave to that call (`replay_program`). The expected side (e.g. `tuple(sort_third
   (x))`, the string a round trip must give back, `abs(... - y) < 1e-6`) is computed there.

Answers are plain data of exact builtin types (None, bool, int, float, str, list, tuple, set, frozenset,
dict; no subclass, nesting and digits bounded), sent as tagged JSON and parsed again here and in the
replay: an answer is a value the code could have returned, so a forged report line is no better than an
honest function returning that value. A case passes only if the candidate run reached it (answered every
earlier call) and its verdict holds.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PeerError

MARK = "@@intellect-node-case"
_DEPTH = 48  # the nesting a plain value may have
_DIGITS = 4000  # the digits an int may have (under Python's own 4300, so every node parses alike)


class NotPlain(PeerError, ValueError):
    """Not plain data: an object of another type (a subclass too), nested too deep, or text that does
    not parse as one (a completion's answer: another party's bytes). Inside the sandbox, where the
    project's errors are not importable, the same name is a plain ValueError (`_CODEC`)."""


def encode(value: object, depth: int = 0) -> object:
    """`value` as JSON-able data: scalars as themselves, containers tagged (`{"l": [...]}` a list, `t` a
    tuple, `s` a set, `f` a frozenset, `d` a dict's [key, value] pairs)."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if depth < _DEPTH:
        if kind is list or kind is tuple or kind is set or kind is frozenset:
            tag = "l" if kind is list else "t" if kind is tuple else "s" if kind is set else "f"
            return {tag: [encode(v, depth + 1) for v in value]}
        if kind is dict:
            return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise NotPlain


def decode(data: object, depth: int = 0) -> object:
    """The value `encode` gave `data` for; `NotPlain` (or TypeError: an unhashable set member or key)
    for anything else."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if kind is dict and len(data) == 1 and depth < _DEPTH:
        ((tag, items),) = data.items()
        if type(items) is list:
            inner = [decode(v, depth + 1) for v in items] if tag in ("l", "t", "s", "f") else None
            if tag == "l":
                return inner
            if tag == "t":
                return tuple(inner or ())
            if tag == "s":
                return set(inner or ())
            if tag == "f":
                return frozenset(inner or ())
            if tag == "d" and all(type(p) is list and len(p) == 2 for p in items):
                return {decode(k, depth + 1): decode(v, depth + 1) for k, v in items}
    raise NotPlain


def dumps(value: object) -> str:
    return json.dumps(encode(value), separators=(",", ":"))


def _int(digits: str) -> int:
    if len(digits) > _DIGITS:
        raise NotPlain
    return int(digits)


def _shallow(text: str) -> bool:
    """Whether `text` nests no deeper than a plain value can (checked before the JSON parser sees it:
    its recursion in C would crash a process whose recursion limit is set high)."""
    depth, quoted = 0, False
    for token in re.finditer(r'\\.|["\[\]{}]', text, re.S):
        c = token.group()
        if c == '"':
            quoted = not quoted
        elif quoted or len(c) == 2:
            continue
        elif c in "[{":
            depth += 1
            if depth > 3 * _DEPTH + 3:
                return False
        else:
            depth -= 1
    return True


def loads(text: str) -> object:
    """The plain value `text` (from `dumps`) stands for; `NotPlain` for any other text."""
    if not _shallow(text):
        raise NotPlain
    try:
        return decode(json.loads(text, parse_int=_int))
    except (ValueError, TypeError, RecursionError):
        raise NotPlain from None


# the same functions inside every sandboxed program (their source, as it is here)
_CODEC = (
    f"_DEPTH = {_DEPTH}\n_DIGITS = {_DIGITS}\n"
    + "class NotPlain(ValueError):\n    pass\n\n\n"
    + "".join(inspect.getsource(f) for f in (encode, decode, dumps, _int, _shallow, loads))
)


@dataclass(frozen=True)
class Step:
    """One step of a problem's test: `setup` (run, not scored), `value` (a case `candidate(...) == <literal>`,
    its answer compared with `expected` here) or `assert` (any other case, judged by the replay run)."""

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
                direct = isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "candidate"
                if direct and not any(uses_candidate(a) for a in [*left.args, *left.keywords]):
                    try:
                        steps.append(Step("value", ast.unparse(left), ast.literal_eval(right)))
                        continue
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        pass
            steps.append(Step("assert", ast.unparse(stmt)))
    return steps


@dataclass(frozen=True)
class Reference:
    """What a problem's test asks: every `candidate` call (the step making it, its [args, kwargs] as
    `dumps` text) in order, and whether each step held for the reference solution."""

    calls: tuple[tuple[int, str], ...]
    held: tuple[bool, ...]
    needs_replay: bool  # some call is not a value case's: an assert case may depend on an answer


def _trusted_program(reference_source: str, steps: Sequence[Step], entry_point: str, stand_in: str) -> str:
    """A run with no model code: the reference solution, a `_candidate` stand-in (`stand_in`, which may
    call `_fn`, the reference function), then every step; its last line the steps' outcomes."""
    plan = [[st.kind, st.source] for st in steps]
    return (
        "import json, random as _random, re, sys as _sys\n"
        f"{_CODEC}"
        "_ns = {'__name__': '__reference__'}\n"
        f"exec(compile({reference_source!r}, '<reference>', 'exec'), _ns)\n"
        f"_fn = _ns[{entry_point!r}]\n"
        f"_steps = {plan!r}\n"
        "_step = -1\n"
        f"{stand_in}"
        "_ns['candidate'] = _candidate\n"
        "_held = []\n"
        "_random.seed(0)\n"
        "for _step, (_kind, _src) in enumerate(_steps):\n"
        "    try:\n"
        "        exec(compile(_src, f'<step {_step}>', 'eval' if _kind == 'value' else 'exec'), _ns)\n"
        "        _held.append(1)\n"
        "    except BaseException:\n"
        "        _held.append(0)\n"
        f"_sys.__stdout__.write('\\n{MARK}-trusted ' + json.dumps(_out()) + '\\n')\n"
    )


def reference_program(reference_source: str, steps: Sequence[Step], entry_point: str) -> str:
    """The reference run: its stand-in records each call, then answers it with the reference solution."""
    stand_in = (
        "_calls = []\n"
        "def _candidate(*args, **kwargs):\n"
        "    _calls.append([_step, dumps([list(args), kwargs])])\n"
        "    return _fn(*args, **kwargs)\n"
        "def _out():\n"
        "    return {'calls': _calls, 'held': _held}\n"
    )
    return _trusted_program(reference_source, steps, entry_point, stand_in)


def _trusted_output(stdout: bytes) -> Any:
    text = stdout.decode("utf-8", errors="replace")
    at = text.rfind(f"\n{MARK}-trusted ")
    if at < 0:
        raise ValueError("no outcome line")
    return json.loads(text[at + len(MARK) + 10 :])


def read_reference(stdout: bytes, steps: Sequence[Step]) -> Reference:
    """The reference run's record (ValueError where it did not end with one)."""
    out = _trusted_output(stdout)
    calls = tuple((int(s), str(a)) for s, a in out["calls"])
    held = tuple(bool(h) for h in out["held"])
    if len(held) != len(steps) or any(not 0 <= s < len(steps) for s, _ in calls):
        raise ValueError("a record of other steps")
    for i, st in enumerate(steps):
        if st.kind == "value" and sum(s == i for s, _ in calls) != 1:
            raise ValueError(f"value case {i} made other than one call")
    return Reference(calls, held, any(steps[s].kind != "value" for s, _ in calls))


def candidate_program(solution: str, entry_point: str, reference: Reference, nonce: str) -> str:
    """The candidate run: the completion's code, a line `MARK-nonce ready` once it defined the function,
    then an answer to every call of `reference`, one line each: `MARK-nonce <call> 3 <value as dumps
    text>`, `... 0` (it raised, or returned something not plain) or `... 2` (out of memory or stack: a
    limit another machine may place differently)."""
    calls = [a for _, a in reference.calls]
    return (
        "import json, random as _random, re, sys as _sys\n"
        f"{_CODEC}"
        f"_calls = {calls!r}\n"
        "_ns = {'__name__': '__candidate__'}\n"
        "_random.seed(0)\n"
        "try:\n"
        f"    exec(compile({solution!r}, '<solution>', 'exec'), _ns)\n"
        f"    _fn = _ns[{entry_point!r}]\n"
        "except BaseException:\n"
        "    _sys.exit(0)\n"
        f"_sys.__stdout__.write('\\n{MARK}-{nonce} ready\\n')\n"
        "_sys.__stdout__.flush()\n"
        "for _i, _call in enumerate(_calls):\n"
        "    _out = ''\n"
        "    try:\n"
        "        _args, _kwargs = loads(_call)\n"
        "        _out = ' ' + dumps(_fn(*_args, **_kwargs))\n"
        "        _ok = 3\n"
        "    except (MemoryError, RecursionError):\n"
        "        _ok = 2\n"
        "    except BaseException:\n"
        "        _ok = 0\n"
        f"    _sys.__stdout__.write('\\n{MARK}-{nonce} %d %d%s\\n' % (_i, _ok, _out))\n"
        "    _sys.__stdout__.flush()\n"
    )


@dataclass(frozen=True)
class Answers:
    """What a candidate run said: `ready` (the completion defined its function), and call by call: `said`
    (it wrote a line for the call), `values` (the `dumps` text of the value, where it wrote exactly one
    line and that line holds plain data), `exhausted` (some line said it ran out of memory or stack)."""

    ready: bool
    said: tuple[bool, ...]
    values: tuple[str | None, ...]
    exhausted: bool


def read_answers(stdout: bytes, calls: int, nonce: str) -> Answers:
    text = stdout.decode("utf-8", errors="replace")
    line = re.compile(rf"^{re.escape(MARK)}-{re.escape(nonce)} (\d+) ([023])(?: (.*))?$", re.M)
    got: dict[int, list[tuple[str, str | None]]] = {}
    for m in line.finditer(text):
        if int(m.group(1)) < calls:
            got.setdefault(int(m.group(1)), []).append((m.group(2), m.group(3)))
    values: list[str | None] = []
    for k in range(calls):
        lines = got.get(k, [])
        value = lines[0][1] if len(lines) == 1 and lines[0][0] == "3" else None
        if value is not None:
            try:
                loads(value)
            except NotPlain:
                value = None
        values.append(value)
    exhausted = any(outcome == "2" for lines in got.values() for outcome, _ in lines)
    ready = re.search(rf"^{re.escape(MARK)}-{re.escape(nonce)} ready$", text, re.M) is not None
    return Answers(ready, tuple(k in got for k in range(calls)), tuple(values), exhausted)


def replay_program(
    reference_source: str, steps: Sequence[Step], entry_point: str, reference: Reference, answers: Answers
) -> str:
    """The replay run: the test once more, each call answered with the completion's answer to the same
    call (the n-th of its step, with the same arguments); a call it did not answer with plain data
    raises an exception no test code catches (`except Exception` does not), so its case fails."""
    stand_in = (
        f"_calls = {list(reference.calls)!r}\n"
        f"_answers = {list(answers.values)!r}\n"
        "_asked = {}\n"
        "class _NoAnswer(BaseException):\n"
        "    pass\n"
        "def _candidate(*args, **kwargs):\n"
        "    n = _asked.get(_step, 0)\n"
        "    _asked[_step] = n + 1\n"
        "    mine = [k for k, (s, _) in enumerate(_calls) if s == _step]\n"
        "    if n >= len(mine) or _answers[mine[n]] is None or _calls[mine[n]][1] != dumps([list(args), kwargs]):\n"
        "        raise _NoAnswer\n"
        "    return loads(_answers[mine[n]])\n"
        "def _out():\n"
        "    return _held\n"
    )
    return _trusted_program(reference_source, steps, entry_point, stand_in)


def read_replay(stdout: bytes, steps: Sequence[Step]) -> tuple[bool, ...] | None:
    """Whether each step held in the replay run; None where the run did not end with its outcomes."""
    try:
        held = _trusted_output(stdout)
    except ValueError:
        return None
    return tuple(bool(h) for h in held) if isinstance(held, list) and len(held) == len(steps) else None


def passed_cases(steps: Sequence[Step], reference: Reference, answers: Answers, replayed: Sequence[bool] | None) -> int:
    """Cases passed: a case the candidate run reached (the completion defined its function, and the run
    said something for every call before the case's step) whose verdict holds: a value case's one answer
    equals its literal; an assert case held in the replay run (`replayed`, None where that run failed),
    or, where no assert case can depend on an answer (`Reference.needs_replay` false), held for the
    reference solution."""
    said = [ok for ok in answers.said] + [False]
    first_silent = said.index(False)
    before = 0  # calls made by the steps before the current one
    passed = 0
    for i, st in enumerate(steps):
        mine = [k for k, (s, _) in enumerate(reference.calls) if s == i]
        reached = answers.ready and before <= first_silent
        before += len(mine)
        if st.kind == "setup" or not reached:
            continue
        if st.kind == "value":
            text = answers.values[mine[0]] if len(mine) == 1 else None
            passed += text is not None and (loads(text) == st.expected) is True
        elif reference.needs_replay:
            passed += replayed is not None and replayed[i]
        else:
            passed += reference.held[i]
    return passed
