"""Exact sampling: seeded Gumbel-max sampling that a validator replays token by token.

A pool whose task spec sets `sampling.exact` has every completion drawn as

    token_j = argmax over the allowed tokens v of  logits_j[v] / T + g(seed, j, v)

where `seed = sample_seed(task_seed, group, sample)` (the task seed is the coordinator's, never the
worker's choice), j is the completion position, "allowed" is the top-k and then top-p set of the
tempered distribution (as vLLM builds it), and g is Gumbel noise made from (seed, j, v) by a
counter-based hash. Gumbel-max draws exactly from softmax(logits / T) restricted to the allowed set,
so honest sampling is unchanged in distribution; but each sample is now a function of its seed, so a
worker cannot keep its best draws, repeat one, re-order them, sample hotter or colder, or edit a token
without the replay finding the position where the seeded argmax is another token.

Device independence. The noise is built from integer arithmetic (32-bit multiply-xorshift rounds done
in int64 with no overflow) and a logarithm made of IEEE-exact steps (`frexp`, +, -, *, /, each one
correctly rounded and done as its own operation), so CPU and CUDA produce bit-identical noise; only the
model's logits differ between machines, and the replay allows a calibrated margin for that.

Pure functions over tensors (no I/O), shared by the worker's samplers (vLLM, transformers) and the
validator's check.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .checks import Reason, SamplingParams, Verdict, allowed

__all__ = ["allowed"]  # the sampler's allowed set lives with the sampling checks; its users import it here too

_M32 = 0xFFFFFFFF
_LN2 = math.log(2.0)
_SQRT_HALF = math.sqrt(0.5)
# 1/(2k+1) for the series log(m) = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), |s| <= 0.1716
_ATANH = [1.0 / (2 * k + 1) for k in range(11)]


def sample_seed(task_seed: int, group: int, sample: int) -> int:
    """The seed of completion `sample` of problem `group` in a task: 64 bits from the task's seed."""
    digest = hashlib.sha256(f"intellect-node/exact/1:{task_seed}:{group}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32, in place, for an int64 tensor holding 32-bit values: one product that never
    overflows int64 (a constant of 2^31 or more is used as c - 2^32, which is the same mod 2^32 and keeps
    |x * c| below 2^63), then the low 32 bits (two's complement: right for a negative product too)."""
    return x.mul_(c - (1 << 32) if c >= 1 << 31 else c).bitwise_and_(_M32)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit finaliser (multiply-xorshift, constants of the 'lowbias32' hash) on int64 tensors; `x`
    itself is left as it is (the first step makes the tensor the rest works on in place)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x ^= x >> 15
    x = _mul32(x, 0x846CA68B)
    x ^= x >> 16
    return x


def _mix_int(x: int) -> int:
    """`_mix` on one Python int."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _seed_key(seed: int) -> int:
    """The 32-bit key of a 64-bit seed."""
    s0, s1 = seed & _M32, (seed >> 32) & _M32
    return _mix_int(s0 ^ _mix_int(s1 ^ 0x9E3779B9))


def _row_keys(
    seeds: Sequence[int], positions: Sequence[int], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two 32-bit noise keys of rows drawn with `seeds[i]` at `positions[i]`, as two [n] int64
    tensors: each distinct seed's key once (Python ints), every position's in a few tensor passes."""
    by_seed = {s: _seed_key(s) for s in set(seeds)}
    key = torch.tensor([by_seed[s] for s in seeds], dtype=torch.int64, device=device)
    pos = torch.tensor(list(positions), dtype=torch.int64, device=device) & _M32
    k1 = _mix(key ^ _mix(pos ^ 0x85EBCA6B))
    return k1, _mix(k1 ^ 0xC2B2AE35)


def _hash(tokens: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """The noise bits of token ids under their positions' two keys (tensors that broadcast together)."""
    return _mix(_mix(tokens ^ first) ^ second)


def noise_bits(seed: int, positions: Sequence[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[P, V] int64 tensor of 32-bit hash values, one per (position, token id): the raw noise."""
    k1, k2 = _row_keys([seed] * len(positions), positions, device)
    tok = torch.arange(vocab, dtype=torch.int64, device=device)[None, :]
    return _hash(tok, k1[:, None], k2[:, None])


def _log(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive float64 values from IEEE-exact steps only (frexp and single + - * /),
    so that every device computes the same bits (library `log`s differ in the last place)."""
    m, e = torch.frexp(x)  # x = m * 2^e, m in [0.5, 1)
    small = m < _SQRT_HALF
    m = torch.where(small, m * 2.0, m)  # m in [0.707, 1.414)
    e = torch.where(small, e - 1, e).to(torch.float64)
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    acc = torch.full_like(z, _ATANH[-1])
    for c in reversed(_ATANH[:-1]):
        acc = acc * z
        acc = acc + c
    return e * _LN2 + (s * acc) * 2.0


def _uniform(bits: torch.Tensor) -> torch.Tensor:
    """32-bit noise as float64 in (0, 1), exactly."""
    return (bits.to(torch.float64) + 0.5) * (2.0**-32)


def _to_gumbel(bits: torch.Tensor) -> torch.Tensor:
    return -_log(-_log(_uniform(bits)))


def gumbel(seed: int, positions: Sequence[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[P, V] float64 Gumbel(0, 1) noise for `seed` at completion `positions`, identical on every device."""
    return _to_gumbel(noise_bits(seed, positions, vocab, device))


# The largest noise value there is (32-bit u at most 1 - 2^-33): no token's score exceeds its tempered
# logit by more, which lets the sampler and the replay skip tokens that cannot come near a known score.
G_MAX = float(_to_gumbel(torch.tensor([_M32], dtype=torch.int64))[0])


#: Values a block of `_noisy_max`'s dense pass holds (its tensors stay in cache between its steps).
_BLOCK_VALUES = 1 << 16


def _noisy_max(
    scaled: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor, among: torch.Tensor, floor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise max and argmax of `scaled + g` over the tokens in `among` ([n, V] bool), where row i's
    noise keys are `k1[i]`, `k2[i]`, for rows whose max reaches `floor[i]` (other rows: -inf).

    Exactly what the dense computation gives (ties included: the first index wins), at a fraction of its
    cost: the exact noise (its IEEE-exact log costs ~30 operations a value) is computed only for tokens
    whose score could reach the floor, found first by the bound G_MAX and then with the library log
    (which is off by far less than the slack allowed here: 1e-6, and more for huge scores)."""
    # the slack covers rounding at any magnitude (a tiny temperature makes scores huge)
    slack = (1e-6 + 1e-12 * floor.abs()).nan_to_num(nan=0.0, posinf=0.0)[:, None]
    floor = floor[:, None] - slack
    reach = among & (scaled + G_MAX >= floor)
    if 4 * int(reach.sum()) < reach.numel():  # few can reach: their noise alone
        r, v = torch.nonzero(reach, as_tuple=True)
        bits = _hash(v, k1[r], k2[r])
        near = scaled[r, v] - torch.log(-torch.log(_uniform(bits))) >= floor[r, 0]
        r, v, bits = r[near], v[near], bits[near]
    else:  # most can (a flat distribution): every token's noise with the library log, a cache-sized block
        # of rows at a time on a CPU (each of the ~30 steps is a pass over memory; a GPU takes all rows in one
        # pass), then exact noise for the few left
        tok = torch.arange(scaled.shape[-1], dtype=torch.int64, device=scaled.device)[None, :]
        cpu = scaled.device.type == "cpu"
        step = max(1, _BLOCK_VALUES // max(1, scaled.shape[-1])) if cpu else max(1, scaled.shape[0])
        for lo in range(0, scaled.shape[0], step):
            b = slice(lo, lo + step)
            g = -torch.log(-torch.log(_uniform(_hash(tok, k1[b, None], k2[b, None]))))
            reach[b] &= scaled[b] + g >= floor[b]
        r, v = torch.nonzero(reach, as_tuple=True)
        bits = _hash(v, k1[r], k2[r])
    score = torch.full_like(scaled, -math.inf)
    score[r, v] = scaled[r, v] + _to_gumbel(bits)
    return score.max(dim=-1)


def choose(logits: torch.Tensor, params: SamplingParams, seed: int, positions: Sequence[int]) -> torch.Tensor:
    """The token the exact sampler draws at each of `positions` from `logits` [P, V] (any float dtype):
    argmax of logits / T + Gumbel noise over the allowed tokens. Returns [P] int64."""
    return choose_rows(logits, params, [seed] * len(positions), positions)


def choose_rows(
    logits: torch.Tensor, params: SamplingParams, seeds: Sequence[int], positions: Sequence[int]
) -> torch.Tensor:
    """`choose` for rows of different completions at once (a sampler's batch): row i is drawn with
    `seeds[i]` at `positions[i]`, under the same terms. Returns [R] int64. The draw's score is at least
    that of the most likely allowed token, so only tokens that can reach it get their exact noise."""
    scaled = logits.to(torch.float64) / params.temperature
    k1, k2 = _row_keys(seeds, positions, scaled.device)
    ok = allowed(scaled, params.top_k, params.top_p)
    top = scaled.masked_fill(~ok, -math.inf).argmax(dim=-1)
    rows = torch.arange(scaled.shape[0], device=scaled.device)
    floor = scaled[rows, top] + _to_gumbel(_hash(top, k1, k2))
    return _noisy_max(scaled, k1, k2, ok, floor)[1]


@dataclass(frozen=True)
class Replay:
    """How a completion's tokens compare with the seeded argmax at every position, in raw-logprob units:
    `gap[j]` is how far the best allowed competitor scores above the sampled token (T x score
    difference; <= 0 when the token is the argmax; -inf when no competitor can come near it, and
    `best[j]` is then meaningless)."""

    gap: torch.Tensor  # [T] float64
    best: torch.Tensor  # [T] int64: the validator's seeded argmax


def replay(
    raw_logprobs: torch.Tensor,
    tokens: Sequence[int],
    params: SamplingParams,
    seed: int,
    margin: float,
    top_p_slack: float = 0.02,
) -> Replay:
    """The validator's replay of one completion from its own prefill rows `raw_logprobs` [T, V]
    (log-softmax of the raw logits, which differ from logits by a constant per row); `replay_many`
    for one completion."""
    return replay_many([(raw_logprobs, tokens, seed)], params, margin, top_p_slack)[0]


#: Values (rows x vocabulary) a replay pass holds at once: memory stays bounded for long completions and
#: large vocabularies, and a file's short completions share passes.
PASS_VALUES = 1 << 20


def replay_many(
    completions: Sequence[tuple[torch.Tensor, Sequence[int], int]],
    params: SamplingParams,
    margin: float,
    top_p_slack: float = 0.02,
    pass_values: int = PASS_VALUES,
) -> list[Replay]:
    """`replay` of several completions (`(raw_logprobs [T, V], tokens, seed)` each, one vocabulary), their
    rows taken `pass_values // V` at a time across completion boundaries: a file's completions are
    replayed in a few large passes instead of many small ones, with the same result.

    Near the edges of the allowed set the worker's numbers may differ from ours, so a competitor counts
    only if it is allowed by a clear margin: its tempered logit `margin / T` above the first value top-k
    leaves out, and inside top-p with the mass before it below top_p by `top_p_slack`. The sampled token
    itself is judged by the sampling checks (`check_sampling`), which allow the same slack at both edges.
    NaN in our own rows is our fault, not the worker's: a `ValueError`."""
    if not completions:
        return []
    V = completions[0][0].shape[-1]
    for raw, tokens, _ in completions:
        if raw.shape[-1] != V or raw.shape[0] != len(tokens):
            raise ValueError(f"replay rows {tuple(raw.shape)} do not match {len(tokens)} tokens of vocabulary {V}")
        if bool(torch.isnan(raw).any()):
            raise ValueError("the prefill gave NaN log-probabilities: the replay cannot judge this completion")
    device = completions[0][0].device
    # every row's noise keys, and the rows cut into passes of at most `per_pass` rows
    keys = [_row_keys([seed] * len(tokens), range(len(tokens)), device) for _, tokens, seed in completions]
    per_pass = max(1, pass_values // max(1, V))
    slices = [
        (i, lo, min(len(t), lo + per_pass))
        for i, (_, t, _) in enumerate(completions)
        for lo in range(0, len(t), per_pass)
    ]
    gaps: list[list[torch.Tensor]] = [[] for _ in completions]
    bests: list[list[torch.Tensor]] = [[] for _ in completions]
    start = 0
    while start < len(slices):
        block, rows = [], 0
        while start < len(slices) and (not block or rows + slices[start][2] - slices[start][1] <= per_pass):
            block.append(slices[start])
            rows += slices[start][2] - slices[start][1]
            start += 1
        raw = torch.cat([completions[i][0][lo:hi] for i, lo, hi in block])
        tok = torch.as_tensor(
            [t for i, lo, hi in block for t in completions[i][1][lo:hi]], dtype=torch.long, device=device
        )
        k1 = torch.cat([keys[i][0][lo:hi] for i, lo, hi in block])
        k2 = torch.cat([keys[i][1][lo:hi] for i, lo, hi in block])
        gap, best = _replay_rows(raw, tok, k1, k2, params, margin, top_p_slack)
        at = 0
        for i, lo, hi in block:
            gaps[i].append(gap[at : at + hi - lo])
            bests[i].append(best[at : at + hi - lo])
            at += hi - lo
    empty = Replay(torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.long))
    return [Replay(torch.cat(g), torch.cat(b)) if g else empty for g, b in zip(gaps, bests, strict=True)]


def _replay_rows(
    raw: torch.Tensor,
    tok: torch.Tensor,
    k1: torch.Tensor,
    k2: torch.Tensor,
    params: SamplingParams,
    margin: float,
    top_p_slack: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of (possibly several) completions: row i holds sampled token `tok[i]`, its position's noise
    keys `k1[i]`, `k2[i]`."""
    scaled = raw.to(torch.float64) / params.temperature
    n, V = scaled.shape
    rows = torch.arange(n, device=scaled.device)
    mine = scaled[rows, tok] + _to_gumbel(_hash(tok, k1, k2))
    competitors = torch.ones_like(scaled, dtype=torch.bool)
    if 0 < params.top_k < V:
        # clearly inside the top k: above the first value it leaves out (the (k+1)-th) by the margin
        first_out = torch.topk(scaled, params.top_k + 1, dim=-1).values[:, -1:]
        competitors &= scaled >= first_out + margin / params.temperature
    if params.top_p < 1.0:
        competitors &= allowed(scaled, params.top_k, max(params.top_p - top_p_slack, 1e-9))
    best_score, best = _noisy_max(scaled, k1, k2, competitors, mine)
    gap = (best_score - mine) * params.temperature
    return torch.where(torch.isfinite(gap), gap, torch.full_like(gap, -math.inf)), best


def runner_up(raw_logprobs: torch.Tensor, tokens: Sequence[int], params: SamplingParams, seed: int) -> torch.Tensor:
    """[T]: how far (raw-logprob units) each sampled token scored above the best other allowed token.
    Where it is below the replay margin, a worker could have sent that other token unseen: the freedom
    a margin leaves a cheater (calibration reports it). Every token's noise: for measurements only."""
    T = len(tokens)
    scaled = raw_logprobs.to(torch.float64) / params.temperature
    score = scaled + gumbel(seed, range(T), scaled.shape[-1], scaled.device)
    score = score.masked_fill(~allowed(scaled, params.top_k, params.top_p), -math.inf)
    tok = torch.as_tensor(list(tokens), dtype=torch.long, device=scaled.device)
    mine = score[torch.arange(T, device=scaled.device), tok]
    other = score.scatter(1, tok[:, None], -math.inf).max(dim=-1).values
    return (mine - other) * params.temperature


NEAR_POSITIONS = 2  # at most this many positions past the margin for a failure to count as near it


def check_replay(
    raw_logprobs: torch.Tensor,
    tokens: Sequence[int],
    params: SamplingParams,
    seed: int,
    margin: float,
    top_p_slack: float = 0.02,
) -> Verdict:
    """Every token is the seeded argmax, up to `margin` (raw-logprob units) for numerical differences
    between the worker's and the validator's kernels (`replay_verdict` of `replay`)."""
    if params.temperature <= 0 or not tokens:
        return Verdict(Reason.OK)
    return replay_verdict(replay(raw_logprobs, tokens, params, seed, margin, top_p_slack), tokens, margin)


def replay_verdict(r: Replay, tokens: Sequence[int], margin: float) -> Verdict:
    """The verdict on a completion's replay `r`: it names the first failing position, and says whether
    the failure is near the threshold (at most `NEAR_POSITIONS` positions past the margin, none past twice
    it: a numerical outlier is possible) or not."""
    if not len(r.gap):
        return Verdict(Reason.OK)
    worst = float(r.gap.max())
    figures = {"replay_gap_max": worst, "replay_margin": margin}
    bad = torch.nonzero(r.gap > margin)
    if not len(bad):
        return Verdict(Reason.OK, figures=figures)
    j = int(bad[0])
    # near the threshold: one or two positions just past the margin, what an honest numerical outlier
    # looks like; a worker steering many tokens by small gaps is not near it, however small the gaps
    near = worst <= 2 * margin and len(bad) <= NEAR_POSITIONS
    figures |= {"replay_position": float(j), "replay_failed_positions": float(len(bad)), "near_threshold": float(near)}
    return Verdict(
        Reason.REPLAY_MISMATCH,
        f"position {j}: token {int(tokens[j])} is {float(r.gap[j]):.3f} below the seeded draw {int(r.best[j])} "
        f"({len(bad)} of {len(tokens)} positions off by more than {margin})",
        figures,
    )
