"""The validator's check of one rollout file: prompt, TOPLOC proofs, sampling, termination, reward.

The I/O-free core: the caller supplies a prefill function (HF transformers or vLLM) and the task
environment; the result says, per completion and for the file, which check failed and why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .rollout.checks import (
    OK,
    Reason,
    SamplingParams,
    SamplingStats,
    SamplingTolerances,
    Verdict,
    check_reward,
    check_sampling,
    check_termination,
    sampling_distribution,
    temperature_test,
)
from .rollout.file import RolloutFile
from .rollout.intake import implausible_repeats
from .tasks.math import MathEnv
from .toploc import ProofFormatError, Thresholds, verify_proofs

THRESHOLDS_DIR = Path(__file__).resolve().parent / "thresholds"


@dataclass(frozen=True)
class Calibrated:
    """Thresholds for one model: TOPLOC per-chunk bounds and sampling tolerances."""

    model: str
    toploc: Thresholds
    sampling: SamplingTolerances
    report: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "toploc": self.toploc.to_dict(),
            "sampling": self.sampling.to_dict(),
            "report": self.report,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibrated:
        return cls(
            str(d["model"]),
            Thresholds.from_dict(d["toploc"]),
            SamplingTolerances.from_dict(d["sampling"]),
            dict(d.get("report", {})),
        )

    @classmethod
    def load(cls, name_or_path: str | Path) -> Calibrated:
        """A shipped calibration by model name (`tiny`, `smollm2`) or a thresholds file."""
        p = Path(name_or_path)
        if not p.exists():
            p = THRESHOLDS_DIR / f"{name_or_path}.json"
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except FileNotFoundError:
            raise ValueError(
                f"no calibrated thresholds for {name_or_path!r}; run `intellect-node toploc calibrate`"
            ) from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"thresholds file {p} is malformed ({exc})") from None


@dataclass(frozen=True)
class SampleVerdict:
    group: int
    sample: int
    verdict: Verdict
    chunks: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class FileVerdict:
    verdict: Verdict
    samples: list[SampleVerdict]

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict.to_dict(),
            "samples": [
                {"group": s.group, "sample": s.sample, **s.verdict.to_dict(), "chunks": s.chunks} for s in self.samples
            ],
        }


# (prompt tokens, completion tokens) -> (hidden [T, H], raw logprobs [T, V])
PrefillFn = Callable[[list[int], list[int]], tuple[torch.Tensor, torch.Tensor]]


def toploc_verdict(
    hidden: torch.Tensor, proofs: Sequence[bytes], thr: Thresholds
) -> tuple[Verdict, list[dict[str, float]]]:
    try:
        checks = verify_proofs(hidden, list(proofs))
    except ProofFormatError as exc:
        return Verdict(Reason.PROOF_MALFORMED, str(exc)), []
    figures = [
        {
            "exp_mismatches": float(c.exp_mismatches),
            "mant_err_mean": float(c.mant_err_mean),
            "mant_err_median": float(c.mant_err_median),
            "sign_mismatches": float(c.sign_mismatches),
        }
        for c in checks
    ]
    for i, c in enumerate(checks):
        if c.exp_mismatches > thr.exp_mismatch_max:
            return Verdict(
                Reason.TOPLOC_EXPONENT,
                f"chunk {i}: {c.exp_mismatches} exponent mismatches > {thr.exp_mismatch_max}",
                figures[i],
            ), figures
        if c.sign_mismatches > thr.sign_mismatch_max:
            return Verdict(
                Reason.TOPLOC_SIGN,
                f"chunk {i}: {c.sign_mismatches} sign mismatches > {thr.sign_mismatch_max}",
                figures[i],
            ), figures
        if c.mant_err_mean > thr.mant_err_mean_max or c.mant_err_median > thr.mant_err_median_max:
            return Verdict(
                Reason.TOPLOC_MANTISSA,
                f"chunk {i}: mantissa error mean {c.mant_err_mean:.2f} / median {c.mant_err_median:.2f} above "
                f"{thr.mant_err_mean_max} / {thr.mant_err_median_max}",
                figures[i],
            ), figures
    return OK, figures


def completion_logq(raw: torch.Tensor, tokens: list[int], params: SamplingParams) -> float | None:
    """log q(completion) under the sampling distribution of `params` from raw log-softmax rows [T, V];
    None for greedy decoding (identical completions are what it produces) or out-of-range ids."""
    if params.temperature <= 0 or raw.shape[0] != len(tokens) or max(tokens) >= raw.shape[1] or min(tokens) < 0:
        return None
    logq = sampling_distribution(raw, params)
    picked = logq.gather(1, torch.tensor(tokens, dtype=torch.long)[:, None]).squeeze(1)
    return float(picked.sum()) if bool(torch.isfinite(picked).all()) else None


def verify_file(
    f: RolloutFile,
    prefill: PrefillFn,
    *,
    params: SamplingParams,
    env: MathEnv,
    encode_prompt: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    stop_ids: set[int],
    calibrated: Calibrated,
    vocab_size: int | None = None,
    expected_policy: int | None = None,
) -> FileVerdict:
    """Check every completion of a rollout file; the file fails on the first failing check of any
    completion, on the file-wide temperature test, or on completions repeated more often than the
    model's own probabilities allow (`node.rollout.intake.implausible_repeats`).

    `params` are the task's sampling parameters (from the pool's spec), never the file header's; the
    caller refuses a header that declares others (`node.rollout.intake.check_terms`). Token ids are
    checked against `vocab_size` (default: the prefill's vocabulary) before the prefill runs."""
    if expected_policy is not None and f.header.policy_version != expected_policy:
        return FileVerdict(
            Verdict(Reason.MALFORMED, f"policy version {f.header.policy_version}, expected {expected_policy}"), []
        )
    results: list[SampleVerdict] = []
    stats: list[SamplingStats] = []
    logps: list[float | None] = []
    first_bad: Verdict | None = None
    for smp in f.samples:
        problem = env.problem(f.header.task_seed, smp.group)
        verdict = OK
        chunks: list[dict[str, float]] = []
        logp: float | None = None
        if smp.task_id != problem.task_id or smp.prompt_tokens != encode_prompt(problem.prompt):
            verdict = Verdict(Reason.PROMPT_MISMATCH, f"prompt of group {smp.group} is not the task's prompt")
        if verdict.ok:
            verdict = check_termination(smp.completion_tokens, smp.finish_reason, params.max_tokens, stop_ids)
        if verdict.ok and vocab_size is not None and max(smp.completion_tokens) >= vocab_size:
            verdict = Verdict(
                Reason.TOKEN_OUT_OF_VOCAB, f"token id {max(smp.completion_tokens)} outside 0..{vocab_size - 1}"
            )
        if verdict.ok:
            hidden, raw = prefill(smp.prompt_tokens, smp.completion_tokens)
            verdict, chunks = toploc_verdict(hidden, smp.proofs, calibrated.toploc)
            if verdict.ok:
                # our own probability of the completion, whatever the worker reported: copies are judged
                # by it even when their reported logprobs are lies (inflated to pass the coordinator)
                logp = completion_logq(raw, smp.completion_tokens, params)
                verdict, st = check_sampling(raw, smp.completion_tokens, smp.logprobs, params, calibrated.sampling)
                stats.append(st)
        if verdict.ok:
            recomputed = env.reward(problem, decode(smp.completion_tokens), len(smp.completion_tokens))
            verdict = check_reward(smp.reward, recomputed)
        results.append(SampleVerdict(smp.group, smp.sample, verdict, chunks))
        logps.append(logp)
        if not verdict.ok and first_bad is None:
            first_bad = verdict
    repeat = implausible_repeats(f.samples, logps)
    if repeat is not None:  # the file-level cheat is named first, whatever else its copies got wrong
        first_bad = Verdict(Reason.DUPLICATE_SAMPLES, repeat.detail)
    if first_bad is None and params.temperature > 0:
        t = temperature_test(stats, calibrated.sampling)
        if not t.ok:
            first_bad = t
    return FileVerdict(first_bad or OK, results)
