"""vLLM in this process: the environment it reads at start, and the lifetime of each `LLM` (open,
counted, shut down without breaking the others)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from node.inference.models import default_cache_dir

if TYPE_CHECKING:
    from vllm import LLM


def _configure_vllm_env(gpu: bool) -> None:
    """Environment vLLM reads at import/engine start. Only sets what the caller has not set.

    CPU (tests, small nodes): in-process engine core (no `__main__` guard needed, no second process)
    and a 1 GiB KV cache. Everywhere: no hub access, a persistent vLLM cache dir, and the V1 model runner, because
    the hidden-state capture hooks its `_model_forward`/`input_batch` (the V2 runner, default on GPUs
    with Triton, lays batches out differently). With a multiprocess engine core (the GPU default), the
    capture functions travel to the worker by cloudpickle, which vLLM only allows with insecure
    serialization switched on.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    # vLLM logs to stdout by default; commands keep stdout for their own output (`--json`)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    # A private but persistent cache: vLLM stores its per-architecture "model info" there. On a miss it
    # inspects the model class in a fresh subprocess that imports vLLM (~9 s on 2 cores), so a throw-away
    # cache dir would cost that on every engine start.
    os.environ.setdefault("VLLM_CACHE_ROOT", str(default_cache_dir().parent / "vllm"))
    if not gpu:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


# LLMs open in this process. vLLM 0.32's in-process engine core (CPU: VLLM_ENABLE_V1_MULTIPROCESSING=0)
# tears down the process-wide distributed state (`cleanup_dist_env_and_memory`: the model-parallel
# groups every in-process engine's forward pass reads) when it shuts down, so closing one LLM broke
# every other LLM still open in the process ("pipeline model parallel group is not initialized").
_open_llms: list[int] = [0]
_open_lock = threading.Lock()


def _open_llm(**kwargs: Any) -> LLM:
    """`vllm.LLM(**kwargs)`, counted open until `_shutdown_llm`."""
    from vllm import LLM

    llm = LLM(**kwargs)
    with _open_lock:
        _open_llms[0] += 1
    return llm


@contextlib.contextmanager
def _keep_distributed_state(keep: bool) -> Iterator[None]:
    """While `keep`, an in-process engine core's shutdown frees memory but leaves the process-wide
    distributed state to the LLMs still open (the one place vLLM 0.32's `EngineCore.shutdown` is
    patched; a vLLM without that name is left alone)."""
    import vllm.v1.engine.core as core_mod

    original = getattr(core_mod, "cleanup_dist_env_and_memory", None)
    if not keep or original is None:
        yield
        return

    def free_memory_only(*_: Any, **__: Any) -> None:
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    core_mod.cleanup_dist_env_and_memory = free_memory_only  # type: ignore[attr-defined]
    try:
        yield
    finally:
        core_mod.cleanup_dist_env_and_memory = original  # type: ignore[attr-defined]


def _shutdown_llm(llm: LLM, gpu: bool) -> None:
    """Stop an `LLM`'s engine core (its worker processes, with multiprocessing) and drop its memory;
    the process's distributed state stays while other LLMs are open here."""
    import gc

    with _open_lock:
        _open_llms[0] = max(0, _open_llms[0] - 1)
        others = _open_llms[0] > 0
    core = getattr(llm.llm_engine, "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    try:
        if callable(shutdown):
            with _keep_distributed_state(others):
                shutdown()
    finally:
        del llm, core
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
