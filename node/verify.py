"""The validator's check of one rollout file: prompt, TOPLOC proofs, sampling, termination, reward.

The I/O-free core: the caller supplies a prefill function (HF transformers or vLLM) and the task
environment; the result says, per completion and for the file, which check failed and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .calibrated import Calibrated
from .rollout.budget import FileLimits
from .rollout.checks import (
    OK,
    Reason,
    SamplingParams,
    SamplingStats,
    StopStats,
    Verdict,
    check_reward,
    check_sampling,
    check_termination,
    sampling_distribution,
    steering_test,
    stop_stats,
    temperature_test,
    termination_test,
)
from .rollout.exact import replay_many, replay_verdict, sample_seed
from .rollout.file import MAX_ROWS, MAX_TOKENS, RolloutFile, RolloutFormatError, RolloutSample
from .rollout.intake import check_bounds, check_sample_indices, check_terms, implausible_repeats
from .tasks import MathEnv
from .taskspec import TaskSpec
from .toploc import ProofFormatError, Thresholds, verify_proofs


@dataclass(frozen=True)
class SampleVerdict:
    group: int
    sample: int
    verdict: Verdict
    chunks: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class FileVerdict:
    verdict: Verdict
    samples: list[SampleVerdict]

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict.to_dict(),
            "samples": [
                {"group": s.group, "sample": s.sample, **s.verdict.to_dict(), "chunks": s.chunks} for s in self.samples
            ],
        }


RERUNS = 2  # extra scorings of a firm reward that differs from the claim (`FileChecks.reward_verdicts`)

# (prompt tokens, completion tokens) -> (hidden [T, H], raw logprobs [T, V])
PrefillFn = Callable[[list[int], list[int]], tuple[torch.Tensor, torch.Tensor]]


def toploc_verdict(
    hidden: torch.Tensor, proofs: Sequence[bytes], thr: Thresholds
) -> tuple[Verdict, list[dict[str, float]]]:
    try:
        checks = verify_proofs(hidden, list(proofs))
    except ProofFormatError as exc:
        return Verdict(Reason.PROOF_MALFORMED, str(exc)), []
    figures = [
        {
            "exp_mismatches": float(c.exp_mismatches),
            "mant_err_mean": float(c.mant_err_mean),
            "mant_err_median": float(c.mant_err_median),
            "sign_mismatches": float(c.sign_mismatches),
        }
        for c in checks
    ]
    for i, c in enumerate(checks):
        if c.exp_mismatches > thr.exp_mismatch_max:
            return Verdict(
                Reason.TOPLOC_EXPONENT,
                f"chunk {i}: {c.exp_mismatches} exponent mismatches > {thr.exp_mismatch_max}",
                figures[i],
            ), figures
        if c.sign_mismatches > thr.sign_mismatch_max:
            return Verdict(
                Reason.TOPLOC_SIGN,
                f"chunk {i}: {c.sign_mismatches} sign mismatches > {thr.sign_mismatch_max}",
                figures[i],
            ), figures
        if c.mant_err_mean > thr.mant_err_mean_max or c.mant_err_median > thr.mant_err_median_max:
            return Verdict(
                Reason.TOPLOC_MANTISSA,
                f"chunk {i}: mantissa error mean {c.mant_err_mean:.2f} / median {c.mant_err_median:.2f} above "
                f"{thr.mant_err_mean_max} / {thr.mant_err_median_max}",
                figures[i],
            ), figures
    return OK, figures


def completion_logq(raw: torch.Tensor, tokens: list[int], params: SamplingParams) -> float | None:
    """log q(completion) under the sampling distribution of `params` from raw log-softmax rows [T, V];
    None for greedy decoding (identical completions are what it produces) or out-of-range ids."""
    if params.temperature <= 0 or raw.shape[0] != len(tokens) or max(tokens) >= raw.shape[1] or min(tokens) < 0:
        return None
    tok = torch.tensor(tokens, dtype=torch.long)[:, None]
    if 0 < params.top_k < raw.shape[1] or params.top_p < 1.0:
        picked = sampling_distribution(raw, params).gather(1, tok).squeeze(1)
    else:  # untruncated: log q(v) = raw(v) / T - logsumexp(raw / T), without building every row's q
        scaled = raw.double() / params.temperature
        picked = scaled.gather(1, tok).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    return float(picked.sum()) if bool(torch.isfinite(picked).all()) else None


@dataclass(frozen=True)
class SampleCheck:
    """One completion's checks: its verdict, the TOPLOC figures, and what the file-wide checks need."""

    verdict: SampleVerdict
    stats: SamplingStats | None = None  # sampling sums for the temperature test (passing completions)
    logq: float | None = None  # our log-probability of the completion (for the repeat bound)
    stops: StopStats | None = None  # stop-token figures for the termination test (statistical pools)
    disagreements: int | None = None  # exact sampling: tokens that are not our seeded argmax (within the margin)


@dataclass(frozen=True)
class FileChecks:
    """Everything a rollout file is checked against: the task's sampling parameters (from the pool's
    spec, never the file header's), its environment, the model's tokenizer and calibrated thresholds.

    The checks come in three steps so that any forward pass can feed them (the validator's prefill,
    or the trainer's old-log-prob pass, which already runs the generating version's weights over every
    sample): `before_prefill` (no model), `after_prefill` (the final-norm hidden states and the raw
    log-softmax rows that produced each completion token), and `conclude` (file-wide: repeats, the
    temperature test). `verify_file` runs the three in order."""

    params: SamplingParams
    env: MathEnv
    encode_prompt: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    stop_ids: set[int]
    calibrated: Calibrated
    vocab_size: int | None = None

    def before_prefill(self, smp: RolloutSample, task_seed: int) -> Verdict:
        """Prompt, termination and token range: the checks that decide whether a prefill may run."""
        problem = self.env.problem(task_seed, smp.group)
        if smp.task_id != problem.task_id or smp.prompt_tokens != self.encode_prompt(problem.prompt):
            return Verdict(Reason.PROMPT_MISMATCH, f"prompt of group {smp.group} is not the task's prompt")
        verdict = check_termination(smp.completion_tokens, smp.finish_reason, self.params.max_tokens, self.stop_ids)
        if verdict.ok and self.vocab_size is not None and max(smp.completion_tokens) >= self.vocab_size:
            verdict = Verdict(
                Reason.TOKEN_OUT_OF_VOCAB, f"token id {max(smp.completion_tokens)} outside 0..{self.vocab_size - 1}"
            )
        return verdict

    def after_prefill(self, smp: RolloutSample, task_seed: int, hidden: torch.Tensor, raw: torch.Tensor) -> SampleCheck:
        """TOPLOC, sampling and reward of a completion that passed `before_prefill`; `hidden` [T, H] and
        `raw` [T, V] come from a forward pass of the generating policy over prompt + completion."""
        return self.after_prefill_many(task_seed, [(smp, hidden, raw)])[0]

    def after_prefill_many(
        self, task_seed: int, items: Sequence[tuple[RolloutSample, torch.Tensor, torch.Tensor]]
    ) -> list[SampleCheck]:
        """`after_prefill` of several completions of one file (`(sample, hidden, raw)` each): the same
        verdicts, with the exact-sampling replays run in shared passes (`replay_many`)."""
        tol = self.calibrated.sampling
        found: list[tuple[Verdict, list[Any], SamplingStats | None, float | None]] = []
        stops: list[StopStats | None] = []
        statistical = self.params.temperature > 0 and not self.params.exact
        for smp, hidden, raw in items:
            verdict, chunks = toploc_verdict(hidden, smp.proofs, self.calibrated.toploc)
            stats = logq = None
            if verdict.ok:
                # our own probability of the completion, whatever the worker reported: copies are judged
                # by it even when their reported logprobs are lies (inflated to pass the coordinator)
                logq = completion_logq(raw, smp.completion_tokens, self.params)
                verdict, stats = check_sampling(raw, smp.completion_tokens, smp.logprobs, self.params, tol)
            found.append((verdict, chunks, stats, logq))
            ok = verdict.ok and statistical and raw.shape[0] == len(smp.completion_tokens)
            stops.append(stop_stats(raw, smp.completion_tokens, self.params, self.stop_ids) if ok else None)
        departed: dict[int, int] = {}
        if self.params.exact and self.params.temperature > 0:
            todo = [k for k, (verdict, *_) in enumerate(found) if verdict.ok]
            replays = replay_many(
                [(items[k][2], items[k][0].completion_tokens, sample_seed(task_seed, items[k][0].group, items[k][0].sample)) for k in todo],
                self.params, tol.margin, tol.top_p_slack,
            )  # fmt: skip
            for k, r in zip(todo, replays, strict=True):
                verdict, chunks, stats, logq = found[k]
                replayed = replay_verdict(r, items[k][0].completion_tokens, tol.margin)
                departed[k] = int((r.gap > 0).sum())
                verdict = (
                    replayed if not replayed.ok else Verdict(Reason.OK, figures=verdict.figures | replayed.figures)
                )
                found[k] = (verdict, chunks, stats, logq)
        # the rewards of the completions that passed, all at once (code runs in parallel sandboxes)
        passing = [k for k, (verdict, *_) in enumerate(found) if verdict.ok]
        for k, reward in zip(passing, self.reward_verdicts(task_seed, [items[k][0] for k in passing]), strict=True):
            verdict, chunks, stats, logq = found[k]
            found[k] = (verdict if reward.ok else reward, chunks, stats, logq)  # a pass keeps its figures
        return [
            SampleCheck(SampleVerdict(smp.group, smp.sample, verdict, chunks), stats, logq, stop, departed.get(k))
            for k, ((smp, _, _), (verdict, chunks, stats, logq), stop) in enumerate(
                zip(items, found, stops, strict=True)
            )
        ]

    def reward_verdicts(self, task_seed: int, samples: Sequence[RolloutSample]) -> list[Verdict]:
        """Each sample's claimed reward against ours, scored in one batch. A reward that is not firm (code
        near its limits) makes a mismatch near-threshold; so does one that differs from the claim but
        not in every one of `RERUNS` more scorings (code whose outcome rests on the clock or os.urandom)."""
        asks = [(self.env.problem(task_seed, x.group), self.decode(x.completion_tokens), len(x.completion_tokens))
                for x in samples]  # fmt: skip
        ours = self.env.rewards_firm(asks)
        differ = [i for i, (want, firm) in enumerate(ours) if firm and not check_reward(samples[i].reward, want).ok]
        if differ:
            again = [self.env.rewards_firm([asks[i] for i in differ]) for _ in range(RERUNS)]
            for j, i in enumerate(differ):
                ours[i] = (ours[i][0], all(run[j][1] and run[j][0] == ours[i][0] for run in again))
        out = []
        for x, (want, firm) in zip(samples, ours, strict=True):
            v = check_reward(x.reward, want)
            if not v.ok and not firm:
                v = Verdict(v.reason, v.detail + " (not firm: near a limit, or varying)", {"near_threshold": 1.0})
            out.append(v)
        return out

    def conclude(self, samples: Sequence[RolloutSample], checks: Sequence[SampleCheck]) -> FileVerdict:
        """The file's verdict from its completions' checks (in the same order as `samples`): the first
        failing completion, else copies the model makes implausible, else the temperature test."""
        first_bad = next((c.verdict.verdict for c in checks if not c.verdict.verdict.ok), None)
        repeat = implausible_repeats(samples, [c.logq for c in checks])
        if repeat is not None:  # the file-level cheat is named first, whatever else its copies got wrong
            first_bad = Verdict(Reason.DUPLICATE_SAMPLES, repeat.detail)
        # exact sampling replays every token: a statistical test would only add false positives
        # a file whose every failure is near its threshold (a replay gap by the margin, a reward our own run
        # got at a time limit) is marked so: honest hardware can land there, so it is not slashed
        soft = (Reason.REPLAY_MISMATCH, Reason.REWARD_MISMATCH)
        if first_bad is not None and first_bad.reason in soft and repeat is None:
            failed = [c.verdict.verdict for c in checks if not c.verdict.verdict.ok]
            near = all(v.reason in soft and v.figures.get("near_threshold") == 1.0 for v in failed)
            note = " (every failure near its threshold: an honest outlier is possible)" if near else ""
            first_bad = Verdict(
                first_bad.reason, first_bad.detail + note, first_bad.figures | {"near_threshold": float(near)}
            )
        if first_bad is None and self.params.temperature > 0 and self.params.exact:
            replayed = [(c.disagreements, len(x.completion_tokens)) for x, c in zip(samples, checks, strict=True)
                        if c.disagreements is not None]  # fmt: skip
            t = steering_test(
                sum(d for d, _ in replayed),
                sum(n for _, n in replayed),
                self.calibrated.sampling.disagree_rate(self.params.temperature),
            )
            if not t.ok:
                first_bad = t
        passed = OK
        if first_bad is None and self.params.temperature > 0 and not self.params.exact:
            t = temperature_test([c.stats for c in checks if c.stats is not None], self.calibrated.sampling)
            if t.ok:  # stop tokens drawn as often as the model's own stop probabilities say (issue 37 (7))
                stops = [c.stops for c in checks if c.stops is not None]
                t = termination_test(stops)
                # the file's stop figures go with a pass: a validator adds them up per node (`cumulative_termination`)
                passed = Verdict(Reason.OK, figures={
                    "stops": float(sum(x.stopped for x in stops)),
                    "expected_stops": sum(x.expected for x in stops),
                    "stop_variance": sum(x.variance for x in stops),
                })  # fmt: skip
            if not t.ok:
                first_bad = t
        return FileVerdict(first_bad or passed, [c.verdict for c in checks])


def verify_file(
    f: RolloutFile,
    prefill: PrefillFn,
    checks: FileChecks,
    *,
    expected_policy: int | None = None,
    expected_units: int | None = None,
) -> FileVerdict:
    """Check every completion of a rollout file; the file fails on the first failing check of any
    completion, on the file-wide temperature test, or on completions repeated more often than the
    model's own probabilities allow (`node.rollout.intake.implausible_repeats`).

    `checks.params` are the task's sampling parameters (from the pool's spec), never the file header's;
    the caller refuses a header that declares others (`node.rollout.intake.check_terms`). Token ids are
    checked against `checks.vocab_size` before the prefill runs.

    `prefill` runs the file's own policy version (its header's). When its record (`expected_policy`,
    written by the coordinator) names another, the file is still judged as itself: one that fails fails
    for what it is (a cheater gains nothing from a record that lies for it), and one that passes is
    `record_mismatch` (soft: the coordinator, not the node, wrote the record). The same holds for the
    record's units (`expected_units`): the pool pays by units, so a record that claims more (or fewer)
    than the file's generated tokens is revoked, softly, whoever it would have paid: the worker signed
    only the file, and the coordinator that wrote the record is the one shown lying (issue 37 (3))."""
    fc = checks
    seed = f.header.task_seed
    checks: list[SampleCheck | None] = []
    ready = []
    for smp in f.samples:
        verdict = fc.before_prefill(smp, seed)
        if verdict.ok:
            ready.append((len(checks), (smp, *prefill(smp.prompt_tokens, smp.completion_tokens))))
            checks.append(None)
        else:
            checks.append(SampleCheck(SampleVerdict(smp.group, smp.sample, verdict)))
    for (k, _), check in zip(ready, fc.after_prefill_many(seed, [item for _, item in ready]), strict=True):
        checks[k] = check
    verdict = fc.conclude(f.samples, [c for c in checks if c is not None])
    if verdict.ok and expected_policy is not None and f.header.policy_version != expected_policy:
        detail = f"the file says policy version {f.header.policy_version}, its record {expected_policy}"
        return FileVerdict(Verdict(Reason.RECORD_MISMATCH, detail), verdict.samples)
    if verdict.ok and expected_units is not None and f.units != expected_units:
        detail = f"the file holds {f.units} generated tokens, its record claims {expected_units} units"
        return FileVerdict(Verdict(Reason.RECORD_MISMATCH, detail), verdict.samples)
    return verdict


def pool_checks(spec: TaskSpec, tools: Any, calibrated: Calibrated) -> FileChecks:
    """The checks of a pool's files: terms from its task spec, tokenizer functions and vocabulary from
    `tools` (a `node.inference.tools.ModelTools` of the spec's model), thresholds from `calibrated`."""
    return FileChecks(
        spec.sampling_params(),
        spec.environment(),
        tools.encode,
        tools.decode,
        set(tools.stop_ids),
        calibrated,
        int(tools.vocab_size) or None,
    )


@dataclass(frozen=True)
class PoolFileCheck:
    """Every check a pool's validators run on one rollout file, for whoever holds the file and a prefill
    of its policy version: the validator, a committee member, and the worker re-checking its own file
    before it appeals. `intake` needs no model; `judge` runs the prefill (blocking: call it in a thread)."""

    spec: TaskSpec
    tools: Any  # node.inference.tools.ModelTools of the spec's model
    calibrated: Calibrated
    pool_id: int
    max_bytes: int = 16 * 1024 * 1024

    def intake(self, data: bytes, node: str) -> RolloutFile | FileVerdict:
        """The checks that need no model (parse, header terms, bounds): the parsed file, or the verdict
        of the first check it fails."""
        try:
            # completions of at most the pool's max_tokens, refused before they are decoded
            limits = FileLimits(MAX_ROWS, MAX_TOKENS, self.spec.max_tokens)
            f = RolloutFile.from_bytes(data, max_bytes=self.max_bytes, limits=limits)
        except RolloutFormatError as exc:
            return FileVerdict(Verdict(Reason.MALFORMED, str(exc)), [])
        if f.header.node.lower() != node.lower():
            return FileVerdict(Verdict(Reason.MALFORMED, f"file header names node {f.header.node}"), [])
        spec = self.spec
        problem = check_terms(
            f.header, pool_id=self.pool_id, env=spec.env, model=spec.model, sampling=spec.sampling
        ) or check_bounds(f, vocab_size=self.tools.vocab_size, max_tokens=spec.max_tokens)
        problem = problem or check_sample_indices(f, spec.group_size)
        if problem is not None:
            reason = Reason.TOKEN_OUT_OF_VOCAB if problem.reason == "token-out-of-vocab" else Reason.MALFORMED
            return FileVerdict(Verdict(reason, f"{problem.reason}: {problem.detail}"), [])
        return f

    def judge(
        self, f: RolloutFile, prefill: Any, expected_policy: int, expected_units: int | None = None
    ) -> dict[str, Any]:
        """The full check of a file that passed `intake`, with `prefill` (a `HfPrefill` of the file's
        policy version), against its record's policy version and units; the verdict as a dict (the
        evidence a validator signs)."""
        tools, spec = self.tools, self.spec
        # One batched forward pass for the samples that reach the prefill (same math as one at a time,
        # much faster): the task's prompt and no more than max_tokens, so a hostile file cannot make us
        # prefill a 32k-token prompt; `verify_file` refuses the others before any prefill.
        checks = pool_checks(spec, tools, self.calibrated)
        env = checks.env
        prompts: dict[int, list[int]] = {}
        pairs = []
        for s in f.samples:
            if s.group not in prompts:
                prompts[s.group] = tools.encode(env.problem(f.header.task_seed, s.group).prompt)
            if s.prompt_tokens == prompts[s.group] and len(s.completion_tokens) <= spec.max_tokens:
                pairs.append((list(s.prompt_tokens), list(s.completion_tokens)))
        done = {(tuple(p), tuple(c)): x for (p, c), x in zip(pairs, prefill.prefill_many(pairs), strict=True)}

        def fn(prompt: list[int], completion: list[int]) -> Any:
            p = done.get((tuple(prompt), tuple(completion))) or prefill.prefill(prompt, completion)
            return p.hidden, p.logprobs

        return verify_file(f, fn, checks, expected_policy=expected_policy, expected_units=expected_units).to_dict()

    def check(
        self, data: bytes, node: str, prefill: Any, expected_policy: int, expected_units: int | None = None
    ) -> dict[str, Any]:
        """`intake`, then `judge` of what passed it."""
        f = self.intake(data, node)
        if isinstance(f, FileVerdict):
            return f.to_dict()
        return self.judge(f, prefill, expected_policy, expected_units)
