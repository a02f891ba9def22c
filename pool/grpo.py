"""GRPO for the pool's trainer: group advantages, the INTELLECT-2 clipped loss, and a `Trainer`.

The pool's trainer turns verified rollout files into a new policy:

1. rollouts whose policy version is too old (more than `async_level` versions behind) or from the
   future are refused (asynchronous RL tolerates bounded staleness, nothing more);
2. every completion gets a group-relative advantage (its reward against the other completions of the
   same prompt in the same file), and groups whose rewards are all equal (advantage 0, no signal) are
   dropped before they cost a forward pass;
3. the trainer recomputes the "old" log-probs itself, with its own copy of the weights of the policy
   version that generated each sample (it keeps the last `async_level` versions), then takes one or
   more AdamW steps on the token-level two-sided clipped policy-gradient loss;
4. the new weights are written as an HF safetensors folder that `VllmEngine.reload_weights` loads.

Single process (CPU or one GPU) is the path tested here. Under `torchrun` with
`torch.distributed` initialised, the same class shards the model with FSDP2 (`fully_shard`), splits the
trained samples across ranks, all-reduces the stats and saves a full state dict from rank 0. That path
is written for multi-GPU nodes and is not exercised by the test suite or on GPUs here; it was run by
hand on CPU (torchrun, 2 ranks, gloo, a micro Llama), where one step and the saved weights matched the
single-process trainer to 2e-8.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from node.fsio import atomic_dir, atomic_file
from node.rollout.file import RolloutFile, RolloutSample

if TYPE_CHECKING:
    from node.verify import FileChecks

T = TypeVar("T")

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
OPTIMIZER_FILE = "optimizer.pt"  # AdamW state next to the newest checkpoint (see Trainer.save_optimizer)


# --------------------------------------------------------------------------------------------------
# advantages and loss
# --------------------------------------------------------------------------------------------------


def group_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages: A_i = (r_i - mean_g) / (std_g + eps) for sample i in group g.

    `rewards` [N] (float), `groups` [N] (any integer ids; samples with the same id form a group).

    std_g is the *population* standard deviation, sqrt(mean_g((r - mean_g)^2)) (divide by n, not
    n - 1): the advantages of a group then have exactly zero mean and unit (population) variance, whatever
    the group size, and a group of one sample is well defined (std 0, advantage 0) instead of 0/0.
    The sample std would shrink every advantage by sqrt((n-1)/n), a group-size-dependent factor with no
    meaning here because the group is the whole population of completions for that prompt.

    A group whose rewards are all equal gets advantages of exactly 0 (not float rounding of
    (r - mean) / eps), so the caller can drop it by testing `== 0`.
    Computed in float64, returned in the rewards' dtype.
    """
    if rewards.dim() != 1 or groups.shape != rewards.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and groups {tuple(groups.shape)} must be equal 1-d shapes")
    if rewards.numel() == 0:
        return rewards.clone()
    r = rewards.to(torch.float64)
    _, idx = torch.unique(groups, return_inverse=True)
    n_groups = int(idx.max()) + 1
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, idx, torch.ones_like(r))
    mean = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, idx, r) / count
    centered = r - mean[idx]
    var = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, idx, centered**2) / count
    std = var.sqrt()
    hi = torch.full((n_groups,), -math.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, idx, r, "amax")
    lo = torch.full((n_groups,), math.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, idx, r, "amin")
    adv = centered / (std[idx] + eps)
    adv = torch.where((hi == lo)[idx], torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps: float = 0.2,
    delta: float = 4.0,
    kl_coef: float = 0.0,
    ref_logprobs: Tensor | None = None,
    entropy_coef: float = 0.0,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """INTELLECT-2's token-level two-sided clipped policy-gradient loss.

    Shapes: `logprobs`, `old_logprobs`, `mask` (and `ref_logprobs`, `entropy`) are [B, T] per token;
    `advantages` is [B] per sequence (broadcast over its tokens) or [B, T].

    For every token t with mask 1:

        r_t   = exp(logprobs_t - old_logprobs_t)
        r'_t  = clamp(r_t, 0, delta)                          # two-sided: also bounds A < 0
        obj_t = min(r'_t * A_t, clip(r'_t, 1 - eps, 1 + eps) * A_t)

        loss  = -(sum_t obj_t) / (number of unmasked tokens)               # token-level normalisation
                + kl_coef * (sum_t k3_t) / (number of unmasked tokens)     # if kl_coef > 0
                - entropy_coef * (sum_t H_t) / (number of unmasked tokens) # if entropy_coef > 0
        k3_t  = exp(ref_t - logprobs_t) - (ref_t - logprobs_t) - 1         # >= 0, unbiased KL(pi||ref)

    Why delta: for A < 0 the PPO min picks r * A when r > 1 + eps, which is unbounded below as r grows,
    so one token whose probability exploded can dominate the batch; clamping r at delta (4) bounds it,
    and past delta the gradient is zero. Token-level normalisation (one mean over all tokens of the
    batch, not a mean per sequence first) gives every token the same weight, so long completions are not
    down-weighted (DAPO / INTELLECT-2).

    Stats (plain floats, over unmasked tokens): `clip_frac`, the fraction of tokens whose gradient the
    clip or the delta bound switched off (A > 0 and r > 1 + eps, A < 0 and r < 1 - eps, or r > delta);
    `ratio_mean`; `approx_kl`, the k3 estimate of KL(old || new), mean((r - 1) - log r); and `kl_ref`,
    `entropy` when used.
    """
    if advantages.dim() == logprobs.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype).expand_as(logprobs)
    m = mask.to(logprobs.dtype)
    n_tok = m.sum().clamp(min=1.0)

    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    ratio_c = torch.clamp(ratio, 0.0, delta)
    unclipped = ratio_c * advantages
    clipped = torch.clamp(ratio_c, 1.0 - eps, 1.0 + eps) * advantages
    obj = torch.minimum(unclipped, clipped)
    loss = -(obj * m).sum() / n_tok

    stats: dict[str, float] = {}
    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        d = ref_logprobs.detach() - logprobs
        k3 = torch.exp(d) - d - 1.0
        kl = (k3 * m).sum() / n_tok
        loss = loss + kl_coef * kl
        stats["kl_ref"] = float(kl.detach())
    if entropy_coef > 0.0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy")
        ent = (entropy * m).sum() / n_tok
        loss = loss - entropy_coef * ent
        stats["entropy"] = float(ent.detach())

    with torch.no_grad():
        a = advantages
        off = ((a > 0) & (ratio > 1.0 + eps)) | ((a < 0) & (ratio < 1.0 - eps)) | (ratio > delta)
        stats["clip_frac"] = float((off.to(m.dtype) * m).sum() / n_tok)
        stats["ratio_mean"] = float((ratio * m).sum() / n_tok)
        stats["approx_kl"] = float((((ratio - 1.0) - log_ratio) * m).sum() / n_tok)
    return loss, stats


# --------------------------------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------------------------------


@dataclass
class StepStats:
    """What one `Trainer.step` did. Means are over the samples/tokens named in their docstring line."""

    version: int  # the policy version the step trained from
    files: int  # rollout files accepted
    stale_rejected: int  # rollout files refused for their policy version (never trained on)
    stale_samples: int  # samples in those files
    samples_seen: int  # samples in accepted files
    zero_adv_dropped: int  # samples dropped because their group's rewards were all equal
    samples_trained: int
    tokens: int  # completion tokens trained on
    mean_reward: float  # over samples_seen (nan when none)
    loss: float  # mean over optimizer steps
    clip_frac: float
    ratio_mean: float
    approx_kl: float
    grad_norm: float  # pre-clip, mean over optimizer steps
    optimizer_steps: int
    seconds: float
    behaviour_fallback: int = 0  # samples whose old log-probs came from the current weights (version not kept)
    verified: int = 0  # trained samples whose TOPLOC, sampling and reward checks passed in the old-log-prob pass
    unverified_dropped: int = 0  # samples not trained because their version's weights were gone (checks on)
    rejected_samples: int = 0  # samples not trained because their file failed the checks
    verify_seconds: float = 0.0  # time spent in those checks (beyond the forward pass the step runs anyway)
    # files that failed the checks: (index in the step's input, verdict as `FileVerdict.to_dict`)
    rejected: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Item:
    sample: RolloutSample
    advantage: float
    temperature: float
    version: int = 0  # policy version that generated the sample
    file: int = -1  # index of its rollout file in the step's input


class Trainer:
    """A causal LM (float32) trained with GRPO on rollout files; see the module docstring.

    `lr`, `weight_decay`, `betas`: AdamW. `max_grad_norm`: global gradient-norm clip per optimizer step.
    `async_level`: rollouts of policy versions current-async_level .. current are accepted.
    `mini_batches`: optimizer steps per `step` call (the accepted samples are split into this many
    mini-batches; the ratio moves away from 1 from the second one on, where the clip acts).
    `micro_batch_size`: samples per forward/backward (gradient accumulation inside a mini-batch).
    `eps`, `delta`, `kl_coef`, `entropy_coef`: passed to `grpo_loss` (a frozen copy of the initial
    weights is the KL reference when `kl_coef` > 0).
    `checks`: the pool's `node.verify.FileChecks`. With them, the old-log-prob pass (the generating
    version's weights over every sample) also captures the final-norm hidden states and runs the TOPLOC,
    sampling and reward checks on them: only samples that were verified, from files that passed, are
    trained on, and the failing files are listed in `StepStats.rejected`. Without them (synthetic data in
    tests and benchmarks) every selected sample is trained on.

    Under `torch.distributed` (torchrun), the model is sharded with FSDP2 on `cuda:LOCAL_RANK`; every rank
    must call `step` with the same files (each trains on its slice of the samples) and `save` (a
    collective; rank 0 writes). Without GPUs the ranks train on CPU over gloo: `test_fsdp.py` checks that two
    ranks end with the same weights as one process.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        lr: float = 1e-5,
        device: str = "cpu",
        async_level: int = 2,
        seed: int = 0,
        max_grad_norm: float = 1.0,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.99),
        mini_batches: int = 1,
        micro_batch_size: int = 8,
        eps: float = 0.2,
        delta: float = 4.0,
        kl_coef: float = 0.0,
        entropy_coef: float = 0.0,
        checks: FileChecks | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if async_level < 0 or mini_batches < 1 or micro_batch_size < 1:
            raise ValueError("async_level >= 0, mini_batches >= 1 and micro_batch_size >= 1 are required")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.model_dir = Path(model_dir)
        self.checks = checks
        self.async_level = async_level
        self.max_grad_norm = max_grad_norm
        self.mini_batches = mini_batches
        self.micro_batch_size = micro_batch_size
        self.loss_kwargs: dict[str, float] = {
            "eps": eps,
            "delta": delta,
            "kl_coef": kl_coef,
            "entropy_coef": entropy_coef,
        }
        # a process group of one (vLLM creates one in-process) is not distributed training
        self.distributed = (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        )
        self.rank = torch.distributed.get_rank() if self.distributed else 0
        self.world = torch.distributed.get_world_size() if self.distributed else 1
        if self.distributed and torch.cuda.is_available():
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            torch.cuda.set_device(torch.device(device))
        self.device = torch.device(device)
        torch.manual_seed(seed)

        def load() -> Any:
            m = AutoModelForCausalLM.from_pretrained(
                str(self.model_dir), dtype=torch.float32, attn_implementation="sdpa"
            )
            return torch.nn.Module.to(m, self.device)

        self._load = load
        self.model: Any = load()
        # weights of the versions a sample may still come from: version -> state dict (CPU copies, or on
        # the device under FSDP, where they are this rank's shards)
        self._history: dict[int, dict[str, Tensor]] = {}
        self._history_device = self.device if self.distributed else torch.device("cpu")
        self._behaviour: Any = None
        self._behaviour_version: int | None = None
        self.config = self.model.config
        pad = getattr(self.config, "pad_token_id", None)
        self.pad_id = int(pad) if isinstance(pad, int) else 0
        self.ref_model: Any = None
        if kl_coef > 0.0:
            self.ref_model = load()
            self.ref_model.eval().requires_grad_(False)
        if self.distributed:
            self._shard(self.model)
            if self.ref_model is not None:
                self._shard(self.ref_model)
        self.model.train()
        self.lr = lr
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.steps = 0

    # -- distributed -------------------------------------------------------------------------------

    def _shard(self, model: Any) -> None:
        """FSDP2: each decoder layer is its own unit (gathered just in time), then the root."""
        from torch.distributed.fsdp import fully_shard

        layers = getattr(getattr(model, "model", None), "layers", None)
        for layer in layers or []:
            fully_shard(layer)
        fully_shard(model)

    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        red = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
        torch.distributed.all_reduce(t, op=red)
        return t.tolist()

    # -- data --------------------------------------------------------------------------------------

    def _select(self, files: Sequence[RolloutFile], current_version: int) -> tuple[list[_Item], dict[str, Any]]:
        """Refuse stale/future files, compute group advantages, drop zero-advantage samples."""
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
                if not math.isfinite(s.reward):  # never a NaN advantage (the checks refuse the file too)
                    continue
                samples.append(s)
                temps.append(temp)
                versions.append(v)
                file_of.append(fi)
                group_ids.append(keys.setdefault((fi, s.group), len(keys)))
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        info["rewards"] = rewards.tolist()
        if not samples:
            return [], info
        adv = group_advantages(rewards, torch.tensor(group_ids))
        items = [
            _Item(s, float(a), t, v, fi)
            for s, a, t, v, fi in zip(samples, adv.tolist(), temps, versions, file_of, strict=True)
            if a != 0.0
        ]
        info["zero_adv_dropped"] = len(samples) - len(items)
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

    # -- the step ----------------------------------------------------------------------------------

    def step(self, files: list[RolloutFile], current_version: int) -> StepStats:
        """One trainer step on the given rollout files; the result is policy version current_version + 1.

        Old log-probs are recomputed by the trainer (no_grad) with its own copy of the weights of the
        version that generated each sample (`remember` / the snapshots kept after every step), rather
        than taken from the worker's file: (1) the worker is untrusted, and its logprobs are checked by
        validators only to a tolerance, so a ratio with the worker's numbers in the denominator would let
        a worker scale its own samples' gradients; (2) vLLM's kernels (and bf16 on GPUs) differ
        numerically from the trainer's, so even on-policy the ratio would not start at 1 and the clip
        would fire on noise; (3) the worker sampled at a temperature and reports raw (temperature 1)
        logprobs. For on-policy samples the ratio is exactly 1 at the first optimizer step. For a sample
        k versions old it is pi_now / pi_then: how far the policy has already moved on that token, so the
        clip stops pushing a token the last k updates already pushed (without this, asynchronous steps
        keep pushing in the same direction until feedback arrives k steps later; on the tiny model
        that collapsed the policy into one repeated token). A sample whose version's weights the trainer
        does not have falls back to the current weights (counted in `behaviour_fallback`).
        """
        t0 = time.perf_counter()
        items, info = self._select(files, current_version)
        rewards: list[float] = info["rewards"]
        # this rank's share of the samples (all ranks computed the same selection from the same files)
        mine = items[self.rank :: self.world]

        # old log-probs: the current weights for this version's samples, the kept weights of older ones.
        # With `checks`, the same forward passes verify every sample before it is trained on.
        self._snapshot(current_version)
        verifying = self.checks is not None
        t_verify = 0.0
        sample_checks: dict[int, Any] = {}  # index in `mine` -> SampleCheck
        forward = list(range(len(mine)))
        if verifying:
            t = time.perf_counter()
            forward = []
            for i, it in enumerate(mine):
                verdict = self.checks.before_prefill(it.sample, files[it.file].header.task_seed)
                if verdict.ok:
                    forward.append(i)
                else:
                    sample_checks[i] = _failed_check(it.sample, verdict)
            t_verify += time.perf_counter() - t
        old_of: dict[int, Tensor] = {}
        ref_of: dict[int, Tensor] = {}
        fallback = 0
        micro = self._micro([mine[i] for i in forward])
        index = self._micro(forward)
        n_micro_max = int(self._all_reduce([float(len(micro))], "max")[0])
        with torch.no_grad():
            for j, mb in enumerate(self._padded(micro, n_micro_max)):
                batch = self._batch(mb)
                tok, logits, hidden = self._forward(self.model, batch, capture=verifying)
                ref_tok = self._token_logprobs(self.ref_model, batch)[0] if self.ref_model is not None else None
                for r, i in enumerate(index[j] if j < len(index) else []):
                    old_of[i] = self._completion_rows(tok, r, mine[i])
                    if ref_tok is not None:
                        ref_of[i] = self._completion_rows(ref_tok, r, mine[i])
                    if verifying and mine[i].version == current_version:
                        t_verify += self._verify_row(sample_checks, i, mine[i], files, logits, hidden, r)
            # same order of forwards on every rank (FSDP collectives): versions from the shared selection
            for v in sorted({it.version for it in items if it.version != current_version}):
                if v not in self._history:
                    fallback += sum(1 for it in mine if it.version == v)
                    continue
                behaviour = self._behaviour_model(v)
                for j, mb in enumerate(self._padded(micro, n_micro_max)):
                    rows = [(r, i) for r, i in enumerate(index[j]) if mine[i].version == v] if j < len(index) else []
                    if not rows and not self.distributed:
                        continue
                    tok, logits, hidden = self._forward(behaviour, self._batch(mb), capture=verifying)
                    for r, i in rows:
                        old_of[i] = self._completion_rows(tok, r, mine[i])
                        if verifying:
                            t_verify += self._verify_row(sample_checks, i, mine[i], files, logits, hidden, r)

        # only verified samples of files that passed are trained on (with `checks`)
        rejected: list[tuple[int, dict[str, Any]]] = []
        unverified = 0
        keep = list(range(len(mine)))
        if verifying:
            t = time.perf_counter()
            by_file: dict[int, list[int]] = {}
            for i in sorted(sample_checks):
                by_file.setdefault(mine[i].file, []).append(i)
            bad_flags = [0.0] * len(files)
            for fi, rows in by_file.items():
                fv = self.checks.conclude([mine[i].sample for i in rows], [sample_checks[i] for i in rows])
                if not fv.ok:
                    bad_flags[fi] = 1.0
                    rejected.append((fi, fv.to_dict()))
            bad = {fi for fi, b in enumerate(self._all_reduce(bad_flags, "max")) if b > 0}
            unverified = sum(1 for i in range(len(mine)) if i not in sample_checks)
            keep = [i for i in range(len(mine)) if i in sample_checks and mine[i].file not in bad]
            t_verify += time.perf_counter() - t
        rejected_samples = sum(1 for i in range(len(mine)) if i in sample_checks) - len(keep)
        kept = [mine[i] for i in keep]
        my_tokens = sum(len(it.sample.completion_tokens) for it in kept)
        micro = self._micro(kept)
        kept_index = self._micro(keep)
        n_micro_max = int(self._all_reduce([float(len(micro))], "max")[0])
        old: list[Tensor] = []
        ref: list[Tensor | None] = []
        for j, mb in enumerate(self._padded(micro, n_micro_max)):
            rows = kept_index[j] if j < len(kept_index) else []
            width = max(len(it.sample.prompt_tokens) + len(it.sample.completion_tokens) - 1 for it in mb)
            old.append(self._place(mb, [old_of[i] for i in rows], width))
            ref.append(self._place(mb, [ref_of[i] for i in rows], width) if self.ref_model is not None else None)
        total_items = int(self._all_reduce([float(len(kept))])[0])

        losses: list[float] = []
        norms: list[float] = []
        sums = {"clip_frac": 0.0, "ratio_mean": 0.0, "approx_kl": 0.0}
        tok_total = 0.0
        # mini-batches: contiguous runs of micro-batches, one optimizer step each
        n_mini = min(self.mini_batches, max(1, n_micro_max))
        bounds = [round(k * n_micro_max / n_mini) for k in range(n_mini + 1)]
        padded = self._padded(micro, n_micro_max)
        for k in range(n_mini):
            lo, hi = bounds[k], bounds[k + 1]
            if total_items == 0 or hi <= lo:
                break
            # token-level normalisation over the whole mini-batch, on all ranks together
            mb_tokens = self._all_reduce(
                [float(sum(self._batch_mask_sum(micro[j]) for j in range(lo, min(hi, len(micro)))))]
            )[0]
            if mb_tokens == 0:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for j in range(lo, hi):
                batch = self._batch(padded[j])
                if j >= len(micro):
                    batch["mask"] = torch.zeros_like(batch["mask"])  # padding micro-batch: collectives only
                want_ent = self.loss_kwargs["entropy_coef"] > 0
                lp, ent = self._token_logprobs(self.model, batch, entropy=want_ent)
                loss, st = grpo_loss(
                    lp,
                    old[j],
                    batch["adv"],
                    batch["mask"],
                    ref_logprobs=ref[j],
                    entropy=ent,
                    **self.loss_kwargs,  # type: ignore[arg-type]
                )
                n = float(batch["mask"].sum())
                # grpo_loss is a mean over this micro-batch's tokens; reweight to a mean over the mini-batch
                scaled = loss * (n / mb_tokens) * self.world  # FSDP averages gradients over ranks
                scaled.backward()
                loss_sum += float(loss.detach()) * n / mb_tokens
                for key in sums:
                    sums[key] += st[key] * n
                tok_total += n
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            if hasattr(norm, "full_tensor"):
                norm = norm.full_tensor()
            self.optimizer.step()
            losses.append(self._all_reduce([loss_sum])[0])
            norms.append(float(norm))
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1

        n_verified = len(kept) if verifying else 0
        red = self._all_reduce(
            [
                sums["clip_frac"], sums["ratio_mean"], sums["approx_kl"], tok_total, float(my_tokens),
                float(n_verified), float(unverified), float(rejected_samples),
            ]
        )  # fmt: skip
        tok_all = max(red[3], 1.0)
        return StepStats(
            version=current_version,
            files=info["files"],
            stale_rejected=info["stale_rejected"],
            stale_samples=info["stale_samples"],
            samples_seen=len(rewards),
            zero_adv_dropped=int(info.get("zero_adv_dropped", 0)),
            samples_trained=total_items,
            tokens=int(red[4]),
            mean_reward=float(sum(rewards) / len(rewards)) if rewards else math.nan,
            loss=float(sum(losses) / len(losses)) if losses else 0.0,
            clip_frac=red[0] / tok_all,
            ratio_mean=red[1] / tok_all if red[3] else 1.0,
            approx_kl=red[2] / tok_all,
            grad_norm=float(sum(norms) / len(norms)) if norms else 0.0,
            optimizer_steps=len(norms),
            behaviour_fallback=fallback,
            seconds=time.perf_counter() - t0,
            verified=int(red[5]),
            unverified_dropped=int(red[6]),
            rejected_samples=int(red[7]),
            verify_seconds=t_verify,
            rejected=rejected,
        )

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

    def _verify_row(
        self,
        out: dict[int, Any],
        i: int,
        it: _Item,
        files: Sequence[RolloutFile],
        logits: Tensor,
        hidden: Any,
        row: int,
    ) -> float:
        """TOPLOC, sampling and reward checks of one sample from its rows of the forward pass; the seconds spent."""
        t = time.perf_counter()
        assert self.checks is not None and hidden is not None
        h = self._completion_rows(hidden, row, it).detach().to("cpu", torch.float32)
        raw = torch.log_softmax(self._completion_rows(logits, row, it).detach().to("cpu", torch.float32), dim=-1)
        out[i] = self.checks.after_prefill(it.sample, files[it.file].header.task_seed, h, raw)
        return time.perf_counter() - t

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

    # -- weights of recent versions (behaviour policies) -------------------------------------------

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

    # -- weights -----------------------------------------------------------------------------------

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


def _final_norm(model: Any) -> Any:
    """The norm after the last decoder layer (Llama, Qwen, SmolLM, Mistral: `model.model.norm`)."""
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    if norm is None:
        raise ValueError(f"{type(model).__name__} has no final norm at model.norm: cannot capture TOPLOC states")
    return norm


def _failed_check(sample: RolloutSample, verdict: Any) -> Any:
    from node.verify import SampleCheck, SampleVerdict

    return SampleCheck(SampleVerdict(sample.group, sample.sample, verdict))


def _dummy_sample(pad_id: int) -> RolloutSample:
    return RolloutSample(0, 0, "", [pad_id], [pad_id], [0.0], 0.0, "length", [])
