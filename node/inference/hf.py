"""The validator's recomputation with plain transformers (`HfPrefill`): one forward over prompt and
completion gives the final-norm hidden states and raw-logit log-softmax of the positions that produced
each completion token, the rows `VllmEngine` captured while generating."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from .types import _TORCH_DTYPES, Completion, DType, Prefill, SamplingSpec

#: Architectures whose attention is plain causal attention over every earlier position, with rotary
#: positions taken from the position ids: a prompt's keys and values are the same fed alone or whole.
FULL_ATTENTION_MODELS = frozenset({"llama", "qwen2", "qwen3"})
#: Rotary scalings fixed at load time. Dynamic NTK and longrope change the frequencies with the
#: sequence's length, so a prompt fed alone would be rotated otherwise than in the whole sequence.
STATIC_ROPE = frozenset({"default", "linear", "llama3"})


def prompt_sharing_safe(config: Any) -> bool:
    """Whether `HfPrefill` may feed a shared prompt once (`_prefill_shared`) for a model with this
    transformers `config`: a known full-attention architecture, no sliding window in any layer (its mask
    follows cache indices, which a padded prompt shifts, and its cache keeps only the window: wrong
    log-probs, then a crash, seen on Mistral, Qwen2 and Gemma-3 configurations) and static rotary
    frequencies. Anything else is fed whole, as before."""
    if getattr(config, "model_type", None) not in FULL_ATTENTION_MODELS:
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True) is not False:
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kinds = [rope] if "rope_type" in rope or "type" in rope or not rope else list(rope.values())
    return all(isinstance(k, dict) and k.get("rope_type", k.get("type", "default")) in STATIC_ROPE for k in kinds)


class HfPrefill:
    """The validator's recomputation with plain transformers: one forward over prompt + completion.

    Returns the final-norm hidden states and the raw-logit log-softmax at the positions that produced
    each completion token (P-1 .. P+T-2), the same rows `VllmEngine` captured while generating.
    """

    def __init__(
        self, model_dir: str | Path, *, dtype: DType = "float32", device: str = "cpu", share_prompts: bool | None = None
    ) -> None:
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
        # A prompt shared by several completions (a task's group) is fed once and its keys and values
        # reused (`_prefill_shared`): 1.3-1.4x faster on a file of groups of 4. Its rounding differs from
        # the whole-sequence pass as much as another batch composition does: up to ~5e-5 in a logprob in
        # fp32, where the honest replay gaps are 0, but up to ~0.08 in bf16, where the shipped replay
        # margin (0.143) was measured without it against an honest worst of 0.118. So fp32 only, by
        # default, and only for models where it is the same computation (`prompt_sharing_safe`).
        safe = prompt_sharing_safe(self.model.config)
        if share_prompts and not safe:
            raise ValueError(f"{model_dir}: a prompt's keys and values computed alone would differ from the whole pass")
        self.share_prompts = safe and self.dtype == torch.float32 if share_prompts is None else share_prompts

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
        `batch_tokens` positions (padding included) a batch, and returned in the order given. With
        `share_prompts`, a prompt that several pairs share is fed once (`_prefill_shared`)."""
        items = [(list(p), list(c)) for p, c in pairs]
        for p, c in items:
            if not p or not c:
                raise ValueError("prefill needs a non-empty prompt and completion")
            if min(min(p), min(c)) < 0 or max(max(p), max(c)) >= self.vocab_size:
                raise ValueError(f"token ids outside the vocabulary [0, {self.vocab_size})")
        results: list[Prefill | None] = [None] * len(items)
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for i, (p, _) in enumerate(items):
            by_prompt.setdefault(tuple(p), []).append(i)
        groups = [ix for ix in by_prompt.values() if len(ix) > 1] if self.share_prompts else []
        alone = [i for ix in by_prompt.values() if not self.share_prompts or len(ix) == 1 for i in ix]
        self._prefill_whole(items, alone, results, batch_size, batch_tokens)
        self._prefill_shared(items, groups, results, batch_size, batch_tokens)
        return [r for r in results if r is not None]

    def _rows_out(
        self, rows: torch.Tensor, chunk: list[int], lengths: list[int], results: list[Prefill | None]
    ) -> None:
        """`rows` (the states that produced the completion tokens of `chunk`'s items, in order) through
        the head at once, split into the items' results."""
        logprobs = torch.log_softmax(self.model.lm_head(rows).to(torch.float32), dim=-1).cpu()
        states = rows.to("cpu", torch.float32)
        at = 0
        for i, n in zip(chunk, lengths, strict=True):
            results[i] = Prefill(hidden=states[at : at + n], logprobs=logprobs[at : at + n])
            at += n

    def _prefill_whole(
        self,
        items: list[tuple[list[int], list[int]]],
        which: list[int],
        results: list[Prefill | None],
        batch_size: int,
        batch_tokens: int,
    ) -> None:
        """Prompt and completion of each of `which` as one sequence."""
        order = sorted(which, key=lambda i: len(items[i][0]) + len(items[i][1]))
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
            self._rows_out(rows, chunk, [n for _, n in spans], results)

    def _prefill_shared(
        self,
        items: list[tuple[list[int], list[int]]],
        groups: list[list[int]],
        results: list[Prefill | None],
        batch_size: int,
        batch_tokens: int,
    ) -> None:
        """Items that share a prompt (each of `groups`): every prompt fed once (right padding, causal),
        then the completions against its keys and values. A completion's row b attends to its prompt's
        real positions (an attention mask hides the prompt pads) and, causally, to its own tokens, at
        positions P..P+T-2 (given, since the pads shift the cache's indices)."""
        from transformers import DynamicCache

        groups = sorted(groups, key=lambda ix: len(items[ix[0]][0]))
        batches: list[list[list[int]]] = []
        for ix in groups:  # prompts of similar length together: a batch's prompt width is its last one's
            width = len(items[ix[0]][0])
            if not batches or len(batches[-1]) >= batch_size or (len(batches[-1]) + 1) * width > batch_tokens:
                batches.append([])
            batches[-1].append(ix)
        for batch in batches:
            prompts = [items[ix[0]][0] for ix in batch]
            wp = max(len(p) for p in prompts)
            ids = torch.zeros((len(prompts), wp), dtype=torch.long)
            for u, p in enumerate(prompts):
                ids[u, : len(p)] = torch.as_tensor(p)
            out = self.model.model(input_ids=ids.to(self.device), use_cache=True)
            last = torch.stack([out.last_hidden_state[u, len(p) - 1] for u, p in enumerate(prompts)])
            kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
            of = {i: u for u, ix in enumerate(batch) for i in ix}
            order = sorted(of, key=lambda i: len(items[i][1]))
            chunks: list[list[int]] = []
            for i in order:  # longest last; attention covers the prompt width too
                n = wp + len(items[i][1]) - 1
                if not chunks or len(chunks[-1]) >= batch_size or (len(chunks[-1]) + 1) * n > batch_tokens:
                    chunks.append([])
                chunks[-1].append(i)
            for chunk in chunks:
                us = torch.as_tensor([of[i] for i in chunk], device=self.device)
                seqs = [items[i][1][:-1] for i in chunk]  # the last completion token is never fed
                wc = max(len(s) for s in seqs)
                rows_of: list[torch.Tensor] = []
                if wc == 0:  # one-token completions: the prompt's last state is all there is
                    rows_of = [last[of[i]][None] for i in chunk]
                else:
                    ids = torch.zeros((len(chunk), wc), dtype=torch.long)
                    mask = torch.zeros((len(chunk), wp + wc), dtype=torch.long)
                    pos = torch.zeros((len(chunk), wc), dtype=torch.long)
                    for b, (i, s) in enumerate(zip(chunk, seqs, strict=True)):
                        at = len(items[i][0])
                        ids[b, : len(s)] = torch.as_tensor(s, dtype=torch.long)
                        mask[b, :at] = 1
                        mask[b, wp:] = 1
                        pos[b] = torch.arange(at, at + wc)
                    cache = DynamicCache()
                    for layer, (k, v) in enumerate(kv):
                        cache.update(k[us], v[us], layer)
                    hidden = self.model.model(
                        input_ids=ids.to(self.device), past_key_values=cache, attention_mask=mask.to(self.device),
                        position_ids=pos.to(self.device), use_cache=False,
                    ).last_hidden_state  # fmt: skip
                    rows_of = [
                        torch.cat([last[of[i]][None], hidden[b, : len(s)]])
                        for b, (i, s) in enumerate(zip(chunk, seqs, strict=True))
                    ]
                self._rows_out(torch.cat(rows_of), chunk, [len(items[i][1]) for i in chunk], results)

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
