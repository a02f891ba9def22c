"""Calibrating TOPLOC thresholds and sampling tolerances for one model.

Honest variations (fp32 and bf16 generation, batch sizes 1 and 8, vLLM generation checked by an HF
prefill in fp32 and in bf16) must all pass; tampered ones (other weights, weights with 1 % noise,
fp8-rounded weights, another system prompt, one changed prompt token, another model's tokens
spliced in) must all fail. Thresholds are the honest maxima plus a margin, kept below the tampered
minima; the run fails loudly if no such thresholds exist.

Every rollout is drawn by exact sampling (seeded Gumbel-max), so the same run measures the replay's
numerical gaps: how far, in raw logprob, an honest token scored below the validator's seeded argmax.
The replay margin is their honest maximum with the same headroom, and the report gives each case's
token count and how many tokens the chosen margin would fail (the measured false-positive count).

Generation runs in child processes (one vLLM engine per process and per weight set); verification
runs here with transformers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.errors import IntellectError

from .rollout.checks import SamplingTolerances
from .tampering import _load_state, _write_variant, fp8_weights, noisy_weights, random_weights
from .toploc import Thresholds, build_proofs, verify_proofs
from .verify import Calibrated

HONEST = ("honest_fp32_batch8", "honest_fp32_batch1", "honest_bf16_batch8")
TAMPERED = (
    "other_weights",
    "weights_noise_1pct",
    "weights_fp8",
    "system_prompt",
    "changed_prompt_token",
    "spliced_tokens",
)
METRICS = ("exp_mismatches", "mant_err_mean", "mant_err_median", "sign_mismatches")
# The logprob error of the sampled tokens (a sampling check) separates what TOPLOC alone may not:
# on a 135M model, weights with 1 % noise stay within bf16 TOPLOC noise but not within its logprobs.
ALL_METRICS = (*METRICS, "logprob_err", "replay_gap")


@dataclass(frozen=True)
class CalibrationConfig:
    model: str = "tiny"
    prompts: int = 8
    samples: int = 2
    max_tokens: int = 64
    temperature: float = 1.0
    seed: int = 0
    # Which honest variations the thresholds must accept: "any" (fp32 and bf16 generation, checked
    # by fp32 and bf16 prefills), or one pool-mandated precision for generation and prefill alike.
    precision: str = "any"


# ------------------------------------------------------------------------------ generation (child)


def _generate_jobs(spec_path: str, out_path: str) -> None:
    """Child process: one engine, several jobs; saves completions (claimed prompt, tokens, logprobs,
    finish reason, hidden states) to `out_path`."""
    from .inference.engine import SamplingSpec, VllmEngine

    spec = json.loads(Path(spec_path).read_text())
    s = spec["sampling"]
    from .rollout.exact import sample_seed

    sampling = SamplingSpec(
        temperature=s["temperature"], top_p=1.0, max_tokens=s["max_tokens"], seed=s["seed"], exact=True
    )
    records: list[dict[str, Any]] = []
    with VllmEngine(spec["model_dir"], dtype=spec["dtype"], seed=s["seed"]) as engine:
        for job in spec["jobs"]:
            gen, claimed = job["gen_prompts"], job["claimed_prompts"]
            if job["batch"] == "all":
                groups = engine.generate(gen, sampling, n=spec["samples"])
            else:
                groups = [engine.generate([p], sampling, n=spec["samples"])[0] for p in gen]
            for i, group in enumerate(groups):
                for j, c in enumerate(group):
                    records.append(
                        {
                            "job": job["name"],
                            "group": i,
                            # one prompt per call in the batch-1 jobs: each is group 0 of its call
                            "seed": sample_seed(s["seed"], i if job["batch"] == "all" else 0, j),
                            "prompt": claimed[i],
                            "tokens": c.tokens,
                            "logprobs": c.logprobs,
                            "finish": c.finish_reason,
                            "hidden": c.hidden,
                        }
                    )
    torch.save(records, out_path)


def _run_child(
    model_dir: Path, dtype: str, jobs: list[dict[str, Any]], cfg: CalibrationConfig, tmp: Path, tag: str
) -> list[dict[str, Any]]:
    spec = {
        "model_dir": str(model_dir),
        "dtype": dtype,
        "samples": cfg.samples,
        "jobs": jobs,
        "sampling": {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens, "seed": cfg.seed},
    }
    spec_path, out_path = tmp / f"{tag}.json", tmp / f"{tag}.pt"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.run(
        [sys.executable, "-m", "node.calibrate", "--child", str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if p.returncode != 0:
        raise RuntimeError(f"generation child {tag} failed:\n{p.stderr[-3000:]}")
    return list(torch.load(out_path, weights_only=False))


# ------------------------------------------------------------------------------ calibration


def _chunk_figures(hidden_claimed: torch.Tensor, hidden_validator: torch.Tensor) -> list[dict[str, float]]:
    checks = verify_proofs(hidden_validator, build_proofs(hidden_claimed))
    return [{m: float(getattr(c, m)) for m in METRICS} for c in checks]


def _worst(chunks: list[dict[str, float]]) -> dict[str, float]:
    return {m: max(c[m] for c in chunks) for m in METRICS}


def _rejected(worst: dict[str, float], thr: Thresholds, tol: SamplingTolerances) -> bool:
    return (
        worst["exp_mismatches"] > thr.exp_mismatch_max
        or worst["mant_err_mean"] > thr.mant_err_mean_max
        or worst["mant_err_median"] > thr.mant_err_median_max
        or worst["sign_mismatches"] > thr.sign_mismatch_max
        or worst["logprob_err"] > tol.logprob_max_abs
        or worst["replay_gap"] > tol.margin
    )


# fmt: off
_SLACK = {"exp_mismatches": 2, "mant_err_mean": 0.5, "mant_err_median": 0.5, "sign_mismatches": 1, "logprob_err": 0.01,
          "replay_gap": 0.01}
# fmt: on


def _build(v: dict[str, float]) -> tuple[Thresholds, SamplingTolerances]:
    return (
        Thresholds(
            exp_mismatch_max=int(v["exp_mismatches"]),
            mant_err_mean_max=round(v["mant_err_mean"], 3),
            mant_err_median_max=round(v["mant_err_median"], 3),
            sign_mismatch_max=int(v["sign_mismatches"]),
        ),
        SamplingTolerances(
            logprob_max_abs=round(v["logprob_err"], 5), replay_margin=round(max(v["replay_gap"], 0.01), 5)
        ),
    )


def choose_thresholds(
    honest: list[dict[str, float]], tampered: list[dict[str, float]]
) -> tuple[Thresholds, SamplingTolerances]:
    """Honest maxima with a margin (x1.5 plus a small absolute slack per metric). Only if that
    lets a tampered rollout through, metrics where the two sets separate are tightened to the
    midpoint between the honest maximum and the tampered minimum."""
    hi = {m: max(h[m] for h in honest) for m in ALL_METRICS}
    values = {m: hi[m] * 1.5 + _SLACK[m] for m in ALL_METRICS}
    thr, tol = _build(values)
    if tampered and not all(_rejected(t, thr, tol) for t in tampered):
        for m in ALL_METRICS:
            lo = min(t[m] for t in tampered)
            if lo > hi[m]:
                values[m] = min(values[m], (hi[m] + lo) / 2)
        thr, tol = _build(values)
    return thr, tol


def _generate_all(
    cfg: CalibrationConfig,
    model_dir: Path,
    prompts: list[list[int]],
    system: list[list[int]],
    changed: list[list[int]],
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    started = time.monotonic()
    base_jobs = [
        {"name": "honest_fp32_batch8", "gen_prompts": prompts, "claimed_prompts": prompts, "batch": "all"},
        {"name": "honest_fp32_batch1", "gen_prompts": prompts, "claimed_prompts": prompts, "batch": "single"},
        {"name": "system_prompt", "gen_prompts": system, "claimed_prompts": prompts, "batch": "all"},
        {"name": "changed_prompt_token", "gen_prompts": changed, "claimed_prompts": prompts, "batch": "all"},
    ]
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="intellect-calibrate-") as tmpdir:
        tmp = Path(tmpdir)
        state = _load_state(model_dir)
        variants = {
            "other_weights": _write_variant(model_dir, tmp / "other", random_weights(model_dir, 1234)),
            "weights_noise_1pct": _write_variant(model_dir, tmp / "noise", noisy_weights(state, 0.01, 99)),
            "weights_fp8": _write_variant(model_dir, tmp / "fp8", fp8_weights(state)),
        }
        records += _run_child(model_dir, "float32", base_jobs, cfg, tmp, "base")
        progress(
            f"  generated honest fp32 (batch 8 and 1), system-prompt and changed-token rollouts ({time.monotonic() - started:.0f} s)"
        )
        bf16_jobs = [{"name": "honest_bf16_batch8", "gen_prompts": prompts, "claimed_prompts": prompts, "batch": "all"}]
        records += _run_child(model_dir, "bfloat16", bf16_jobs, cfg, tmp, "bf16")
        progress(f"  generated honest bf16 rollouts ({time.monotonic() - started:.0f} s)")
        for name, d in variants.items():
            job = [{"name": name, "gen_prompts": prompts, "claimed_prompts": prompts, "batch": "all"}]
            records += _run_child(d, "float32", job, cfg, tmp, name)
            progress(f"  generated {name} rollouts ({time.monotonic() - started:.0f} s)")
    return records


def measure(
    cfg: CalibrationConfig, progress: Callable[[str], None] = print, cache: Path | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Generate every honest and tampered case and measure each rollout's worst chunk, logprob error and
    replay gap (with every token's gap, for the false-positive count)."""
    from .inference.engine import HfPrefill
    from .rollout.checks import SamplingParams
    from .rollout.exact import replay, runner_up

    params = SamplingParams(cfg.temperature, exact=True)
    from .inference.tools import model_tools
    from .tasks.math import MathEnv

    started = time.monotonic()
    tools = model_tools(cfg.model)
    model_dir, encode = tools.path, tools.encode
    problems = MathEnv().problems(cfg.seed, cfg.prompts)
    prompts = [encode(p.prompt) for p in problems]
    system = [encode("You are a pirate who answers in rhymes. " + p.prompt) for p in problems]
    changed = [list(p) for p in prompts]
    for p in changed:  # one prompt token (the last non-template one we can find) replaced
        j = max(0, len(p) - 3)
        p[j] = (p[j] + 7) % tools.tokenizer_size  # an id the tokenizer has
    progress(f"calibrating {cfg.model}: {cfg.prompts} prompts x {cfg.samples} samples, {cfg.max_tokens} tokens")
    cached = (
        cache / f"{cfg.model.replace('/', '_')}-{cfg.prompts}-{cfg.samples}-{cfg.max_tokens}-{cfg.seed}-exact.pt"
        if cache
        else None
    )
    if cached is not None and cached.exists():
        records = list(torch.load(cached, weights_only=False))
        progress(f"  reusing generated rollouts from {cached}")
    else:
        records = _generate_all(cfg, model_dir, prompts, system, changed, progress)
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            torch.save(records, cached)

    # tokens of another model spliced into honest completions from the middle on (same prompt and
    # sample index: both jobs list completions group by group in the same order)
    honest8 = [r for r in records if r["job"] == "honest_fp32_batch8"]
    other = [r for r in records if r["job"] == "other_weights"]
    for h, o in zip(honest8, other, strict=True):
        k = len(h["tokens"]) // 2
        m = min(len(o["tokens"]), len(h["tokens"])) - k
        if k < 1 or m < 1:
            continue
        records.append(
            {
                "job": "spliced_tokens",
                "group": h["group"],
                "seed": h["seed"],
                "prompt": h["prompt"],
                "tokens": h["tokens"][:k] + o["tokens"][k : k + m],
                "logprobs": h["logprobs"][:k] + o["logprobs"][k : k + m],
                "finish": "length",
                "hidden": torch.cat([h["hidden"][:k], o["hidden"][k : k + m]]),
            }
        )

    validators = {"hf_fp32": HfPrefill(model_dir, dtype="float32"), "hf_bf16": HfPrefill(model_dir, dtype="bfloat16")}
    per_case: dict[str, list[dict[str, Any]]] = {}
    for vname, v in validators.items():
        pre = v.prefill_many([(r["prompt"], r["tokens"]) for r in records])
        for r, p in zip(records, pre, strict=True):
            worst = _worst(_chunk_figures(r["hidden"], p.hidden))
            mine = p.token_logprobs(r["tokens"]).double()
            worst["logprob_err"] = float((mine - torch.tensor(r["logprobs"], dtype=torch.float64)).abs().max())
            gap = replay(p.logprobs, r["tokens"], params, r["seed"], 0.0).gap
            worst["replay_gap"] = max(float(gap.max()), 0.0) if len(gap) else 0.0
            worst["tokens"] = float(len(r["tokens"]))
            worst["replay_gaps"] = gap.tolist()
            worst["runner_up"] = runner_up(p.logprobs, r["tokens"], params, r["seed"]).tolist()
            per_case.setdefault(f"{r['job']}@{vname}", []).append(worst)
    progress(f"  verified {len(records)} rollouts with fp32 and bf16 prefills ({time.monotonic() - started:.0f} s)")
    return per_case


def evaluate(
    per_case: dict[str, list[dict[str, Any]]], thr: Thresholds, tol: SamplingTolerances
) -> tuple[dict[str, Any], list[str]]:
    """Per case: how many rollouts the thresholds reject, and the figures' ranges; plus every
    honest rollout rejected or tampered rollout accepted, as failures."""
    cases: dict[str, Any] = {}
    failures = []
    for case, ws in sorted(per_case.items()):
        job = case.split("@")[0]
        rejected = sum(_rejected(w, thr, tol) for w in ws)
        loose = SamplingTolerances(logprob_max_abs=float("inf"), replay_margin=float("inf"))
        cases[case] = {
            "kind": "honest" if job in HONEST else "tampered",
            "rollouts": len(ws),
            "tokens": int(sum(w.get("tokens", 0) for w in ws)),
            # tokens whose replay gap the chosen margin fails (for honest cases: the false positives)
            "replay_failed_tokens": sum(g > tol.margin for w in ws for g in w.get("replay_gaps", [])),
            # tokens that are not the seeded argmax, within the margin (the steering test counts them)
            "replay_disagreements": sum(0 < g <= tol.margin for w in ws for g in w.get("replay_gaps", [])),
            # tokens where another token scored within the margin of the draw: where a cheater could steer
            "steerable_tokens": sum(0 <= g <= tol.margin for w in ws for g in w.get("runner_up", [])),
            "rejected": rejected,
            "by_toploc": sum(_rejected(w, thr, loose) for w in ws),
            "max": {m: max(w[m] for w in ws) for m in ALL_METRICS},
            "min": {m: min(w[m] for w in ws) for m in ALL_METRICS},
        }
        if job in HONEST and rejected:
            failures.append(f"{case}: {rejected} of {len(ws)} honest rollouts rejected")
        if job in TAMPERED and rejected != len(ws):
            failures.append(f"{case}: {len(ws) - rejected} of {len(ws)} tampered rollouts accepted")
    return cases, failures


def disagree_rate(per_case: dict[str, list[dict[str, Any]]]) -> float:
    """The steering test's honest rate (`SamplingTolerances.replay_disagree_rate`): over the honest cases,
    the largest upper confidence bound on the share of tokens that are not the validator's seeded argmax
    ((k + 3 + 3 sqrt(k)) / n for k of n tokens: about three standard deviations, and the rule of three
    where none was seen), x1.5. A calibration sees a few thousand tokens of one machine: its point
    estimate is no bound on another machine's near-ties."""
    rates = []
    for case, ws in per_case.items():
        if case.split("@")[0] in HONEST:
            gaps = [g for w in ws for g in w.get("replay_gaps", [])]
            k = sum(g > 0 for g in gaps)
            rates.append((k + 3 + 3 * k**0.5) / max(len(gaps), 1))
    return round(min(1.0, max(rates, default=0.0) * 1.5), 6)


def for_precision(per_case: dict[str, list[dict[str, Any]]], precision: str) -> dict[str, list[dict[str, Any]]]:
    """The cases that matter for a pool that mandates `precision` ("any", "fp32" or "bf16")."""
    if precision == "any":
        return per_case
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be any, fp32 or bf16, not {precision!r}")
    other = "bf16" if precision == "fp32" else "fp32"
    return {
        c: ws for c, ws in per_case.items() if c.endswith(f"@hf_{precision}") and not c.startswith(f"honest_{other}")
    }


def calibrate(cfg: CalibrationConfig, progress: Callable[[str], None] = print, cache: Path | None = None) -> Calibrated:
    started = time.monotonic()
    per_case = for_precision(measure(cfg, progress, cache), cfg.precision)
    honest = [w for c, ws in per_case.items() if c.split("@")[0] in HONEST for w in ws]
    tampered = [w for c, ws in per_case.items() if c.split("@")[0] in TAMPERED for w in ws]
    thr, tol = choose_thresholds(honest, tampered)
    tol = dataclasses.replace(tol, replay_disagree_rate=disagree_rate(per_case))
    cases, failures = evaluate(per_case, thr, tol)
    report = {
        "config": cfg.__dict__,
        "cases": cases,
        "failures": failures,
        "seconds": round(time.monotonic() - started, 1),
    }
    result = Calibrated(cfg.model, thr, tol, report)
    if failures:
        raise CalibrationFailed(result, failures)
    return result


class CalibrationFailed(IntellectError):
    """No thresholds separate the honest rollouts from the tampered ones."""

    def __init__(self, result: Calibrated, failures: list[str]) -> None:
        super().__init__(
            "calibration found no thresholds that separate honest from tampered rollouts: " + "; ".join(failures),
            "calibrate on more prompts, or check that the engine is the pool's",
        )
        self.result = result


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _generate_jobs(sys.argv[2], sys.argv[3])
    else:
        cfg = CalibrationConfig(model=sys.argv[1] if len(sys.argv) > 1 else "tiny")
        out = calibrate(cfg)
        print(json.dumps(out.to_dict(), indent=2))
