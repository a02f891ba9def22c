"""Weight sets a cheater might run instead of the pool's model, for calibration's tampered cases (and
the devnet's `--cheat model` worker): noise on every weight, fp8-rounded matrices, other random weights;
and the safetensors reading and writing they need."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def _load_state(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def _write_variant(model_dir: Path, out: Path, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    return out


def noisy_weights(state: dict[str, torch.Tensor], rel: float, seed: int) -> dict[str, torch.Tensor]:
    """Each weight times (1 + rel * N(0, 1)): a model that is almost, but not exactly, the pool's."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        noise = torch.randn(v.shape, generator=g, dtype=torch.float32)
        out[k] = (v.float() * (1 + rel * noise)).to(v.dtype)
    return out


def fp8_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each matrix rounded to float8 e4m3 with a per-tensor scale (a cheaper model a cheater might run)."""
    out = {}
    for k, v in state.items():
        if v.ndim < 2:
            out[k] = v
            continue
        scale = v.float().abs().amax().clamp_min(1e-12) / 448.0
        out[k] = ((v.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(v.dtype)
    return out


def random_weights(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """Same architecture, other weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_config(config)
    ref = _load_state(model_dir)
    own = model.state_dict()
    return {k: own[k].to(ref[k].dtype) for k in ref if k in own}
