"""TOPLOC costs on this machine, measured in one run with the tiny model (or --model).

Prints: proof bytes per 32 generated tokens; proof building time as a fraction of generation time;
and the validator's prefill speed over the same tokens relative to generation speed. Ends with one
JSON line.

    .venv/bin/python bench/toploc.py [--model tiny] [--prompts 16] [--samples 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from node.inference.engine import HfPrefill, SamplingSpec, VllmEngine
from node.inference.models import ensure_model
from node.tasks.math import MathEnv
from node.tasks.prompts import prompt_encoder
from node.toploc import build_proofs, verify_proofs


def main() -> dict[str, float]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    model_dir = ensure_model(args.model)
    encode = prompt_encoder(AutoTokenizer.from_pretrained(str(model_dir)))
    prompts = [encode(p.prompt) for p in MathEnv().problems(1, args.prompts)]
    sampling = SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1)
    with VllmEngine(model_dir, dtype="float32") as engine:
        engine.generate(prompts[:2], SamplingSpec(1.0, 1.0, 8, 0))  # warm-up
        t0 = time.perf_counter()
        groups = engine.generate(prompts, sampling, n=args.samples)
        gen_s = time.perf_counter() - t0
    completions = [c for g in groups for c in g]
    tokens = sum(len(c.tokens) for c in completions)

    t0 = time.perf_counter()
    proofs = [build_proofs(c.hidden) for c in completions]
    build_s = time.perf_counter() - t0
    n_proofs = sum(len(p) for p in proofs)
    proof_bytes = sum(len(b) for p in proofs for b in p)

    validator = HfPrefill(model_dir, dtype="float32")
    validator.prefill_many([(c.prompt_tokens, c.tokens) for c in completions[:4]])  # warm-up
    t0 = time.perf_counter()
    pre = validator.prefill_many([(c.prompt_tokens, c.tokens) for c in completions])
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    worst = max(ch.exp_mismatches for c, p, pr in zip(completions, pre, proofs, strict=True) for ch in verify_proofs(p.hidden, pr))
    verify_s = time.perf_counter() - t0

    out = {
        "model": args.model,
        "completions": len(completions),
        "generated_tokens": tokens,
        "proof_bytes_per_32_tokens": proof_bytes / n_proofs,
        "generation_tokens_per_s": tokens / gen_s,
        "proof_build_ms_per_chunk": 1e3 * build_s / n_proofs,
        "proof_overhead_fraction": build_s / gen_s,
        "prefill_tokens_per_s": tokens / prefill_s,
        "prefill_vs_generation_speed": gen_s / prefill_s,
        "verify_ms_per_chunk": 1e3 * verify_s / n_proofs,
        "honest_worst_exp_mismatches": worst,
    }
    return out


if __name__ == "__main__":
    figures = main()
    for k, v in figures.items():
        print(f"{k:32s} {v}", file=sys.stderr)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items()}))
