"""Cross-hardware honesty: proofs built on this CPU, verified against a bf16 prefill on a GPU.

Two steps, so the GPU machine needs only torch + transformers (not vLLM):

    # here (CPU): generate with vLLM, build TOPLOC proofs, save everything needed to verify
    .venv/bin/python bench/gpu_crosscheck.py make --model smollm2 --out crosscheck.pt
    # on the GPU machine, with the same model folder and crosscheck.pt copied over
    python bench/gpu_crosscheck.py check crosscheck.pt --model-dir DIR [--dtype bfloat16]

The rollouts are drawn by exact sampling (seeded Gumbel-max, `node.rollout.exact`), and `make` also
saves a block of the exact sampler's noise computed here. `check` prints one JSON line: per-chunk
exponent mismatches, mantissa error mean/median and sign mismatches (max and mean over chunks), logprob
error, whether the shipped thresholds accept every rollout, whether the noise recomputed on the check's
device is bit-identical to this CPU's (`noise_identical`), and the replay of every sampled token from
the check's own logits (`replay_failures`, `replay_gap_max`, over `replay_tokens`). The figures belong
in the README's TOPLOC and exact-sampling sections.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def make(args: argparse.Namespace) -> None:

    from node.inference.engine import SamplingSpec, VllmEngine
    from node.inference.tools import model_tools
    from node.rollout.exact import gumbel, noise_bits, sample_seed
    from node.tasks.math import MathEnv
    from node.toploc import build_proofs

    tools = model_tools(args.model)
    model_dir, encode = tools.path, tools.encode
    prompts = [encode(p.prompt) for p in MathEnv().problems(3, args.prompts)]
    spec = SamplingSpec(1.0, 1.0, args.max_tokens, 3, stop_token_ids=tuple(sorted(tools.stop_ids)), exact=True)
    with VllmEngine(model_dir, dtype="float32") as engine:
        groups = engine.generate(prompts, spec, n=2)
    rows = [
        {
            "prompt": c.prompt_tokens,
            "tokens": c.tokens,
            "logprobs": c.logprobs,
            "proofs": build_proofs(c.hidden),
            "seed": sample_seed(spec.seed, i, j),
        }
        for i, g in enumerate(groups)
        for j, c in enumerate(g)
    ]
    noise = {"seed": 2**63 + 12345, "positions": list(range(0, 4096, 97)), "vocab": tools.vocab_size}
    noise["bits"] = noise_bits(noise["seed"], noise["positions"], noise["vocab"])
    noise["gumbel"] = gumbel(noise["seed"], noise["positions"], noise["vocab"])
    torch.save({"model": args.model, "rows": rows, "noise": noise, "top_p": spec.top_p}, args.out)
    print(f"saved {len(rows)} proved rollouts to {args.out}; model folder: {model_dir}", file=sys.stderr)


def check(args: argparse.Namespace) -> None:
    from node.inference.engine import HfPrefill
    from node.rollout.checks import SamplingParams
    from node.rollout.exact import gumbel, noise_bits, replay
    from node.toploc import verify_proofs
    from node.verify import Calibrated

    data = torch.load(args.file, weights_only=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prefill = HfPrefill(args.model_dir, dtype=args.dtype, device=device)
    cal = Calibrated.load(args.thresholds or data["model"])
    n = data["noise"]
    bits = noise_bits(n["seed"], n["positions"], n["vocab"], device).cpu()
    g = gumbel(n["seed"], n["positions"], n["vocab"], device).cpu()
    noise_identical = bool(torch.equal(bits, n["bits"]) and torch.equal(g, n["gumbel"]))
    params = SamplingParams(1.0, data.get("top_p", 1.0), exact=True)
    margin = cal.sampling.margin
    chunks, lp_err, accepted, replay_failures, replay_tokens, gap_max = [], 0.0, 0, 0, 0, -float("inf")
    for r in data["rows"]:
        p = prefill.prefill(r["prompt"], r["tokens"])
        gap = replay(p.logprobs.to(device), r["tokens"], params, r["seed"], margin).gap.cpu()
        replay_failures += int((gap > margin).sum())
        replay_tokens += len(r["tokens"])
        gap_max = max(gap_max, float(gap.max()))
        checks = verify_proofs(p.hidden, r["proofs"])
        chunks += checks
        err = float((p.token_logprobs(r["tokens"]) - torch.tensor(r["logprobs"])).abs().max())
        lp_err = max(lp_err, err)
        accepted += all(cal.toploc.accepts(c) for c in checks) and err <= cal.sampling.logprob_max_abs
    out = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "dtype": args.dtype,
        "model": data["model"],
        "rollouts": len(data["rows"]),
        "chunks": len(chunks),
        "exp_mismatches_max": max(c.exp_mismatches for c in chunks),
        "exp_mismatches_mean": sum(c.exp_mismatches for c in chunks) / len(chunks),
        "mant_err_mean_max": max(c.mant_err_mean for c in chunks),
        "mant_err_median_max": max(c.mant_err_median for c in chunks),
        "sign_mismatches_max": max(c.sign_mismatches for c in chunks),
        "logprob_err_max": lp_err,
        "accepted_by_shipped_thresholds": accepted,
        "noise_identical": noise_identical,
        "noise_values": int(bits.numel()),
        "replay_tokens": replay_tokens,
        "replay_failures": replay_failures,
        "replay_gap_max": gap_max,
        "replay_margin": margin,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--model", default="smollm2")
    m.add_argument("--prompts", type=int, default=8)
    m.add_argument("--max-tokens", type=int, default=96)
    m.add_argument("--out", type=Path, default=Path("crosscheck.pt"))
    c = sub.add_parser("check")
    c.add_argument("file", type=Path)
    c.add_argument("--model-dir", required=True)
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    c.add_argument("--thresholds", help="thresholds file or model name (default: the model's shipped file)")
    a = ap.parse_args()
    make(a) if a.cmd == "make" else check(a)
