"""GRPO for the pool's trainer: group advantages, the INTELLECT-2 clipped loss (`loss`), and a `Trainer`
(`trainer`, with `data`, `checkpoints` and `fsdp`).

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

from .checkpoints import OPTIMIZER_FILE, WEIGHT_FILES
from .loss import group_advantages, grpo_loss
from .trainer import StepStats, Trainer

__all__ = ["OPTIMIZER_FILE", "WEIGHT_FILES", "StepStats", "Trainer", "group_advantages", "grpo_loss"]
