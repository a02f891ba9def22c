"""Rollout file format and the sampling / termination / reward checks, on synthetic data."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from node.rollout.checks import (
    Reason,
    SamplingParams,
    SamplingTolerances,
    check_reward,
    check_sampling,
    check_termination,
    sampling_distribution,
    temperature_test,
)
from node.rollout.file import RolloutFile, RolloutFormatError, RolloutHeader, RolloutSample, work_key
from node.tasks import MathEnv, ThinkingBudgetEnv, get_env
from node.tasks.math import extract_answer

TOL = SamplingTolerances()


def logits(T: int, V: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(T, V, generator=g, dtype=torch.float64) * scale, dim=-1)


def sample(raw: torch.Tensor, p: SamplingParams, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    q = sampling_distribution(raw, p).exp()
    return torch.multinomial(q, 1, generator=g).squeeze(1).tolist()


def claimed(raw: torch.Tensor, tokens: list[int]) -> list[float]:
    return raw.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, 0.9), SamplingParams(1.2, 0.95, 20)])
def test_honest_sampling_passes(seed, params):
    raw = logits(150, 64, seed)
    toks = sample(raw, params, seed + 100)
    v, stats = check_sampling(raw, toks, claimed(raw, toks), params, TOL)
    assert v.ok, v
    assert temperature_test([stats], TOL).ok


@pytest.mark.parametrize(("true_t", "claimed_t"), [(1.6, 0.7), (0.3, 1.0), (2.0, 1.0)])
def test_temperature_lie_is_caught(true_t, claimed_t):
    raw = logits(300, 64, 1)
    toks = sample(raw, SamplingParams(true_t), 5)
    v, stats = check_sampling(raw, toks, claimed(raw, toks), SamplingParams(claimed_t), TOL)
    assert v.ok  # every single token is possible at any temperature ...
    verdict = temperature_test([stats], TOL)  # ... but not the whole sequence
    assert verdict.reason is Reason.TEMPERATURE_MISMATCH, verdict


def test_token_outside_top_p_and_top_k():
    raw = logits(40, 64, 2)
    worst = raw.argmin(dim=-1).tolist()
    v, _ = check_sampling(raw, worst, claimed(raw, worst), SamplingParams(1.0, 0.5), TOL)
    assert v.reason is Reason.TOKEN_OUTSIDE_TOP_P
    v, _ = check_sampling(raw, worst, claimed(raw, worst), SamplingParams(1.0, 1.0, 10), TOL)
    assert v.reason is Reason.TOKEN_OUTSIDE_TOP_K


def test_greedy_claim_with_sampled_tokens():
    raw = logits(40, 64, 3)
    toks = sample(raw, SamplingParams(1.0), 1)
    v, _ = check_sampling(raw, toks, claimed(raw, toks), SamplingParams(0.0), TOL)
    assert v.reason is Reason.TOKEN_NOT_GREEDY
    top = raw.argmax(dim=-1).tolist()
    v, _ = check_sampling(raw, top, claimed(raw, top), SamplingParams(0.0), TOL)
    assert v.ok


def test_logprob_and_shape_mismatch():
    raw = logits(40, 64, 4)
    toks = sample(raw, SamplingParams(1.0), 1)
    lp = claimed(raw, toks)
    lp[7] += 0.5
    v, _ = check_sampling(raw, toks, lp, SamplingParams(1.0), TOL)
    assert v.reason is Reason.LOGPROB_MISMATCH and "token 7" in v.detail
    v, _ = check_sampling(raw, toks[:-1], lp[:-1], SamplingParams(1.0), TOL)
    assert v.reason is Reason.MALFORMED
    v, _ = check_sampling(raw, [*toks[:-1], 999], lp, SamplingParams(1.0), TOL)
    assert v.reason is Reason.TOKEN_OUT_OF_VOCAB


def test_termination():
    eos = {2}
    assert check_termination([5, 6, 2], "stop", 10, eos).ok
    assert check_termination([5] * 10, "length", 10, eos).ok
    assert check_termination([5, 6], "length", 10, eos).reason is Reason.BAD_TERMINATION  # truncated, no EOS
    assert check_termination([5, 6], "stop", 10, eos).reason is Reason.BAD_TERMINATION  # claims stop, no EOS
    assert check_termination([5, 2, 6, 2], "stop", 10, eos).reason is Reason.BAD_TERMINATION  # text after EOS
    assert check_termination([5] * 11, "length", 10, eos).reason is Reason.TOO_LONG
    assert check_termination([], "stop", 10, eos).reason is Reason.BAD_TERMINATION


def test_reward_check():
    assert check_reward(1.0, 1.0).ok
    assert check_reward(1.0, 0.0).reason is Reason.REWARD_MISMATCH
    assert check_reward(float("nan"), 0.0).reason is Reason.REWARD_MISMATCH


def test_math_env_is_deterministic_and_scores():
    env = MathEnv()
    a, b = env.problems(7, 5), env.problems(7, 5)
    assert a == b and len({p.prompt for p in a}) > 1
    p = a[0]
    assert env.reward(p, f" {p.answer}", 3) == 1.0
    assert env.reward(p, f" {p.answer + 1}", 3) == 0.0
    assert extract_answer("We get 3 then Answer: 12.") == 12
    tb = ThinkingBudgetEnv()
    q = tb.problem(7, 0)
    target = q.meta["target"]
    assert f"about {target} tokens" in q.prompt
    assert tb.reward(q, str(q.answer), target) == 1.0
    assert tb.reward(q, str(q.answer), target * 3) == 0.5
    assert tb.reward(q, "no", target) == 0.0
    with pytest.raises(ValueError, match="unknown task environment"):
        get_env("chess")


def _file(n_tokens: int = 40) -> RolloutFile:
    h = RolloutHeader(1, "0x" + "ab" * 20, 3, "math", 42, {"temperature": 1.0, "top_p": 1.0}, "tiny")
    s = RolloutSample(
        0,
        0,
        "math-42-0",
        [1, 2, 3],
        list(range(n_tokens)),
        [-1.0] * n_tokens,
        1.0,
        "length",
        [bytes([i]) * 258 for i in range((n_tokens + 31) // 32)],
    )
    return RolloutFile(h, [s, RolloutSample(**{**s.__dict__, "sample": 1})])


def test_rollout_file_roundtrip_and_key():
    f = _file()
    data = f.to_bytes()
    assert data == _file().to_bytes()  # deterministic: the work key is a function of the content
    back = RolloutFile.from_bytes(data)
    assert back == f and back.units == 80
    assert work_key(data).startswith("0x") and len(work_key(data)) == 66


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda s: {**s, "logprobs": s["logprobs"][:-1]}, "logprobs for"),
        (lambda s: {**s, "proofs": s["proofs"][:1]}, "proofs for"),
        (lambda s: {**s, "proofs": [b"x" * 257, s["proofs"][1]]}, "not 258 bytes"),
        (lambda s: {**s, "finish_reason": "tired"}, "finish reason"),
        (lambda s: {**s, "completion_tokens": [], "logprobs": [], "proofs": []}, "completion of 0 tokens"),
    ],
)
def test_invalid_samples_are_refused(mutate, needle):
    f = _file()
    bad = RolloutSample(**mutate(dict(f.samples[0].__dict__)))
    with pytest.raises(RolloutFormatError, match=needle):
        RolloutFile(f.header, [bad]).to_bytes()


def test_size_limit_and_garbage():
    data = _file().to_bytes()
    with pytest.raises(RolloutFormatError, match="limit"):
        RolloutFile.from_bytes(data, max_bytes=100)
    with pytest.raises(RolloutFormatError, match="parquet"):
        RolloutFile.from_bytes(data[: len(data) // 2])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000), st.integers(min_value=0, max_value=3000))
def test_decoder_never_crashes(noise, cut):
    data = _file().to_bytes()
    mutated = data[:cut] + noise + data[cut + len(noise) :]
    with contextlib.suppress(RolloutFormatError):
        RolloutFile.from_bytes(mutated)


def _bomb(rows: int, tokens: int) -> bytes:
    """A file whose every completion is one token id repeated: dictionary + run-length pages make it a few
    KB on the wire (and in the footer's sizes), `rows * tokens * 8` bytes once decoded."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from node.rollout.file import SCHEMA

    f = _file()
    meta = pq.read_schema(io.BytesIO(f.to_bytes())).metadata
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * tokens)
    ints = pa.ListArray.from_arrays(offsets, pa.array(np.full(rows * tokens, 5, dtype=np.int32)))
    floats = pa.ListArray.from_arrays(offsets, pa.array(np.full(rows * tokens, -1.0, dtype=np.float32)))
    proofs = b"\x01" * (258 * ((tokens + 31) // 32))
    t = pa.table(
        {
            "group": pa.array(np.zeros(rows, dtype=np.int32)),
            "sample": pa.array(np.arange(rows, dtype=np.int32)),
            "task_id": ["t"] * rows,
            "prompt_tokens": pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32)), pa.array(
                np.ones(rows, dtype=np.int32))),
            "completion_tokens": ints,
            "logprobs": floats,
            "reward": [0.0] * rows,
            "finish_reason": ["length"] * rows,
            "proofs": [proofs] * rows,
        },
        schema=SCHEMA.with_metadata(meta),
    )  # fmt: skip
    buf = io.BytesIO()
    pq.write_table(t, buf, compression="zstd", use_dictionary=True, write_statistics=False)
    return buf.getvalue()


def test_a_run_length_bomb_is_refused_within_its_budget(tmp_path):
    import subprocess
    import sys

    data = _bomb(1024, 8192)  # 7 KB that decode to 1024 x 8192 x 8 = 64 MiB of token ids and logprobs
    assert len(data) < 64 * 1024
    with pytest.raises(RolloutFormatError, match="bomb"):
        RolloutFile.from_bytes(data)
    small = _bomb(8, 64)  # the same encoding at an honest size decodes fine
    assert len(RolloutFile.from_bytes(small).samples) == 8
    one_row = _bomb(1, 4_000_000)  # the whole bomb in one row (one batch): refused from the footer's counts
    with pytest.raises(RolloutFormatError, match=r"declares 800\d{4} values"):
        RolloutFile.from_bytes(one_row)

    # peak memory of a fresh process reading each: the bomb costs about its budget (16 MiB and a batch),
    # not the 64 MiB of Arrow and ~600 MB of Python lists it would decode to
    def peak_mb(blob: bytes) -> float:
        path = tmp_path / "f.parquet"
        path.write_bytes(blob)
        code = (
            "import resource, sys\nfrom node.rollout.file import RolloutFile, RolloutFormatError\n"
            "try:\n    RolloutFile.from_bytes(open(sys.argv[1], 'rb').read())\nexcept RolloutFormatError:\n    pass\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
        )
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
        return float(out.stdout.strip().splitlines()[-1])

    assert peak_mb(data) - peak_mb(small) < 40
