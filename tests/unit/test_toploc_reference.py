"""Byte compatibility with the reference `toploc` 0.1.6 library, in both directions.

The reference is called the way a worker of the original system proves [T, H] decode states:
`build_proofs_bytes(hidden, decode_batching_size=32, topk=128, skip_prefill=True)` (a tensor iterates
by rows, so each proof covers 32 rows), and its C++ tensor path `verify_proofs_bytes(hidden, proofs,
32, 128, skip_prefill=True)` checks them. It proves bf16 only, so fp32 inputs are compared through
`hidden.to(bfloat16)`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from node.toploc import MAX_MODULUS, build_proofs, verify_proofs
from node.toploc import _gf as gf

toploc = pytest.importorskip("toploc")
from toploc.C.csrc.ndd import compute_newton_coefficients, evaluate_polynomials  # noqa: E402
from toploc.C.csrc.poly import ProofPoly  # noqa: E402

NULL = bytes(258)


def states(T: int, H: int, seed: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g)
    if kind == "quantised":  # a handful of distinct magnitudes: ties everywhere, also at the cut-off
        h = (h * 3).round() / 3
    elif kind == "heavy":  # a few outlier dimensions, as real hidden states have
        h[:, :: max(1, H // 8)] *= 20
    return h


def ref_build(hb: torch.Tensor) -> list[bytes]:
    """The reference's proofs; where it gives up (a chunk with < 128 values nulls the whole list),
    the reference's own polynomial through all of that chunk's values, zero-padded to 128 terms."""
    proofs = toploc.build_proofs_bytes(hb, 32, 128, skip_prefill=True)
    if NULL not in proofs:
        return proofs
    out = []
    for start in range(0, hb.shape[0], 32):
        flat = hb[start : start + 32].reshape(-1)
        idx = flat.abs().topk(min(128, flat.numel())).indices
        raw = ProofPoly.from_points_tensor(idx, flat[idx]).to_bytes()
        out.append(raw + bytes(258 - len(raw)))
    return out


def ref_verify(hb: torch.Tensor, proofs: list[bytes]) -> list[tuple[int, float, float]]:
    return [
        (r.exp_mismatches, r.mant_err_mean, r.mant_err_median)
        for r in toploc.verify_proofs_bytes(hb, proofs, 32, 128, skip_prefill=True)
    ]


def ours(checks) -> list[tuple[int, float, float]]:
    return [(c.exp_mismatches, c.mant_err_mean, c.mant_err_median) for c in checks]


def cut_off_ties(hb: torch.Tensor) -> int:
    """How many chunks have more values equal to the 128th magnitude than fit in the top 128."""
    n = 0
    for start in range(0, hb.shape[0], 32):
        mag = hb[start : start + 32].reshape(-1).abs().float()
        if mag.numel() <= 128:
            continue
        kth = mag.topk(128).values[-1]
        n += int((mag > kth).sum() + (mag == kth).sum() > 128)
    return n


@pytest.mark.parametrize("T", [1, 31, 32, 33, 100, 257])
@pytest.mark.parametrize("H", [64, 256, 576])
@pytest.mark.parametrize("kind", ["normal", "quantised", "heavy"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_build_is_byte_identical(T: int, H: int, kind: str, dtype: torch.dtype) -> None:
    for seed in range(2):
        h = states(T, H, seed=1000 * seed + T + H, kind=kind).to(dtype)
        hb = h.to(torch.bfloat16)
        assert build_proofs(h) == ref_build(hb)


def test_ties_at_the_cut_off_are_exercised() -> None:
    """The equality above means something only if the inputs have ties the selection must break."""
    hb = states(257, 256, seed=1, kind="quantised").to(torch.bfloat16)
    assert cut_off_ties(hb) >= 5
    hb = states(257, 576, seed=2, kind="normal").to(torch.bfloat16)
    assert cut_off_ties(hb) >= 1
    assert build_proofs(hb) == ref_build(hb)


def test_reference_gives_null_proofs_where_we_do_not() -> None:
    """Surprises pinned: fp32 input, or a chunk of < 128 values, makes the reference log an error and
    return null proofs (modulus 0) for the whole sequence, one more than there are chunks. fp16 input
    it proves from fp16 bit patterns (which its own verify cannot check: it aborts the process)."""
    h = states(64, 64, seed=3, kind="normal")
    assert toploc.build_proofs_bytes(h, 32, 128, skip_prefill=True) == [NULL, NULL, NULL]
    assert build_proofs(h) == toploc.build_proofs_bytes(h.to(torch.bfloat16), 32, 128, skip_prefill=True)
    half = h.to(torch.float16)  # the reference interpolates fp16 bit patterns: another encoding
    assert toploc.build_proofs_bytes(half, 32, 128, skip_prefill=True) != build_proofs(half)
    assert build_proofs(half) == toploc.build_proofs_bytes(half.to(torch.bfloat16), 32, 128, skip_prefill=True)
    short = states(33, 64, seed=4, kind="normal").to(torch.bfloat16)
    assert toploc.build_proofs_bytes(short, 32, 128, skip_prefill=True) == [NULL, NULL, NULL]
    assert len(build_proofs(short)) == 2


@pytest.mark.parametrize(("T", "H"), [(32, 256), (100, 576), (257, 256), (64, 4096)])
@pytest.mark.parametrize("kind", ["normal", "quantised"])
def test_reference_verifies_our_proofs_with_our_figures(T: int, H: int, kind: str) -> None:
    h = states(T, H, seed=T * H, kind=kind)
    hb = h.to(torch.bfloat16)
    proofs = build_proofs(h)
    g = torch.Generator().manual_seed(5)
    noisy = h * (1 + 0.01 * torch.randn(h.shape, generator=g))
    other = states(T, H, seed=T * H + 1, kind=kind)
    for validator in (h, noisy, other):
        vb = validator.to(torch.bfloat16)
        assert ours(verify_proofs(validator, proofs)) == ref_verify(vb, proofs)
    assert all(r == (0, 0.0, 0.0) for r in ref_verify(hb, proofs))


@pytest.mark.parametrize(("T", "H"), [(33, 256), (257, 576)])
def test_we_verify_reference_proofs(T: int, H: int) -> None:
    hb = states(T, H, seed=6, kind="heavy").to(torch.bfloat16)
    proofs = toploc.build_proofs_bytes(hb, 32, 128, skip_prefill=True)
    checks = verify_proofs(hb, proofs)
    assert all(
        (c.exp_mismatches, c.mant_err_mean, c.mant_err_median, c.sign_mismatches) == (0, 0, 0, 0) for c in checks
    )
    assert all(c.sign_mismatches == 0 for c in verify_proofs(hb.float(), proofs))


def test_chunk_larger_than_the_field_agrees_with_cpp_not_python_path() -> None:
    """32 x 4096 values with the largest at flat indices i and i + 65497: the modulus drops below
    65497; the reference builds it right and its C++ verify agrees, its Python verify fails it."""
    h = torch.randn(32, 4096, generator=torch.Generator().manual_seed(7)) * 0.01
    for n, i in enumerate((7, 1234, 30000, 50001)):
        h.view(-1)[i] = 50.0 + n
        h.view(-1)[i + MAX_MODULUS] = -60.0 - n
    hb = h.to(torch.bfloat16)
    proofs = build_proofs(hb)
    assert int.from_bytes(proofs[0][:2], "big") < MAX_MODULUS
    assert proofs == toploc.build_proofs_bytes(hb, 32, 128, skip_prefill=True)
    assert ours(verify_proofs(hb, proofs)) == ref_verify(hb, proofs) == [(0, 0.0, 0.0)]
    [python_path] = toploc.verify_proofs_bytes(list(hb), proofs, 32, 128, skip_prefill=True)
    assert python_path.exp_mismatches > 38  # the reference's bug: raw index instead of index mod m


def test_interpolation_equals_reference_newton() -> None:
    rng = np.random.default_rng(8)
    for k in (1, 2, 3, 17, 64, 128):
        x = np.stack([rng.choice(MAX_MODULUS, size=k, replace=False) for _ in range(4)])
        x[0, 0] = 0
        y = rng.integers(0, 65536, size=(4, k))
        c = gf.interpolate(x, y)
        for n in range(4):
            assert c[n].tolist() == compute_newton_coefficients(x[n].tolist(), y[n].tolist())
            pts = rng.integers(0, 200_000, size=40)
            assert gf.evaluate(c[n : n + 1], pts[None])[0].tolist() == evaluate_polynomials(c[n].tolist(), pts.tolist())


def test_moduli_equal_reference() -> None:
    rng = np.random.default_rng(9)
    idx = np.stack([rng.choice(200_000, size=128, replace=False) for _ in range(6)])
    idx[1, :3] = [5, 5 + MAX_MODULUS, 5 + 2 * MAX_MODULUS]
    ys = [0] * 128
    expected = [ProofPoly.from_points(row.tolist(), ys).modulus for row in idx]
    assert gf.injective_moduli(idx).tolist() == expected
