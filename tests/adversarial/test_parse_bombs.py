"""Parse bombs within the size bounds: rollout files of about 15 MiB that are refused only after their rows
were decoded. Found on main: such a file raised the coordinator's peak memory by 1.9 GB in 5 s before it
was refused (every row became Python objects before any row was checked), and four such parses ran at once.

Each attack runs in a fresh process that parses the file the way a daemon does (the coordinator with its
task's limits, the validator with its pool's), and reports how far its peak memory rose."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from node.rollout.budget import MemoryBudget, ParseBusy
from node.rollout.file import SCHEMA, _write

ROOT = Path(__file__).resolve().parents[2]
#: What a parse of a hostile file may add to a daemon's peak memory (its file, a batch of rows, slack).
BOUND_MB = 300

PROBE = """
import json, resource, sys, threading
from node import protocol
from node.rollout.file import RolloutFile
from node.rollout.budget import FileLimits
from node.tasks.math import MathEnv

data = open(sys.argv[1], "rb").read()
mode = sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
outcomes = []

def parse():
    try:
        if mode == "coordinator":  # the limits of the task it issued: 1 prompt x 8 samples, max_tokens 64
            task = protocol.Task(task_id="t", pool_id=1, node="0x" + "ab" * 20, env="math", seed=5, prompts=1,
                                 group_size=8, sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 64},
                                 policy_version=0, model="tiny", issued_at=0.0, expires_at=1e12)
            if hasattr(protocol, "file_limits"):
                limits = protocol.file_limits(task, MathEnv(), lambda s: list(range(len(s.split()))))
                RolloutFile.from_bytes(data, limits=limits)
            else:  # how the coordinator parsed before it knew its tasks' limits
                RolloutFile.from_bytes(data)
        elif mode == "validator":  # the pool's spec: completions of at most 64 tokens
            RolloutFile.from_bytes(data, limits=FileLimits(4096, 32768, 64))
        else:  # no limits at all: the batch checks and the shared budget alone
            RolloutFile.from_bytes(data)
        outcomes.append("accepted")
    except Exception as exc:
        outcomes.append(type(exc).__name__ + ": " + str(exc)[:200])

threads = [threading.Thread(target=parse) for _ in range(4)]  # four parses at once, as the intake allows
for t in threads:
    t.start()
for t in threads:
    t.join()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rise_mb": (peak - base) / 1024, "outcomes": outcomes}))
"""


def _bomb(rows: int, tokens: int, proofs: bool, every: int = 5) -> bytes:
    """`rows` completions of `tokens` ids each (compressible: zstd squeezes them ~15x), logprobs, and whole
    proofs (zeros) or none; a file of some 15 MiB that decodes to up to 250 MB."""
    rng = np.random.default_rng(0)
    period = rng.integers(0, 50_000, size=tokens, dtype=np.int32)
    comp = pa.array([period] * rows, type=pa.list_(pa.int32()))

    def noisy() -> np.ndarray:  # every `every`-th logprob drawn: what makes the file big enough to decode
        lp = np.full(tokens, -1.5, dtype=np.float32)
        lp[::every] = -rng.random(len(lp[::every]), dtype=np.float32)
        return lp

    logp = pa.array([noisy() for _ in range(rows)], type=pa.list_(pa.float32()))
    proof = bytes(-(-tokens // 32) * 258) if proofs else b""
    cols = {
        "group": pa.array([0] * rows, pa.int32()),
        "sample": pa.array(list(range(rows)), pa.int32()),
        "task_id": pa.array(["t"] * rows),
        "prompt_tokens": pa.array([[1, 2, 3]] * rows, type=pa.list_(pa.int32())),
        "completion_tokens": comp,
        "logprobs": logp,
        "reward": pa.array([0.0] * rows, pa.float64()),
        "finish_reason": pa.array(["length"] * rows),
        "proofs": pa.array([proof] * rows, pa.binary()),
    }
    meta = {"format": "intellect-rollout/1", "header": {"pool_id": 1, "node": "0x" + "ab" * 20,
            "policy_version": 0, "env": "math", "task_seed": 5, "sampling": {}, "model": "tiny", "extra": {}}}  # fmt: skip
    return _write(pa.Table.from_pydict(cols, schema=SCHEMA.with_metadata({"intellect": json.dumps(meta)})))


def _parse_in_a_daemon_process(path: Path, mode: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), mode],
        capture_output=True, text=True, cwd=str(ROOT), timeout=600, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("rows", "tokens", "proofs", "mode"),
    [
        (2000, 15_000, False, "none"),  # rows refused by the last check only: no proofs
        (2000, 15_000, False, "validator"),
        (1000, 15_000, True, "coordinator"),  # well-formed rows, beyond the task's shape
        (1000, 15_000, True, "validator"),
    ],
)
def test_a_parse_bomb_costs_a_bounded_share_of_memory(
    tmp_path: Path, rows: int, tokens: int, proofs: bool, mode: str
) -> None:
    data = _bomb(rows, tokens, proofs, every=5 if not proofs else 2)
    assert 8 << 20 < len(data) <= 64 << 20, len(data)  # within the size bound of a rollout upload
    path = tmp_path / "bomb.parquet"
    path.write_bytes(data)
    del data
    seen = _parse_in_a_daemon_process(path, mode)
    assert all(o != "accepted" for o in seen["outcomes"]), seen
    assert seen["rise_mb"] < BOUND_MB, f"four parses of a {path.stat().st_size >> 20} MiB file: {seen}"


def test_parses_share_one_memory_budget() -> None:
    budget = MemoryBudget(total=1000, wait=0.5)
    inside, most, lock = [0], [0], threading.Lock()
    outcomes: list[str] = []

    def parse(n: int) -> None:
        try:
            with budget.reserve(n, "file"):
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.2)
                with lock:
                    inside[0] -= 1
            outcomes.append("done")
        except ParseBusy as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=parse, args=(400,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 2 and outcomes.count("done") == 4 and budget.peak <= 1000 and budget.used == 0
    # a parse that cannot get its share in time is told so (not a verdict on its file)
    with budget.reserve(900, "file"):
        t = threading.Thread(target=parse, args=(400,))
        t.start()
        t.join()
    assert "parse budget" in outcomes[-1]
    assert not budget.fits(1001) and budget.fits(1000)
