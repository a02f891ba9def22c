"""TOPLOC proofs on synthetic hidden states: honest acceptance, rejection of other states, malformed
input, the thresholds' JSON form and the field arithmetic underneath. No reference library needed."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.toploc import (
    DEFAULT_THRESHOLDS,
    MAX_MODULUS,
    NO_COMPARABLE_VALUE,
    ChunkCheck,
    ProofFormatError,
    Thresholds,
    build_proofs,
    proof_commitment,
    proof_size,
    verify_proofs,
)
from node.toploc import _gf as gf


def states(T: int, H: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g).to(dtype)


def mlp_states(tokens: torch.Tensor, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A tiny 'model' (embedding, MLP, RMS norm) run at a given precision, to get realistic rounding."""
    g = torch.Generator().manual_seed(seed)
    H = 256
    emb = torch.randn(1000, H, generator=g)
    w1 = torch.randn(H, 4 * H, generator=g) / H**0.5
    w2 = torch.randn(4 * H, H, generator=g) / (4 * H) ** 0.5
    x = emb[tokens].to(dtype)
    h = x + torch.nn.functional.gelu(x @ w1.to(dtype)) @ w2.to(dtype)
    h = h.float()
    return (h / h.pow(2).mean(-1, keepdim=True).sqrt()).to(dtype)


def exact(check: ChunkCheck) -> bool:
    return (
        check.exp_mismatches == 0
        and check.mant_err_mean == 0
        and check.mant_err_median == 0
        and check.sign_mismatches == 0
    )


# --- honest verification -------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 31, 32, 33, 100])
@pytest.mark.parametrize("H", [64, 576])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_identical_states_verify_exactly(T: int, H: int, dtype: torch.dtype) -> None:
    h = states(T, H, seed=T * H, dtype=dtype)
    proofs = build_proofs(h)
    assert len(proofs) == -(-T // 32)
    assert all(len(p) == 258 == proof_size() for p in proofs)
    checks = verify_proofs(h, proofs)
    assert [c.index for c in checks] == list(range(len(proofs)))
    assert all(exact(c) and DEFAULT_THRESHOLDS.accepts(c) for c in checks)


def test_build_is_deterministic_and_precision_independent_after_bf16() -> None:
    h = states(70, 256, seed=1)
    proofs = build_proofs(h)
    assert proofs == build_proofs(h.clone()) == build_proofs(h.to(torch.bfloat16))
    assert proofs == build_proofs(h.t().contiguous().t())  # a non-contiguous view
    assert all(exact(c) for c in verify_proofs(h, tuple(proofs)))


def test_small_fp_noise_is_accepted() -> None:
    h = states(96, 576, seed=2)
    g = torch.Generator().manual_seed(3)
    noisy = h * (1 + 2**-9 * torch.randn(h.shape, generator=g))  # about half a bf16 ulp
    checks = verify_proofs(noisy, build_proofs(h))
    assert all(DEFAULT_THRESHOLDS.accepts(c) for c in checks), checks
    assert all(c.mant_err_median <= 1 for c in checks)


def test_bf16_worker_fp32_validator_is_accepted() -> None:
    tokens = torch.randint(0, 1000, (100,), generator=torch.Generator().manual_seed(4))
    worker = mlp_states(tokens, torch.bfloat16)
    validator = mlp_states(tokens, torch.float32)
    assert not torch.equal(worker.float(), validator.to(torch.bfloat16).float())  # the precisions differ
    checks = verify_proofs(validator, build_proofs(worker))
    assert all(DEFAULT_THRESHOLDS.accepts(c) for c in checks), checks


def test_other_states_are_rejected() -> None:
    h = states(100, 576, seed=5)
    proofs = build_proofs(h)
    for other in (states(100, 576, seed=6), h.roll(1, dims=0)):
        checks = verify_proofs(other, proofs)
        assert not any(DEFAULT_THRESHOLDS.accepts(c) for c in checks), checks


def test_other_prompt_through_same_model_is_rejected() -> None:
    g = torch.Generator().manual_seed(7)
    a, b = torch.randint(0, 1000, (64,), generator=g), torch.randint(0, 1000, (64,), generator=g)
    checks = verify_proofs(mlp_states(b, torch.float32), build_proofs(mlp_states(a, torch.float32)))
    assert not any(DEFAULT_THRESHOLDS.accepts(c) for c in checks)


def test_negated_states_pass_reference_figures_but_fail_on_signs() -> None:
    """Magnitude, exponent and mantissa are blind to a sign flip; the sign check is what catches it."""
    h = states(64, 256, seed=8)
    checks = verify_proofs(-h, build_proofs(h))
    for c in checks:
        assert (c.exp_mismatches, c.mant_err_mean, c.mant_err_median) == (0, 0.0, 0.0)
        assert c.sign_mismatches == 128
        assert not DEFAULT_THRESHOLDS.accepts(c)
        assert any("sign" in v for v in DEFAULT_THRESHOLDS.violations(c))


def planted_collisions(seed: int) -> torch.Tensor:
    """A 32 x 4096 chunk (131,072 values) whose largest values sit at flat indices i and i + 65497."""
    h = states(32, 4096, seed=seed) * 0.01
    flat = h.view(-1)
    for n, i in enumerate((7, 1234, 30000, 50001)):
        flat[i] = 50.0 + n
        flat[i + MAX_MODULUS] = -60.0 - n
    return h


def test_chunk_larger_than_the_field_verifies_honestly() -> None:
    h = planted_collisions(seed=9)
    proofs = build_proofs(h)
    modulus = int.from_bytes(proofs[0][:2], "big")
    assert modulus < MAX_MODULUS  # the raw indices collide mod p, so a smaller modulus was needed
    assert exact(verify_proofs(h, proofs)[0])
    assert not DEFAULT_THRESHOLDS.accepts(verify_proofs(states(32, 4096, seed=10), proofs)[0])


def test_tiny_tail_chunk_uses_all_its_values() -> None:
    h = states(33, 64, seed=11)  # the tail chunk holds 64 values, fewer than topk
    proofs = build_proofs(h)
    assert [len(p) for p in proofs] == [258, 258]
    assert proofs[1][2 + 2 * 64 :] == bytes(2 * 64)  # degree < 64: upper coefficients are zero
    checks = verify_proofs(h, proofs)
    assert all(exact(c) for c in checks)
    assert checks[1].exp_mismatches == 0


def test_other_chunk_and_topk_sizes() -> None:
    h = states(50, 128, seed=12)
    proofs = build_proofs(h, chunk=16, topk=64)
    assert len(proofs) == 4 and all(len(p) == proof_size(64) == 130 for p in proofs)
    assert all(exact(c) for c in verify_proofs(h, proofs, chunk=16, topk=64))


def craft_proof(values: np.ndarray, idx: np.ndarray) -> bytes:
    coeffs = gf.interpolate(idx[None, :], values[None, :])[0]
    return np.concatenate([[MAX_MODULUS], coeffs]).astype(">u2").tobytes()


def own_topk(h: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    bits = h.to(torch.bfloat16).view(torch.int16).reshape(-1)
    idx = (bits & 0x7FFF).topk(128).indices
    return idx.numpy().astype(np.int64), bits[idx].numpy().astype(np.int64) & 0xFFFF


def test_figures_on_a_crafted_proof() -> None:
    """Known perturbations give known figures; the median is the upper middle value, as the
    reference's C++ path reports it (statistics.median would say 1.0 here)."""
    h = torch.full((32, 64), 0.001)
    h.view(-1)[torch.randperm(2048, generator=torch.Generator().manual_seed(13))[:128]] = torch.linspace(1.0, 1.9, 128)
    idx, bits = own_topk(h)
    assert ((bits & 0x7F) <= 0x7D).all()
    claimed = bits.copy()
    claimed[:60] += 2  # mantissa off by 2 on 60 values
    claimed[120:] ^= 0x0100  # 8 exponents wrong: their mantissas are not compared
    [check] = verify_proofs(h, [craft_proof(claimed, idx)])
    assert check.exp_mismatches == 8
    assert check.mant_err_mean == 60 * 2 / 120
    assert check.mant_err_median == 2.0  # sorted: 60 zeros then 60 twos; element 120 // 2 is a two
    assert check.sign_mismatches == 0
    claimed[:4] ^= 0x8000
    assert verify_proofs(h, [craft_proof(claimed, idx)])[0].sign_mismatches == 4


def test_all_exponents_wrong_reports_no_comparable_value() -> None:
    h = states(32, 64, seed=14)
    idx, bits = own_topk(h)
    [check] = verify_proofs(h, [craft_proof(bits ^ 0x0100, idx)])
    assert check.exp_mismatches == 128
    assert check.mant_err_mean == check.mant_err_median == NO_COMPARABLE_VALUE
    assert not DEFAULT_THRESHOLDS.accepts(check)


# --- malformed input ------------------------------------------------------------------------------


def good() -> tuple[torch.Tensor, list[bytes]]:
    h = states(64, 64, seed=15)
    return h, build_proofs(h)


def with_modulus(proof: bytes, m: int) -> bytes:
    return m.to_bytes(2, "big") + proof[2:]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: [p[0][:-1], p[1]], r"proof 0 is 257 bytes; a proof is exactly 258 bytes"),
        (lambda p: [p[0], p[1] + b"\0"], r"proof 1 is 259 bytes"),
        (lambda p: [b"", p[1]], r"proof 0 is 0 bytes"),
        (lambda p: [p[0], with_modulus(p[1], 0)], r"proof 1 has modulus 0; it must be in \[1, 65497\]"),
        (lambda p: [with_modulus(p[0], 65498), p[1]], r"modulus 65498"),
        (lambda p: [with_modulus(p[0], 5), p[1]], r"modulus 5, too small to keep 128 indices distinct"),
        (lambda p: [p[0][:2] + b"\xff\xff" + p[0][4:], p[1]], r"coefficient 0 is 65535, not a field element"),
        (lambda p: p[:1], r"got 1 proofs for 2 chunks"),
        (lambda p: [*p, p[0]], r"got 3 proofs for 2 chunks"),
        (lambda p: [], r"got 0 proofs for 2 chunks"),
        (lambda p: [p[0], "x" * 258], r"proof 1 must be bytes, got str"),
        (lambda p: b"".join(p), r"proofs must be a list of bytes, got bytes"),
        (lambda p: None, r"proofs must be a list of bytes, got NoneType"),
    ],
)
def test_malformed_proofs(mutate, message) -> None:
    h, proofs = good()
    with pytest.raises(ProofFormatError, match=message):
        verify_proofs(h, mutate(proofs))


def bad_states() -> list[tuple[object, str]]:
    nan = states(40, 64, seed=16)
    nan[33, 5] = float("nan")
    inf = states(40, 64, seed=16).to(torch.bfloat16)
    inf[0, 1] = float("-inf")
    return [
        (torch.zeros(64), r"must be 2-D \[tokens, hidden_size\], got shape \(64,\)"),
        (torch.zeros(2, 32, 64), r"got shape \(2, 32, 64\)"),
        (torch.zeros(0, 64), r"is empty: shape \(0, 64\)"),
        (torch.zeros(32, 0), r"is empty"),
        (torch.zeros(32, 64, dtype=torch.int32), r"must be floating point .* got torch.int32"),
        (np.zeros((32, 64), dtype=np.float32), r"must be a torch.Tensor, got ndarray"),
        (nan, r"contain 1 NaN/inf value\(s\) .* first at token 33, dim 5"),
        (inf, r"first at token 0, dim 1"),
        (torch.full((32, 64), 3.4e38), r"NaN/inf .*after bf16 rounding"),  # finite fp32, inf in bf16
    ]


@pytest.mark.parametrize(("hidden", "message"), bad_states())
def test_malformed_states(hidden, message) -> None:
    with pytest.raises(ProofFormatError, match=message):
        build_proofs(hidden)
    with pytest.raises(ProofFormatError, match=message):
        verify_proofs(hidden, [bytes(258)] * 2)


def test_validator_states_of_another_length_are_a_count_error() -> None:
    _, proofs = good()
    with pytest.raises(ProofFormatError, match="got 2 proofs for 3 chunks"):
        verify_proofs(states(65, 64, seed=15), proofs)


@pytest.mark.parametrize(("kw", "message"), [({"chunk": 0}, "chunk"), ({"topk": 0}, "topk"), ({"topk": 70000}, "topk")])
def test_bad_parameters(kw: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_proofs(states(32, 64, seed=0), **kw)


def test_reference_null_proof_is_rejected() -> None:
    """What the reference emits when it fails internally: modulus 0, all coefficients 0."""
    h = states(32, 64, seed=17)
    with pytest.raises(ProofFormatError, match="modulus 0"):
        verify_proofs(h, [bytes(258)])


proof_bytes = st.one_of(
    st.binary(min_size=0, max_size=300),
    st.binary(min_size=258, max_size=258),
    st.builds(
        lambda m, rest: m.to_bytes(2, "big") + rest, st.integers(0, 65535), st.binary(min_size=256, max_size=256)
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(proof_bytes, min_size=0, max_size=3), st.integers(1, 70))
def test_fuzz_arbitrary_proof_bytes(proofs: list[bytes], T: int) -> None:
    h = states(T, 64, seed=T)
    try:
        checks = verify_proofs(h, proofs)
    except ProofFormatError:
        return
    assert len(checks) == len(proofs)
    for c in checks:
        assert 0 <= c.exp_mismatches <= 128 and 0 <= c.sign_mismatches <= 128
        assert c.mant_err_mean >= 0 and c.mant_err_median >= 0


# --- thresholds and commitment --------------------------------------------------------------------


def test_default_thresholds_are_the_reference_authors() -> None:
    t = Thresholds()
    assert (t.exp_mismatch_max, t.mant_err_mean_max, t.mant_err_median_max) == (38, 10.0, 8.0)
    assert t == DEFAULT_THRESHOLDS


def test_thresholds_are_inclusive() -> None:
    t = Thresholds()
    assert t.accepts(ChunkCheck(0, 38, 10.0, 8.0, 4))
    assert t.violations(ChunkCheck(0, 38, 10.0, 8.0, 4)) == []
    assert not t.accepts(ChunkCheck(0, 39, 0.0, 0.0, 0))
    assert not t.accepts(ChunkCheck(0, 0, 10.5, 0.0, 0))
    assert not t.accepts(ChunkCheck(0, 0, 0.0, 9.0, 0))
    assert not t.accepts(ChunkCheck(0, 0, 0.0, 0.0, 5))
    assert len(t.violations(ChunkCheck(3, 128, NO_COMPARABLE_VALUE, NO_COMPARABLE_VALUE, 9))) == 4


def test_thresholds_json_round_trip() -> None:
    t = Thresholds(exp_mismatch_max=20, mant_err_mean_max=4.5, mant_err_median_max=3, sign_mismatch_max=0)
    assert Thresholds.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert Thresholds.from_dict({"exp_mismatch_max": 10}) == Thresholds(exp_mismatch_max=10)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"exp_mismatches_max": 3}, "unknown threshold key"),
        ({"exp_mismatch_max": -1}, ">= 0"),
        ({"exp_mismatch_max": 2.5}, "must be an integer"),
        ({"sign_mismatch_max": True}, "must be an integer"),
        ({"mant_err_mean_max": "10"}, "must be a number"),
        ({"mant_err_mean_max": float("inf")}, "finite"),
        ([1, 2], "JSON object"),
    ],
)
def test_thresholds_reject_bad_json(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Thresholds.from_dict(data)  # type: ignore[arg-type]


def test_proof_commitment() -> None:
    _, proofs = good()
    c = proof_commitment(proofs)
    assert len(c) == 32 and c == hashlib.sha256(b"".join(proofs)).digest()
    tampered = [proofs[0], proofs[1][:-1] + bytes([proofs[1][-1] ^ 1])]
    assert proof_commitment(tampered) != c
    assert proof_commitment([]) == hashlib.sha256(b"").digest()
    with pytest.raises(ProofFormatError, match="one size"):
        proof_commitment([proofs[0], proofs[1][:-2]])
    with pytest.raises(ProofFormatError, match="list of bytes"):
        proof_commitment(b"".join(proofs))


# --- field arithmetic ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 130))
def test_interpolation_passes_through_its_points(data: st.DataObject, k: int) -> None:
    xs = data.draw(st.lists(st.integers(0, MAX_MODULUS - 1), min_size=k, max_size=k, unique=True))
    ys = data.draw(st.lists(st.integers(0, 65535), min_size=k, max_size=k))
    x, y = np.array([xs], dtype=np.int64), np.array([ys], dtype=np.int64)
    c = gf.interpolate(x, y)
    assert c.shape == (1, k) and ((c >= 0) & (c < MAX_MODULUS)).all()
    assert (gf.evaluate(c, x) == y % MAX_MODULUS).all()
    assert (gf.evaluate(gf.vanishing_poly(x)[:, :], x) == 0).all()


def test_evaluate_matches_horner() -> None:
    rng = np.random.default_rng(18)
    coeffs = rng.integers(0, 65536, size=(3, 128))  # unreduced, as on the wire
    x = rng.integers(0, 200_000, size=(3, 50))
    got = gf.evaluate(coeffs, x)
    for n in range(3):
        for j in range(50):
            acc = 0
            for c in reversed(coeffs[n].tolist()):
                acc = (acc * int(x[n, j]) + c) % MAX_MODULUS
            assert got[n, j] == acc


def test_injective_moduli_are_the_largest() -> None:
    rng = np.random.default_rng(19)
    idx = np.stack([rng.choice(131072, size=128, replace=False) for _ in range(20)])
    idx[0, :2] = [10, 10 + MAX_MODULUS]
    moduli = gf.injective_moduli(idx)
    for row, m in zip(idx, moduli, strict=True):
        assert len(set((row % m).tolist())) == 128
        for bigger in range(int(m) + 1, MAX_MODULUS + 1):
            assert len(set((row % bigger).tolist())) < 128
    assert moduli[0] < MAX_MODULUS
    assert (gf.injective_moduli(np.array([[0, 5, 65496]])) == MAX_MODULUS).all()
    with pytest.raises(ValueError, match="not distinct"):
        gf.injective_moduli(np.array([[70000, 70000]]))
