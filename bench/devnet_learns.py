"""Does a devnet learn? `intellect-node devnet --model tiny --honest --steps 24 --seed 0 --train --eval 64`,
then the final policy against the base model on held-out thinking-budget problems.

Everything is the real thing: anvil and the contracts, the coordinator training GRPO in its process and
broadcasting each version, two workers generating with vLLM and hot-reloading every version they are
told of, the validator checking each rollout against the checkpoint of its claimed version, and the
evaluation generating with vLLM from the coordinator's saved checkpoint. About 4-5 minutes on 2 cores
(a soak run: it was a test until issue 36 moved it here to keep `make test` within its 40 minutes; the
suite keeps `test_grpo_learns.py`, the same trainer and engine learning in one process, and
`test_devnet.py`, the devnet's training bookkeeping over three steps).

Why the gain is not luck. The training curve alone is a weak witness: each step draws new problems, and
their random length targets move a step's mean by about 0.04. The evaluation removes that noise by
pairing: the base model and the final policy answer the same 64 problems (a seed space no task uses)
with the same sampling seeds, and the gain is the mean of the per-problem differences, its standard
error their spread over sqrt(64). A gain of 4 standard errors has a one-sided probability below 1e-4
under the hypothesis that the final policy is no better (t, 63 degrees of freedom); the 0.03 floor
keeps a tiny but consistent difference from counting as learning. Measured on 2 cores: seeds 0-3
gained 0.16-0.20 at 14-22 standard errors, the curve taking off after 8-10 steps.

Also checked: each worker's rollouts carry non-decreasing policy versions that reach past half the run,
no step trained on a rollout more than async_level (2) versions older than the policy it updated, and
the first worker's relay served the checkpoints (the coordinator lists it as a source).

    .venv/bin/python bench/devnet_learns.py [--steps 24] [--seed 0] [--eval 64] [--dir DIR]

Prints the curve and the held-out figures to stderr, then ONE JSON line (`gain`, `se`, `t`, `base`,
`final`, `steps`, `seconds`, `learned`, `problems`); exit status 1 if it did not learn or a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 0.03  # held-out reward gain required (the reward lies in [-0.5, 1]; the base model scores -0.49)
T_MIN = 4.0  # and the gain in standard errors of the paired per-problem differences


def checks(report: dict[str, Any], steps: int, problems: int) -> list[str]:
    """What a run that learned shows, as a list of what it did not."""
    out: list[str] = []
    t = report["training"]
    curve = t["reward_curve"]
    if not (report["ok"] and t["policy_version"] == len(curve) >= steps - 4):  # all steps unless some went stale
        out.append(f"run not ok or too few policy steps: {t['policy_version']} of {steps}")
    ev = t["eval"]
    if ev["version"] != len(curve) or ev["problems"] != problems:
        out.append(f"evaluated v{ev['version']} on {ev['problems']} problems")
    gain, se = ev["gain_over_base"]["final"]["gain"], ev["gain_over_base"]["final"]["se"]
    if not (gain >= MARGIN and gain >= T_MIN * se):
        out.append(f"gain {gain:.3f} ({se:.3f} SE) under {MARGIN} or {T_MIN} SE")
    for node, versions in t["rollout_versions"].items():
        if versions != sorted(versions) or versions[-1] < len(curve) // 2:
            out.append(f"{node}'s rollout versions {versions}")
    if not all(v >= base_v - 2 for base_v, versions in enumerate(t["trained_versions"]) for v in versions):
        out.append(f"a step trained on a rollout too stale: {t['trained_versions']}")
    if len(t["relays"]) != 1 or t["relays_refused"]:
        out.append(f"relays {t['relays']}, refused {t['relays_refused']}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=24, help="rollout files per worker (2 per policy step)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval", dest="problems", type=int, default=64, help="held-out problems")
    ap.add_argument("--dir", help="the devnet's folder (default: a temporary one, removed after)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="devnet-learns-") as tmp:
        folder = Path(args.dir) if args.dir else Path(tmp)
        report_path = folder / "r.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
        started = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-m", "cli.main", "devnet", "--model", "tiny", "--honest", "--steps", str(args.steps),
             "--seed", str(args.seed), "--train", "--eval", str(args.problems), "--report", str(report_path),
             "--dir", str(folder / "dn"), "--timeout", "1200"],
            capture_output=True, text=True, env=env, cwd=str(ROOT), check=False,
        )  # fmt: skip
        seconds = time.monotonic() - started
        if p.returncode != 0:
            print(p.stdout[-3000:] + p.stderr[-3000:], file=sys.stderr)
            print(json.dumps({"learned": False, "problems": ["the devnet failed"], "seconds": round(seconds, 1)}))
            return 1
        report = json.loads(report_path.read_text())
    t = report["training"]
    curve, ev = t["reward_curve"], t["eval"]
    gain, se = ev["gain_over_base"]["final"]["gain"], ev["gain_over_base"]["final"]["se"]
    base, final = ev["mean_reward"]["base"], ev["mean_reward"]["final"]
    print(f"curve {[round(r, 3) for r in curve]}", file=sys.stderr)
    print(
        f"held-out: base {base:.3f}, v{ev['version']} {final:.3f}, gain {gain:.3f} = {gain / se:.1f} SE ({seconds:.0f} s;"
        f" curve first/last 4 steps {statistics.fmean(curve[:4]):.3f} / {statistics.fmean(curve[-4:]):.3f})",
        file=sys.stderr,
    )
    problems = checks(report, args.steps, args.problems)
    figures = {
        "gain": round(gain, 4), "se": round(se, 4), "t": round(gain / se, 1) if se else None,
        "base": round(base, 4), "final": round(final, 4), "steps": len(curve), "seconds": round(seconds, 1),
        "learned": not problems, "problems": problems,
    }  # fmt: skip
    print(json.dumps(figures))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
