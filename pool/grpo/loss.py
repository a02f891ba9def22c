"""GRPO's two pure pieces: group-relative advantages and the INTELLECT-2 clipped policy-gradient loss."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    pass


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
