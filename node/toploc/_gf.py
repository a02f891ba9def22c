"""Batched polynomial arithmetic over GF(65497), the field TOPLOC proofs live in.

A proof is the unique polynomial of degree < k through k points (index mod m -> bf16 bit pattern). The
reference builds it with an O(k^2) scalar Newton loop per chunk; a Python loop of that shape would cost
milliseconds per chunk. Here each step is a whole-array numpy operation over all chunks at once, so a
call costs a few dozen array operations whatever the number of chunks.

Interpolation uses the Lagrange form rewritten through power sums, which has no per-point loop:

    P(X)   = prod_j (X - x_j)                      monic, degree k (a product tree, log2 k levels)
    a_j    = y_j / P'(x_j)                          values times barycentric weights
    S_r    = sum_j a_j x_j^r                        r = 0 .. k-1
    c_i    = sum_{r=0}^{k-1-i} P_{i+1+r} S_r        the coefficients, ascending

because P(X)/(X - x_j) = sum_i X^i sum_{t>i} P_t x_j^(t-1-i). The interpolating polynomial is unique,
so these coefficients equal the reference's Newton coefficients exactly.

Powers x^r (r < 128) are split as x^(16a) * x^b: two small tables per point instead of a 128 x 128
one, and evaluating a polynomial or a power sum becomes two small matrix products.

Field elements are held as float64 integers: a product of two is < 2^32 and a sum of up to 256 such
products is < 2^40, exact within float64's 53-bit mantissa, so BLAS does the matrix products.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

PRIME = 65497
"""The field prime; also the largest modulus a proof may carry."""

_ORDER = PRIME - 1  # order of the multiplicative group, which is cyclic
_BABY = 16  # x^r = x^(16a) * x^b with b < 16

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def _prime_factors(n: int) -> list[int]:
    out: list[int] = []
    d = 2
    while d * d <= n:
        if n % d == 0:
            out.append(d)
            while n % d == 0:
                n //= d
        d += 1
    if n > 1:
        out.append(n)
    return out


def _primitive_root() -> int:
    factors = _prime_factors(_ORDER)
    g = 2
    while any(pow(g, _ORDER // q, PRIME) == 1 for q in factors):
        g += 1
    return g


def _tables() -> tuple[IntArray, IntArray]:
    """exp[e] = g^e for e in [0, p-1) and its inverse log[v] for v in [1, p); log[0] is -1 (unused).

    Built as an outer product of g^i (i < 256) and g^(256 b) so import costs well under 1 ms.
    """
    g = _primitive_root()
    low = np.empty(256, dtype=np.int64)
    high = np.empty(256, dtype=np.int64)
    low[0] = high[0] = 1
    g256 = pow(g, 256, PRIME)
    for i in range(1, 256):
        low[i] = low[i - 1] * g % PRIME
        high[i] = high[i - 1] * g256 % PRIME
    exp = (high[:, None] * low[None, :] % PRIME).reshape(-1)[:_ORDER].copy()
    log = np.full(PRIME, -1, dtype=np.int64)
    log[exp] = np.arange(_ORDER, dtype=np.int64)
    return exp, log


_EXP, _LOG = _tables()
_EXP_F = _EXP.astype(np.float64)
_INV_PRIME = 1.0 / PRIME
_LOG32 = np.where(_LOG < 0, 0, _LOG).astype(np.int32)  # log(0) read as 0; callers patch zero rows


def _reduce(v: FloatArray) -> FloatArray:
    """v mod p for exact float64 integers 0 <= v < 2^53.

    np.fmod is exact too but takes ~100 ns per element for values near 2^38 (it works bit by bit).
    The quotient estimate here is off by at most one, only at exact multiples of p; one compare fixes it.
    """
    if v.size <= 1024:  # below this, fewer numpy calls win
        return (v.astype(np.int64) % PRIME).astype(np.float64)
    r = v - np.floor(v * _INV_PRIME) * PRIME
    np.subtract(r, PRIME, out=r, where=r >= PRIME)
    return r


def inverse(v: IntArray) -> IntArray:
    """Elementwise multiplicative inverse of nonzero field elements."""
    v = v % PRIME
    if np.any(v == 0):
        raise ZeroDivisionError("0 has no inverse in GF(65497)")
    return _EXP[(-_LOG[v]) % _ORDER]


@dataclass(frozen=True)
class _Powers:
    """x^b (b < 16) and x^(16a) (a < giants) for a batch of points x, shapes (N, J, 16), (N, J, giants)."""

    baby: FloatArray
    giant: FloatArray

    @property
    def giants(self) -> int:
        return self.giant.shape[-1]


def _powers(x: IntArray, n: int) -> _Powers:
    """Powers of field elements x up to x^(n-1), split as x^(16a) * x^b.

    One table lookup for both: r * log(x) < 2^31 for r < 32768 fits int32, and numpy reduces int32 by a scalar
    through a fast division where int64 `%` costs ~4 ns per element. 0^0 = 1, as Horner's rule has it.
    """
    giants = -(-n // _BABY)
    if n > 32768:
        raise ValueError(f"powers up to x^{n - 1} would overflow the int32 exponent arithmetic")
    exponents = np.concatenate([np.arange(_BABY), np.arange(giants) * _BABY]).astype(np.int32)
    e = np.multiply.outer(_LOG32[x], exponents)
    e -= (e // np.int32(_ORDER)) * np.int32(_ORDER)
    table = np.take(_EXP_F, e)
    zero = x == 0
    if zero.any():
        table[zero] = (exponents == 0).astype(np.float64)
    return _Powers(table[..., :_BABY], table[..., _BABY:])


def _evaluate(coeffs: IntArray, pw: _Powers) -> IntArray:
    chunks, ncoef = coeffs.shape
    c = np.zeros((chunks, pw.giants * _BABY))
    c[:, :ncoef] = coeffs % PRIME
    c = c.reshape(chunks, pw.giants, _BABY)
    # inner[n, j, a] = sum_b x_j^b c[16a + b]; then sum_a x_j^(16a) inner[n, j, a]
    inner = _reduce(np.matmul(pw.baby, c.transpose(0, 2, 1)))
    return _reduce(np.einsum("nja,nja->nj", pw.giant, inner)).astype(np.int64)


def evaluate(coeffs: IntArray, x: IntArray) -> IntArray:
    """Evaluate polynomial coeffs[n, :] (ascending) at every x[n, j]; shapes (N, K), (N, J) -> (N, J).

    Coefficients and points are reduced mod p first, which is what Horner's rule mod p computes for
    any integer input (the reference accepts unreduced 16-bit coefficients from the wire).
    """
    return _evaluate(coeffs, _powers(x % PRIME, coeffs.shape[1]))


def _power_sums(a: FloatArray, pw: _Powers, n: int) -> FloatArray:
    """S[m, r] = sum_j a[m, j] x[m, j]^r for r < n, as float64 field elements."""
    weighted = _reduce(a[..., None] * pw.giant)  # (N, J, giants)
    s = _reduce(np.matmul(weighted.transpose(0, 2, 1), pw.baby))  # (N, giants, 16): S[16g + b]
    return s.reshape(a.shape[0], pw.giants * _BABY)[:, :n]


def _poly_mul_halves(polys: IntArray) -> IntArray:
    """Multiply the polynomials of the first half of axis 1 by those of the second half.

    Layout (coefficient, factor, chunk) keeps the long axes innermost, so numpy's inner loops stay
    wide even when the polynomials are short. The anti-diagonal sums of each m x m outer product are
    the product's coefficients: writing the outer product into rows padded to 2m and re-reading the
    buffer with row length 2m-1 shifts row i right by i, so one sum over rows gives all of them.
    The arrays are small (~1,000 elements per chunk in all), so int64 `%` costs less than the
    several operations of the float reduction.
    """
    m, factors, chunks = polys.shape
    half = factors // 2
    padded = np.zeros((m, 2 * m, half, chunks), dtype=np.int64)
    np.multiply(polys[:, None, :half], polys[None, :, half:], out=padded[:, :m])
    skewed = padded.reshape(2 * m * m, half, chunks)[: m * (2 * m - 1)].reshape(m, 2 * m - 1, half, chunks)
    return skewed.sum(axis=0) % PRIME


def vanishing_poly(x: IntArray) -> IntArray:
    """Ascending coefficients of prod_j (X - x[n, j]): shape (N, k + 1), monic."""
    chunks, k = x.shape
    size = 1 << max(0, (k - 1).bit_length())
    polys = np.zeros((2, size, chunks), dtype=np.int64)
    polys[0] = 1  # padding factors are the constant 1
    polys[0, :k] = ((-x) % PRIME).T
    polys[1, :k] = 1
    while polys.shape[1] > 1:
        polys = _poly_mul_halves(polys)
    return np.ascontiguousarray(polys[: k + 1, 0].T)


@cache
def _hankel_index(k: int) -> IntArray:
    return np.arange(k)[:, None] + np.arange(k)[None, :] + 1


def interpolate(x: IntArray, y: IntArray) -> IntArray:
    """Coefficients (ascending, shape (N, k)) of the polynomial of degree < k through (x, y) per row.

    x must hold k distinct field elements per row (callers reduce indices by an injective modulus
    first); y is reduced mod p, as the reference does.
    """
    if x.shape != y.shape or x.ndim != 2 or x.shape[-1] == 0:
        raise ValueError(f"need matching non-empty (N, k) point arrays, got {x.shape} and {y.shape}")
    k = x.shape[-1]
    x = x % PRIME
    y = y % PRIME
    srt = np.sort(x, axis=-1)
    if np.any(srt[:, 1:] == srt[:, :-1]):
        raise ValueError("interpolation points must be distinct")
    p = vanishing_poly(x)  # (N, k + 1)
    deriv = p[:, 1:] * np.arange(1, k + 1) % PRIME  # P', ascending, length k
    pw = _powers(x, k)
    a = (y * inverse(_evaluate(deriv, pw)) % PRIME).astype(np.float64)  # P'(x_j) != 0: x distinct
    s = _power_sums(a, pw, k)
    ppad = np.concatenate([p, np.zeros((p.shape[0], k), dtype=np.int64)], axis=-1).astype(np.float64)
    hankel = np.take(ppad, _hankel_index(k), axis=-1)  # hankel[n, i, r] = P_{i+1+r}, 0 past degree k
    return _reduce(np.matmul(hankel, s[:, :, None])[:, :, 0]).astype(np.int64)


def injective_moduli(idx: IntArray, upper: int = PRIME, block: int = 32) -> IntArray:
    """Per row of non-negative indices, the largest m <= upper with all idx % m distinct.

    Candidates are tested a block at a time for all unresolved rows together (reduce, sort, look for
    equal neighbours); random-looking index sets usually succeed within the first few candidates.
    Raises ValueError for a row where no modulus >= 1 works (impossible unless indices repeat).
    """
    rows = idx.shape[0]
    out = np.zeros(rows, dtype=np.int64)
    small = idx.max(axis=-1, initial=-1) < upper
    out[small] = upper  # every index is already its own residue
    todo = np.flatnonzero(~small)
    top = upper
    while todo.size:
        if top < 1:
            raise ValueError("no injective modulus exists: the indices are not distinct")
        cands = np.arange(top, max(top - block, 0), -1, dtype=np.int64)
        res = np.sort(idx[todo][None, :, :] % cands[:, None, None], axis=-1)
        ok = ~np.any(res[..., 1:] == res[..., :-1], axis=-1)
        found = ok.any(axis=0)
        out[todo[found]] = cands[ok[:, found].argmax(axis=0)]
        todo = todo[~found]
        top -= block
        block = min(block * 2, 4096)
    return out
