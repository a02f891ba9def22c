"""TOPLOC costs on this machine, measured in one run with the tiny model (or --model).

Prints: proof bytes per 32 generated tokens; proof building time as a fraction of (batched)
generation time; the validator's prefill speed over the same tokens relative to generation
speed: per sequence (decoding one sequence token by token vs one prefill over it, the TOPLOC
claim) and batched (vLLM's batched throughput vs batched prefill); and the validator's whole cost
per token (`PoolFileCheck.judge` on the completions as one rollout file: batched prefill, TOPLOC, the
sampling checks, the exact-sampling replay and the rewards) against the worker's batched generation
with exact sampling (`validation_cost_vs_generation`, target <= 0.1), and the same with the bf16 prefill
a validator may choose where the thresholds were calibrated for it (`validation_bf16_cost_vs_generation`).
The prefill's weight FLOP/s against a plain matmul of the model's shape (`prefill_share_of_matmul_peak`)
says how much a faster prefill could still gain on this machine; `prefill_cost_floor` (and
`prefill_bf16_cost_floor`) is the prefill's cost against generation if it ran at that peak: the least
any validator could reach here, since generation does the same weight FLOPs per token.
Timed runs are the fastest of `--repeats` on both sides.
Ends with one JSON line.

    .venv/bin/python bench/toploc.py [--model tiny] [--prompts 16] [--samples 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from node.inference.engine import HfPrefill, SamplingSpec, VllmEngine
from node.inference.models import ensure_model
from node.inference.tools import model_tools
from node.rollout.build import build_rollout_file
from node.rollout.checks import Reason
from node.rollout.exact import sample_seed
from node.rollout.file import RolloutHeader
from node.tasks.math import MathEnv
from node.taskspec import TaskSpec
from node.toploc import build_proofs, verify_proofs
from node.verify import Calibrated, PoolFileCheck


def generate(args: argparse.Namespace) -> None:
    """Child process: vLLM generation, batched and one sequence at a time, with timings.

    Generation runs in its own process because a vLLM engine pins the process to one torch thread;
    the validator's prefill then gets the machine's threads, as a validator process would."""
    tools = model_tools(args.model)
    model_dir, encode = tools.path, tools.encode
    prompts = [encode(p.prompt) for p in MathEnv().problems(1, args.prompts)]
    sampling = SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1, exact=True)
    with VllmEngine(model_dir, dtype="float32") as engine:
        engine.generate(prompts[:2], SamplingSpec(1.0, 1.0, 8, 0))  # warm-up
        batched_s = math.inf
        for _ in range(args.repeats):  # the fastest of a few runs (this machine is noisy); seeded: same output
            t0 = time.perf_counter()
            groups = engine.generate(prompts, sampling, n=args.samples)
            batched_s = min(batched_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        singles = [engine.generate([p], sampling, n=1)[0][0] for p in prompts[: args.singles]]
        single_s = time.perf_counter() - t0
    rows = [c for g in groups for c in g]
    seeds = [sample_seed(1, i, j) for i, g in enumerate(groups) for j in range(len(g))]
    torch.save(
        {
            "groups": groups,
            "batched": rows,
            "seeds": seeds,
            "batched_s": batched_s,
            "singles": singles,
            "single_s": single_s,
        },
        args.child,
    )


def matmul_gflops(hidden: int, dtype: torch.dtype, rows: int = 8192) -> float:
    """This machine's plain matrix-multiply speed for a [rows, hidden] x [hidden, 2 * hidden] product."""
    a, b = torch.randn(rows, hidden, dtype=dtype), torch.randn(hidden, 2 * hidden, dtype=dtype)
    a @ b  # warm-up
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 10)
    return 2 * rows * hidden * 2 * hidden / best / 1e9


def main(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gen.pt"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            str(out),
            "--model",
            args.model,
            "--prompts",
            str(args.prompts),
            "--samples",
            str(args.samples),
            "--max-tokens",
            str(args.max_tokens),
            "--singles",
            str(args.singles),
            "--repeats",
            str(args.repeats),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        gen = torch.load(out, weights_only=False)
    completions, singles = gen["batched"], gen["singles"]
    tokens = sum(len(c.tokens) for c in completions)
    single_tokens = sum(len(c.tokens) for c in singles)

    t0 = time.perf_counter()
    proofs = [build_proofs(c.hidden) for c in completions]
    build_s = time.perf_counter() - t0
    n_proofs = sum(len(p) for p in proofs)
    proof_bytes = sum(len(b) for p in proofs for b in p)

    validator = HfPrefill(ensure_model(args.model), dtype="float32")
    validator.prefill_many([(c.prompt_tokens, c.tokens) for c in completions[:4]])  # warm-up
    t0 = time.perf_counter()
    for c in singles:
        validator.prefill(c.prompt_tokens, c.tokens)
    prefill_single_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pre = validator.prefill_many([(c.prompt_tokens, c.tokens) for c in completions])
    prefill_s = time.perf_counter() - t0
    # a bf16 prefill (calibrated as honest where the pool allows any precision) on this CPU's bf16 units
    fast = HfPrefill(ensure_model(args.model), dtype="bfloat16")
    fast.prefill_many([(c.prompt_tokens, c.tokens) for c in completions[:4]])  # warm-up
    t0 = time.perf_counter()
    fast.prefill_many([(c.prompt_tokens, c.tokens) for c in completions])
    prefill_bf16_s = time.perf_counter() - t0
    del fast
    # how close the prefill runs to this machine's matrix-multiply peak: its weight FLOPs (2 per weight
    # per position fed through the layers, 2 per head weight per completion row: the head runs only
    # there; embeddings are a lookup) per second, against a plain matmul of the model's shape
    head = validator.hidden_size * validator.vocab_size  # the output layer, tied to the embeddings or not
    body = sum(
        p.numel() for n, p in validator.model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n
    )
    whole = sum(len(c.prompt_tokens) + len(c.tokens) - 1 for c in completions)  # what generation feeds
    fed = whole  # the prefill feeds each group's prompt once where it shares them (fp32's default)
    if validator.share_prompts:
        fed = sum(len(p) for p in {tuple(c.prompt_tokens) for c in completions}) + sum(
            len(c.tokens) - 1 for c in completions
        )
    prefill_flops = 2 * (body * fed + head * tokens)
    prefill_gflops = prefill_flops / prefill_s / 1e9
    peak_gflops = matmul_gflops(validator.hidden_size, torch.float32)
    peak_bf16_gflops = matmul_gflops(validator.hidden_size, torch.bfloat16)
    # Generation does the same weight FLOPs per token as the prefill (no prefix caching on CPU; the head
    # once per generated token): where it runs near this machine's matmul peak (batched decoding of a
    # model this size is compute-bound on a CPU, memory-bound on a GPU), no prefill can cost much less.
    # The floors: the prefill's weight FLOPs at the machine's fp32 / bf16 (whole pass) matmul peak,
    # against the generation's time.
    generation_flops = 2 * (body * whole + head * tokens)
    generation_gflops = generation_flops / gen["batched_s"] / 1e9
    t0 = time.perf_counter()
    worst = max(ch.exp_mismatches for p, pr in zip(pre, proofs, strict=True) for ch in verify_proofs(p.hidden, pr))
    verify_s = time.perf_counter() - t0

    # the validator's whole check of the same completions as one rollout file: what `validate` runs
    tools = model_tools(args.model)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens, "exact": True}
    header = RolloutHeader(1, "0x" + "00" * 20, 0, "math", 1, sampling, args.model)
    env = MathEnv()
    f = build_rollout_file(header, env.problems(1, args.prompts), gen["groups"], env=env, decode=tools.decode)
    spec = TaskSpec(args.model, "math", sampling, group_size=args.samples)
    calibrated = Calibrated.load(args.model)
    check = PoolFileCheck(spec, tools, calibrated, 1)

    def judged(prefill: HfPrefill) -> tuple[float, dict[str, Any]]:
        best, verdict = math.inf, {}
        for _ in range(args.repeats):  # the fastest of a few runs, as for generation
            t0 = time.perf_counter()
            verdict = check.judge(f, prefill, 0)
            best = min(best, time.perf_counter() - t0)
        return best, verdict

    validate_s, verdict = judged(validator)
    failed = sum(s["reason"] != str(Reason.OK) for s in verdict["samples"])
    honest_ok = bool(verdict["ok"])
    # `validate --prefill-dtype bfloat16`, where the model's thresholds were calibrated for it
    validate_bf16_s = math.nan
    if "bfloat16" in calibrated.prefill_dtypes():
        fast = HfPrefill(ensure_model(args.model), dtype="bfloat16")
        validate_bf16_s, verdict_bf16 = judged(fast)
        failed += sum(s["reason"] != str(Reason.OK) for s in verdict_bf16["samples"])
        honest_ok = honest_ok and bool(verdict_bf16["ok"])

    return {
        "model": args.model,
        "completions": len(completions),
        "generated_tokens": tokens,
        "proof_bytes_per_32_tokens": proof_bytes / n_proofs,
        "proof_build_ms_per_chunk": 1e3 * build_s / n_proofs,
        "proof_overhead_fraction": build_s / gen["batched_s"],
        "generation_tokens_per_s_batched": tokens / gen["batched_s"],
        "prefill_tokens_per_s_batched": tokens / prefill_s,
        "prefill_vs_generation_speed_batched": gen["batched_s"] / tokens * tokens / prefill_s,
        "generation_tokens_per_s_per_sequence": single_tokens / gen["single_s"],
        "prefill_tokens_per_s_per_sequence": single_tokens / prefill_single_s,
        "prefill_vs_generation_speed": gen["single_s"] / prefill_single_s,
        "prefill_gflops": prefill_gflops,
        "matmul_peak_gflops": peak_gflops,
        "prefill_share_of_matmul_peak": prefill_gflops / peak_gflops,
        "generation_gflops": generation_gflops,
        "prefill_cost_floor": prefill_flops / peak_gflops / 1e9 / gen["batched_s"],
        "prefill_bf16_cost_floor": generation_flops / peak_bf16_gflops / 1e9 / gen["batched_s"],
        "verify_ms_per_chunk": 1e3 * verify_s / n_proofs,
        "honest_worst_exp_mismatches": worst,
        "checks_ms_per_token": 1e3 * (validate_s - prefill_s) / tokens,
        "prefill_cost_vs_generation": prefill_s / gen["batched_s"],
        "prefill_bf16_cost_vs_generation": prefill_bf16_s / gen["batched_s"],
        "validation_cost_vs_generation": validate_s / gen["batched_s"],
        "validation_bf16_cost_vs_generation": validate_bf16_s / gen["batched_s"],
        "honest_file_ok": honest_ok,
        "honest_completions_failed": failed,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--singles", type=int, default=6, help="sequences generated and prefilled one at a time")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of batched generation and of judging (fastest)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        generate(a)
        sys.exit(0)
    figures = main(a)
    for k, v in figures.items():
        print(f"{k:32s} {v}", file=sys.stderr)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items()}))
