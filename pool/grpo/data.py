"""From rollout files to training batches: stale files refused, group advantages, zero-advantage samples
kept for the checks but not trained on, right-padded tensors, micro-batches, and token log-probs from logits. A mixin of `Trainer`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from node.rollout.file import RolloutFile, RolloutSample

if TYPE_CHECKING:
    pass

from .loss import group_advantages

T = TypeVar("T")


@dataclass
class _Item:
    sample: RolloutSample
    advantage: float
    temperature: float
    version: int = 0  # policy version that generated the sample
    file: int = -1  # index of its rollout file in the step's input
    train: bool = True  # False: checked with its file, never trained on (zero advantage, non-finite reward)


class DataMixin:
    """Batching and log-probs of a `Trainer` (state set up by `Trainer.__init__`)."""

    async_level: int
    micro_batch_size: int
    pad_id: int
    device: torch.device

    def _select(self, files: Sequence[RolloutFile], current_version: int) -> tuple[list[_Item], dict[str, Any]]:
        """Refuse stale/future files and compute group advantages. Every sample of every other file is an
        item, so that the trainer's checks see all of it: one whose advantage is zero (its group's rewards
        are all equal) or whose reward is not finite is checked and not trained on (`_Item.train`).
        Dropping them before the checks let a fabricated file whose groups all score the same pass
        unchecked."""
        info: dict[str, Any] = {"files": 0, "stale_rejected": 0, "stale_samples": 0, "rewards": []}
        samples: list[RolloutSample] = []
        temps: list[float] = []
        versions: list[int] = []
        file_of: list[int] = []
        group_ids: list[int] = []
        keys: dict[tuple[int, int], int] = {}
        for fi, f in enumerate(files):
            v = f.header.policy_version
            if v < current_version - self.async_level or v > current_version:
                info["stale_rejected"] += 1
                info["stale_samples"] += len(f.samples)
                continue
            info["files"] += 1
            temp = float(f.header.sampling.get("temperature", 1.0)) or 1.0  # greedy rollouts: plain logits
            for s in f.samples:
                samples.append(s)
                temps.append(temp)
                versions.append(v)
                file_of.append(fi)
                # a non-finite reward is in no group: never a NaN advantage (the checks refuse its file)
                group_ids.append(keys.setdefault((fi, s.group), len(keys)) if math.isfinite(s.reward) else -1)
        finite = [i for i, g in enumerate(group_ids) if g >= 0]
        rewards = torch.tensor([samples[i].reward for i in finite], dtype=torch.float64)
        info["rewards"] = rewards.tolist()
        if not samples:
            return [], info
        adv = [0.0] * len(samples)
        if finite:
            groups = torch.tensor([group_ids[i] for i in finite])
            for i, a in zip(finite, group_advantages(rewards, groups).tolist(), strict=True):
                adv[i] = float(a)
        items = [
            _Item(s, a, t, v, fi, train=a != 0.0)
            for s, a, t, v, fi in zip(samples, adv, temps, versions, file_of, strict=True)
        ]
        info["zero_adv_dropped"] = sum(1 for it in items if not it.train)
        return items, info

    def _batch(self, items: Sequence[_Item]) -> dict[str, Tensor]:
        """Right-padded batch. Row b holds prompt + completion[:-1]; the completion token j is predicted at
        position P-1+j, so `targets`/`mask` mark those positions (the last completion token is never fed)."""
        seqs = [list(it.sample.prompt_tokens) + list(it.sample.completion_tokens[:-1]) for it in items]
        width = max(len(s) for s in seqs)
        b = len(seqs)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        targets = torch.zeros((b, width), dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.float32)
        temps = torch.ones((b, 1, 1), dtype=torch.float32)
        for i, (it, s) in enumerate(zip(items, seqs, strict=True)):
            p, c = len(it.sample.prompt_tokens), it.sample.completion_tokens
            ids[i, : len(s)] = torch.as_tensor(s)
            attn[i, : len(s)] = 1
            targets[i, p - 1 : p - 1 + len(c)] = torch.as_tensor(c)
            mask[i, p - 1 : p - 1 + len(c)] = 1.0
            temps[i] = it.temperature
        adv = torch.tensor([it.advantage for it in items], dtype=torch.float32)
        out = {"ids": ids, "attn": attn, "targets": targets, "mask": mask, "temps": temps, "adv": adv}
        return {k: v.to(self.device) for k, v in out.items()}

    def _token_logprobs(
        self, model: Any, batch: dict[str, Tensor], entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """log pi(target | prefix) at every position [B, T] (logits divided by the sampling temperature)."""
        logits = model(input_ids=batch["ids"], attention_mask=batch["attn"]).logits.float()
        return self._from_logits(logits, batch, entropy)

    @staticmethod
    def _from_logits(logits: Tensor, batch: dict[str, Tensor], entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        logp = torch.log_softmax(logits / batch["temps"], dim=-1)
        tok = logp.gather(-1, batch["targets"].unsqueeze(-1)).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1) if entropy else None
        return tok, ent

    def _micro(self, items: list[T]) -> list[list[T]]:
        """`items` (samples, or their indices) cut into micro-batches."""
        return [items[i : i + self.micro_batch_size] for i in range(0, len(items), self.micro_batch_size)]

    def _forward(self, model: Any, batch: dict[str, Tensor], capture: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """`_token_logprobs` that also returns the raw logits [B, T, V] and, with `capture`, the final-norm
        hidden states [B, T, H] of the same forward pass (a hook on the decoder's last norm: the states
        TOPLOC commits to, whatever wraps the model)."""
        got: list[Tensor] = []
        handle = _final_norm(model).register_forward_hook(lambda _m, _i, out: got.append(out)) if capture else None
        try:
            logits = model(input_ids=batch["ids"], attention_mask=batch["attn"]).logits.float()
        finally:
            if handle is not None:
                handle.remove()
        return self._from_logits(logits, batch)[0], logits, (got[-1] if got else None)

    @staticmethod
    def _completion_rows(t: Tensor, row: int, it: _Item) -> Tensor:
        """Row `row` of a [B, T, ...] tensor at the positions that produced `it`'s completion tokens."""
        p = len(it.sample.prompt_tokens)
        return t[row, p - 1 : p - 1 + len(it.sample.completion_tokens)]

    def _place(self, mb: list[_Item], rows: list[Tensor], width: int) -> Tensor:
        """Per-sample completion rows laid out as a [B, width] batch like `_batch(mb)`'s targets (zeros
        elsewhere, and for padding samples without rows)."""
        out = torch.zeros((len(mb), width), dtype=torch.float32, device=self.device)
        for b, (it, r) in enumerate(zip(mb, rows, strict=False)):
            p = len(it.sample.prompt_tokens)
            out[b, p - 1 : p - 1 + r.shape[0]] = r
        return out

    def _padded(self, micro: list[list[_Item]], n: int) -> list[list[_Item]]:
        """`micro` extended to n micro-batches (FSDP ranks must run the same number of forward passes);
        the extra ones repeat a real sample or a dummy one and are trained with mask 0."""
        if len(micro) >= n:
            return micro
        filler = micro[0][:1] if micro else [_Item(_dummy_sample(self.pad_id), 0.0, 1.0)]
        return micro + [filler] * (n - len(micro))

    def _batch_mask_sum(self, mb: list[_Item]) -> int:
        return sum(len(it.sample.completion_tokens) for it in mb)


def _final_norm(model: Any) -> Any:
    """The norm after the last decoder layer (Llama, Qwen, SmolLM, Mistral: `model.model.norm`)."""
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    if norm is None:
        raise ValueError(f"{type(model).__name__} has no final norm at model.norm: cannot capture TOPLOC states")
    return norm


def _dummy_sample(pad_id: int) -> RolloutSample:
    return RolloutSample(0, 0, "", [pad_id], [pad_id], [0.0], 0.0, "length", [])
