"""GRPO trainer costs on this machine: Trainer.step throughput on synthetic rollout files, and save time.

Synthetic files (random prompt/completion tokens, rewards varying inside every group, so nothing is
dropped) go through `pool.grpo.Trainer` on the tiny model (or --model); prints per-step seconds and
trained tokens per second, the checkpoint save time, and ends with one JSON line.

    .venv/bin/python bench/rl_core.py [--model tiny] [--prompts 8] [--group 8] [--prompt-len 40]
        [--completion-len 48] [--steps 3] [--micro-batch 8] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from node.inference.models import ensure_model
from node.rollout.file import RolloutFile, RolloutHeader, RolloutSample
from pool.grpo import Trainer


def synthetic_file(version: int, args: argparse.Namespace, vocab: int, seed: int) -> RolloutFile:
    rng = random.Random(seed)
    samples = []
    for g in range(args.prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
        for j in range(args.group):
            n = rng.randint(max(1, args.completion_len // 2), args.completion_len)
            comp = [rng.randrange(3, vocab) for _ in range(n)]
            samples.append(RolloutSample(g, j, f"t{g}", prompt, comp, [-1.0] * n, rng.random(), "length", []))
    header = RolloutHeader(1, "0x" + "00" * 20, version, "bench", seed, {"temperature": 1.0}, "bench")
    return RolloutFile(header, samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--completion-len", type=int, default=48)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    model = ensure_model(args.model)
    t0 = time.perf_counter()
    trainer = Trainer(model, lr=1e-5, device=args.device, micro_batch_size=args.micro_batch)
    load_s = time.perf_counter() - t0
    vocab = int(trainer.config.vocab_size)
    steps = []
    for v in range(args.steps):
        stats = trainer.step([synthetic_file(v, args, vocab, seed=v)], current_version=v)
        steps.append(stats)
        print(
            f"step {v}: {stats.samples_trained} samples, {stats.tokens} tokens, {stats.seconds:.2f} s "
            f"({stats.tokens / stats.seconds:.0f} tok/s), loss {stats.loss:+.4f}, grad norm {stats.grad_norm:.3f}"
        )
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        trainer.save(Path(d) / "ckpt")
        save_s = time.perf_counter() - t0
    tokens = sum(s.tokens for s in steps)
    seconds = sum(s.seconds for s in steps)
    result = {
        "model": args.model,
        "device": args.device,
        "load_s": round(load_s, 3),
        "step_s": [round(s.seconds, 3) for s in steps],
        "train_tok_per_s": round(tokens / seconds, 1),
        "save_s": round(save_s, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
