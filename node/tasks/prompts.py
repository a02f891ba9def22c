"""Turning task text into prompt tokens the same way on the worker and on the validator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def prompt_encoder(tokenizer: Any, chat: bool | None = None) -> Callable[[str], list[int]]:
    """Text -> token ids: through the model's chat template (as a user turn, with the generation
    prompt) when it has one and `chat` is not False, else the plain tokenization with special tokens."""
    use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat

    def encode(text: str) -> list[int]:
        if use_chat:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return [int(t) for t in tokenizer(text, add_special_tokens=True)["input_ids"]]

    return encode


def stop_ids(tokenizer: Any) -> set[int]:
    """Token ids that end a completion: EOS (and the chat end-of-turn token when distinct)."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    for name in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(name)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids
