"""The tokenizer-derived tools of a model: the one builder every role (worker, validator, coordinator,
the `rollout verify` and `toploc calibrate` commands, benchmarks) uses, so that all of them encode a
prompt, decode a completion and stop on the same tokens."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ModelTools:
    """Tokenizer-derived functions every role needs for a model, identical on all of them."""

    name: str
    path: Path
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    stop_ids: set[int]
    vocab_size: int = 0  # rows of the model's output layer: every token id it can emit is below this
    tokenizer_size: int = 0  # ids the tokenizer knows (len(tokenizer)); may be below vocab_size (padded rows)


def model_tools(name: str) -> ModelTools:
    """The tools of model `name` (anything `ensure_model` takes: `tiny`, `smollm2`, a model folder),
    building the model on first use. Blocking (loads a tokenizer): trio callers use a worker thread."""
    from transformers import AutoTokenizer

    from ..tasks.prompts import prompt_encoder, stop_ids
    from .models import ensure_model

    path = ensure_model(name)
    tok = AutoTokenizer.from_pretrained(str(path))
    return ModelTools(
        name,
        path,
        prompt_encoder(tok),
        lambda ids: str(tok.decode(ids, skip_special_tokens=True)),
        stop_ids(tok),
        model_vocab_size(path),
        len(tok),
    )


def model_vocab_size(path: Path) -> int:
    """The vocabulary size in a model folder's config.json (the embedding and output rows)."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    size = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"{path}/config.json has no vocab_size")
    return size
