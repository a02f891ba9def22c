"""Checks on an untrusted rollout file that need no model: run before any heavy work, wherever a file
enters (coordinator submit, validator, trainer).

- `check_terms`: the header names the pool, environment and model of the task and declares exactly
  the task's sampling parameters (no extra key, no other value). The checker takes the parameters
  from the task or the pool's spec, never from the header, so a header that differs is malformed.
- `check_bounds`: every token id within the model's vocabulary, every reported logprob a finite
  number <= 0, every reward finite, no completion longer than the task's `max_tokens`.
- `implausible_repeats`: identical completions of one prompt are refused unless the model makes that
  many identical draws plausible.

The repeat bound. Under honest sampling the n completions of a prompt are independent draws, and a
completion c has probability p = q(c | prompt) under the task's sampling distribution q. The chance
that some k of the n draws all equal c is at most C(n, k) * p^k (a union bound over the k-subsets).
A repeat is refused only when that bound is below `REPEAT_ALPHA` (1e-9), so an honest file is refused
this way with probability below 1e-9 per repeated completion. A short, confident answer passes: eight
copies of a two-token answer the model gives with probability 0.5 have a bound of 0.5^8 = 0.004. A
copied 20-token sample of a model that is unsure (p ~ e^-40) is refused at the second copy. p is the
validator's own probability (its prefill); the coordinator, which runs no model, can use the worker's
reported logprobs only when the task samples at temperature 1 without truncation (q is then the raw
model distribution), and leaves the other cases to the validator, whose logprob check catches a
worker that inflates them.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .file import RolloutFile, RolloutHeader, RolloutSample

REPEAT_ALPHA = 1e-9
LOGPROB_SLACK = 1e-3  # a reported logprob above this is no log-probability


@dataclass(frozen=True)
class Problem:
    """Why a file is refused: a short reason code and a sentence."""

    reason: str
    detail: str


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def check_terms(h: RolloutHeader, *, pool_id: int, env: str, model: str, sampling: Mapping[str, Any]) -> Problem | None:
    """The header's pool, environment, model and sampling parameters are exactly the task's."""
    if h.pool_id != pool_id:
        return Problem("wrong-pool", f"file for pool {h.pool_id}, expected pool {pool_id}")
    if h.env != env:
        return Problem("wrong-task", f"file claims environment {h.env!r}, the task's is {env!r}")
    if h.model != model:
        return Problem("wrong-task", f"file claims model {h.model!r}, the task's is {model!r}")
    extra = sorted(set(h.sampling) - set(sampling))
    if extra:
        return Problem("wrong-sampling", f"header declares sampling key(s) {extra} the task never set")
    for k, v in sampling.items():
        if k not in h.sampling or not same_value(h.sampling[k], v):
            return Problem("wrong-sampling", f"sampling.{k} is {h.sampling.get(k)!r}, the task says {v!r}")
    return None


def check_bounds(f: RolloutFile, *, vocab_size: int, max_tokens: int) -> Problem | None:
    """Token ids in the vocabulary, logprobs finite and <= 0, rewards finite, lengths within the task."""
    for s in f.samples:
        where = f"group {s.group} sample {s.sample}"
        if not s.prompt_tokens:
            return Problem("malformed", f"{where}: empty prompt")
        if len(s.completion_tokens) > max_tokens:
            return Problem("too-long", f"{where}: {len(s.completion_tokens)} tokens, max_tokens is {max_tokens}")
        top = max(max(s.prompt_tokens), max(s.completion_tokens))
        if top >= vocab_size:
            return Problem("token-out-of-vocab", f"{where}: token id {top} outside the vocabulary of {vocab_size}")
        bad = next((x for x in s.logprobs if not (math.isfinite(x) and x <= LOGPROB_SLACK)), None)
        if bad is not None:
            return Problem("bad-logprob", f"{where}: reported logprob {bad} is not a finite number <= 0")
        if not math.isfinite(s.reward):
            return Problem("wrong-reward", f"{where}: reward {s.reward} is not finite")
    return None


def check_sample_indices(f: RolloutFile, group_size: int) -> Problem | None:
    """Every group holds exactly the samples 0 .. group_size-1, once each. Under exact sampling a sample's
    index is its seed: a worker that may pick indices may draw many and keep the ones it likes."""
    seen: dict[int, set[int]] = {}
    for s in f.samples:
        got = seen.setdefault(s.group, set())
        if not 0 <= s.sample < group_size or s.sample in got:
            return Problem(
                "wrong-shape",
                f"group {s.group}: sample index {s.sample} (samples must be 0..{group_size - 1}, once each)",
            )
        got.add(s.sample)
    short = next((g for g, got in seen.items() if len(got) != group_size), None)
    if short is not None:
        return Problem("wrong-shape", f"group {short}: {len(seen[short])} samples, the task's groups hold {group_size}")
    return None


def repeat_log_bound(draws: int, copies: int, logp: float) -> float:
    """log of C(draws, copies) * p^copies: an upper bound on the chance of `copies` identical honest draws."""
    if copies <= 1:
        return 0.0
    log_comb = math.lgamma(draws + 1) - math.lgamma(copies + 1) - math.lgamma(draws - copies + 1)
    return log_comb + copies * min(0.0, logp)


def completion_hashes(s: RolloutSample) -> tuple[str, str]:
    """sha256 hex of the prompt's token ids, and of prompt and completion together (for an index)."""
    prompt = hashlib.sha256(repr(tuple(s.prompt_tokens)).encode()).hexdigest()
    both = hashlib.sha256(f"{prompt}|{tuple(s.completion_tokens)!r}".encode()).hexdigest()
    return prompt, both


def completion_key(s: RolloutSample) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(s.prompt_tokens), tuple(s.completion_tokens)


def implausible_repeats(
    samples: Sequence[RolloutSample],
    logps: Sequence[float | None],
    *,
    prior_draws: Mapping[tuple[int, ...], int] | None = None,
    prior_copies: Mapping[tuple[tuple[int, ...], tuple[int, ...]], int] | None = None,
    alpha: float = REPEAT_ALPHA,
) -> Problem | None:
    """The first completion repeated more often than its probability allows, if any.

    `logps[i]` is log q(completion i | prompt) under the task's sampling distribution, or None where
    it is not known (that completion is then not judged). `prior_draws` / `prior_copies` count draws
    of a prompt and copies of a completion seen in earlier files, so a copy across files or nodes is
    judged with all the draws it competes with."""
    draws: Counter[tuple[int, ...]] = Counter(tuple(s.prompt_tokens) for s in samples)
    copies: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter(completion_key(s) for s in samples)
    limit = math.log(alpha)
    judged: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for s, lp in zip(samples, logps, strict=True):
        key = completion_key(s)
        if lp is None or key in judged:
            continue
        judged.add(key)
        k = copies[key] + (prior_copies or {}).get(key, 0)
        n = draws[key[0]] + (prior_draws or {}).get(key[0], 0)
        if k > 1 and repeat_log_bound(n, k, lp) < limit:
            return Problem(
                "duplicate-samples",
                f"group {s.group}: one completion appears {k} times in {n} draws, its probability "
                f"{math.exp(lp):.3g} makes that implausible (bound {math.exp(repeat_log_bound(n, k, lp)):.3g})",
            )
    return None


def plain_sampling(sampling: Mapping[str, Any]) -> bool:
    """Temperature 1 without top-k/top-p truncation: the raw model distribution is the sampling one."""
    return (
        float(sampling.get("temperature", 0)) == 1.0
        and float(sampling.get("top_p", 1.0)) >= 1.0
        and int(sampling.get("top_k", -1)) <= 0
    )


def reported_logps(f: RolloutFile, sampling: Mapping[str, Any]) -> list[float | None]:
    """Per-sample log q from the worker's reported logprobs where they are q's (plain sampling)."""
    if not plain_sampling(sampling):
        return [None] * len(f.samples)
    return [float(sum(s.logprobs)) for s in f.samples]
