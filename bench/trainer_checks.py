"""What it costs the trainer to verify everything it trains on, measured in one run.

Real rollout files (the vLLM engine on the tiny model, or --model, with TOPLOC proofs; the
thinking-budget task so groups carry a signal) plus one forged file (hand-written completions with
the honest proofs) go through two `pool.grpo.Trainer`s that start from the same weights: one with the
pool's checks (`node.verify.pool_checks`: TOPLOC, sampling and reward on the hidden states and logits of
its old-log-prob pass), one without. Both take the same steps on the same files; the order of the two
alternates each step, so drift of the machine hits both alike.

Prints, per step and in total: samples trained, the share of them verified before training (target
100 %), the time inside the checks as a fraction of the checked step (`verify_frac`, target <= 10 %),
and the checked step's time over the unchecked one's (`slowdown`). Ends with one JSON line.

    .venv/bin/python bench/trainer_checks.py [--model tiny] [--files 4] [--prompts 6] [--group 8]
        [--max-tokens 96] [--steps 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from node.inference.engine import SamplingSpec, VllmEngine
from node.inference.tools import model_tools
from node.rollout.build import build_rollout_file
from node.rollout.file import RolloutFile, RolloutHeader, chunks_for
from node.tasks import get_env
from node.taskspec import TaskSpec
from node.verify import Calibrated, pool_checks
from pool.grpo import Trainer

ENV = "thinking-budget"


def honest_files(engine: VllmEngine, checks, args: argparse.Namespace, sampling: dict, seed0: int) -> list[RolloutFile]:
    env = get_env(ENV)
    out = []
    for k in range(args.files):
        seed = seed0 + k
        problems = env.problems(seed, args.prompts)
        spec = SamplingSpec(1.0, 1.0, args.max_tokens, seed=seed, stop_token_ids=tuple(sorted(checks.stop_ids)))
        groups = engine.generate([checks.encode_prompt(p.prompt) for p in problems], spec, n=args.group)
        header = RolloutHeader(1, "0x" + "ab" * 20, 0, ENV, seed, dict(sampling), args.model)
        f = build_rollout_file(header, problems, groups, env=env, decode=checks.decode)
        out.append(RolloutFile.from_bytes(f.to_bytes()))
    return out


def forged(f: RolloutFile, checks, max_tokens: int) -> RolloutFile:
    """Hand-written completions of varied length with the right answer, honest proofs kept."""
    env = get_env(ENV)
    samples = []
    for s in f.samples:
        problem = env.problem(f.header.task_seed, s.group)
        text = " ".join(["so"] * (2 + 3 * s.sample)) + f" the answer is {problem.answer}"
        ids = [t for t in checks.encode_prompt(text) if t not in checks.stop_ids][-(max_tokens - 1) :]
        ids.append(min(checks.stop_ids))
        lp = (list(s.logprobs) + [-1.0] * max_tokens)[: len(ids)]
        proofs = (list(s.proofs) * max_tokens)[: chunks_for(len(ids))]  # as many as the length needs
        reward = env.reward(problem, checks.decode(ids), len(ids))
        samples.append(
            dataclasses.replace(
                s, completion_tokens=ids, logprobs=lp, proofs=proofs, finish_reason="stop", reward=reward
            )
        )
    return RolloutFile(f.header, samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--files", type=int, default=4, help="honest rollout files per step")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    args = ap.parse_args()

    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens}
    tools = model_tools(args.model)
    checks = pool_checks(TaskSpec(args.model, ENV, sampling), tools, Calibrated.load(args.model))
    engine = VllmEngine(tools.path, dtype="float32", seed=0, max_model_len=1024)
    try:
        t0 = time.perf_counter()
        batches = [honest_files(engine, checks, args, sampling, 1000 * (v + 1)) for v in range(args.steps)]
        print(f"generated {args.steps} x {args.files} rollout files in {time.perf_counter() - t0:.1f} s")
    finally:
        engine.close()

    # every file is of version 0 (the weights that generated it): from step 1 on both trainers compute
    # old log-probs (and the checked one verifies) with their kept copy of version 0, as for late rollouts
    keep = args.steps + 1
    checked = Trainer(tools.path, lr=1e-5, async_level=keep, checks=checks, micro_batch_size=args.micro_batch)
    plain = Trainer(tools.path, lr=1e-5, async_level=keep, micro_batch_size=args.micro_batch)
    rows = []
    for v, files in enumerate(batches):
        if v % 2 == 0:
            a = checked.step(files, v)
            b = plain.step(files, v)
        else:
            b = plain.step(files, v)
            a = checked.step(files, v)
        rows.append({"samples_trained": a.samples_trained, "verified": a.verified, "refused": len(a.rejected),
                     "checked_s": a.seconds, "plain_s": b.seconds, "verify_s": a.verify_seconds})  # fmt: skip
        print(
            f"step {v}: {a.samples_trained} samples trained ({a.verified} verified, {len(a.rejected)} honest "
            f"file(s) refused), checked {a.seconds:.2f} s, unchecked {b.seconds:.2f} s, inside the checks "
            f"{a.verify_seconds:.3f} s"
        )
    # and one step (untimed) with a forgery next to the honest files: refused, the honest ones trained
    probe = checked.step([*batches[0], forged(batches[0][0], checks, args.max_tokens)], len(batches))
    refused = [r["verdict"]["reason"] for _, r in probe.rejected]
    print(f"with a forged file: {probe.samples_trained} samples trained, refused {refused}")
    trained = sum(r["samples_trained"] for r in rows)
    checked_s = sum(r["checked_s"] for r in rows)
    result = {
        "model": args.model,
        "steps": args.steps,
        "samples_trained": trained,
        "verified_share": round(sum(r["verified"] for r in rows) / trained, 4) if trained else None,
        "honest_refused": sum(r["refused"] for r in rows),
        "forgery_refused": probe.rejected != [] and probe.rejected[0][0] == len(batches[0]),
        "verify_frac": round(sum(r["verify_s"] for r in rows) / checked_s, 4),
        "slowdown": round(checked_s / sum(r["plain_s"] for r in rows), 4),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
