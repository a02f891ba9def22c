"""Hostile rollout files against the validator's whole per-record pipeline (`Validator.intake`, then
`Validator.judge`: parse, header terms from the pool's spec, bounds, the real transformers prefill on the
tiny model, TOPLOC, sampling, repeats) and against the coordinator's intake (`check_submission`).

Each attack must end as a verdict on its record, in bounded time, never as an exception; the honest file
made by the real vLLM engine in the same run must pass."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import trio
from eth_account import Account

from node import protocol
from node.chain.deployment import Deployment
from node.inference.tools import model_tools
from node.rollout.build import build_rollout_file
from node.rollout.file import PROOF_BYTES, RolloutFile, RolloutHeader, chunks_for
from node.tasks.math import MathEnv
from node.validator import Validator, ValidatorConfig
from node.verify import FileVerdict
from tests.conftest import write_spec

SEED = 21
PROMPTS = 2
GROUP = 4
MAX_TOKENS = 24
NODE = "0x" + "ab" * 20
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": MAX_TOKENS}


def _validator(tmp_path: Path, tiny_model: Path, **spec: Any) -> Validator:
    uri, digest = write_spec(tmp_path / "spec", sampling=spec.pop("sampling", SAMPLING), **spec)
    cfg = ValidatorConfig(1, tmp_path / "v", "http://127.0.0.1:1", Deployment(31337, {}, 0), model=None)
    v = Validator(cfg, Account.create())
    model = trio.run(v.load_spec, {"specURI": uri, "specHash": digest, "poolId": 1})
    assert model == "tiny"
    v.tools = model_tools("tiny")
    return v


def _honest(engine: Any, v: Validator, sampling: dict[str, Any] = SAMPLING, group: int = GROUP) -> RolloutFile:
    from node.inference.engine import SamplingSpec

    assert v.tools is not None
    env = MathEnv()
    problems = env.problems(SEED, PROMPTS)
    spec = SamplingSpec(
        float(sampling["temperature"]), 1.0, int(sampling["max_tokens"]), seed=SEED,
        stop_token_ids=tuple(sorted(v.tools.stop_ids)),
    )  # fmt: skip
    groups = engine.generate([v.tools.encode(p.prompt) for p in problems], spec, n=group)
    header = RolloutHeader(1, NODE, 0, "math", SEED, dict(sampling), "tiny")
    return build_rollout_file(header, problems, groups, env=env, decode=v.tools.decode)


def _row(v: Validator) -> dict[str, Any]:
    return {"work_key": "0x" + "00" * 32, "node": NODE, "policy_version": 0, "attempts": 0, "status": "pending"}


def _verdict(v: Validator, data: bytes, prefill: Any) -> dict[str, Any]:
    f = v.intake(data, _row(v))
    return f.to_dict() if isinstance(f, FileVerdict) else v.judge(f, _row(v), prefill)


def _retyped(data: bytes) -> bytes:
    """The same table with its token columns re-typed to int64 (a writer that ignores the schema)."""
    t = pq.read_table(io.BytesIO(data))
    cols = {n: t.column(n) for n in t.schema.names}
    cols["completion_tokens"] = cols["completion_tokens"].cast(pa.list_(pa.int64()))
    out = io.BytesIO()
    pq.write_table(pa.table(cols).replace_schema_metadata(t.schema.metadata), out)
    return out.getvalue()


def _with(f: RolloutFile, i: int, **over: Any) -> bytes:
    samples = list(f.samples)
    samples[i] = dataclasses.replace(samples[i], **over)
    return dataclasses.replace(f, samples=samples).to_bytes()


def test_hostile_files_end_as_verdicts_never_as_exceptions(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any, hf_prefill: Any
) -> None:
    v = _validator(tmp_path, tiny_model)
    f = _honest(vllm_engine, v)
    honest = f.to_bytes()
    assert _verdict(v, honest, hf_prefill)["ok"], "the honest file must pass"
    vocab = v.tools.vocab_size  # type: ignore[union-attr]
    s0 = f.samples[0]
    h = f.header
    long_completion = [5] * 4096
    attacks: dict[str, bytes] = {
        "token past the vocabulary": _with(f, 0, completion_tokens=[*s0.completion_tokens[:-1], vocab + 3]),
        "negative token id": honest.replace(b"\x00", b"\x00"),  # placeholder, replaced below
        "NaN logprob": _with(f, 1, logprobs=[float("nan")] * len(f.samples[1].logprobs)),
        "inf reward": _with(f, 1, reward=float("inf")),
        "huge completion": _with(
            f,
            0,
            completion_tokens=long_completion,
            logprobs=[-1.0] * 4096,
            proofs=[bytes(PROOF_BYTES)] * chunks_for(4096),
        ),
        "huge prompt": _with(f, 0, prompt_tokens=[5] * 30_000),
        "truncated parquet": honest[: len(honest) // 2],
        "random bytes": bytes(range(256)) * 64,
        "re-typed parquet": _retyped(honest),
        "header declares top_k=1": dataclasses.replace(
            f, header=dataclasses.replace(h, sampling={**SAMPLING, "top_k": 1})
        ).to_bytes(),
        "header claims another temperature": dataclasses.replace(
            f, header=dataclasses.replace(h, sampling={**SAMPLING, "temperature": 0.5})
        ).to_bytes(),
        "header claims another model": dataclasses.replace(f, header=dataclasses.replace(h, model="tiny:1")).to_bytes(),
        "header claims another environment": dataclasses.replace(
            f, header=dataclasses.replace(h, env="thinking-budget")
        ).to_bytes(),
        "header names another node": dataclasses.replace(
            f, header=dataclasses.replace(h, node="0x" + "cd" * 20)
        ).to_bytes(),
        "zero-modulus proofs": dataclasses.replace(
            f, samples=[dataclasses.replace(s, proofs=[bytes(PROOF_BYTES)] * len(s.proofs)) for s in f.samples]
        ).to_bytes(),
        "0xff proofs": _with(f, 2, proofs=[b"\xff" * PROOF_BYTES] * len(f.samples[2].proofs)),
    }
    del attacks["negative token id"]  # the file format cannot carry one (int32 >= 0 is checked on read)
    # rewards the task does not give, all different: every group has a signal, so the trainer looks at it
    attacks["reward lies"] = dataclasses.replace(
        f, samples=[dataclasses.replace(s, reward=0.1 * i) for i, s in enumerate(f.samples)]
    ).to_bytes()
    for name, data in attacks.items():
        started = time.monotonic()
        verdict = _verdict(v, data, hf_prefill)
        took = time.monotonic() - started
        assert not verdict["ok"], f"{name}: accepted"
        assert verdict["verdict"]["reason"], name
        assert took < 60, f"{name}: {took:.0f} s"

    # the trainer (with the pool's checks) takes every one that parses without raising, and trains on none
    from node.verify import pool_checks
    from pool.grpo import Trainer

    assert v.spec is not None and v.calibrated is not None
    trainer = Trainer(tiny_model, lr=1e-3, async_level=0, checks=pool_checks(v.spec, v.tools, v.calibrated))
    looked = 0
    for name, data in attacks.items():
        try:
            g = RolloutFile.from_bytes(data)
        except Exception:
            continue
        st = trainer.step([g], 0)
        assert st.samples_trained == 0, f"{name}: trained on {st.samples_trained} samples"
        looked += bool(st.rejected)
    assert looked >= 1  # the reward lies reached the checks (an inf reward never makes an advantage)


def test_copied_completions_are_refused_and_honest_repeats_pass(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any, hf_prefill: Any
) -> None:
    """One real draw copied to fill its group is refused by the validator from its own probabilities,
    even with reported logprobs inflated to 0 (which gets it past the coordinator's bound), and by the
    coordinator from honest reported logprobs. At a low temperature honest completions repeat often;
    those files pass both."""
    v = _validator(tmp_path, tiny_model)
    f = _honest(vllm_engine, v)
    first = f.samples[0]
    copies = [dataclasses.replace(first, sample=j) for j in range(GROUP)]
    copied = dataclasses.replace(f, samples=copies + [s for s in f.samples if s.group != 0])
    verdict = _verdict(v, copied.to_bytes(), hf_prefill)
    assert not verdict["ok"] and verdict["verdict"]["reason"] == "duplicate_samples", verdict["verdict"]
    inflated = dataclasses.replace(
        copied, samples=[dataclasses.replace(s, logprobs=[0.0] * len(s.logprobs)) if s.group == 0 else s
                         for s in copied.samples]
    )  # fmt: skip
    verdict = _verdict(v, inflated.to_bytes(), hf_prefill)
    assert not verdict["ok"] and verdict["verdict"]["reason"] == "duplicate_samples", verdict["verdict"]

    tools = v.tools
    assert tools is not None
    now = time.time()
    task = protocol.Task("t-1", 1, NODE, "math", SEED, PROMPTS, GROUP, dict(SAMPLING), 0, "tiny", now, now + 60)

    def intake(g: RolloutFile) -> protocol.Decision:
        return protocol.check_submission(
            g, task, sender=NODE, now=now, current_policy=0, async_level=2, env=MathEnv(),
            encode_prompt=tools.encode, decode=tools.decode, vocab_size=tools.vocab_size,
        )  # fmt: skip

    assert intake(f).accepted
    refused = intake(copied)
    assert not refused.accepted and refused.reason == "duplicate-samples"
    assert intake(inflated).accepted  # this one is the validator's to catch (above)

    # honest repeats: a near-greedy temperature makes most of a group identical
    cold = {"temperature": 0.05, "top_p": 1.0, "max_tokens": 8}
    v2 = _validator(tmp_path / "cold", tiny_model, sampling=cold, group_size=8)
    g = _honest(vllm_engine, v2, cold, group=8)
    distinct = {tuple(s.completion_tokens) for s in g.samples if s.group == 0}
    assert len(distinct) < 8, "the test needs repeated honest completions"
    assert _verdict(v2, g.to_bytes(), hf_prefill)["ok"]


def test_a_validator_with_another_model_than_the_spec_refuses_to_start(tmp_path: Path) -> None:
    """Started with the wrong --model it would find every honest file malformed and slash them all."""
    import pytest

    from node.errors import ConfigError

    uri, digest = write_spec(tmp_path / "spec")
    for model, ok in (("smollm2", False), ("tiny", True), (None, True)):
        cfg = ValidatorConfig(1, tmp_path / f"v-{model}", "http://127.0.0.1:1", Deployment(31337, {}, 0), model=model)
        v = Validator(cfg, Account.create())
        if ok:
            assert trio.run(v.load_spec, {"specURI": uri, "specHash": digest, "poolId": 1}) == "tiny"
        else:
            with pytest.raises(ConfigError, match="is not the model of pool 1"):
                trio.run(v.load_spec, {"specURI": uri, "specHash": digest, "poolId": 1})


def test_a_bf16_prefill_runs_only_where_its_calibration_covers_it(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any
) -> None:
    """`validate --prefill-dtype bfloat16` (about twice as fast on bf16 CPUs) checks with the shipped tiny
    thresholds, calibrated against fp32 and bf16 prefills: the honest fp32 file passes, a copied group is
    still caught. Against thresholds calibrated for fp32 only it refuses to start: honest work would meet
    bounds nobody measured for that prefill, and an honest provider could be slashed."""
    import pytest
    import torch

    from node.errors import ConfigError
    from node.verify import Calibrated

    uri, digest = write_spec(tmp_path / "spec", sampling=SAMPLING)
    pool = {"specURI": uri, "specHash": digest, "poolId": 1}
    cfg = ValidatorConfig(1, tmp_path / "v", "http://127.0.0.1:1", Deployment(31337, {}, 0), prefill_dtype="bfloat16")
    v = Validator(cfg, Account.create())
    assert trio.run(v.load_spec, pool) == "tiny"
    v.tools = model_tools("tiny")
    prefill = v._load_prefill()
    assert prefill.dtype is torch.bfloat16
    f = _honest(vllm_engine, v)
    assert _verdict(v, f.to_bytes(), prefill)["ok"], "the honest fp32 file must pass a bf16 prefill"
    copied = dataclasses.replace(
        f, samples=[dataclasses.replace(f.samples[0], sample=j) for j in range(GROUP)] + list(f.samples[GROUP:])
    )
    verdict = _verdict(v, copied.to_bytes(), prefill)
    assert not verdict["ok"] and verdict["verdict"]["reason"] == "duplicate_samples", verdict["verdict"]

    shipped = Calibrated.load("tiny")
    assert shipped.prefill_dtypes() == ("float32", "bfloat16") and shipped.prefill_dtype(None) == "float32"
    fp32_only = dataclasses.replace(shipped, report={"config": {"precision": "fp32"}})
    bf16_only = dataclasses.replace(shipped, report={"config": {"precision": "bf16"}})
    assert bf16_only.prefill_dtype(None) == "bfloat16"  # a bf16 pool's validator prefills in bf16 unasked
    assert dataclasses.replace(shipped, report={}).prefill_dtypes() == ("float32",)  # unknown: fp32 only
    for thresholds, wanted in ((fp32_only, "bfloat16"), (bf16_only, "float32")):
        cfg = ValidatorConfig(
            1, tmp_path / f"v-{wanted}", "http://127.0.0.1:1", Deployment(31337, {}, 0),
            thresholds=thresholds, prefill_dtype=wanted,
        )  # fmt: skip
        with pytest.raises(ConfigError, match=f"not calibrated with a {wanted} prefill"):
            trio.run(Validator(cfg, Account.create()).load_spec, pool)
