"""Rollout checks that TOPLOC cannot make: TOPLOC proves which model computed the hidden states, but
not how tokens were sampled from them. From the validator's own prefill these checks decide whether
every sampled token was possible under the claimed sampling parameters, whether the reported
logprobs are the model's, whether the temperature matches statistically, whether the completion
ended honestly, and whether the claimed reward is the task's.

Pure functions over tensors and lists; each returns a `Verdict` with a reason code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import torch


class Reason(StrEnum):
    OK = "ok"
    PROOF_MALFORMED = "proof_malformed"
    TOPLOC_EXPONENT = "toploc_exponent_mismatch"
    TOPLOC_MANTISSA = "toploc_mantissa_error"
    TOPLOC_SIGN = "toploc_sign_mismatch"
    PROMPT_MISMATCH = "prompt_mismatch"
    TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
    TOKEN_NOT_GREEDY = "token_not_greedy"
    TOKEN_OUTSIDE_TOP_K = "token_outside_top_k"
    TOKEN_OUTSIDE_TOP_P = "token_outside_top_p"
    LOGPROB_MISMATCH = "logprob_mismatch"
    TEMPERATURE_MISMATCH = "temperature_mismatch"
    REPLAY_MISMATCH = "replay_mismatch"
    BAD_TERMINATION = "bad_termination"
    TOO_LONG = "too_long"
    REWARD_MISMATCH = "reward_mismatch"
    DUPLICATE_SAMPLES = "duplicate_samples"
    MALFORMED = "malformed_rollout"
    # the file is not what the coordinator recorded for it (another policy version): the record is the
    # coordinator's doing, never the node's, so the units are revoked without a slash
    RECORD_MISMATCH = "record_mismatch"
    # the file names no weights, or weights nobody announced for its version: it cannot be judged against
    # what its worker signed for, so its units are revoked without a slash (`node.policy.weights_of`)
    WEIGHTS_UNKNOWN = "weights_unknown"
    UNSIGNED = "not_signed_by_node"
    UNAVAILABLE = "data_unavailable"


@dataclass(frozen=True)
class Verdict:
    reason: Reason
    detail: str = ""
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.reason is Reason.OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = str(self.reason)
        return d


OK = Verdict(Reason.OK)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    exact: bool = False  # seeded Gumbel-max sampling the validator replays (`node.rollout.exact`)


@dataclass(frozen=True)
class SamplingTolerances:
    """Slack for numeric differences between the worker's and the validator's kernels; calibrated
    per model (see `node.calibrate`)."""

    logprob_max_abs: float = 0.05
    top_p_slack: float = 0.02
    greedy_logprob_slack: float = 0.05
    temperature_z_max: float = 6.0
    # exact sampling: how far (raw logprob units) the sampled token may score below the seeded argmax;
    # 0 means "not calibrated": twice `logprob_max_abs` (both tokens' logprobs may be off by that much)
    replay_margin: float = 0.0
    # exact sampling: the share of honest tokens that are not the validator's seeded argmax (numerical
    # near-ties), with headroom; 0 means "not calibrated": the share a margin-wide tie could reach
    replay_disagree_rate: float = 0.0

    @property
    def margin(self) -> float:
        """The replay margin in force."""
        return self.replay_margin if self.replay_margin > 0 else 2.0 * self.logprob_max_abs

    def disagree_rate(self, temperature: float) -> float:
        """The honest rate of tokens that are not the seeded argmax the steering test allows: the
        calibrated one (measured at temperature 1, divided by a lower temperature: the tempered scores'
        spacing shrinks with it; measured on tiny, the honest rate grows more slowly), else the chance that the best two Gumbel-perturbed scores fall within the margin
        (their spacing is about exponential with rate 1 in tempered units): a bound no honest run exceeds,
        and no test at all against a worker steering within the margin."""
        if self.replay_disagree_rate > 0:  # calibrated at temperature 1: colder, near-ties are closer
            return min(1.0, self.replay_disagree_rate / min(1.0, max(temperature, 1e-6)))
        return min(1.0, self.margin / max(temperature, 1e-6))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingTolerances:
        return cls(**{k: float(v) for k, v in d.items() if k in cls.__dataclass_fields__})


# ------------------------------------------------------------------------------------ termination


def check_termination(tokens: list[int], finish_reason: str, max_tokens: int, stop_ids: set[int]) -> Verdict:
    """A completion ends with a stop token ("stop") or at exactly max_tokens ("length"); a stop
    token anywhere before the end means text was appended after the model stopped."""
    n = len(tokens)
    if n == 0:
        return Verdict(Reason.BAD_TERMINATION, "empty completion")
    if n > max_tokens:
        return Verdict(Reason.TOO_LONG, f"{n} tokens, max_tokens is {max_tokens}")
    early = [i for i, t in enumerate(tokens[:-1]) if t in stop_ids]
    if early:
        return Verdict(Reason.BAD_TERMINATION, f"stop token at position {early[0]} before the end")
    if finish_reason == "stop":
        if tokens[-1] not in stop_ids:
            return Verdict(Reason.BAD_TERMINATION, f"finish 'stop' but last token {tokens[-1]} is no stop token")
        return OK
    if finish_reason == "length":
        if n != max_tokens:
            return Verdict(Reason.BAD_TERMINATION, f"finish 'length' after {n} of {max_tokens} tokens (truncated)")
        return OK
    return Verdict(Reason.BAD_TERMINATION, f"unknown finish reason {finish_reason!r}")


# ------------------------------------------------------------------------------------ sampling


@dataclass(frozen=True)
class SamplingStats:
    """Per-completion sums for the temperature test (aggregated over a rollout file)."""

    surprisal_excess: float  # sum over tokens of (-log q(token) - H(q))
    variance: float  # sum over tokens of Var_q(-log q)
    tokens: int
    logq: float = 0.0  # log q(completion): the summed log-probability of its tokens under the sampling distribution


def allowed(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[P, V] bool: the tokens the sampler may pick from tempered logits `scaled` (= logits / T): the
    top-k, then the smallest set of those whose renormalised probability reaches top_p (the token that
    crosses top_p included), as vLLM builds it. Ties at the k-th value are all kept."""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    V = scaled.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        keep &= scaled >= kth
    if top_p < 1.0:
        lp = torch.log_softmax(scaled.masked_fill(~keep, -math.inf), dim=-1)
        sorted_lp, order = torch.sort(lp, dim=-1, descending=True)
        p = sorted_lp.exp()
        before = torch.cumsum(p, dim=-1) - p
        drop = torch.zeros_like(keep).scatter(-1, order, before >= top_p)
        keep &= ~drop
    return keep


def sampling_distribution(raw_logprobs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """log q: the distribution the claimed parameters sample from (temperature, then top-k and
    top-p truncation, renormalised), from raw log-softmax rows [T, V]."""
    scaled = torch.log_softmax(raw_logprobs.double() / p.temperature, dim=-1)
    return torch.log_softmax(scaled.masked_fill(~allowed(scaled, p.top_k, p.top_p), -math.inf), dim=-1)


def check_sampling(
    raw_logprobs: torch.Tensor,
    tokens: list[int],
    claimed_logprobs: list[float],
    p: SamplingParams,
    tol: SamplingTolerances,
) -> tuple[Verdict, SamplingStats]:
    """Every token possible under the claimed parameters, and the reported logprobs the model's.

    `raw_logprobs` is the validator's [T, V] log-softmax at temperature 1 for the positions that
    produced the T tokens; `claimed_logprobs` are the worker's reported (raw) logprobs. Under exact
    sampling (`p.exact`) the replay judges every token, so the temperature test's sums are not built
    (the stats returned are empty) and without top-k / top-p no distribution is built at all."""
    T, V = raw_logprobs.shape
    empty = SamplingStats(0.0, 0.0, 0)
    if len(tokens) != T or len(claimed_logprobs) != T:
        return Verdict(
            Reason.MALFORMED, f"{len(tokens)} tokens, {len(claimed_logprobs)} logprobs, {T} prefill rows"
        ), empty
    tok = torch.tensor(tokens, dtype=torch.long)
    if T and (int(tok.min()) < 0 or int(tok.max()) >= V):
        return Verdict(Reason.TOKEN_OUT_OF_VOCAB, f"token id outside 0..{V - 1}"), empty
    lp = raw_logprobs.double()
    mine = lp.gather(1, tok[:, None]).squeeze(1)
    claimed = torch.tensor(claimed_logprobs, dtype=torch.float64)
    if not torch.isfinite(claimed).all():
        return Verdict(Reason.LOGPROB_MISMATCH, "non-finite reported logprob"), empty
    err = (mine - claimed).abs()
    worst = float(err.max()) if T else 0.0
    if worst > tol.logprob_max_abs:
        j = int(err.argmax())
        return Verdict(
            Reason.LOGPROB_MISMATCH,
            f"token {j}: reported logprob {float(claimed[j]):.4f}, model gives {float(mine[j]):.4f}",
            {"logprob_max_abs_err": worst},
        ), empty

    if p.temperature == 0:
        gap = lp.max(dim=-1).values - mine
        bad = torch.nonzero(gap > tol.greedy_logprob_slack)
        if len(bad):
            j = int(bad[0])
            return Verdict(Reason.TOKEN_NOT_GREEDY, f"token {j} is {float(gap[j]):.3f} nats below the argmax"), empty
        return Verdict(Reason.OK, figures={"logprob_max_abs_err": worst}), empty

    truncated = 0 < p.top_k < V or p.top_p < 1.0
    if p.exact and not truncated:  # the replay checks every token; no distribution to build here
        return Verdict(Reason.OK, figures={"logprob_max_abs_err": worst}), empty
    scaled = torch.log_softmax(lp / p.temperature, dim=-1)
    tok_scaled = scaled.gather(1, tok[:, None]).squeeze(1)
    if 0 < p.top_k < V:
        # at the k-th value the worker's numbers and ours may order near-equal tokens differently: a
        # token is outside top-k only if it is clearly below the k-th value (by the replay margin)
        kth = torch.topk(scaled, p.top_k, dim=-1).values[:, -1]
        rank = (scaled > tok_scaled[:, None] + 1e-9).sum(dim=-1)
        bad = torch.nonzero(tok_scaled < kth - tol.margin / p.temperature)
        if len(bad):
            j = int(bad[0])
            return Verdict(Reason.TOKEN_OUTSIDE_TOP_K, f"token {j} has rank {int(rank[j])}, top_k is {p.top_k}"), empty
    if p.top_p < 1.0:
        if 0 < p.top_k < V:  # top-p acts on the top-k distribution, renormalised (as vLLM does)
            kth = torch.topk(scaled, p.top_k, dim=-1).values[:, -1:]
            scaled = torch.log_softmax(scaled.masked_fill(scaled < kth, -math.inf), dim=-1)
            tok_scaled = scaled.gather(1, tok[:, None]).squeeze(1)
        probs = scaled.exp()
        mass_before = (probs * (scaled > tok_scaled[:, None]).double()).sum(dim=-1)
        bad = torch.nonzero(mass_before >= p.top_p + tol.top_p_slack)
        if len(bad):
            j = int(bad[0])
            return Verdict(
                Reason.TOKEN_OUTSIDE_TOP_P,
                f"token {j}: {float(mass_before[j]):.3f} of the mass ranks above it, top_p is {p.top_p}",
            ), empty
    if p.exact:  # exact sampling replays every token: the temperature test's sums are never used
        return Verdict(Reason.OK, figures={"logprob_max_abs_err": worst}), empty

    logq = sampling_distribution(raw_logprobs, p)
    q = logq.exp()
    finite = torch.where(torch.isfinite(logq), logq, torch.zeros_like(logq))
    entropy = -(q * finite).sum(dim=-1)
    second = (q * finite.square()).sum(dim=-1)
    var = (second - entropy.square()).clamp_min(0.0)
    s = -logq.gather(1, tok[:, None]).squeeze(1)
    s = torch.where(torch.isfinite(s), s, entropy)  # tokens admitted only by the slack above
    stats = SamplingStats(float((s - entropy).sum()), float(var.sum()), T, -float(s.sum()))
    return Verdict(Reason.OK, figures={"logprob_max_abs_err": worst}), stats


def temperature_test(stats: list[SamplingStats], tol: SamplingTolerances) -> Verdict:
    """Are the sampled tokens as surprising as the claimed distribution predicts? Under honest
    sampling the summed excess surprisal has mean 0 and the summed variance, so its z-score is
    about standard normal; a hotter sampler gives large positive z, a colder one large negative."""
    excess = sum(s.surprisal_excess for s in stats)
    var = sum(s.variance for s in stats)
    n = sum(s.tokens for s in stats)
    if var <= 1e-12:
        return Verdict(Reason.OK, "distribution is deterministic; nothing to test", {"temperature_z": 0.0, "tokens": n})
    z = excess / math.sqrt(var)
    figures = {"temperature_z": z, "tokens": float(n)}
    if abs(z) > tol.temperature_z_max:
        side = "hotter" if z > 0 else "colder"
        return Verdict(Reason.TEMPERATURE_MISMATCH, f"tokens look sampled {side} than claimed (z = {z:.1f})", figures)
    return Verdict(Reason.OK, figures=figures)


STEERING_ALPHA = 1e-9  # chance that an honest file fails the steering test


def binomial_tail_log_bound(n: int, total: int, rate: float) -> float:
    """log of the Chernoff bound on P(Binomial(total, rate) >= n): -total * KL(n/total || rate) when
    n/total > rate, else 0 (no bound)."""
    if total <= 0 or n <= rate * total:
        return 0.0
    if rate <= 0.0:
        return -math.inf
    x = n / total
    if x >= 1.0:
        return total * math.log(rate)
    return -total * (x * math.log(x / rate) + (1 - x) * math.log((1 - x) / (1 - rate)))


def steering_test(disagreements: int, tokens: int, rate: float, alpha: float = STEERING_ALPHA) -> Verdict:
    """Exact sampling: whether a file's tokens depart from the validator's seeded argmax more often than
    honest numerical near-ties do. Each such token is within the replay margin (the replay passed), so
    each was a free choice for a worker that can see the runner-up: one that takes it wherever it helps
    leaves many more of them than `rate` (the calibrated honest share). Fails when the binomial tail is
    below `alpha`; the remaining capacity is the few departures the bound still allows per file."""
    log_bound = binomial_tail_log_bound(disagreements, tokens, rate)
    figures = {"replay_disagreements": float(disagreements), "replay_disagree_rate": rate, "log_bound": log_bound}
    if log_bound >= math.log(alpha):
        return Verdict(Reason.OK, figures=figures)
    # hard only when even twice the honest rate cannot explain it: a machine whose near-ties are more
    # frequent than any the calibration saw loses the file's units, never its stake
    near = binomial_tail_log_bound(disagreements, tokens, min(1.0, 2 * rate)) >= math.log(alpha)
    figures["near_threshold"] = float(near)
    return Verdict(
        Reason.REPLAY_MISMATCH,
        f"{disagreements} of {tokens} tokens are not the seeded draw (each within the margin), where honest "
        f"numerical near-ties make about {rate * tokens:.1f}: steered within the replay margin "
        f"(chance for honest sampling below e^{log_bound:.0f})"
        + (" (within twice the honest rate: an outlier machine is possible)" if near else ""),
        figures,
    )


TERMINATION_ALPHA = 1e-9  # chance that an honest file fails the termination test (each tail)


@dataclass(frozen=True)
class StopStats:
    """One completion's stop-token figures under the sampling distribution: `stopped` 1 if it ended on a
    stop token, `expected` the sum over its positions of q(stop set), `variance` the sum of q(1 - q)."""

    stopped: int
    expected: float
    variance: float


def stop_stats(raw_logprobs: torch.Tensor, tokens: list[int], p: SamplingParams, stop_ids: set[int]) -> StopStats:
    """`StopStats` of a completion from the validator's raw log-softmax rows [T, V] (row t produced
    token t), under the task's sampling distribution (temperature, top-k, top-p)."""
    ids = sorted(i for i in stop_ids if 0 <= i < raw_logprobs.shape[1])
    if not ids or p.temperature <= 0:
        return StopStats(0, 0.0, 0.0)
    if 0 < p.top_k < raw_logprobs.shape[1] or p.top_p < 1.0:
        logq = sampling_distribution(raw_logprobs, p)[:, ids]
    else:
        scaled = raw_logprobs.double() / p.temperature
        logq = scaled[:, ids] - torch.logsumexp(scaled, dim=-1, keepdim=True)
    q = torch.logsumexp(logq, dim=-1).exp().clamp(0.0, 1.0)
    stopped = int(bool(tokens) and tokens[-1] in stop_ids)
    return StopStats(stopped, float(q.sum()), float((q * (1.0 - q)).sum()))


def termination_test(stats: Sequence[StopStats], alpha: float = TERMINATION_ALPHA) -> Verdict:
    """Whether a file's completions stop as often as the model's own stop probabilities say.

    Along one completion the indicator "a stop token was drawn at this position" minus q(stop) there is
    a martingale difference bounded by 1, so over a file the number of stops S and its compensator E (the
    sum of q(stop) over every position generated) differ by more than a only with probability at most
    exp(-a^2 / (2 (V + a / 3))) (Freedman's inequality; V the sum of q(1 - q)), in either direction. A
    worker that bans stop tokens (longer completions, or more tokens paid) has S far below E; one that
    forces them where the model would rarely stop has S far above. Each tail fails below `alpha`: an
    honest file fails with probability below 2 `alpha`. Statistical pools only: exact sampling replays
    every token, stop tokens included."""
    s = sum(x.stopped for x in stats)
    e = sum(x.expected for x in stats)
    v = sum(x.variance for x in stats)
    a = abs(e - s)
    if a <= 0:
        return OK
    log_bound = -(a * a) / (2.0 * (v + a / 3.0))
    figures = {"stops": float(s), "expected_stops": e, "log_bound": log_bound}
    if log_bound >= math.log(alpha):
        return Verdict(Reason.OK, figures=figures)
    if s < e:
        detail = f"{s} completions stopped where the model's stop probabilities expect {e:.1f}: stop tokens suppressed"
    else:
        detail = f"{s} completions stopped where the model's stop probabilities expect {e:.1f}: stops forced"
    return Verdict(Reason.BAD_TERMINATION, detail + f" (chance for honest sampling below e^{log_bound:.0f})", figures)


TERMINATION_SLACK = 0.02  # share of a node's expected stops its files may miss across files (numerics: a
# bf16 prefill shifted the tiny model's stop probabilities by 0.9 % against fp32)


def cumulative_termination(
    stopped: float, expected: float, variance: float, slack: float = TERMINATION_SLACK, alpha: float = TERMINATION_ALPHA
) -> Verdict:
    """The termination test over every file of one node a validator checked: a worker that bans stop
    tokens in a share of its completions small enough for each file to pass (in a file of 64 completions
    about a quarter of them) still stops less than the model says, file after file, and the deficit grows
    linearly while its noise grows as a square root. Lower tail only (the cheat that is paid: longer
    completions), past `slack` of the expected stops (a validator's prefill may differ from the worker's
    kernels by a relative bias that no count of files averages away). Freedman's inequality bounds the
    whole path of a martingale, so checking after every file keeps its 1e-9. A failure is soft
    (`near_threshold`): no single file shows it, so it revokes units and makes the node's work checked
    whatever the sample rate, never a slash."""
    a = expected * (1.0 - slack) - stopped
    figures = {"node_stops": stopped, "node_expected_stops": expected}
    if a <= 0:
        return Verdict(Reason.OK, figures=figures)
    log_bound = -(a * a) / (2.0 * (variance + a / 3.0))
    if log_bound >= math.log(alpha):
        return Verdict(Reason.OK, figures=figures | {"log_bound": log_bound})
    return Verdict(
        Reason.BAD_TERMINATION,
        f"across the node's checked files {stopped:.0f} completions stopped where the model's stop probabilities "
        f"expect {expected:.1f}: stop tokens suppressed in part of its completions (chance for honest sampling "
        f"below e^{log_bound:.0f})",
        figures | {"log_bound": log_bound, "near_threshold": 1.0},
    )


def check_reward(claimed: float, recomputed: float, tol: float = 1e-6) -> Verdict:
    if not math.isfinite(claimed) or abs(claimed - recomputed) > tol:
        return Verdict(Reason.REWARD_MISMATCH, f"claimed reward {claimed}, task gives {recomputed}")
    return OK


# ------------------------------------------------------------------------------------ verdicts

NEAR = ":near-threshold"


def stored_reason(verdict: dict[str, Any]) -> str:
    """The reason a failed verdict is kept and invalidated under: its reason code, marked when every
    failure it found is near its threshold (a numerical outlier of honest hardware is possible)."""
    v = verdict["verdict"]
    near = (v.get("figures") or {}).get("near_threshold") == 1.0
    return f"{v['reason']}{NEAR if near else ''}"


def invalidation_is_hard(reason: str) -> bool:
    """Hard (an accusation that ends in a slash) unless nobody served the file (nobody can show what it
    held), the file is not what the coordinator recorded (the coordinator wrote the record), its weights
    cannot be told (none named, or none announced for its version), or every
    failure was near its threshold: then soft, the units revoked without a slash."""
    soft = (Reason.UNAVAILABLE, Reason.RECORD_MISMATCH, Reason.WEIGHTS_UNKNOWN)
    return reason not in soft and not reason.endswith(NEAR)
