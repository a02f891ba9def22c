"""`intellect-node eval`: real vLLM scoring of checkpoints on held-out problems with paired seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pool.evaluate import Evaluation, eval_seed

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "eval", *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(ROOT),
    )  # fmt: skip


def test_paired_gain_is_the_mean_per_problem_difference() -> None:
    ev = Evaluation("thinking-budget", 4, 2, 48, 0, {"a": [0.0, 0.5, -0.5, 0.0], "b": [0.25, 0.5, 0.0, 0.25]})
    gain, se = ev.gain("a", "b")
    assert gain == pytest.approx(0.25)
    # differences 0.25, 0, 0.5, 0.25: stdev 0.2041, over sqrt(4)
    assert se == pytest.approx(0.2041241 / 2)
    assert ev.gain("a", "a") == (0.0, 0.0)
    assert eval_seed(0) != eval_seed(1) and 0 <= eval_seed(0) < 2**62


def _stops_at_once(base: Path, out: Path) -> Path:
    """A checkpoint of the tiny model that always ends its answer at once: every layer adds nothing to
    the residual stream, every token embeds to the same vector, and only EOS has a non-zero output row,
    so EOS wins every sampling step by a wide margin."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out)
    sd = load_file(str(base / "model.safetensors"))
    for k, v in sd.items():
        if k.endswith(("o_proj.weight", "down_proj.weight", "lm_head.weight")):
            sd[k] = torch.zeros_like(v)
        elif k.endswith("norm.weight") or k.endswith("embed_tokens.weight"):
            sd[k] = torch.ones_like(v)
    sd["lm_head.weight"][2] = 1.0  # EOS (id 2): logit 256 against 0 for every other token
    save_file(sd, str(out / "model.safetensors"))
    return out


@pytest.mark.slow
def test_eval_pairs_versions_on_the_same_problems_and_seeds(tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    stops = _stops_at_once(tiny_model, tmp_path / "stops")
    p = _cli(
        "--model", str(tiny_model), "--checkpoint", f"same={tiny_model}", "--checkpoint", f"other={stops}",
        "--problems", "6", "--samples", "3", "--max-tokens", "24", "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    per = data["per_problem"]
    assert sorted(per) == ["base", "other", "same"] and all(len(v) == 6 for v in per.values())
    # the same weights with the same seeds sample the same completions: identical scores, zero gain
    assert per["same"] == per["base"]
    assert data["gain_over_base"]["same"] == {"gain": 0.0, "se": 0.0}
    # other weights are really loaded and scored: answers of (almost) no tokens against the base
    # model's 24-token ramble, each scored by the length penalty against its problem's target
    assert per["other"] != per["base"]
    assert all(r <= -0.5 * (1 - 1 / 8) for r in per["other"])  # at most 1 token against targets >= 8
    assert all(-0.5 <= r <= 1.0 for v in per.values() for r in v)


def test_eval_rejects_bad_checkpoints(tmp_path: Path) -> None:
    p = _cli("--checkpoint", "no-equals-sign")
    assert p.returncode == 2 and "LABEL=FOLDER" in p.stderr
    p = _cli("--checkpoint", f"x={tmp_path}")
    assert p.returncode == 1 and "no model.safetensors" in p.stderr
