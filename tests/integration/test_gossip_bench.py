"""Smoke test of bench/gossip.py: 4 node processes on 127.0.0.1, 100 messages, nothing lost.

Runs the bench as a user would (a subprocess, one JSON line on stdout) with a hard time limit; it checks
the output's shape and zero loss, not the latency targets (those depend on the machine's cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "nodes",
    "messages_published",
    "expected_deliveries",
    "deliveries",
    "lost",
    "duplicates",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "delivered_per_s",
    "rejected",
    "dropped",
}


@pytest.mark.slow
def test_gossip_bench_four_nodes_loses_nothing() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "bench/gossip.py",
            "--nodes",
            "4",
            "--messages",
            "100",
            "--seconds-limit",
            "45",
            "--runs",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line, got stdout={proc.stdout!r} stderr={proc.stderr[-2000:]}"
    out = json.loads(lines[0])
    assert out.keys() >= KEYS, KEYS - out.keys()
    assert "error" not in out, out["error"]
    assert out["nodes"] == 4
    assert out["messages_published"] == 100
    assert out["expected_deliveries"] == 300
    assert out["lost"] == 0, out
    assert out["deliveries"] == 300
    assert out["duplicates"] == 0
    assert out["latency_p50_ms"] <= out["latency_p99_ms"] <= out["latency_max_ms"]
    assert proc.returncode == 0, proc.stderr[-2000:]
