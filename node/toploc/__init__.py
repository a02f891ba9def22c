"""TOPLOC proofs of inference: workers commit to their last hidden states, validators check them.

`build_proofs` (worker) and `verify_proofs` (validator) are pure functions over tensors and bytes;
`Thresholds` turns a `ChunkCheck` into accept/reject; `proof_commitment` is what goes on chain.
The wire format is byte-compatible with the reference `toploc` 0.1.6 library.
"""

from .proofs import (
    CHUNK,
    DEFAULT_THRESHOLDS,
    MAX_MODULUS,
    NO_COMPARABLE_VALUE,
    TOPK,
    ChunkCheck,
    ProofFormatError,
    Thresholds,
    build_proofs,
    proof_commitment,
    proof_size,
    verify_proofs,
)

__all__ = [
    "CHUNK",
    "DEFAULT_THRESHOLDS",
    "MAX_MODULUS",
    "NO_COMPARABLE_VALUE",
    "TOPK",
    "ChunkCheck",
    "ProofFormatError",
    "Thresholds",
    "build_proofs",
    "proof_commitment",
    "proof_size",
    "verify_proofs",
]
