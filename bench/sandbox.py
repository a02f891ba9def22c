"""The code sandbox's cost on this machine, measured in one run.

Runs the same HumanEval programs (candidate runs of the canonical solutions answering their tests' calls,
as the code environment builds them; the reference runs that record those calls go first, untimed) three
ways: in the sandbox (`node.sandbox.Sandbox`: bubblewrap, seccomp, rlimits) `--parallel` at a
time, in the sandbox one at a time, and as bare `python -c` subprocesses one at a time (no isolation: for
the overhead figure only). Prints sandboxed runs per second (parallel and serial), the bare subprocess's,
and the sandbox's overhead per run in ms; ends with one JSON line.

    .venv/bin/python bench/sandbox.py [--runs 164] [--parallel 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from node.sandbox import Limits, Sandbox
from node.tasks.code import CodeEnv, _load, solution_source
from node.tasks.code_cases import candidate_program


def main(args: argparse.Namespace) -> dict[str, float]:
    rows = _load()[0]
    limits = Limits()
    parallel = Sandbox(limits, parallel=args.parallel)
    parallel.probe()
    refs = CodeEnv(parallel).references(sorted({i % len(rows) for i in range(args.runs)}))
    programs = []
    for i in range(args.runs):
        row = rows[i % len(rows)]
        solution = solution_source(row["prompt"], row["canonical_solution"], row["entry_point"])
        programs.append(candidate_program(solution, row["entry_point"], refs[i % len(rows)], "bench"))
    serial = Sandbox(limits, parallel=1)

    t0 = time.perf_counter()
    results = parallel.run_many(programs)
    parallel_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    serial.run_many(programs[: args.serial])
    serial_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p in programs[: args.serial]:
        subprocess.run([sys.executable, "-I", "-S", "-c", p], capture_output=True, check=False, env={})
    bare_s = time.perf_counter() - t0
    return {
        "runs": len(programs),
        "parallel": args.parallel,
        "cpus": os.cpu_count() or 0,
        "all_ok": all(r.ok for r in results),
        "sandboxed_runs_per_s": len(programs) / parallel_s,
        "sandboxed_runs_per_s_serial": args.serial / serial_s,
        "bare_runs_per_s_serial": args.serial / bare_s,
        "overhead_ms_per_run": 1e3 * (serial_s - bare_s) / args.serial,
        "overhead_ratio": serial_s / bare_s,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=164)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--serial", type=int, default=40, help="runs timed one at a time, sandboxed and bare")
    figures = main(ap.parse_args())
    for k, v in figures.items():
        print(f"{k:30s} {v}", file=sys.stderr)
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()}))
