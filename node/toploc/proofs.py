"""TOPLOC proofs: a worker commits to the last hidden states of its generation; a validator checks them.

For every chunk of 32 generated tokens the worker keeps the 128 largest-magnitude values of the
flattened [32, H] hidden states, as (index -> bf16 bit pattern) points, and encodes them as the
polynomial through those points over GF(65497) (indices reduced by the largest modulus m <= 65497
that keeps them distinct). A validator re-runs the prefill, takes its own top-128 indices, evaluates
the polynomial there and compares with its own values: honest hardware differences move mantissa
bits a little; another model, prompt or precision moves exponents and whole values.

Wire format, kept byte-identical to the reference `toploc` 0.1.6 (`build_proofs_bytes(h, 32, 128,
skip_prefill=True)` on a bf16 [T, H] tensor) so proofs interoperate: per chunk, the modulus as 2
big-endian bytes, then the 128 coefficients (ascending degree) as 2 big-endian bytes each: 258 bytes.

Deliberate differences from the reference, each because the reference's behaviour is unsafe:
- Input of any float dtype is rounded to bf16 first. The reference proves bf16 (and fp16 bit
  patterns); given fp32 it fails internally and returns all-zero "null" proofs with modulus 0.
- The top-k is selected on CPU. torch's order among tied values (common at the cut-off in bf16) is
  only reproducible within one implementation, and byte-equal proofs need the same tied indices.
- A chunk with fewer than `topk` values (a short tail with a small H) is proved from all its values
  and the coefficients are zero-padded; the reference nulls every proof of the sequence instead.
- Verification evaluates at index mod m (the reference's Python path uses the raw index, which fails
  honest chunks of more than 65,497 values), checks sign bits too, and rejects malformed proofs with
  `ProofFormatError` (the reference crashes the process on a zero modulus, aborts on extra proofs and
  silently ignores missing ones).

Everything here is pure: tensors and bytes in, bytes and figures out.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch

from node.errors import IntellectError

from . import _gf

CHUNK = 32
"""Generated tokens per proof."""
TOPK = 128
"""Values committed to per proof."""
MAX_MODULUS = _gf.PRIME
MAX_TOPK = 4096
"""Largest supported topk: keeps the O(k^2) interpolation arrays small and the exponent arithmetic in int32."""
NO_COMPARABLE_VALUE = 2.0**64
"""Mantissa error reported when no exponent matched, as the reference does: rejects under any threshold."""

_EXP_MASK = 0x7F80
_MANT_MASK = 0x007F


class ProofFormatError(IntellectError, ValueError):
    """A proof or hidden-state tensor that cannot be checked: the work is unverifiable, not merely wrong."""


def proof_size(topk: int = TOPK) -> int:
    """Bytes per proof: 2-byte modulus + topk 2-byte coefficients (258 for the default 128)."""
    return 2 + 2 * topk


@dataclass(frozen=True)
class ChunkCheck:
    """How far a proof is from the validator's own states for one chunk (higher is worse everywhere).

    Mantissa errors and sign mismatches are counted only where the exponents agree: elsewhere the
    proof's value is already counted as wrong, and a value evaluated at an index the worker did not
    commit to is noise.
    """

    index: int
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    sign_mismatches: int


@dataclass(frozen=True)
class Thresholds:
    """Acceptance limits for one chunk; inclusive, so a figure equal to its limit passes.

    The first three defaults are the values the TOPLOC authors used (38 of 128 exponents may differ,
    mantissa error mean <= 10 and median <= 8, in units of the 7-bit bf16 mantissa). They are not
    universal: calibrate them per model and hardware. The reference never checks signs; an honest
    value with a matching exponent never has a flipped sign (the top-k are the largest magnitudes),
    while a random value matches an exponent with p ~ 1/256, so a few sign flips already mean
    tampering. With at most 38 unmatched points, P(more than 4 by chance) < 1e-7.
    """

    exp_mismatch_max: int = 38
    mant_err_mean_max: float = 10.0
    mant_err_median_max: float = 8.0
    sign_mismatch_max: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            integral = f.name.endswith("mismatch_max")
            if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
                kind = "an integer" if integral else "a number"
                raise ValueError(f"threshold {f.name} must be {kind}, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"threshold {f.name} must be finite and >= 0, got {value!r}")

    def violations(self, check: ChunkCheck) -> list[str]:
        """Why `check` fails, one phrase per exceeded limit; empty when it passes (for evidence logs)."""
        out = []
        if check.exp_mismatches > self.exp_mismatch_max:
            out.append(f"{check.exp_mismatches} exponent mismatches > {self.exp_mismatch_max}")
        if check.mant_err_mean > self.mant_err_mean_max:
            out.append(f"mantissa error mean {check.mant_err_mean:g} > {self.mant_err_mean_max:g}")
        if check.mant_err_median > self.mant_err_median_max:
            out.append(f"mantissa error median {check.mant_err_median:g} > {self.mant_err_median_max:g}")
        if check.sign_mismatches > self.sign_mismatch_max:
            out.append(f"{check.sign_mismatches} sign mismatches > {self.sign_mismatch_max}")
        return out

    def accepts(self, check: ChunkCheck) -> bool:
        return not self.violations(check)

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Thresholds:
        """Thresholds from a JSON object; missing keys take the defaults, unknown keys are an error
        (a misspelt limit must not silently fall back to the default)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"thresholds must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown threshold key(s) {unknown}; expected some of {sorted(known)}")
        return cls(**dict(data))


DEFAULT_THRESHOLDS = Thresholds()


def _check_params(chunk: int, topk: int) -> None:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk must be an integer in [1, {MAX_TOPK}], got {topk!r}")


def _bf16_bits(hidden: object, what: str) -> np.ndarray:
    """The [T, H] states as bf16 bit patterns (int16, C-contiguous), after validating them.

    Only the rounding to bf16 runs in torch; the rest is numpy, which is single-threaded: each torch
    op over a large tensor is an OpenMP region, and a region stalls for a scheduler time slice when
    another process holds one of the cores (measured: 10x slower proofs on a busy 2-core machine).
    """
    if not isinstance(hidden, torch.Tensor):
        raise ProofFormatError(f"{what} must be a torch.Tensor, got {type(hidden).__name__}")
    if hidden.dim() != 2:
        raise ProofFormatError(f"{what} must be 2-D [tokens, hidden_size], got shape {tuple(hidden.shape)}")
    if hidden.shape[0] == 0 or hidden.shape[1] == 0:
        raise ProofFormatError(f"{what} is empty: shape {tuple(hidden.shape)}")
    if not hidden.is_floating_point():
        raise ProofFormatError(f"{what} must be floating point (bf16, fp16 or fp32), got {hidden.dtype}")
    bits = hidden.detach().to(torch.bfloat16).cpu().contiguous().view(torch.int16).numpy()
    special = (bits & _EXP_MASK) == _EXP_MASK  # all exponent bits set: inf or NaN
    if special.any():
        row, col = np.argwhere(special)[0]
        raise ProofFormatError(
            f"{what} contain {int(special.sum())} NaN/inf value(s) (after bf16 rounding), "
            f"first at token {row}, dim {col}"
        )
    return bits


@dataclass(frozen=True)
class _Selection:
    """Top-k points of a run of equally sized chunks: first chunk number, indices, bf16 bit patterns."""

    first: int
    idx: np.ndarray  # (n, k) int64 flat indices within each chunk
    bits: np.ndarray  # (n, k) int64 in [0, 65536)


def _select(bits: np.ndarray, chunk: int, topk: int) -> list[_Selection]:
    """Top-k by magnitude per chunk: full chunks in one batched call, the shorter tail in another.

    Magnitude order of bf16 values is the order of their bit patterns with the sign cleared, so the
    selection runs on int16 keys; torch's CPU top-k gives the same tied indices for any dtype with the
    same order (it compares values, then partial-sorts or selects depending on k and the row length),
    so the chosen set equals the reference's `flat.abs().topk(k)` on the bf16 chunk.
    """
    rows, width = bits.shape
    full, tail = divmod(rows, chunk)
    keys = torch.from_numpy(bits & 0x7FFF)
    parts = []
    if full:
        parts.append((0, full, chunk))
    if tail:
        parts.append((full * chunk, 1, tail))
    out = []
    for start, count, length in parts:
        n = length * width
        rows_of = slice(start, start + count * length)
        idx = keys[rows_of].reshape(count, n).topk(min(topk, n), dim=-1).indices.numpy()
        vals = np.take_along_axis(bits[rows_of].reshape(count, n), idx, axis=1)
        out.append(_Selection(start // chunk, idx, vals.astype(np.int64) & 0xFFFF))
    return out


def build_proofs(hidden: torch.Tensor, *, chunk: int = CHUNK, topk: int = TOPK) -> list[bytes]:
    """One proof (`proof_size(topk)` bytes) per `chunk` rows of `hidden` [T, H], the tail included.

    `hidden` holds the final-norm hidden states of the T positions that produced the T generated
    tokens. Byte-identical to the reference for bf16 input (and for `hidden.to(bfloat16)` otherwise).
    """
    _check_params(chunk, topk)
    bits = _bf16_bits(hidden, "hidden states")
    proofs: list[bytes] = []
    for sel in _select(bits, chunk, topk):
        moduli = _gf.injective_moduli(sel.idx)
        coeffs = _gf.interpolate(sel.idx % moduli[:, None], sel.bits)
        rows = np.zeros((len(moduli), 1 + topk), dtype=">u2")
        rows[:, 0] = moduli
        rows[:, 1 : 1 + coeffs.shape[1]] = coeffs
        proofs.extend(row.tobytes() for row in rows)
    return proofs


def _parse(proofs: object, expected: int, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """(moduli (n,), coefficients (n, topk)) from untrusted proof bytes, or a ProofFormatError."""
    if isinstance(proofs, (bytes, bytearray, str)) or not isinstance(proofs, Sequence):
        raise ProofFormatError(f"proofs must be a list of bytes, got {type(proofs).__name__}")
    if len(proofs) != expected:
        raise ProofFormatError(
            f"got {len(proofs)} proofs for {expected} chunks of hidden states; need exactly one per chunk"
        )
    size = proof_size(topk)
    for i, proof in enumerate(proofs):
        if not isinstance(proof, (bytes, bytearray, memoryview)):
            raise ProofFormatError(f"proof {i} must be bytes, got {type(proof).__name__}")
        if len(proof) != size:
            raise ProofFormatError(f"proof {i} is {len(proof)} bytes; a proof is exactly {size} bytes")
    raw = np.frombuffer(b"".join(bytes(p) for p in proofs), dtype=">u2").reshape(expected, 1 + topk)
    raw = raw.astype(np.int64)
    moduli, coeffs = raw[:, 0], raw[:, 1:]
    bad_mod = np.flatnonzero((moduli == 0) | (moduli > MAX_MODULUS))
    if bad_mod.size:
        i = int(bad_mod[0])
        raise ProofFormatError(f"proof {i} has modulus {moduli[i]}; it must be in [1, {MAX_MODULUS}]")
    bad = np.argwhere(coeffs >= _gf.PRIME)
    if bad.size:
        i, j = (int(v) for v in bad[0])
        raise ProofFormatError(
            f"proof {i} coefficient {j} is {coeffs[i, j]}, not a field element (< {_gf.PRIME}); "
            "honest builders always reduce it"
        )
    return moduli, coeffs


def verify_proofs(
    hidden: torch.Tensor, proofs: Sequence[bytes], *, chunk: int = CHUNK, topk: int = TOPK
) -> list[ChunkCheck]:
    """Compare `proofs` against the validator's own hidden states [T, H] (from its prefill), per chunk.

    Figures are those of the reference's C++ tensor path (exponent mismatches; mean and upper-middle
    median of |mantissa difference| where exponents match), plus sign mismatches. Judge them with
    `Thresholds.accepts`.
    """
    _check_params(chunk, topk)
    bits = _bf16_bits(hidden, "hidden states")
    expected = -(-bits.shape[0] // chunk)
    moduli, coeffs = _parse(proofs, expected, topk)
    checks: list[ChunkCheck] = []
    for sel in _select(bits, chunk, topk):
        n, k = sel.idx.shape
        which = slice(sel.first, sel.first + n)
        mod = moduli[which]
        short = np.flatnonzero(mod < k)
        if short.size:
            i = sel.first + int(short[0])
            raise ProofFormatError(f"proof {i} has modulus {moduli[i]}, too small to keep {k} indices distinct")
        claimed = _gf.evaluate(coeffs[which], sel.idx % mod[:, None])
        checks.extend(_compare(claimed, sel.bits, sel.first))
    return checks


def _compare(claimed: np.ndarray, own: np.ndarray, first: int) -> list[ChunkCheck]:
    """Exponent, mantissa and sign agreement of (n, k) bf16 bit patterns, vectorised over chunks."""
    exp_match = (claimed & _EXP_MASK) == (own & _EXP_MASK)
    matches = exp_match.sum(axis=1)
    sign_flip = ((claimed ^ own) & 0x8000) != 0
    sign_mismatches = (sign_flip & exp_match).sum(axis=1)
    err = np.abs((claimed & _MANT_MASK) - (own & _MANT_MASK))
    total = np.where(exp_match, err, 0).sum(axis=1)
    ordered = np.sort(np.where(exp_match, err, np.iinfo(np.int64).max), axis=1)  # unmatched sort last
    upper_mid = np.take_along_axis(ordered, (matches // 2)[:, None].clip(max=ordered.shape[1] - 1), axis=1)[:, 0]
    k = claimed.shape[1]
    out = []
    for i in range(claimed.shape[0]):
        m = int(matches[i])
        mean = float(total[i]) / m if m else NO_COMPARABLE_VALUE
        median = float(upper_mid[i]) if m else NO_COMPARABLE_VALUE
        out.append(ChunkCheck(first + i, k - m, mean, median, int(sign_mismatches[i])))
    return out


def proof_commitment(proofs: Sequence[bytes]) -> bytes:
    """sha256 over the concatenated proofs: the 32 bytes recorded on chain with the work.

    All proofs must have one length, so the concatenation splits back in exactly one way.
    """
    if isinstance(proofs, (bytes, bytearray, str)) or not isinstance(proofs, Sequence):
        raise ProofFormatError(f"proofs must be a list of bytes, got {type(proofs).__name__}")
    h = hashlib.sha256()
    size = None
    for i, proof in enumerate(proofs):
        if not isinstance(proof, (bytes, bytearray, memoryview)):
            raise ProofFormatError(f"proof {i} must be bytes, got {type(proof).__name__}")
        if size is None:
            size = len(proof)
        elif len(proof) != size:
            raise ProofFormatError(f"proof {i} is {len(proof)} bytes but proof 0 is {size}; proofs have one size")
        h.update(proof)
    return h.digest()
