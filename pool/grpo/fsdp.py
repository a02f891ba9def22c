"""Multi-GPU training with FSDP2 under `torchrun`: each decoder layer is its own shard unit (gathered just in
time), then the root; statistics are all-reduced across ranks. Written for multi-GPU nodes; the suite
runs it on CPU over gloo (`tests/integration/test_fsdp.py`: two ranks end with the same weights as one
process)."""

from __future__ import annotations

from typing import Any

import torch


def shard(model: Any) -> None:
    """FSDP2: each decoder layer is its own unit (gathered just in time), then the root."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers or []:
        fully_shard(layer)
    fully_shard(model)


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """`values` summed (or maxed) over the ranks, as float64."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    red = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
    torch.distributed.all_reduce(t, op=red)
    return t.tolist()
