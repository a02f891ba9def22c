"""The validator's whole check on rollout files made by the real vLLM engine on the tiny model:
honest files pass; tampered models, prompts and tokens fail TOPLOC (with the shipped, calibrated
thresholds); a temperature lie, a truncated completion, a reward lie and a foreign prompt fail the
checks beyond TOPLOC."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from node.rollout.build import build_rollout_file
from node.rollout.checks import Reason
from node.rollout.file import RolloutFile, RolloutHeader, RolloutSample
from node.tasks.math import MathEnv
from node.taskspec import TaskSpec
from node.verify import Calibrated, FileChecks, verify_file

SEED = 11
PROMPTS = 6
SAMPLES = 2


@pytest.fixture(scope="module")
def tools(tiny_model: Path):
    from node.inference.tools import model_tools

    t = model_tools(str(tiny_model))
    return {
        "encode": t.encode,
        "decode": t.decode,
        "stop": t.stop_ids,
        "env": MathEnv(),
        "calibrated": Calibrated.load("tiny"),
    }


def make_file(engine, tools, *, temperature=1.0, claimed_temperature=None, max_tokens=48, batch="all", prompts=None):
    from node.inference.engine import SamplingSpec

    env = tools["env"]
    problems = env.problems(SEED, PROMPTS)
    encoded = prompts or [tools["encode"](p.prompt) for p in problems]
    spec = SamplingSpec(
        temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=SEED, stop_token_ids=tuple(tools["stop"])
    )
    if batch == "all":
        groups = engine.generate(encoded, spec, n=SAMPLES)
    else:
        groups = [engine.generate([p], spec, n=SAMPLES)[0] for p in encoded]
    if prompts is not None:  # claim the task's prompt, whatever was generated from
        claimed = [tools["encode"](p.prompt) for p in problems]
        for g, c in zip(groups, claimed, strict=True):
            for comp in g:
                comp.prompt_tokens = c
    t = temperature if claimed_temperature is None else claimed_temperature
    header = RolloutHeader(
        1, "0x" + "ab" * 20, 0, "math", SEED, {"temperature": t, "top_p": 1.0, "max_tokens": max_tokens}, "tiny"
    )
    f = build_rollout_file(header, problems, groups, env=env, decode=tools["decode"])
    return RolloutFile.from_bytes(f.to_bytes())  # through the wire format, as a validator gets it


def verify(f, hf_prefill, tools):
    def prefill(prompt, completion):
        p = hf_prefill.prefill(prompt, completion)
        return p.hidden, p.logprobs

    return verify_file(f, prefill, checks_for(f, tools, hf_prefill.vocab_size))


def checks_for(f, tools, vocab_size):
    """The checks of the task the file's header claims (these tests forge headers on purpose)."""
    return FileChecks(
        TaskSpec(f.header.model, f.header.env, dict(f.header.sampling)).sampling_params(),
        tools["env"],
        tools["encode"],
        tools["decode"],
        tools["stop"],
        tools["calibrated"],
        vocab_size,
    )


@pytest.mark.parametrize("batch", ["all", "single"])
def test_honest_rollout_files_verify(vllm_engine, hf_prefill, tools, batch):
    f = make_file(vllm_engine, tools, batch=batch)
    v = verify(f, hf_prefill, tools)
    assert v.ok, v.to_dict()
    assert len(v.samples) == PROMPTS * SAMPLES and all(s.verdict.ok for s in v.samples)
    assert all(
        ch["exp_mismatches"] <= tools["calibrated"].toploc.exp_mismatch_max for s in v.samples for ch in s.chunks
    )


@pytest.mark.parametrize(("actual", "claimed"), [(2.0, 1.0), (0.4, 1.0)])
def test_temperature_lie_is_caught(vllm_engine, hf_prefill, tools, actual, claimed):
    f = make_file(vllm_engine, tools, temperature=actual, claimed_temperature=claimed, max_tokens=64)
    v = verify(f, hf_prefill, tools)
    assert v.verdict.reason is Reason.TEMPERATURE_MISMATCH, v.to_dict()["verdict"]
    # every single completion passed TOPLOC: the lie is only visible in the token statistics
    assert all(s.verdict.ok for s in v.samples)


def test_truncated_completion_is_caught(vllm_engine, hf_prefill, tools):
    from node.toploc import build_proofs

    f = make_file(vllm_engine, tools)
    s = next(x for x in f.samples if x.finish_reason == "length")
    k = len(s.completion_tokens) // 2
    # a consistent forgery: fewer tokens, their logprobs, proofs rebuilt from the honest prefix states
    hidden = hf_prefill.prefill(s.prompt_tokens, s.completion_tokens[:k]).hidden
    cut = replace(s, completion_tokens=s.completion_tokens[:k], logprobs=s.logprobs[:k], proofs=build_proofs(hidden))
    for reason in ("length", "stop"):
        bad = RolloutFile(f.header, [replace(cut, finish_reason=reason)])
        v = verify(RolloutFile.from_bytes(bad.to_bytes()), hf_prefill, tools)
        assert v.verdict.reason is Reason.BAD_TERMINATION, v.to_dict()["verdict"]


def test_reward_lie_and_foreign_prompt_are_caught(vllm_engine, hf_prefill, tools):
    f = make_file(vllm_engine, tools)
    s = f.samples[0]
    lie = RolloutFile(f.header, [replace(s, reward=s.reward + 1.0)])
    assert verify(lie, hf_prefill, tools).verdict.reason is Reason.REWARD_MISMATCH
    other = RolloutFile(f.header, [replace(s, group=1)])  # the completion of task 0 filed under task 1
    assert verify(other, hf_prefill, tools).verdict.reason is Reason.PROMPT_MISMATCH


def test_other_prompt_generation_fails_toploc(vllm_engine, hf_prefill, tools):
    env = tools["env"]
    problems = env.problems(SEED, PROMPTS)
    pirate = [tools["encode"]("You are a pirate. " + p.prompt) for p in problems]
    f = make_file(vllm_engine, tools, prompts=pirate)
    v = verify(f, hf_prefill, tools)
    assert v.verdict.reason in (Reason.TOPLOC_EXPONENT, Reason.TOPLOC_MANTISSA), v.to_dict()["verdict"]
    assert all(not s.verdict.ok for s in v.samples)


def test_logprob_lie_is_caught(vllm_engine, hf_prefill, tools):
    f = make_file(vllm_engine, tools)
    s = f.samples[0]
    lie = RolloutFile(f.header, [replace(s, logprobs=[x + 0.5 for x in s.logprobs])])
    assert verify(lie, hf_prefill, tools).verdict.reason is Reason.LOGPROB_MISMATCH


def test_malformed_proof_bytes_in_a_file(vllm_engine, hf_prefill, tools):
    f = make_file(vllm_engine, tools)
    s = f.samples[0]
    zero_modulus = b"\x00\x00" + s.proofs[0][2:]
    bad = RolloutFile(f.header, [RolloutSample(**{**s.__dict__, "proofs": [zero_modulus, *s.proofs[1:]]})])
    v = verify(RolloutFile.from_bytes(bad.to_bytes()), hf_prefill, tools)
    assert v.verdict.reason is Reason.PROOF_MALFORMED and "modulus" in v.verdict.detail


CAL = {"prompts": 4, "samples": 2, "max_tokens": 48, "seed": 5}


@pytest.fixture(scope="module")
def calibration_cases(tmp_path_factory):
    """The calibration cases generated once: per-case figures and the generated records (cached)."""
    import torch

    from node.calibrate import CalibrationConfig, measure

    cache = tmp_path_factory.mktemp("calibration")
    per_case = measure(CalibrationConfig("tiny", **CAL), progress=lambda m: None, cache=cache)
    (records_file,) = cache.glob("*.pt")
    return per_case, list(torch.load(records_file, weights_only=False))


@pytest.mark.slow
def test_every_tamper_case_is_rejected_and_every_honest_case_accepted(calibration_cases):
    """The calibration cases (honest: fp32/bf16, batch 1/8, fp32/bf16 prefill; tampered: other
    weights, 1 % noise, fp8 weights, system prompt, changed prompt token, spliced tokens), freshly
    generated with other prompts than the calibration used, judged by the shipped thresholds."""
    from node.calibrate import TAMPERED, evaluate

    cal = Calibrated.load("tiny")
    per_case, _ = calibration_cases
    cases, failures = evaluate(per_case, cal.toploc, cal.sampling)
    assert failures == []
    assert {c.split("@")[0] for c in cases} >= set(TAMPERED)
    for case, r in cases.items():
        if r["kind"] == "tampered":
            assert r["rejected"] == r["rollouts"] > 0, case
            if case.split("@")[0] in ("other_weights", "system_prompt", "changed_prompt_token", "spliced_tokens"):
                assert r["by_toploc"] == r["rollouts"], f"{case}: not all rejected by TOPLOC itself"
        else:
            assert r["rejected"] == 0, case


@pytest.mark.slow
def test_honest_variations_pass_every_check_of_the_validator_and_the_trainer(
    calibration_cases, tools, tiny_model, hf_prefill
):
    """Zero false rejections: the honest calibration files (vLLM fp32 at batch 8 and 1, vLLM bf16) as whole
    rollout files through every check (terms, bounds, prompts, termination, TOPLOC, sampling, the
    temperature test, repeats, rewards), judged by the validator's fp32 and bf16 prefills and by the
    trainer's own old-log-prob forward pass."""
    import torch

    from node.calibrate import HONEST
    from node.inference.engine import Completion, HfPrefill
    from node.rollout.intake import check_bounds, check_terms
    from pool.grpo import Trainer
    from pool.grpo.data import _Item

    _, records = calibration_cases
    env = tools["env"]
    problems = env.problems(CAL["seed"], CAL["prompts"])
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": CAL["max_tokens"]}
    header = RolloutHeader(1, "0x" + "ab" * 20, 0, "math", CAL["seed"], sampling, "tiny")
    trainer = Trainer(tiny_model, lr=0.0)

    def trainer_prefill(prompt, completion):
        s = RolloutSample(0, 0, "", prompt, completion, [0.0] * len(completion), 0.0, "length", [])
        it = _Item(s, 1.0, 1.0)
        with torch.no_grad():
            _, logits, hidden = trainer._forward(trainer.model, trainer._batch([it]), capture=True)
        rows = trainer._completion_rows
        return rows(hidden, 0, it).float(), torch.log_softmax(rows(logits, 0, it).float(), dim=-1)

    def via(prefill):
        def fn(prompt, completion):
            x = prefill.prefill(prompt, completion)
            return x.hidden, x.logprobs

        return fn

    prefills = {
        "hf_fp32": via(hf_prefill),
        "hf_bf16": via(HfPrefill(tiny_model, dtype="bfloat16")),
        "trainer": trainer_prefill,
    }
    files = 0
    for job in HONEST:
        groups: dict[int, list] = {}
        for r in records:
            if r["job"] == job:
                groups.setdefault(r["group"], []).append(
                    Completion(r["prompt"], r["tokens"], r["logprobs"], r["finish"], r["hidden"])
                )
        f = build_rollout_file(header, problems, [groups[i] for i in range(len(problems))], env=env,
                               decode=tools["decode"])  # fmt: skip
        f = RolloutFile.from_bytes(f.to_bytes())
        assert check_terms(f.header, pool_id=1, env="math", model="tiny", sampling=sampling) is None
        assert check_bounds(f, vocab_size=hf_prefill.vocab_size, max_tokens=CAL["max_tokens"]) is None
        for name, fn in prefills.items():
            v = verify_file(f, fn, checks_for(f, tools, hf_prefill.vocab_size))
            assert v.ok, (job, name, v.to_dict()["verdict"])
        files += 1
    assert files == len(HONEST) == 3


def test_rollout_verify_command(vllm_engine, tools, tmp_path, capsys):
    import json

    from cli.main import entry

    f = make_file(vllm_engine, tools)
    good = tmp_path / "good.parquet"
    good.write_bytes(f.to_bytes())
    assert entry(["rollout", "verify", str(good), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["units"] == f.units and out["work_key"].startswith("0x")
    s = f.samples[0]
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(RolloutFile(f.header, [replace(s, reward=s.reward + 1)]).to_bytes())
    assert entry(["rollout", "verify", str(bad)]) == 1
    assert "INVALID: reward_mismatch" in capsys.readouterr().out
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    assert entry(["rollout", "verify", str(junk)]) == 1
    assert "not a readable parquet file" in capsys.readouterr().err


def test_rollout_verify_sets_an_evidence_document_against_its_own_check(vllm_engine, tools, tmp_path, capsys):
    """`rollout verify FILE --evidence DOC`: each claim of a validator's evidence document, "agree" or
    "DISPUTE"; a document about another file is refused with one line."""
    import json

    from cli.main import entry
    from node.evidence import encode_evidence
    from node.rollout.file import work_key

    f = make_file(vllm_engine, tools)
    good = tmp_path / "good.parquet"
    good.write_bytes(f.to_bytes())
    s = f.samples[0]
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(RolloutFile(f.header, [replace(s, reward=s.reward + 1)]).to_bytes())
    true_doc = tmp_path / "true.json"
    assert entry(["rollout", "verify", str(bad), "--json", "--evidence-out", str(true_doc)]) == 1
    truth = json.loads(capsys.readouterr().out)
    # the document a validator's daemon would write: canonical JSON of the verdict, its sha256 the hash
    doc, digest = encode_evidence(
        {
            "work_key": work_key(bad.read_bytes()),
            "pool": f.header.pool_id,
            **{k: truth[k] for k in ("ok", "verdict", "samples")},
        }
    )
    assert true_doc.read_bytes() == doc and truth["evidence_hash"] == digest
    assert entry(["rollout", "verify", str(bad), "--evidence", str(true_doc)]) == 1
    out = capsys.readouterr().out
    assert "agree  file: evidence says reward_mismatch, our check says reward_mismatch" in out
    assert "DISPUTE" not in out
    # a lying validator's document on the honest file: every claim disputed, and the file stands
    lie = {
        "work_key": work_key(good.read_bytes()), "ok": False, "verdict": {"reason": "toploc_mismatch", "detail": ""},
        "samples": [{"group": 0, "sample": 1, "reason": "toploc_mismatch"}],
    }  # fmt: skip
    lie_doc = tmp_path / "lie.json"
    lie_doc.write_bytes(encode_evidence(lie)[0])
    assert entry(["rollout", "verify", str(good), "--evidence", str(lie_doc), "--json"]) == 0
    claims = json.loads(capsys.readouterr().out)["evidence"]
    assert claims == [
        "DISPUTE file: evidence says toploc_mismatch, our check says ok",
        "DISPUTE group 0 sample 1: evidence says toploc_mismatch, ours ok",
    ]
    # the evidence of another file is not compared with this one
    assert entry(["rollout", "verify", str(good), "--evidence", str(true_doc)]) != 0
    err = capsys.readouterr().err
    assert "is it the evidence of this file?" in err and "not work" in err
