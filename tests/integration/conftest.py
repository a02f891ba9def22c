"""Fixtures for the inference-engine tests: tiny models built once per session, one real vLLM engine.

Starting vLLM costs seconds (imports, model inspection, KV cache), so the engine is session-scoped;
tests that change its weights restore them before returning.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # torch/vLLM imports stay out of the other integration tests' collection
    from node.inference.engine import HfPrefill, VllmEngine


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama (seed 0), built into a session temp dir."""
    from node.inference.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-seed0", seed=0)


@pytest.fixture(scope="session")
def tiny_model_other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer, different weights (seed 1): a stand-in for a new policy."""
    from node.inference.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-seed1", seed=1)


@pytest.fixture(scope="session")
def vllm_engine(tiny_model: Path) -> Iterator[VllmEngine]:
    """A real vLLM engine (fp32, CPU in-process) on the tiny model."""
    pytest.importorskip("vllm")
    from node.inference.engine import VllmEngine

    engine = VllmEngine(tiny_model, dtype="float32", seed=0, max_model_len=1024)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="session")
def hf_prefill(tiny_model: Path) -> HfPrefill:
    """The validator's transformers prefill on the same tiny model (fp32)."""
    from node.inference.engine import HfPrefill

    return HfPrefill(tiny_model, dtype="float32")
