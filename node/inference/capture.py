"""Per-token hidden states out of vLLM: vLLM 0.32 has no public output for them during generation, so the
V1 model runner's `_model_forward` is wrapped inside each vLLM worker (via `LLM.collective_rpc`) to
record, per internal request, the positions and final-norm states of every forward step; `VllmEngine`
pops the records and assembles, for every completion, the states of the positions that produced its
tokens. These functions run inside vLLM's worker processes."""

from __future__ import annotations

from typing import Any

import torch

_CAPTURE_ATTR = "_intellect_capture"


def _install_capture(worker: Any) -> bool:
    """Wrap the worker's model runner so every forward step records final hidden states per request.

    Records, per internal request id, the positions >= num_prompt_tokens-1 (the only rows a proof needs)
    and their states as float32 CPU tensors. Idempotent.
    """
    runner = worker.model_runner
    if getattr(runner, _CAPTURE_ATTR, None) is not None:
        return True
    for attr in ("_model_forward", "input_batch", "query_start_loc", "requests"):
        if not hasattr(runner, attr):
            raise RuntimeError(
                f"vLLM model runner {type(runner).__name__} lacks {attr!r}: hidden-state capture needs the "
                "V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)"
            )
    records: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    original = runner._model_forward

    def forward_and_record(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        hidden = out[0] if isinstance(out, tuple) else out
        positions = kwargs.get("positions")
        if positions is None and len(args) > 1:
            positions = args[1]
        if not isinstance(hidden, torch.Tensor) or not isinstance(positions, torch.Tensor) or positions.dim() != 1:
            return out  # pipeline-parallel intermediate ranks, M-RoPE models: not supported, record nothing
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        if num_reqs == 0:
            return out
        req_ids = batch.req_ids[:num_reqs]
        qsl = runner.query_start_loc.cpu[: num_reqs + 1].tolist()
        pos_cpu = positions[: qsl[-1]].to("cpu", non_blocking=False)
        for i, rid in enumerate(req_ids):
            state = runner.requests.get(rid)
            if state is None or state.sampling_params is None:
                continue
            lo, hi = qsl[i], qsl[i + 1]
            if hi <= lo:
                continue
            pos = pos_cpu[lo:hi]
            keep = pos >= state.num_prompt_tokens - 1
            if not bool(keep.any()):
                continue
            rows = torch.nonzero(keep).squeeze(1) + lo
            states = hidden.index_select(0, rows.to(hidden.device)).to("cpu", torch.float32)
            records.setdefault(rid, []).append((pos[keep].clone(), states))
        return out

    runner._model_forward = forward_and_record
    setattr(runner, _CAPTURE_ATTR, records)
    return True


def _eager_token_ranks(worker: Any) -> bool:
    """Replace vLLM's torch.compile'd token-rank counter with its eager equivalent (CPU only).

    vLLM computes the rank of every sampled token whenever logprobs are requested, with a function
    compiled by inductor on first use: 3 s with a warm inductor cache and ~20 s cold on 2 cores, in the
    first `generate`. We never use the ranks, and eagerly the count is one comparison and a sum.
    """
    import vllm.v1.sample.sampler as sampler

    def count_greater_equal(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return (x >= values).sum(-1)

    sampler.batched_count_greater_than = count_greater_equal  # type: ignore[attr-defined]
    return True


def _pop_captured(worker: Any) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Hand over and forget everything recorded so far (keyed by internal request id)."""
    records: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = getattr(worker.model_runner, _CAPTURE_ATTR)
    out = dict(records)
    records.clear()
    return out


def _assemble_hidden(
    pieces: list[tuple[torch.Tensor, torch.Tensor]], first_pos: int, length: int, hidden_size: int
) -> torch.Tensor:
    """Place recorded (positions, states) rows into [length, H] for positions first_pos..first_pos+length-1.

    Later pieces overwrite earlier ones, so a request that vLLM preempted and recomputed keeps the
    states of its final computation.
    """
    out = torch.empty(length, hidden_size, dtype=torch.float32)
    filled = torch.zeros(length, dtype=torch.bool)
    for pos, states in pieces:
        idx = pos.to(torch.long) - first_pos
        ok = (idx >= 0) & (idx < length)
        out[idx[ok]] = states[ok]
        filled[idx[ok]] = True
    if not bool(filled.all()):
        missing = (~filled).nonzero().squeeze(1).tolist()[:8]
        raise RuntimeError(f"hidden states missing for completion rows {missing} (of {length})")
    return out
