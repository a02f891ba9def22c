"""The worker-coordinator protocol: request-response messages and the coordinator's acceptance rules.

Pure (no I/O): message encoding with strict validation, the `Task` a coordinator hands out, and
`check_submission`, the coordinator's decision on an uploaded rollout file. The daemons
(`pool.coordinator`, `node.worker`) move these bytes over `node.p2p` request-response streams.

Every reply is a msgpack map ``{"ok": true, ...}`` or ``{"ok": false, "error": ..., "hint": ...}``,
so a refusal reaches the worker as a readable sentence, not as a bare stream error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import msgpack

from node.decoding import DecodeError, unpack_msgpack
from node.errors import PeerError

from .rollout.budget import FileLimits
from .rollout.file import RolloutFile
from .rollout.intake import Problem as Refusal
from .rollout.intake import check_bounds, check_sample_indices, check_terms, implausible_repeats, reported_logps
from .tasks.math import MathEnv, Problem

INVITE_PROTOCOL = "/intellect/invite/1"
TASK_PROTOCOL = "/intellect/task/1"
SUBMIT_PROTOCOL = "/intellect/submit/1"
# {"work_key": key} -> {"ok": true, "signature": the node's `RolloutClaim` signature}; served by the
# coordinator (for every file it accepted) and by each worker (for its own files, until they are final)
SIGNATURE_PROTOCOL = "/intellect/signature/1"

MAX_MESSAGE = 64 * 1024
REWARD_TOLERANCE = 1e-6


class ProtocolError(PeerError, ValueError):
    """A message that does not follow the protocol (malformed, wrong types, refused)."""


def pack(obj: dict[str, Any]) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"{what} of {len(data)} bytes exceeds {MAX_MESSAGE}")
    try:
        obj = unpack_msgpack(data, what=what, max_bytes=MAX_MESSAGE)
    except DecodeError as exc:
        raise ProtocolError(f"malformed {what}: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"malformed {what}: expected a map")
    return obj


def ok(**fields: Any) -> bytes:
    return pack({"ok": True, **fields})


def refuse(error: str, hint: str = "", *, retry: bool = False) -> bytes:
    """A refusal; with `retry` a passing one (the coordinator is busy, the sender over its request
    budget, the chain unreachable): the same request may succeed later and is not a verdict."""
    return pack({"ok": False, "error": error, "hint": hint, **({"retry": True} if retry else {})})


class ProtocolBusy(ProtocolError):
    """A passing refusal (`refuse(..., retry=True)`): ask again later."""


#: How the coordinator's refusal of an upload starts (the node has no open task, or is no member): final,
#: unlike a transport failure, which a worker retries.
UPLOAD_REFUSED = "upload refused:"


def reply_body(data: bytes, what: str) -> dict[str, Any]:
    """Decode a reply; a refusal becomes a `ProtocolError` (`ProtocolBusy` for a passing one) carrying
    the coordinator's message."""
    obj = unpack(data, what)
    if obj.get("ok") is not True:
        kind = ProtocolBusy if obj.get("retry") is True else ProtocolError
        raise kind(f"{what} refused: {obj.get('error', 'no reason given')}", str(obj.get("hint", "")))
    return obj


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    v = obj.get(name)
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
        raise ProtocolError(f"malformed {what}: field {name!r} missing or of the wrong type")
    return v


@dataclass(frozen=True)
class Task:
    """One unit of work: `prompts` problems of `env` drawn from `seed` (chosen by the coordinator),
    `group_size` completions each, with `sampling`, generated with a policy version from
    `min_policy_version` to `policy_version`. The coordinator binds both to one version: the one the
    worker named when it asked (it holds it, so it keeps generating while a newer checkpoint downloads)
    if that is fresh enough, else its current one. Were the task open to several versions, a worker
    could generate it under each and submit the file it likes best."""

    task_id: str
    pool_id: int
    node: str
    env: str
    seed: int
    prompts: int
    group_size: int
    sampling: dict[str, Any]
    policy_version: int
    model: str
    issued_at: float
    expires_at: float
    min_policy_version: int = 0

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: Any) -> Task:
        if not isinstance(obj, dict):
            raise ProtocolError("malformed task: expected a map")
        w = "task"
        sampling = _field(obj, "sampling", dict, w)
        for k in ("temperature", "max_tokens"):
            v = sampling.get(k)
            if (
                not isinstance(v, (int, float))
                or isinstance(v, bool)
                or (isinstance(v, float) and not math.isfinite(v))
            ):
                raise ProtocolError(f"malformed task: sampling.{k} missing or not a finite number")
        t = cls(
            task_id=_field(obj, "task_id", str, w),
            pool_id=_field(obj, "pool_id", int, w),
            node=_field(obj, "node", str, w),
            env=_field(obj, "env", str, w),
            seed=_field(obj, "seed", int, w),
            prompts=_field(obj, "prompts", int, w),
            group_size=_field(obj, "group_size", int, w),
            sampling=dict(sampling),
            policy_version=_field(obj, "policy_version", int, w),
            model=_field(obj, "model", str, w),
            issued_at=float(_field(obj, "issued_at", (int, float), w)),
            expires_at=float(_field(obj, "expires_at", (int, float), w)),
            min_policy_version=obj.get("min_policy_version", obj["policy_version"]),
        )
        if type(t.min_policy_version) is not int:
            raise ProtocolError("malformed task: field 'min_policy_version' of the wrong type")
        if not 0 <= t.min_policy_version <= t.policy_version:
            raise ProtocolError("malformed task: min_policy_version outside 0..policy_version")
        if not (1 <= t.prompts <= 1024 and 1 <= t.group_size <= 64 and 1 <= int(sampling["max_tokens"]) <= 32768):
            raise ProtocolError("malformed task: prompts, group size or max_tokens out of range")
        return t


@dataclass(frozen=True)
class Decision:
    accepted: bool
    reason: str = ""
    detail: str = ""


ACCEPT = Decision(True)


def file_limits(task: Task, env: MathEnv, encode_prompt: Callable[[str], list[int]]) -> FileLimits:
    """What a rollout file for `task` may hold: `prompts` x `group_size` rows, its own prompts (the
    longest, encoded), completions of at most its `max_tokens`."""
    longest = max((len(encode_prompt(env.problem(task.seed, g).prompt)) for g in range(task.prompts)), default=0)
    return FileLimits(task.prompts * task.group_size, longest, int(task.sampling["max_tokens"]))


def check_submission(
    f: RolloutFile,
    task: Task,
    *,
    sender: str,
    now: float,
    current_policy: int,
    async_level: int,
    env: MathEnv,
    encode_prompt: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    vocab_size: int,
    prior_draws: Mapping[tuple[int, ...], int] | None = None,
    prior_copies: Mapping[tuple[tuple[int, ...], tuple[int, ...]], int] | None = None,
) -> Decision:
    """The coordinator's checks on an uploaded rollout file for `task` (issued to `sender`).

    Cheap checks only (no model): the file belongs to this task, node and pool; it is on time; its
    header declares exactly the task's terms (`node.rollout.intake.check_terms`); token ids, logprobs
    and lengths are in bounds; its policy is fresh enough; every group has the task's prompt and size;
    each reward is what the task's verifier gives the completion; no completion is repeated more often
    than its (reported) probability allows, counting the copies of earlier files (`prior_*`). The expensive
    re-computation (TOPLOC, sampling statistics) is the validators' job."""
    h = f.header
    if h.node.lower() != sender.lower() or task.node.lower() != sender.lower():
        return Decision(False, "wrong-node", f"file of {h.node}, task of {task.node}, sent by {sender}")
    if now > task.expires_at:
        return Decision(False, "expired", f"task {task.task_id} expired {now - task.expires_at:.0f} s ago")
    wrong = check_terms(h, pool_id=task.pool_id, env=task.env, model=task.model, sampling=task.sampling)
    if wrong is None and h.task_seed != task.seed:
        wrong = Refusal("wrong-task", f"task seed {h.task_seed}, the task's is {task.seed}")
    if wrong is None:
        wrong = check_bounds(f, vocab_size=vocab_size, max_tokens=int(task.sampling["max_tokens"]))
    if wrong is not None:
        return Decision(False, wrong.reason, wrong.detail)
    if h.policy_version < current_policy - async_level or h.policy_version > current_policy:
        return Decision(
            False,
            "stale-policy",
            f"policy {h.policy_version}, current {current_policy}, async level {async_level}",
        )
    if not task.min_policy_version <= h.policy_version <= task.policy_version:
        bound = (
            f"version {task.policy_version}"
            if task.min_policy_version == task.policy_version
            else f"versions {task.min_policy_version}..{task.policy_version}"
        )
        return Decision(
            False,
            "wrong-version",
            f"generated with policy version {h.policy_version}; task {task.task_id} is bound to {bound}",
        )
    counts: dict[int, int] = {}
    groups: dict[int, tuple[Problem, list[int]]] = {}
    for s in f.samples:
        if not 0 <= s.group < task.prompts:
            return Decision(False, "wrong-shape", f"group {s.group} outside the task's {task.prompts} prompts")
        counts[s.group] = counts.get(s.group, 0) + 1
        if s.group not in groups:
            p = env.problem(task.seed, s.group)
            groups[s.group] = (p, encode_prompt(p.prompt))
        problem, prompt = groups[s.group]
        if s.task_id != problem.task_id or s.prompt_tokens != prompt:
            return Decision(False, "wrong-prompt", f"group {s.group} does not hold the task's prompt")
        if len(s.completion_tokens) > int(task.sampling["max_tokens"]):
            return Decision(False, "too-long", f"group {s.group} sample {s.sample} exceeds max_tokens")
    if len(counts) != task.prompts or any(c != task.group_size for c in counts.values()):
        return Decision(False, "wrong-shape", f"expected {task.prompts} groups of {task.group_size}")
    # every reward at once, once the file's shape is known good (an environment that runs code runs them
    # in parallel, and never for a file refused on cheaper grounds); a reward that is not firm (code near
    # its time limit) is left to the validators: our own run may have been the slow one
    wants = env.rewards_firm(
        [(groups[s.group][0], decode(s.completion_tokens), len(s.completion_tokens)) for s in f.samples]
    )
    for s, (want, firm) in zip(f.samples, wants, strict=True):
        if not math.isfinite(s.reward) or (firm and abs(s.reward - want) > REWARD_TOLERANCE):
            return Decision(False, "wrong-reward", f"group {s.group} sample {s.sample}: {s.reward} claimed, {want}")
    bad_index = check_sample_indices(f, task.group_size)
    if bad_index is not None:
        return Decision(False, bad_index.reason, bad_index.detail)
    if f.units <= 0:
        return Decision(False, "empty", "no generated tokens")
    repeat = implausible_repeats(
        f.samples, reported_logps(f, task.sampling), prior_draws=prior_draws, prior_copies=prior_copies
    )
    if repeat is not None:
        return Decision(False, repeat.reason, repeat.detail)
    return ACCEPT
