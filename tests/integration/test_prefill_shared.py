"""The validator's prefill with a shared prompt fed once (`HfPrefill(share_prompts=True)`, the fp32
default): a task's group of completions gets the same states and log-probs as when each completion is
fed whole with its prompt, in the order given, whatever the batch limits, with one-token completions,
prompts of other lengths side by side, prompts with a single completion and repeated pairs; and it
feeds fewer positions through the model."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from node.inference.hf import HfPrefill


def pairs_of_groups() -> list[tuple[list[int], list[int]]]:
    rng = random.Random(7)

    def tokens(lo: int, hi: int) -> list[int]:
        return [rng.randrange(3, 512) for _ in range(rng.randrange(lo, hi))]

    pairs = []
    for _ in range(7):  # groups of 1 to 5 completions under prompts of 4 to 70 tokens
        prompt = tokens(4, 70)
        pairs += [(prompt, tokens(1, 48)) for _ in range(rng.randrange(1, 6))]
    pairs.append((pairs[0][0], [11]))  # a one-token completion beside its group's longer ones
    pairs.append((tokens(2, 6), [12]))  # a short prompt alone, one token
    pairs.append(pairs[3])  # the same pair twice
    rng.shuffle(pairs)
    return pairs


def fed_positions(prefill: HfPrefill, pairs: list[tuple[list[int], list[int]]], **limits: int) -> tuple[list, int]:
    fed = 0

    def count(module: torch.nn.Module, args: tuple) -> None:
        nonlocal fed
        fed += args[0].numel()

    hook = prefill.model.model.embed_tokens.register_forward_pre_hook(count)
    try:
        return prefill.prefill_many(pairs, **limits), fed
    finally:
        hook.remove()


@pytest.mark.parametrize("limits", [{}, {"batch_size": 2, "batch_tokens": 64}, {"batch_size": 3, "batch_tokens": 100}])
def test_a_shared_prompt_fed_once_gives_the_whole_pass_results(tiny_model: Path, limits: dict[str, int]) -> None:
    pairs = pairs_of_groups()
    shared = HfPrefill(tiny_model, dtype="float32")
    whole = HfPrefill(tiny_model, dtype="float32", share_prompts=False)
    assert shared.share_prompts and not whole.share_prompts  # fp32's default
    got, fed_shared = fed_positions(shared, pairs, **limits)
    want, fed_whole = fed_positions(whole, pairs, **limits)
    assert len(got) == len(pairs)
    for (_, completion), a, b in zip(pairs, got, want, strict=True):
        assert a.hidden.shape == (len(completion), shared.hidden_size)
        assert a.logprobs.shape == (len(completion), shared.vocab_size)
        assert float((a.hidden - b.hidden).abs().max()) < 1e-5
        assert float((a.logprobs - b.logprobs).abs().max()) < 1e-5
    alone = shared.prefill(*pairs[0])  # a pair on its own is fed whole
    assert float((alone.logprobs - got[0].logprobs).abs().max()) < 1e-5
    if not limits:  # positions through the model, padding included: what the forward passes cost
        assert fed_shared < 0.8 * fed_whole, (fed_shared, fed_whole)


def test_bf16_keeps_the_whole_pass_by_default(tiny_model: Path) -> None:
    """bf16's rounding under a shared prompt differs from the whole pass by up to ~0.08 in a logprob,
    and the shipped replay margin was measured on the whole pass: not shared unless asked for."""
    assert not HfPrefill(tiny_model, dtype="bfloat16").share_prompts
    assert HfPrefill(tiny_model, dtype="bfloat16", share_prompts=True).share_prompts


def test_sharing_only_where_a_prompt_alone_is_the_same_computation() -> None:
    """`prompt_sharing_safe`: full-attention Llama/Qwen with static rotary positions only. A sliding
    window (its mask follows cache indices, which a padded prompt shifts; its cache keeps only the
    window) or length-dependent rotary frequencies (dynamic NTK) would give other log-probs."""
    from transformers import Gemma3TextConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    from node.inference.hf import prompt_sharing_safe

    assert prompt_sharing_safe(LlamaConfig()) and prompt_sharing_safe(Qwen2Config())
    llama3 = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}  # fmt: skip
    assert prompt_sharing_safe(LlamaConfig(rope_parameters=llama3))
    assert not prompt_sharing_safe(
        LlamaConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    )
    assert not prompt_sharing_safe(MistralConfig(sliding_window=16))
    assert not prompt_sharing_safe(Qwen2Config(use_sliding_window=True, sliding_window=16, max_window_layers=1))
    assert not prompt_sharing_safe(Gemma3TextConfig())  # sliding layers
    assert not prompt_sharing_safe(GPT2Config())  # an architecture not known to be safe


def test_a_sliding_window_model_is_fed_whole(tmp_path: Path) -> None:
    """A pool may name any model folder. On a sliding-window model (window 16) a shared prompt gave
    log-probs 0.3-0.5 off for the shorter of two prompts: such a model is fed whole, and asking for
    sharing is refused."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=16)  # fmt: skip
    MistralForCausalLM(config).save_pretrained(tmp_path / "sw16")
    prefill = HfPrefill(tmp_path / "sw16", dtype="float32")
    assert not prefill.share_prompts
    with pytest.raises(ValueError, match="whole pass"):
        HfPrefill(tmp_path / "sw16", dtype="float32", share_prompts=True)
    rng = random.Random(0)
    short, long = [rng.randrange(3, 512) for _ in range(4)], [rng.randrange(3, 512) for _ in range(10)]
    pairs = [(p, [rng.randrange(3, 512) for _ in range(20)]) for p in (short, short, long, long)]
    for (p, c), got in zip(pairs, prefill.prefill_many(pairs), strict=True):
        assert float((got.logprobs - prefill.prefill(p, c).logprobs).abs().max()) < 1e-5
