"""Exact sampling inside vLLM: a logits processor that draws each token of the requests that ask for it
with `node.rollout.exact.choose` (seeded Gumbel-max) and leaves the row with that one token allowed.

The request itself is greedy (temperature 0) and carries its terms in `SamplingParams.extra_args`
under `EXTRA_KEY`: {"seed", "temperature", "top_p", "top_k"}. vLLM computes the raw logprobs it
returns before any logits processor runs, so `Completion.logprobs` stay the model's raw log-softmax,
and its greedy argmax then picks our draw. The processor is loaded by vLLM from its qualified name
(`engine.EXACT_PROCESSOR`), in the engine's own process, so it works with the in-process CPU engine and with a
multiprocess GPU engine core alike. This module imports vLLM: load it only where vLLM runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from vllm import SamplingParams as VllmSamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from ..rollout.checks import SamplingParams
from ..rollout.exact import choose_rows
from .engine import EXACT_KEY as EXTRA_KEY


def exact_terms(extra: dict[str, Any] | None) -> tuple[SamplingParams, int] | None:
    """The sampling terms and seed a request's `extra_args` ask for, or None (not an exact request)."""
    x = (extra or {}).get(EXTRA_KEY)
    if x is None:
        return None
    if not isinstance(x, dict):
        raise ValueError(f"extra_args[{EXTRA_KEY!r}] must be a dict")
    temperature, top_p, top_k, seed = (x.get(k) for k in ("temperature", "top_p", "top_k", "seed"))
    if not (isinstance(temperature, float | int) and temperature > 0 and math.isfinite(temperature)):
        raise ValueError("exact sampling needs a positive temperature")
    if not (isinstance(top_p, float | int) and 0 < top_p <= 1):
        raise ValueError("exact sampling: top_p must be in (0, 1]")
    if not isinstance(top_k, int) or not isinstance(seed, int) or seed < 0:
        raise ValueError("exact sampling: top_k and seed must be integers (seed >= 0)")
    return SamplingParams(float(temperature), float(top_p), top_k, exact=True), seed


class ExactSampler(LogitsProcessor):
    """Draws the next token of every exact request by seeded Gumbel-max (see the module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params: VllmSamplingParams) -> None:
        exact_terms(sampling_params.extra_args)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        # batch row -> (terms, seed, the request's live list of output token ids)
        self.rows: dict[int, tuple[SamplingParams, int, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax: it must run for greedy requests

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def add(params: VllmSamplingParams, _prompt: list[int] | None, output: list[int]) -> Any:
            terms = exact_terms(params.extra_args)
            return None if terms is None else (*terms, output)

        process_dict_updates(self.rows, batch_update, add)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        # rows under the same terms are drawn together (one pass over the batch, not one per request);
        # a row's position is the number of tokens generated so far (vLLM appends each sampled token,
        # or a placeholder for it with async scheduling, before the next step)
        groups: dict[SamplingParams, list[int]] = {}
        for row, (params, _seed, _output) in self.rows.items():
            groups.setdefault(params, []).append(row)
        for params, rows in groups.items():
            seeds = [self.rows[r][1] for r in rows]
            positions = [len(self.rows[r][2]) for r in rows]
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)
            tokens = choose_rows(logits.index_select(0, index), params, seeds, positions)
            logits.index_fill_(0, index, -math.inf)
            logits[index, tokens] = 0.0
        return logits
