"""What the inference engines exchange: sampling parameters, a completion with the hidden states and
logprobs of the positions that produced its tokens, a prefill's recomputation of them, and the
per-completion seed. Pure data."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from node.errors import IntellectError

if TYPE_CHECKING:
    pass


DType = Literal["float32", "bfloat16"]
_TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample. temperature 0 is greedy; top_k -1 disables top-k; seed makes a run repeatable.
    `exact`: seeded Gumbel-max sampling (`node.rollout.exact`), completion (i, j) drawn with
    `sample_seed(seed, i, j)`: `seed` is then the task's seed and i the problem's group."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    top_k: int = -1
    stop_token_ids: tuple[int, ...] | None = None
    exact: bool = False


@dataclass
class Completion:
    """One generated completion and what TOPLOC and the RL trainer need from it.

    `logprobs[j]`: log-softmax of the raw logits (temperature 1, no top-p) for `tokens[j]`.
    `hidden[j]`: float32 copy of the final-norm hidden state at position len(prompt_tokens)-1+j.
    `finish_reason`: "stop" (EOS or a stop token; the stop token is the last entry of `tokens`) or
    "length" (max_tokens reached).
    """

    prompt_tokens: list[int]
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    hidden: torch.Tensor


@dataclass
class Prefill:
    """A validator's recomputation for one (prompt, completion) pair: rows match `Completion.hidden`."""

    hidden: torch.Tensor  # [T, H] float32
    logprobs: torch.Tensor  # [T, V] float32, log-softmax of raw logits

    def token_logprobs(self, tokens: Sequence[int]) -> torch.Tensor:
        """The logprob of each given token at its row: [T]."""
        idx = torch.as_tensor(list(tokens), dtype=torch.long).unsqueeze(1)
        return self.logprobs.gather(1, idx).squeeze(1)


def completion_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The per-completion vLLM seed for sample `sample_index` of prompt `prompt_index` in one call.

    Every completion is its own vLLM request with its own seeded generator, so the tokens of a completion
    depend only on (seed, prompt index, sample index), the weights and the prompt, not on which other
    requests share its batch. Hash-derived so different prompts/samples get unrelated streams.
    """
    digest = hashlib.sha256(f"intellect-node:{seed}:{prompt_index}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # non-negative int63


class ContextTooShort(IntellectError, ValueError):
    """A prompt plus the tokens it may generate do not fit the engine's context: its completions would
    be cut short (finish 'length' before max_tokens), which validators judge as truncated work."""
