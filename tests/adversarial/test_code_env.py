"""The code environment (`node.tasks.code`): HumanEval from the installed wheel, rewards from sandboxed
runs of the real problems' tests. Honest solutions score what they pass; hostile completions (each escape
attempt written as a model's answer) score nothing and leave this process unharmed; the coordinator's
intake recomputes the same rewards and refuses a lied one; a reward our own run got at a time limit is
never grounds for a slash."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from node.rollout.checks import Reason, Verdict
from node.tasks import Problem, content_hash, get_env
from node.tasks.code import CodeEnv, Step, _load, solution_source, split_cases
from node.tasks.code_cases import NotPlain, Reference, dumps, loads, passed_cases, read_answers

ROWS = _load()[0]


@pytest.fixture(scope="module")
def env() -> CodeEnv:
    e = get_env("code")
    assert isinstance(e, CodeEnv)
    return e


def _problem(i: int) -> Problem:
    return Problem(f"code-x-{i}", "", 0, {"humaneval": i, "entry_point": ROWS[i]["entry_point"]})


def _fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\nDone."


def test_the_problems_come_from_the_wheel_and_split_into_cases() -> None:
    assert len(ROWS) == 164
    steps = split_cases(ROWS[0]["test"])
    assert [st.kind for st in steps if st.kind != "setup"] == ["value"] * 7  # HumanEval/0 asserts seven things
    assert steps[-1].expected is False and "candidate(" in steps[-1].source and "False" not in steps[-1].source
    # every problem has at least one case, loops that assert count as one, and most are value cases
    every = [split_cases(r["test"]) for r in ROWS]
    assert all(any(st.kind != "setup" for st in s) for s in every)
    cases = [st for s in every for st in s if st.kind != "setup"]
    assert sum(st.kind == "value" for st in cases) / len(cases) > 0.85


def test_the_problems_are_seeded_and_the_prompt_shows_the_function(env: CodeEnv) -> None:
    a, b = env.problems(7, 5), env.problems(7, 5)
    assert a == b and env.problems(8, 5) != a
    assert all(ROWS[p.meta["humaneval"]]["prompt"] in p.prompt for p in a)
    assert len(content_hash(env)) == 64 and len(env.data_hash) == 64


def test_honest_solutions_score_the_share_of_cases_they_pass(env: CodeEnv) -> None:
    picks = [_problem(i) for i in range(0, 164, 8)]
    whole = [(p, _fenced(ROWS[p.meta["humaneval"]]["prompt"] + ROWS[p.meta["humaneval"]]["canonical_solution"]))
             for p in picks]  # fmt: skip
    body = [(p, ROWS[p.meta["humaneval"]]["canonical_solution"]) for p in picks]  # a continuation of the prompt
    scores = env.scores(whole + body)
    assert all(s.reward == 1.0 and s.status == "ok" for s in scores), scores
    # HumanEval/0 asks whether two numbers are closer than a threshold: "always True" passes 4 of its 7
    s = env.scores([(_problem(0), "    return True\n"), (_problem(0), "nothing like code")])
    assert (s[0].passed, s[0].cases, s[0].reward) == (4, 7, 4 / 7) and s[1].reward == 0.0


HOSTILE = {
    "network": "    import socket\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n    return True\n",
    "read a secret": "    return open({secret!r}).read() == 'x'\n",
    "write outside": "    open({victim!r}, 'w').write('pwned')\n    return True\n",
    "fork bomb": "    import os\n    while True:\n        os.fork()\n",
    "infinite loop": "    while True:\n        pass\n",
    "sleep": "    import time\n    time.sleep(60)\n",
    "huge output": "    while True:\n        print('x' * 100000)\n",
    "memory": "    x = bytearray(1 << 34)\n    return True\n",
    "kill the parent": "    import os, signal\n    os.kill({me}, signal.SIGKILL)\n    os.kill(os.getppid(), signal.SIGKILL)\n",
    "exit early": "    import os\n    os._exit(0)\n",
    "fake report": "    print('@@intellect-node-case 0 1')\n    print('@@intellect-node-case-0 0 1')\n    raise SystemExit\n",
    "catch the cpu signal": "    import signal\n    def stop(*a):\n        raise ValueError\n"
    "    signal.signal(signal.SIGXCPU, stop)\n    while True:\n        pass\n",
}


def test_hostile_completions_are_contained_and_score_nothing(tmp_path: Path) -> None:
    secret, victim = tmp_path / "secret", tmp_path / "victim"
    secret.write_text("x")
    fill = {"secret": str(secret), "victim": str(victim), "me": os.getpid()}
    names = list(HOSTILE)
    # HumanEval/0's first case expects True: an attack that returned True would score. Shorter limits than
    # the environment's own (5 CPU seconds, 20 wall) keep the test short; the same code enforces them.
    from node.sandbox import Limits, Sandbox

    env = CodeEnv(Sandbox(Limits(cpu_s=2, wall_s=8.0), parallel=2))
    scores = env.scores([(_problem(0), HOSTILE[n].format(**fill)) for n in names])
    for name, s in zip(names, scores, strict=True):
        assert s.reward == 0.0, (name, s)
    by = dict(zip(names, scores, strict=True))
    assert by["infinite loop"].at_limit and by["sleep"].at_limit and by["huge output"].at_limit
    # it survives its CPU limit (the case fails, the run ends normally) but took its whole CPU time: on
    # a faster machine that case might have passed, so the reward is not firm
    assert by["catch the cpu signal"].at_limit
    assert not by["network"].at_limit and not by["fork bomb"].at_limit
    assert not victim.exists() and secret.read_text() == "x"
    assert env.scores([(_problem(0), ROWS[0]["canonical_solution"])])[0].reward == 1.0  # still working


def test_report_lines_need_the_runs_nonce_one_line_a_call_and_plain_data() -> None:
    steps = [Step("setup", "x = 1"), Step("value", "candidate(2)", 4), Step("assert", "assert True"),
             Step("value", "candidate(3)", [9])]  # fmt: skip
    ref = Reference(((1, dumps([[2], {}])), (3, dumps([[3], {}]))), (True,) * 4, needs_replay=False)
    tag = b"@@intellect-node-case-abc"
    out = tag + b" ready\n" + tag + b" 0 3 4\n@@intellect-node-case-zzz 1 3 7\n" + tag + b' 1 3 {"l":[9]}\n'

    def passed(stdout: bytes) -> int:
        return passed_cases(steps, ref, read_answers(stdout, 2, "abc"), None)

    assert passed(out) == 3  # the line with another nonce is not the run's
    assert not read_answers(out, 2, "abc").exhausted and read_answers(out + tag + b" 1 2\n", 2, "abc").exhausted
    assert passed(out + tag + b" 1 3 7\n") == 2  # two lines for call 1: no answer
    assert passed(out.replace(b" 0 3 4", b" 0 3 5")) == 2  # a wrong value (the assert case still reached)
    assert passed(out.replace(b" 0 3 4", b" 0 1")) == 0  # no "held" in this grammar: call 0 never answered
    assert passed(out.replace(b"{", b"__import__('os') {")) == 2  # not data
    assert passed(out.replace(b'{"l":[9]}', b"[9]")) == 2  # untagged: not a plain value either
    assert passed(out.replace(tag + b" 0 3 4\n", b"")) == 0  # call 0 never answered: no later case was reached
    assert passed(out.replace(b" ready", b" 9")) == 0  # the completion never defined its function
    assert solution_source("def f():\n", "    return 1\n", "f") == "def f():\n    return 1\n"
    assert solution_source("P\n", "```python\ndef f():\n    return 2\n```", "f").endswith("return 2\n")


def test_answers_are_plain_data_of_exact_builtin_types() -> None:
    values = [
        None,
        True,
        1,
        -0.0,
        float("inf"),
        "é\ud800",
        [1, (2, "x")],
        {frozenset({1}), (None,)},
        {(1, 2): {"a": []}},
    ]
    for v in values:
        back = loads(dumps(v))
        assert back == v and type(back) is type(v) and repr(back) == repr(v), v
    nan = loads(dumps(float("nan")))
    assert isinstance(nan, float) and nan != nan
    assert type(loads(dumps(True))) is bool and type(loads(dumps(1.0))) is float

    class Sly(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    deep: list[object] = []
    for _ in range(60):
        deep = [deep]
    for bad in (Sly(1), [Sly(1)], {1: object()}, deep, range(3), b"x", 1j):
        with pytest.raises(NotPlain):
            dumps(bad)
    # nested past what a plain value may be: refused before the parser (whose recursion in C would crash
    # a process with a high recursion limit, as this one may have) sees it
    for text in (
        '{"l":[' * 200 + "]}" * 200,
        "[" * 100000,
        "[9]",
        '{"l":[],"t":[]}',
        '{"x":[1]}',
        '{"s":[{"l":[]}]}',
        "1" * 4001,
        "nul",
        "",
    ):
        with pytest.raises(NotPlain):
            loads(text)


def test_code_that_tampers_with_the_harness_does_not_pass(env: CodeEnv) -> None:
    """Found in review: code in the same interpreter as the tests could rewrite them or the report lines.
    The completion's run now holds no test and decides nothing: it answers calls with plain data, every
    verdict is made outside (`tests/adversarial/test_code_reward_forgery.py` plays such tricks on all 164
    problems)."""
    attacks = {
        "rewrite the calls": "    import sys\n    f = sys._getframe(1)\n"
        "    f.f_globals['_calls'][:] = [f.f_globals['_calls'][0]] * len(f.f_globals['_calls'])\n"
        "    return None\n",
        "rewrite the reports": "    import sys\n    class W:\n        def write(self, t):\n"
        "            sys.stderr.write(t.replace(' 0\\n', ' 1\\n').replace(' 3 0', ' 3 True'))\n"
        "        def flush(self):\n            pass\n    sys.__stdout__ = W()\n    return None\n",
        # the nonce dug out of the harness's own code, then a guess of each kind for every case
        "print every guess": "    import sys\n    f = sys._getframe(1)\n"
        "    while '_calls' not in f.f_globals:\n        f = f.f_back\n"
        "    mark = next(c for c in f.f_code.co_consts if isinstance(c, str) and c.startswith('\\n@@intellect'))\n"
        "    mark = mark.split()[0]\n"
        "    for i in range(40):\n        for g in ('true', 'false'):\n"
        "            sys.__stdout__.write(f'\\n{mark} {i} 3 {g}\\n')\n    return None\n",
    }
    scores = env.scores([(_problem(0), a) for a in attacks.values()])
    honest_true = env.scores([(_problem(0), "    return True\n")])[0]
    for name, s in zip(attacks, scores, strict=True):
        assert s.reward <= honest_true.reward, (name, s)  # no better than the constant answer it is
    assert [s.reward for s in scores] == [0.0, 0.0, 0.0], scores


def test_the_intake_recomputes_code_rewards_and_refuses_a_lie(env: CodeEnv) -> None:
    from node.protocol import Task, check_submission
    from node.rollout.file import PROOF_BYTES, RolloutFile, RolloutHeader, RolloutSample, chunks_for

    seed, node = 5, "0x" + "ab" * 20
    problems = env.problems(seed, 2)
    texts = [ROWS[p.meta["humaneval"]]["canonical_solution"] for p in problems] + ["    raise ValueError('no')\n"]

    def decode(ids: list[int]) -> str:
        return texts[ids[0]]

    def sample(g: int, j: int, text_id: int, reward: float) -> RolloutSample:
        return RolloutSample(
            g, j, problems[g].task_id, [g + 1], [text_id], [-0.1], reward, "stop", [bytes(PROOF_BYTES)] * chunks_for(1)
        )

    sampling: dict[str, Any] = {"temperature": 1.0, "max_tokens": 8}
    task = Task("t", 1, node, "code", seed, 2, 2, sampling, 0, "tiny", 0.0, 1e12)
    header = RolloutHeader(1, node, 0, "code", seed, sampling, "tiny")
    # a failing answer may still pass a problem's always-true cases (HumanEval has a few)
    r0, r1 = (env.rewards([(p, texts[2], 1)])[0] for p in problems)
    honest = [sample(0, 0, 0, 1.0), sample(0, 1, 2, r0), sample(1, 0, 1, 1.0), sample(1, 1, 2, r1)]

    def intake(samples: list[RolloutSample]) -> Any:
        return check_submission(
            RolloutFile(header, samples), task, sender=node, now=1.0, current_policy=0, async_level=1, env=env,
            encode_prompt=lambda text: [1 + [p.prompt for p in problems].index(text)], decode=decode, vocab_size=8,
        )  # fmt: skip

    assert intake(honest).accepted, intake(honest)
    lied = [*honest[:1], sample(0, 1, 2, r0 + 0.5), *honest[2:]]
    d = intake(lied)
    assert not d.accepted and d.reason == "wrong-reward", d
    # a completion that runs into its time limit: its reward depends on the machine, so the intake leaves it
    # to the validators (whose verdict on it is soft) rather than refuse what may be an honest file
    texts.append("    while True:\n        pass\n")
    timing = [*honest[:1], sample(0, 1, 3, 1.0), *honest[2:]]
    assert intake(timing).accepted


def test_a_reward_our_run_got_at_a_time_limit_is_never_a_slash(env: CodeEnv) -> None:
    """Timing is what two honest machines can disagree on: a validator whose own run of a completion hit
    a time limit does not slash over its reward (the file's verdict is near-threshold, so soft)."""
    from node.rollout.checks import SamplingParams, invalidation_is_hard, stored_reason
    from node.rollout.file import RolloutSample
    from node.verify import Calibrated, FileChecks, SampleCheck, SampleVerdict

    ((reward, firm),) = env.rewards_firm([(_problem(0), "    while True:\n        pass\n", 5)])
    assert reward == 0.0 and not firm
    assert env.rewards_firm([(_problem(0), ROWS[0]["canonical_solution"], 5)]) == [(1.0, True)]
    checks = FileChecks(SamplingParams(1.0, exact=True), env, str.split, str, set(), Calibrated.load("tiny"))  # type: ignore[arg-type]
    timing = Verdict(Reason.REWARD_MISMATCH, "claimed 1.0, task gives 0.0 (our run ended at a time limit)",
                     {"near_threshold": 1.0})  # fmt: skip
    plain = Verdict(Reason.REWARD_MISMATCH, "claimed 1.0, task gives 0.0")
    for verdicts, hard in (([timing], False), ([timing, timing], False), ([timing, plain], True), ([plain], True)):
        samples = [RolloutSample(0, j, "t", [1], [j + 2], [-1.0], 1.0, "stop", []) for j in range(len(verdicts))]
        fv = checks.conclude(samples, [SampleCheck(SampleVerdict(0, j, v)) for j, v in enumerate(verdicts)])
        assert not fv.ok and invalidation_is_hard(stored_reason(fv.to_dict())) is hard, verdicts


def test_the_validator_recomputes_a_real_files_code_rewards_and_catches_a_lie(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any, hf_prefill: Any
) -> None:
    """A code file the real engine generated (tiny model) passes the validator's whole pipeline with the
    rewards its worker computed in its own sandbox; the same file with one reward raised fails as
    `reward_mismatch`, a hard verdict (the validator's run ended within its limits)."""
    import dataclasses

    import trio
    from eth_account import Account

    from node.chain.deployment import Deployment
    from node.inference.engine import SamplingSpec
    from node.inference.tools import model_tools
    from node.rollout.build import build_rollout_file
    from node.rollout.checks import invalidation_is_hard, stored_reason
    from node.rollout.file import RolloutHeader
    from node.validator import Validator, ValidatorConfig
    from node.verify import FileVerdict
    from tests.conftest import write_spec

    tools = model_tools("tiny")
    env = CodeEnv()
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "exact": True}
    # a task seed whose two problems fit the test engine's 1024-token context with room to generate
    seed = next(s for s in range(100) if all(len(tools.encode(p.prompt)) < 900 for p in env.problems(s, 2)))
    uri, digest = write_spec(tmp_path / "spec", environment="code", sampling=sampling, group_size=2)
    v = Validator(ValidatorConfig(1, tmp_path / "v", "http://127.0.0.1:1", Deployment(31337, {}, 0)), Account.create())
    assert trio.run(v.load_spec, {"specURI": uri, "specHash": digest, "poolId": 1}) == "tiny"
    v.tools = tools
    problems = env.problems(seed, 2)
    spec = SamplingSpec(1.0, 1.0, 16, seed=seed, stop_token_ids=tuple(sorted(tools.stop_ids)), exact=True)
    groups = vllm_engine.generate([tools.encode(p.prompt) for p in problems], spec, n=2)
    header = RolloutHeader(1, "0x" + "ab" * 20, 0, "code", seed, dict(sampling), "tiny")
    f = build_rollout_file(header, problems, groups, env=env, decode=tools.decode)
    row = {"work_key": "0x" + "00" * 32, "node": header.node, "policy_version": 0, "attempts": 0, "status": "pending"}

    def verdict(data: bytes) -> dict[str, Any]:
        g = v.intake(data, row)
        return g.to_dict() if isinstance(g, FileVerdict) else v.judge(g, row, hf_prefill)

    honest = verdict(f.to_bytes())
    assert honest["ok"], honest["verdict"]
    raised = dataclasses.replace(f.samples[1], reward=f.samples[1].reward + 0.5)
    lied = dataclasses.replace(f, samples=[f.samples[0], raised, *f.samples[2:]])
    bad = verdict(lied.to_bytes())
    assert not bad["ok"] and bad["verdict"]["reason"] == "reward_mismatch", bad["verdict"]
    assert invalidation_is_hard(stored_reason(bad))


def test_a_reward_that_varies_between_runs_is_never_a_slash(env: CodeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code whose outcome rests on os.urandom (or the clock) can score differently on the worker and on the
    validator, both honest. A firm reward that differs from the claim is scored again; if the reruns
    disagree, the mismatch is near-threshold (soft). A lie about a deterministic reward stays hard."""
    import node.verify
    from node.rollout.checks import SamplingParams
    from node.rollout.file import RolloutSample
    from node.verify import Calibrated, FileChecks

    monkeypatch.setattr(node.verify, "RERUNS", 6)  # the chance that 6 reruns all agree by luck: ~1e-5
    i = max(range(len(ROWS)), key=lambda j: sum(st.kind == "value" for st in split_cases(ROWS[j]["test"])))
    seed = next(s for s in range(100000) if env.problem(s, 0).meta["humaneval"] == i)
    p, row = env.problem(seed, 0), ROWS[i]
    # right or wrong by a coin at every call: its reward differs between runs (as code using the clock may)
    coin = "    import os\n    if os.urandom(1)[0] < 128:\n        return None\n" + row["canonical_solution"]
    texts = [coin, row["canonical_solution"]]
    checks = FileChecks(SamplingParams(1.0, exact=True), env, str.split, lambda ids: texts[ids[0]], set(),
                        Calibrated.load("tiny"))  # type: ignore[arg-type]  # fmt: skip

    def sample(text_id: int, reward: float) -> RolloutSample:
        return RolloutSample(0, text_id, p.task_id, [1], [text_id], [-1.0], reward, "stop", [])

    # the coin's claim: whatever the worker's own run gave; ours will differ in some rerun (each run
    # flips a coin per case), so the verdict is soft whether our first run matches the claim or not
    for claim in (0.0, 1.0):
        (v,) = checks.reward_verdicts(seed, [sample(0, claim)])
        assert v.ok or v.figures.get("near_threshold") == 1.0, v
    (lie,) = checks.reward_verdicts(seed, [sample(1, 0.0)])  # the canonical solution scores 1.0, every time
    assert not lie.ok and lie.figures.get("near_threshold") is None, lie
