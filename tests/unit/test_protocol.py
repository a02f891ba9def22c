"""The worker-coordinator protocol without I/O: `check_submission`'s verdicts, `Task.from_wire`'s
validation and the reply codec (`unpack`, `reply_body`), with a fuzz pass over the decoders."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node import protocol
from node.protocol import MAX_MESSAGE, ProtocolError, Task, check_submission
from node.rollout.file import PROOF_BYTES, RolloutFile, RolloutHeader, RolloutSample, chunks_for
from node.tasks.math import MathEnv

NODE = "0x" + "ab" * 20
OTHER = "0x" + "cd" * 20
SEED = 1234
NOW = 1_000_000.0
ENV = MathEnv()


def encode(text: str) -> list[int]:
    return [ord(c) % 100 for c in text][:8]


def decode(ids: list[int]) -> str:
    return ""


def make_task(**over: Any) -> Task:
    base: dict[str, Any] = {
        "task_id": "t-1",
        "pool_id": 7,
        "node": NODE,
        "env": "math",
        "seed": SEED,
        "prompts": 2,
        "group_size": 3,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 16},
        "policy_version": 5,
        "model": "tiny",
        "issued_at": NOW - 10,
        "expires_at": NOW + 100,
    }
    base.update(over)
    return Task(**base)


def make_sample(group: int, sample: int, **over: Any) -> RolloutSample:
    problem = ENV.problem(SEED, group)
    completion = over.pop("completion_tokens", [1, 2, 3])
    base: dict[str, Any] = {
        "group": group,
        "sample": sample,
        "task_id": problem.task_id,
        "prompt_tokens": encode(problem.prompt),
        "completion_tokens": completion,
        "logprobs": [-0.5] * len(completion),
        "reward": 0.0,  # decode() gives "", which MathEnv scores 0
        "finish_reason": "stop",
        "proofs": [bytes(PROOF_BYTES)] * chunks_for(len(completion)),
    }
    base.update(over)
    return RolloutSample(**base)


def make_header(**over: Any) -> RolloutHeader:
    base: dict[str, Any] = {
        "pool_id": 7,
        "node": NODE.upper().replace("0X", "0x"),  # case differs from the task's: addresses compare case-blind
        "policy_version": 5,
        "env": "math",
        "task_seed": SEED,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 16},
        "model": "tiny",
    }
    base.update(over)
    return RolloutHeader(**base)


def make_file(header: RolloutHeader | None = None, samples: list[RolloutSample] | None = None) -> RolloutFile:
    if samples is None:
        samples = [make_sample(g, i) for g in range(2) for i in range(3)]
    return RolloutFile(header or make_header(), samples)


def check(f: RolloutFile, task: Task | None = None, **over: Any) -> protocol.Decision:
    kw: dict[str, Any] = {
        "sender": NODE,
        "now": NOW,
        "current_policy": 5,
        "async_level": 2,
        "env": ENV,
        "encode_prompt": encode,
        "decode": decode,
        "vocab_size": 512,
    }
    kw.update(over)
    return check_submission(f, task or make_task(), **kw)


def test_honest_file_is_accepted() -> None:
    f = make_file()
    # the file is a valid rollout file, and survives a round trip unchanged
    assert RolloutFile.from_bytes(f.to_bytes()) == f
    assert check(f) == protocol.ACCEPT
    # an older policy within the async level is fine, as is the deadline itself
    assert check(make_file(make_header(policy_version=3))).accepted
    assert check(f, now=NOW + 100).accepted


def test_right_answer_with_reward_one_is_accepted() -> None:
    problem = ENV.problem(SEED, 0)
    answer = str(problem.answer)

    def dec(ids: list[int]) -> str:
        return f"Answer: {answer}" if ids == [9, 9] else ""

    samples = [make_sample(0, i, completion_tokens=[9, 9], reward=1.0) for i in range(3)]
    samples += [make_sample(1, i) for i in range(3)]
    assert check(make_file(samples=samples), decode=dec).accepted


def _reason(d: protocol.Decision) -> str:
    assert not d.accepted
    assert d.detail
    return d.reason


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("file-node", "wrong-node"),
        ("sender", "wrong-node"),
        ("task-node", "wrong-node"),
        ("pool", "wrong-pool"),
        ("expired", "expired"),
        ("seed", "wrong-task"),
        ("env", "wrong-task"),
        ("model", "wrong-task"),
        ("stale-policy", "stale-policy"),
        ("future-policy", "stale-policy"),
        ("other-version", "wrong-version"),  # fresh enough, but not the version the task was bound to
        ("temperature", "wrong-sampling"),
        ("max-tokens", "wrong-sampling"),
        ("missing-sampling", "wrong-sampling"),
        ("prompt-tokens", "wrong-prompt"),
        ("prompt-id", "wrong-prompt"),
        ("group-outside", "wrong-shape"),
        ("group-short", "wrong-shape"),
        ("group-long", "wrong-shape"),
        ("group-missing", "wrong-shape"),
        ("too-long", "too-long"),
        ("reward-lie", "wrong-reward"),
        ("reward-nan", "wrong-reward"),
        ("extra-sampling-key", "wrong-sampling"),  # e.g. top_k=1: greedy decoding the task never asked for
        ("token-past-vocab", "token-out-of-vocab"),
        ("prompt-past-vocab", "token-out-of-vocab"),
        ("logprob-nan", "bad-logprob"),
        ("logprob-positive", "bad-logprob"),
        ("copied-completion", "duplicate-samples"),
        ("reward-inf", "wrong-reward"),
    ],
)
def test_each_violation_is_rejected_with_its_reason(case: str, reason: str) -> None:
    honest = [make_sample(g, i) for g in range(2) for i in range(3)]
    header = make_header()
    task = make_task()
    over: dict[str, Any] = {}
    samples = list(honest)
    if case == "file-node":
        header = make_header(node=OTHER)
    elif case == "sender":
        over["sender"] = OTHER
    elif case == "task-node":
        task = make_task(node=OTHER)
    elif case == "pool":
        header = make_header(pool_id=8)
    elif case == "expired":
        over["now"] = NOW + 101
    elif case == "seed":
        header = make_header(task_seed=SEED + 1)
    elif case == "env":
        header = make_header(env="thinking-budget")
    elif case == "model":
        header = make_header(model="tiny:1")
    elif case == "stale-policy":
        header = make_header(policy_version=2)  # current 5, async level 2: 3 is the oldest allowed
    elif case == "future-policy":
        header = make_header(policy_version=6)
    elif case == "other-version":
        header = make_header(policy_version=4)
        task = make_task(min_policy_version=5)
    elif case == "temperature":
        header = make_header(sampling={"temperature": 2.0, "top_p": 1.0, "max_tokens": 16})
    elif case == "max-tokens":
        header = make_header(sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 17})
    elif case == "missing-sampling":
        header = make_header(sampling={"temperature": 1.0, "max_tokens": 16})
    elif case == "prompt-tokens":
        samples[4] = make_sample(1, 1, prompt_tokens=encode("something else"))
    elif case == "prompt-id":
        samples[4] = dataclasses.replace(samples[4], task_id=ENV.problem(SEED, 0).task_id)
    elif case == "group-outside":
        samples[5] = make_sample(2, 0)
    elif case == "group-short":
        samples = samples[:5]
    elif case == "group-long":
        samples.append(make_sample(1, 3))
    elif case == "group-missing":
        samples = [make_sample(0, i) for i in range(3)]
    elif case == "too-long":
        samples[0] = make_sample(0, 0, completion_tokens=[1] * 17)
    elif case == "reward-lie":
        samples[3] = make_sample(1, 0, reward=1.0)
    elif case == "reward-nan":
        samples[3] = make_sample(1, 0, reward=float("nan"))
    elif case == "extra-sampling-key":
        header = make_header(sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "top_k": 1})
    elif case == "token-past-vocab":
        samples[2] = make_sample(0, 2, completion_tokens=[1, 512, 3])
    elif case == "prompt-past-vocab":
        samples[2] = make_sample(0, 2, prompt_tokens=[*encode(ENV.problem(SEED, 0).prompt)[:-1], 10**6])
    elif case == "logprob-nan":
        samples[2] = make_sample(0, 2, logprobs=[-0.1, float("nan"), -0.2])
    elif case == "logprob-positive":
        samples[2] = make_sample(0, 2, logprobs=[-0.1, 3.0, -0.2])
    elif case == "copied-completion":  # one 12-token draw of probability e^-24 sent three times
        copy = [5] * 12
        samples[:3] = [make_sample(0, i, completion_tokens=copy, logprobs=[-2.0] * 12) for i in range(3)]
    elif case == "reward-inf":
        samples[3] = make_sample(1, 0, reward=float("inf"))
    else:  # pragma: no cover
        raise AssertionError(case)
    assert _reason(check(make_file(header, samples), task, **over)) == reason


def test_confident_repeats_pass_and_copies_across_files_count() -> None:
    """Honest low-entropy answers repeat: three copies of a 3-token answer of probability 0.22 each (the
    file's default samples) pass. The same 12-token completion of probability e^-24 passes once, but a
    second copy in a later file (the prior counts an earlier file contributed) is refused."""
    assert check(make_file()).accepted
    rare = [make_sample(0, 0, completion_tokens=[5] * 12, logprobs=[-2.0] * 12)]
    rare += [make_sample(0, i, completion_tokens=[6, i], logprobs=[-1.0, -1.0]) for i in (1, 2)]
    rare += [make_sample(1, i) for i in range(3)]
    f = make_file(samples=rare)
    assert check(f).accepted
    s = rare[0]
    prior_draws = {tuple(s.prompt_tokens): 3}
    prior_copies = {(tuple(s.prompt_tokens), tuple(s.completion_tokens)): 1}
    assert _reason(check(f, prior_draws=prior_draws, prior_copies=prior_copies)) == "duplicate-samples"


def test_empty_file_is_rejected() -> None:
    f = RolloutFile(make_header(), [])
    assert _reason(check(f, make_task(prompts=1, group_size=1))) == "wrong-shape"


# ---------------------------------------------------------------------- Task.from_wire


def test_task_round_trips_through_the_wire() -> None:
    t = make_task()
    wire = protocol.unpack(protocol.pack({"task": t.to_wire()}), "reply")["task"]
    assert Task.from_wire(wire) == t


@pytest.mark.parametrize(
    "mutate",
    [
        lambda w: w.pop("task_id"),
        lambda w: w.update(seed="1"),
        lambda w: w.update(pool_id=True),  # a bool is not an int here
        lambda w: w.update(prompts=0),
        lambda w: w.update(prompts=1025),
        lambda w: w.update(group_size=65),
        lambda w: w.update(sampling={"temperature": 1.0}),
        lambda w: w.update(sampling={"temperature": True, "max_tokens": 8}),
        lambda w: w.update(sampling={"temperature": 1.0, "max_tokens": 0}),
        lambda w: w.update(sampling="hot"),
        lambda w: w.update(sampling={"temperature": 1.0, "max_tokens": float("nan")}),
        lambda w: w.update(sampling={"temperature": 1.0, "max_tokens": float("inf")}),
        lambda w: w.update(sampling={"temperature": float("nan"), "max_tokens": 8}),
        lambda w: w.update(sampling={"temperature": 1.0, "max_tokens": 10**30}),
        lambda w: w.update(expires_at="soon"),
        lambda w: w.update(node=None),
    ],
)
def test_task_from_wire_rejects_malformed_maps(mutate: Any) -> None:
    w = make_task().to_wire()
    mutate(w)
    with pytest.raises(ProtocolError, match="malformed task"):
        Task.from_wire(w)


@pytest.mark.parametrize("obj", [None, [], "task", 3, b"\x80"])
def test_task_from_wire_rejects_non_maps(obj: Any) -> None:
    with pytest.raises(ProtocolError, match="expected a map"):
        Task.from_wire(obj)


# ---------------------------------------------------------------------- codec


def test_ok_reply_decodes() -> None:
    assert protocol.reply_body(protocol.ok(units=5), "submission") == {"ok": True, "units": 5}


def test_refusal_becomes_protocol_error_with_the_message() -> None:
    with pytest.raises(ProtocolError) as info:
        protocol.reply_body(
            protocol.refuse("node 0x1 is not a member of pool 3", "join the pool first"), "task request"
        )
    assert info.value.message == "task request refused: node 0x1 is not a member of pool 3"
    assert info.value.hint == "join the pool first"
    assert str(info.value) == "task request refused: node 0x1 is not a member of pool 3; join the pool first"
    with pytest.raises(ProtocolError, match="refused: no reason given"):
        protocol.reply_body(protocol.pack({"ok": "yes"}), "invite request")


def test_oversize_and_garbage_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.unpack(protocol.pack({"x": "a" * MAX_MESSAGE}), "reply")
    for junk in (b"", b"\xc1", b"\x92\x01", msgpack.packb([1, 2]), msgpack.packb({1: 2}), b"\x81\xa1a"):
        with pytest.raises(ProtocolError, match="malformed reply"):
            protocol.unpack(junk, "reply")
    with pytest.raises(ProtocolError):
        protocol.reply_body(b"\xff\xff", "reply")


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
_task_keys = st.sampled_from([f.name for f in dataclasses.fields(Task)] + ["temperature", "max_tokens"])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_unpack_raw_bytes(data: bytes) -> None:
    try:
        obj = protocol.unpack(data, "message")
    except ProtocolError:
        return
    assert isinstance(obj, dict)
    with contextlib.suppress(ProtocolError):
        protocol.reply_body(data, "message")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(_task_keys, st.text(max_size=8)), _values, max_size=14), st.booleans())
def test_fuzz_task_from_wire(obj: dict[str, Any], start_valid: bool) -> None:
    wire: dict[str, Any] = make_task().to_wire() if start_valid else {}
    wire.update(obj)
    try:
        data = protocol.pack({"task": wire})
    except (ValueError, TypeError, OverflowError):
        data = None
    try:
        t = Task.from_wire(wire)
    except ProtocolError:
        t = None
    if t is not None:
        assert 1 <= t.prompts <= 1024 and 1 <= t.group_size <= 64
    if data is not None and len(data) <= MAX_MESSAGE:
        with contextlib.suppress(ProtocolError):
            Task.from_wire(protocol.unpack(data, "reply").get("task"))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["temperature", "max_tokens", "top_p"]), _values, max_size=3))
def test_fuzz_task_sampling(sampling: dict[str, Any]) -> None:
    wire = make_task().to_wire()
    wire["sampling"] = sampling
    try:
        t = Task.from_wire(wire)
    except ProtocolError:
        return
    assert 1 <= int(t.sampling["max_tokens"]) <= 32768


def test_a_passing_refusal_is_told_apart_from_a_verdict() -> None:
    import pytest

    from node import protocol

    with pytest.raises(protocol.ProtocolBusy, match="busy"):
        protocol.reply_body(protocol.refuse("the coordinator is busy", "submit again", retry=True), "submission")
    with pytest.raises(protocol.ProtocolError) as refused:
        protocol.reply_body(protocol.refuse("wrong reward", ""), "submission")
    assert not isinstance(refused.value, protocol.ProtocolBusy)
