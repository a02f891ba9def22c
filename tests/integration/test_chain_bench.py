"""Smoke test of bench/chain.py on two short histories: the worker's steady-state chain calls do not
grow with the chain's history, and the old full claim scan's do (call counts, not timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_chain_bench_steady_calls_do_not_grow_with_history():
    out = subprocess.run(
        [sys.executable, "bench/chain.py", "--histories", "500,20000"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    short, long = figures["calls_per_min"]
    assert short > 0 and long == short, figures
    assert figures["claim_scan_calls_per_min"][0] == figures["claim_scan_calls_per_min"][1]
    old_short, old_long = figures["old_claim_scan_calls_per_min"]
    assert old_long > 3 * old_short  # what the incremental scan replaced: one page per 2,000 blocks, every 5 s
