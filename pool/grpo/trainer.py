"""The GRPO `Trainer`: one `step` turns verified rollout files into the next policy version (see the
package docstring); `data` builds its batches, `checkpoints` keeps its weights, `fsdp` shards it."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from node.rollout.file import RolloutFile, RolloutSample

if TYPE_CHECKING:
    from node.verify import FileChecks

from .checkpoints import CheckpointMixin
from .data import DataMixin, _Item
from .fsdp import all_reduce, shard
from .loss import grpo_loss


@dataclass
class StepStats:
    """What one `Trainer.step` did. Means are over the samples/tokens named in their docstring line."""

    version: int  # the policy version the step trained from
    files: int  # rollout files accepted
    stale_rejected: int  # rollout files refused for their policy version (never trained on)
    stale_samples: int  # samples in those files
    samples_seen: int  # samples in accepted files
    zero_adv_dropped: int  # samples checked but not trained on: their group's rewards were all equal
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
    # files (index in the step's input) the checks could not cover: their version's weights were gone
    unchecked: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Trainer(DataMixin, CheckpointMixin):
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

    def _shard(self, model: Any) -> None:
        shard(model)

    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        return all_reduce(values, self.device, op) if self.distributed else values

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
        # without checks only trained samples need old log-probs; with them every sample is checked
        forward = [i for i, it in enumerate(mine) if it.train]
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
        unchecked: list[int] = []
        unverified = 0
        keep = [i for i, it in enumerate(mine) if it.train]
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
            gone = [0.0] * len(files)
            for i in range(len(mine)):
                if i not in sample_checks:
                    gone[mine[i].file] = 1.0
            flags = self._all_reduce(bad_flags + gone, "max")
            bad = {fi for fi, b in enumerate(flags[: len(files)]) if b > 0}
            unchecked = [fi for fi, b in enumerate(flags[len(files) :]) if b > 0 and fi not in bad]
            unverified = sum(1 for i in range(len(mine)) if i not in sample_checks and mine[i].train)
            keep = [i for i in keep if i in sample_checks and mine[i].file not in bad]
            t_verify += time.perf_counter() - t
        rejected_samples = sum(1 for i in sample_checks if mine[i].train) - len(keep)
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
            unchecked=unchecked,
        )

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


def _failed_check(sample: RolloutSample, verdict: Any) -> Any:
    from node.verify import SampleCheck, SampleVerdict

    return SampleCheck(SampleVerdict(sample.group, sample.sample, verdict))
