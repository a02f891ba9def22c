"""The bounded decoders (`node.decoding`) and every decoder of another party's bytes built on them, fuzzed
with hypothesis: arbitrary bytes, depth bombs, width bombs and huge numbers end as each decoder's own
error, never as another exception; well-formed documents within the bounds decode as `json`/`msgpack` would.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node import evidence, protocol, taskspec
from node.decoding import DEFAULT_DEPTH, DecodeError, check_shape, json_shape, loads_json, unpack_msgpack
from node.p2p import envelope
from node.rollout.file import RolloutFormatError, _header

FUZZ = settings(max_examples=150, deadline=None)

scalars = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.text(max_size=20)
json_values = st.recursive(
    scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def depth_of(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max((depth_of(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((depth_of(x) for x in v.values()), default=0)
    return 0


def bomb(depth: int, kinds: str) -> str:
    """`depth` nested arrays and objects (kinds cycles through 'a' and 'o'), with brackets in strings."""
    opens = "".join('[" ]]]", ' if kinds[i % len(kinds)] == "a" else '{"k]}": ' for i in range(depth))
    closes = "".join("]" if kinds[i % len(kinds)] == "a" else "}" for i in reversed(range(depth)))
    return opens + "0" + closes


@FUZZ
@given(json_values)
def test_documents_within_the_bounds_decode_as_json_does(v: Any) -> None:
    text = json.dumps(v)
    assert loads_json(text.encode(), what="doc", max_bytes=1 << 20) == json.loads(text)
    assert json_shape(text.encode())[0] == depth_of(v)


@FUZZ
@given(st.integers(DEFAULT_DEPTH + 1, 120_000), st.text(alphabet="ao", min_size=1, max_size=5))
def test_depth_bombs_are_refused_whatever_their_shape(depth: int, kinds: str) -> None:
    with pytest.raises(DecodeError, match="levels deep"):
        loads_json(bomb(depth, kinds).encode(), what="doc", max_bytes=16 << 20)


def test_brackets_inside_strings_are_text() -> None:
    text = json.dumps(["[" * 10_000, {"}": "{" * 500, 'esc\\"[[[': '"[['}])
    assert loads_json(text.encode(), what="doc", max_bytes=1 << 20)[0] == "[" * 10_000
    assert json_shape(text.encode())[0] == 2
    # an unterminated string cannot hide brackets: they are counted, and refused
    with pytest.raises(DecodeError, match="levels deep"):
        loads_json(b'"abc' + b"[" * 1000, what="doc", max_bytes=1 << 20)


def test_only_utf8_is_parsed_so_the_scan_sees_what_the_parser_sees() -> None:
    # in UTF-16 a character's bytes read as a quote to a byte scan: the brackets looked like string text
    deep = '["\u2200", ' + "[" * 100 + "]" * 100 + ', "b"]'
    for data in (deep.encode("utf-16-le"), deep.encode("utf-16"), deep.encode("utf-32"), b"\xef\xbb\xbf[1]"):
        with pytest.raises(DecodeError, match="UTF-8"):
            loads_json(data, what="doc", max_bytes=1 << 20)
    with pytest.raises(DecodeError, match="UTF-8"):
        loads_json(b'["\xff"]', what="doc", max_bytes=64)
    assert loads_json('["\u2200", []]'.encode(), what="doc", max_bytes=64) == ["\u2200", []]


def test_width_bombs_and_huge_numbers_are_refused() -> None:
    with pytest.raises(DecodeError, match="values"):
        loads_json(b"[" + b"[]," * 200_000 + b"0]", what="doc", max_bytes=16 << 20)
    with pytest.raises(DecodeError, match="digits"):
        loads_json(b'{"a": ' + b"9" * 400 + b"}", what="doc", max_bytes=1 << 20)
    for const in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400"):
        with pytest.raises(DecodeError):
            loads_json(b"[" + const + b"]", what="doc", max_bytes=1 << 20)
    assert loads_json(b"[" + b"9" * 78 + b", 1.5e300]", what="doc", max_bytes=128) == [int("9" * 78), 1.5e300]
    assert math.isfinite(loads_json(b"2.5", what="doc", max_bytes=8))
    with pytest.raises(DecodeError, match="exceeds"):
        loads_json(b"[1]" * 10, what="doc", max_bytes=8)


@FUZZ
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_end_as_decode_errors(data: bytes) -> None:
    for fn in (
        lambda: loads_json(data, what="doc", max_bytes=4096),
        lambda: unpack_msgpack(data, what="doc", max_bytes=4096),
    ):
        with contextlib.suppress(DecodeError):
            fn()


def test_msgpack_depth_and_width_are_bounded_without_recursion() -> None:
    deep = b"\x91" * 1000 + b"\xc0"  # arrays nested 1,000 deep (msgpack's own stack allows this)
    with pytest.raises(DecodeError):
        unpack_msgpack(deep, what="doc", max_bytes=1 << 20)
    with pytest.raises(DecodeError):
        unpack_msgpack(b"\x81\xa1a" * 200_000 + b"\xc0", what="doc", max_bytes=1 << 20)
    wide = msgpack.packb([[0] * 1000] * 200)
    with pytest.raises(DecodeError, match="values"):
        unpack_msgpack(wide, what="doc", max_bytes=1 << 20)
    assert unpack_msgpack(msgpack.packb({"a": [1, {"b": b"x"}]}), what="doc", max_bytes=64) == {"a": [1, {"b": b"x"}]}
    nested: list[Any] = []
    for _ in range(100_000):  # built by hand: a walk of it must not recurse
        nested = [nested]
    with pytest.raises(DecodeError, match="levels deep"):
        check_shape(nested, what="doc")


# ------------------------------------------------------------------ each decoder of another party's bytes

hostile_json = (
    st.integers(DEFAULT_DEPTH + 1, 60_000).map(lambda d: bomb(d, "ao").encode())
    | st.integers(1, 600).map(lambda n: b'{"model": ' + b"7" * n + b"}")
    | st.sampled_from([b'{"model": NaN}', b'{"sampling": {"temperature": Infinity}}', b"[" + b"0," * 120_000 + b"0]"])
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=500)
)


@FUZZ
@given(hostile_json)
def test_the_task_spec_decoder(data: bytes) -> None:
    with contextlib.suppress(taskspec.TaskSpecError):
        taskspec.parse_spec(data)


@FUZZ
@given(hostile_json)
def test_the_evidence_decoder(data: bytes) -> None:
    with contextlib.suppress(evidence.EvidenceError):
        evidence.parse_evidence(data)


@FUZZ
@given(hostile_json)
def test_the_rollout_header_decoder(data: bytes) -> None:
    with contextlib.suppress(RolloutFormatError):
        _header({b"intellect": data})


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
hostile_msgpack = (
    st.integers(1, 70_000).map(lambda d: b"\x91" * d + b"\xc0")
    | st.integers(1, 20_000).map(lambda d: b"\x81\xa1a" * d + b"\xc0")
    | st.integers(1, 70_000).map(lambda n: b"\xdd" + n.to_bytes(4, "big"))  # an array announcing n values
    | st.sampled_from([msgpack.packb({"n": 2**64 - 1}), msgpack.packb({"x": float("nan")})])
    | msgpack_values.map(lambda v: msgpack.packb(v, use_bin_type=True))
    | st.binary(max_size=500)
)


@FUZZ
@given(hostile_msgpack)
def test_the_message_decoder(data: bytes) -> None:
    with contextlib.suppress(protocol.ProtocolError):
        protocol.unpack(data, "message")


@FUZZ
@given(hostile_msgpack)
def test_the_gossip_envelope_decoder(data: bytes) -> None:
    with contextlib.suppress(envelope.EnvelopeError):
        envelope.decode(data)
