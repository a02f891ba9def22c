"""The validator's recomputation with plain transformers (`HfPrefill`): one forward over prompt and
completion gives the final-norm hidden states and raw-logit log-softmax of the positions that produced
each completion token, the rows `VllmEngine` captured while generating."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    pass


from .types import _TORCH_DTYPES, Completion, DType, Prefill, SamplingSpec


class HfPrefill:
    """The validator's recomputation with plain transformers: one forward over prompt + completion.

    Returns the final-norm hidden states and the raw-logit log-softmax at the positions that produced
    each completion token (P-1 .. P+T-2), the same rows `VllmEngine` captured while generating.
    """

    def __init__(self, model_dir: str | Path, *, dtype: DType = "float32", device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_TORCH_DTYPES)}, got {dtype!r}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.device = torch.device(device)
        self.dtype = _TORCH_DTYPES[dtype]
        # sdpa: causal attention that ignores right padding, and the same math for batch sizes 1 and N.
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=self.dtype, attn_implementation="sdpa")
        self.model: Any = torch.nn.Module.to(model, self.device)
        self.model.eval()
        self.hidden_size = int(self.model.config.hidden_size)
        self.vocab_size = int(self.model.config.vocab_size)

    @torch.inference_mode()
    def prefill(self, prompt_tokens: Sequence[int], completion_tokens: Sequence[int]) -> Prefill:
        """Recompute one completion: `hidden` [T, H] and `logprobs` [T, V], both float32."""
        return self.prefill_many([(prompt_tokens, completion_tokens)])[0]

    @torch.inference_mode()
    def prefill_many(
        self,
        pairs: Iterable[tuple[Sequence[int], Sequence[int]]],
        *,
        batch_size: int = 32,
        batch_tokens: int = 8192,
    ) -> list[Prefill]:
        """Batched `prefill`: right padding, so every real token keeps positions 0..L-1 and (causal
        attention) never sees a pad; results equal single prefills to float rounding.
        Sequences are batched in order of length (little padding), at most `batch_size` of them and
        `batch_tokens` positions (padding included) a batch, and returned in the order given."""
        items = [(list(p), list(c)) for p, c in pairs]
        for p, c in items:
            if not p or not c:
                raise ValueError("prefill needs a non-empty prompt and completion")
            if min(min(p), min(c)) < 0 or max(max(p), max(c)) >= self.vocab_size:
                raise ValueError(f"token ids outside the vocabulary [0, {self.vocab_size})")
        results: list[Prefill | None] = [None] * len(items)
        order = sorted(range(len(items)), key=lambda i: len(items[i][0]) + len(items[i][1]))
        pad_id = 0
        batches: list[list[int]] = []
        for i in order:  # longest last: a batch's width is its last sequence's length
            n = len(items[i][0]) + len(items[i][1]) - 1
            if not batches or len(batches[-1]) >= batch_size or (len(batches[-1]) + 1) * n > batch_tokens:
                batches.append([])
            batches[-1].append(i)
        for chunk in batches:
            # the last completion token is never fed: its state did not produce any token
            seqs = [items[i][0] + items[i][1][:-1] for i in chunk]
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
            for b, s in enumerate(seqs):
                ids[b, : len(s)] = torch.as_tensor(s)
            # no attention mask: the pads are on the right, so causal attention alone keeps every real
            # token from seeing one (the pads' own rows are never read), and sdpa takes its causal path
            hidden = self.model.model(input_ids=ids.to(self.device)).last_hidden_state
            # the rows that produced completion tokens, all of the batch's at once through the head
            spans = [(len(items[i][0]) - 1, len(items[i][1])) for i in chunk]
            rows = torch.cat([hidden[b, at : at + n] for b, (at, n) in enumerate(spans)])
            logprobs = torch.log_softmax(self.model.lm_head(rows).to(torch.float32), dim=-1).cpu()
            states = rows.to("cpu", torch.float32)
            at = 0
            for i, (_, n) in zip(chunk, spans, strict=True):
                results[i] = Prefill(hidden=states[at : at + n], logprobs=logprobs[at : at + n])
                at += n
        return [r for r in results if r is not None]

    @torch.inference_mode()
    def generate_exact(self, prompts: list[list[int]], sampling: SamplingSpec, n: int = 1) -> list[list[Completion]]:
        """Exact sampling with transformers (no vLLM needed): completion (i, j) drawn token by token with
        `node.rollout.exact.choose` and `sample_seed(sampling.seed, i, j)`, the same draws as `VllmEngine`
        makes for an exact `SamplingSpec` up to numerical differences between the two (a near tie can
        go either way). One sequence at a time, with a KV cache; returns [prompt][sample] completions
        with their raw logprobs and final-norm hidden states, as `VllmEngine.generate` does."""
        from ..rollout.checks import SamplingParams
        from ..rollout.exact import choose, sample_seed

        if not sampling.exact or sampling.temperature <= 0:
            raise ValueError("generate_exact needs an exact SamplingSpec with a positive temperature")
        params = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens, exact=True)
        stops = set(sampling.stop_token_ids or ())
        out: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            row = []
            for j in range(n):
                seed = sample_seed(sampling.seed, i, j)
                ids = torch.as_tensor([list(prompt)], device=self.device)
                past: Any = None
                tokens: list[int] = []
                logprobs: list[float] = []
                states: list[torch.Tensor] = []
                finish = "length"
                while len(tokens) < sampling.max_tokens:
                    o = self.model.model(input_ids=ids, past_key_values=past, use_cache=True)
                    past = o.past_key_values
                    h = o.last_hidden_state[:, -1]
                    lp = torch.log_softmax(self.model.lm_head(h).to(torch.float32), dim=-1)
                    token = int(choose(lp, params, seed, [len(tokens)])[0])
                    tokens.append(token)
                    logprobs.append(float(lp[0, token]))
                    states.append(h[0].to("cpu", torch.float32))
                    if token in stops:
                        finish = "stop"
                        break
                    ids = torch.as_tensor([[token]], device=self.device)
                row.append(Completion(list(prompt), tokens, logprobs, finish, torch.stack(states)))
            out.append(row)
        return out

    @torch.inference_mode()
    def greedy(self, prompt_tokens: Sequence[int], max_tokens: int, eos_token_id: int | None = None) -> list[int]:
        """Greedy decoding with transformers (for cross-checking an engine); stops after EOS."""
        ids = torch.as_tensor([list(prompt_tokens)], device=self.device)
        out = self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id if eos_token_id is not None else 0,
        )
        return out[0, ids.shape[1] :].tolist()
