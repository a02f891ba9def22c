"""`intellect-node devnet`: the whole protocol on one machine, on a local anvil chain (see `run`):
`setup` (spec, options, keys, the pool), `procs` (every role as its own process), `report` (disputes,
outcome, audit and summary)."""

from .procs import Proc, make_procs, stop_all
from .report import check_outcome
from .run import DevnetFailed, orchestrate, run_devnet
from .setup import DevnetOptions, Roles, create_pool, peer_id_of

__all__ = [
    "DevnetFailed",
    "DevnetOptions",
    "Proc",
    "Roles",
    "check_outcome",
    "create_pool",
    "make_procs",
    "orchestrate",
    "peer_id_of",
    "run_devnet",
    "stop_all",
]
