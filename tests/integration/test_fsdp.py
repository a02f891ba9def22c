"""The trainer's FSDP2 path for real: two ranks under torchrun (gloo on CPU) train the same steps as one
process and end with the same weights and figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.grpo_data import micro_llama

HERE = Path(__file__).resolve().parent


def _run(argv: list[str], out: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads((out / "stats.json").read_text())


@pytest.mark.slow
def test_two_fsdp_ranks_train_like_one_process(tmp_path: Path) -> None:
    """Three steps (micro-batches of 2, gradient clipping, AdamW, samples one version
    old whose old log-probs come from the kept weights of version 0, then the same file too stale to
    use): the 2-rank FSDP2 run splits the samples between the ranks, shards every layer, all-reduces
    the token counts and figures, and gathers the full weights to rank 0 to save. The saved weights
    and the per-step loss, grad norm and ratio match the single-process run to float32 rounding.
    (One optimizer step per call: with several mini-batches each rank's mini-batch holds other samples
    than the single process's, so those runs differ by design.)"""
    from safetensors.torch import load_file

    model = micro_llama(tmp_path / "model", layers=2)
    script = str(HERE / "fsdp_steps.py")
    single = _run([sys.executable, script, str(model), str(tmp_path / "one")], tmp_path / "one")
    sharded = _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         script, str(model), str(tmp_path / "two")],
        tmp_path / "two",
    )  # fmt: skip
    assert (single["world"], sharded["world"]) == (1, 2)
    for a, b in zip(single["steps"], sharded["steps"], strict=True):  # type: ignore[call-overload]
        for key in ("samples_trained", "stale_rejected", "optimizer_steps", "behaviour_fallback", "tokens"):
            assert a[key] == b[key], (key, a, b)
        for key in ("loss", "grad_norm", "ratio_mean", "clip_frac", "mean_reward"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (key, a, b)
    steps = single["steps"]
    assert [s["stale_rejected"] for s in steps] == [0, 0, 1]  # type: ignore[index]
    assert steps[1]["ratio_mean"] != 1.0  # type: ignore[index]
    w1 = load_file(str(tmp_path / "one" / "ckpt" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "ckpt" / "model.safetensors"))
    base = load_file(str(model / "model.safetensors"))
    assert set(w1) == set(w2)
    assert any(not torch.equal(w1[k], base[k]) for k in w1)  # it trained
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < 1e-5, worst
