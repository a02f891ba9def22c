"""Trainer test data shared by the unit tests and the FSDP script: a micro Llama (no tokenizer: the
trainer works on token ids) and rollout files of random tokens with given rewards."""

from __future__ import annotations

from pathlib import Path

import torch

from node.rollout.file import RolloutFile, RolloutHeader, RolloutSample


def micro_llama(out: Path, layers: int = 1) -> Path:
    """A Llama with a 32-token vocabulary and 16-wide hidden states, saved as safetensors in `out`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    return out


def rollout(version: int, rewards: list[list[float]], seed: int = 0) -> RolloutFile:
    """One group per row of `rewards` (a random prompt each), one sample per reward."""
    gen = torch.Generator().manual_seed(seed + 100 * version)
    samples = []
    for g, row in enumerate(rewards):
        prompt = torch.randint(3, 32, (4 + g,), generator=gen).tolist()
        for j, r in enumerate(row):
            n = 3 + (j % 4)
            comp = torch.randint(3, 32, (n,), generator=gen).tolist()
            samples.append(RolloutSample(g, j, f"t{g}", prompt, comp, [-1.0] * n, r, "length", []))
    header = RolloutHeader(1, "0x" + "ab" * 20, version, "thinking-budget", 0, {"temperature": 1.0}, "micro")
    return RolloutFile(header, samples)
