"""The trainer's weights on disk and in memory: HF checkpoint folders (written atomically), AdamW's state
beside the newest one, and the weights of the recent policy versions a sample may still come from
(its behaviour policy). A mixin of `Trainer`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from node.fsio import atomic_dir, atomic_file

if TYPE_CHECKING:
    pass


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
OPTIMIZER_FILE = "optimizer.pt"  # AdamW state next to the newest checkpoint (see Trainer.save_optimizer)


class CheckpointMixin:
    """Checkpoints and behaviour-policy weights of a `Trainer` (state set up by `Trainer.__init__`)."""

    model: Any
    model_dir: Path
    config: Any
    optimizer: Any
    lr: float
    steps: int
    rank: int
    distributed: bool
    device: torch.device
    async_level: int
    _history: dict[int, dict[str, Tensor]]
    _history_device: torch.device
    _behaviour: Any
    _behaviour_version: int | None
    _load: Any
    _shard: Any

    def _snapshot(self, current_version: int) -> None:
        """Keep the current weights as `current_version` (if not kept yet) and forget versions that no
        accepted sample can come from any more (older than current - async_level)."""
        for v in [v for v in self._history if v < current_version - self.async_level or v > current_version]:
            del self._history[v]
        if current_version not in self._history and self.async_level > 0:
            self._history[current_version] = {
                k: t.detach().to(self._history_device, copy=True) for k, t in self.model.state_dict().items()
            }

    def remember(self, version: int, model_dir: str | Path) -> None:
        """Load the weights of an earlier `version` from a checkpoint folder written by `save` (after a
        restart, so samples of that version get their true old log-probs). Single process only."""
        from safetensors.torch import load_file

        if self.distributed:
            raise RuntimeError("remember() is for the single-process trainer")
        state = load_file(str(Path(model_dir) / "model.safetensors"))
        own = self.model.state_dict()
        if getattr(self.config, "tie_word_embeddings", False) and "lm_head.weight" in own:
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        missing = set(own) - set(state)
        if missing:
            raise ValueError(f"{model_dir}: checkpoint lacks {sorted(missing)[:3]}")
        self._history[version] = {k: state[k].to(self._history_device, own[k].dtype) for k in own}

    def _behaviour_model(self, version: int) -> Any:
        """A second model instance holding the weights of `version` (created on first use)."""
        if self._behaviour is None:
            self._behaviour = self._load()
            if self.distributed:
                self._shard(self._behaviour)
            self._behaviour.eval().requires_grad_(False)
        if self._behaviour_version != version:
            self._behaviour.load_state_dict(self._history[version])
            self._behaviour_version = version
        return self._behaviour

    def state_dict_for_inference(self) -> dict[str, Tensor]:
        """The full weights in HF naming as contiguous float32 CPU tensors, tied duplicates removed.

        Under FSDP this is a collective (every rank must call it); the full state dict is gathered to CPU
        and only rank 0 gets a non-empty dict.
        """
        if self.distributed:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.rank != 0:
                return {}
        else:
            sd = self.model.state_dict()
        out = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in sd.items()}
        if getattr(self.config, "tie_word_embeddings", False):
            out.pop("lm_head.weight", None)
        return out

    def save(self, path: Path) -> Path:
        """Write an HF checkpoint folder at `path` (replaced atomically): the model folder's config,
        tokenizer and generation files plus `model.safetensors` with the current weights. Collective under
        FSDP (rank 0 writes, the others wait at a barrier)."""
        from safetensors.torch import save_file

        path = Path(path)
        state = self.state_dict_for_inference()
        if self.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_dir(path) as tmp:
                for src in self.model_dir.iterdir():
                    skip = src.name in WEIGHT_FILES or src.name == OPTIMIZER_FILE or src.name.endswith(".safetensors")
                    if src.is_file() and not skip:
                        shutil.copy2(src, tmp / src.name)
                save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
                (tmp / "trainer.json").write_text(json.dumps({"steps": self.steps, "source": str(self.model_dir)}))
        if self.distributed:
            torch.distributed.barrier()
        return path

    def save_optimizer(self, folder: Path) -> Path:
        """Write AdamW's state (moments and step counts) into checkpoint `folder` (single process), so a
        trainer restarted from that checkpoint goes on with the same update scale instead of Adam's
        first-step jolt (a fresh Adam moves every weight by about lr at its first step)."""
        if self.distributed:
            raise RuntimeError("save_optimizer() is for the single-process trainer")
        out = Path(folder) / OPTIMIZER_FILE
        with atomic_file(out) as fh:
            torch.save(self.optimizer.state_dict(), fh)
        return out

    def load_optimizer(self, folder: Path) -> bool:
        """Restore AdamW's state saved in checkpoint `folder`; False if there is none. The learning rate
        stays this trainer's own (a restart may change it)."""
        f = Path(folder) / OPTIMIZER_FILE
        if self.distributed or not f.is_file():
            return False
        self.optimizer.load_state_dict(torch.load(f, map_location=self.device, weights_only=True))
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        return True
