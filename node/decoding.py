"""Bounded decoders for bytes that come from another party (JSON and msgpack).

Every decoder of hostile bytes goes through here, so that the shape of what a peer sends is checked
before Python objects are built from it:

- **size**: the byte length, before anything is parsed;
- **depth**: how deeply arrays and maps nest, found by a scan of the bytes themselves (JSON) or by the
  unpacker's own bounded stack plus an iterative walk (msgpack). It does not rely on the interpreter's
  recursion limit: a dependency raises it to 100,000 at import, and then the C stack of the JSON parser
  overflows (SIGSEGV, a dead daemon) long before a `RecursionError` could be raised;
- **width**: how many values the document holds in all (each one is a Python object, tens of bytes);
- **numbers**: integers of at most `max_int_digits` digits, no NaN, no Infinity, no float that
  overflows to infinity. Python's own JSON parser accepts all of those.

A refusal is a `DecodeError` (a `ValueError`, so every caller that already catches a malformed
document's `ValueError` keeps doing so) naming what was refused. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgpack
import numpy as np

from node.errors import PeerError

#: Nesting that no document of this protocol needs (the deepest, a task spec, nests 3 or 4 levels).
DEFAULT_DEPTH = 32
#: Values in one document: arrays, maps, strings, numbers, each counted once.
DEFAULT_ITEMS = 100_000
#: Digits of an integer (a uint256 is 78 digits in decimal).
DEFAULT_INT_DIGITS = 80


class DecodeError(PeerError, ValueError):
    """Bytes from another party that are malformed or beyond a decoder's bounds."""


# A JSON string, unrolled so that it matches in linear time: a quote, runs of plain characters and
# escapes, a quote. An unterminated string does not match, and its brackets are then counted, which
# can only overestimate the depth.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Structural bytes outside strings: +1 opens a level, -1 closes one, 2 separates values.
_LEVEL = bytes(1 if c in b"[{" else 255 if c in b"]}" else 0 for c in range(256))
_SEPARATORS = bytes(1 if c in b",:" else 0 for c in range(256))


def json_shape(data: bytes) -> tuple[int, int]:
    """(deepest nesting, number of values at most) of a JSON document, from its bytes alone.

    Strings are cut out first (brackets and commas inside them are text); what is left is counted with
    numpy, so a 64 MiB document costs tens of milliseconds and no Python object per value."""
    bare = _JSON_STRING.sub(b'""', data)
    levels = np.frombuffer(bare.translate(_LEVEL), dtype=np.int8)
    depth = int(np.cumsum(levels, dtype=np.int64).max(initial=0))
    opened = int(np.count_nonzero(levels == 1))
    separators = int(np.count_nonzero(np.frombuffer(bare.translate(_SEPARATORS), dtype=np.uint8)))
    return depth, opened + separators + 1


def utf8_text(raw: bytes, what: str) -> str:
    """`raw` as strict UTF-8 (JSON's encoding). `json.loads` of bytes would also guess UTF-16 and UTF-32,
    where a byte scan reads other characters' bytes as quotes and brackets: a document 100,000 deep in
    UTF-16 looked 1 deep to it, and overflowed the parser's stack."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff", b"\xef\xbb\xbf")) or b"\x00" in raw:
        raise DecodeError(f"{what} is not UTF-8 JSON (a byte order mark or a NUL byte)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} is not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _refuse_constant(name: str) -> Any:
    raise DecodeError(f"{name} is not a JSON number")


def loads_json(
    data: bytes | str,
    *,
    what: str,
    max_bytes: int,
    max_depth: int = DEFAULT_DEPTH,
    max_items: int = DEFAULT_ITEMS,
    max_int_digits: int = DEFAULT_INT_DIGITS,
) -> Any:
    """`json.loads` for another party's bytes, within the bounds above; raises `DecodeError`."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise DecodeError(f"{what} of {len(raw)} bytes exceeds the limit of {max_bytes}")
    text = utf8_text(raw, what)  # the bytes scanned are the bytes parsed: never UTF-16 or UTF-32
    depth, items = json_shape(raw)
    if depth > max_depth:
        raise DecodeError(f"{what} nests {depth} levels deep, the limit is {max_depth}")
    if items > max_items:
        raise DecodeError(f"{what} holds about {items} values, the limit is {max_items}")

    def parse_int(s: str) -> int:
        if len(s.lstrip("-")) > max_int_digits:
            raise DecodeError(f"{what} holds an integer of {len(s.lstrip('-'))} digits (limit {max_int_digits})")
        return int(s)

    def parse_float(s: str) -> float:
        if len(s) > max_int_digits + 40:
            raise DecodeError(f"{what} holds a number written in {len(s)} characters")
        x = float(s)
        if not math.isfinite(x):
            raise DecodeError(f"{what} holds a number that is not finite ({s[:20]})")
        return x

    try:
        return json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=_refuse_constant)
    except DecodeError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise DecodeError(f"{what} is not valid JSON ({exc})") from None


def unpack_msgpack(
    data: bytes,
    *,
    what: str,
    max_bytes: int,
    max_depth: int = DEFAULT_DEPTH,
    max_items: int = DEFAULT_ITEMS,
) -> Any:
    """`msgpack.unpackb` for another party's bytes (str keys, no extension types, bytes as bytes);
    raises `DecodeError`.

    The unpacker's length limits keep a small input from announcing a huge array; its C stack is of fixed
    size (it refuses deeper input with `StackError`), and the result is then walked iteratively for the
    depth and the number of values, before any caller looks at it."""
    raw = bytes(data)
    if len(raw) > max_bytes:
        raise DecodeError(f"{what} of {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        obj = msgpack.unpackb(
            raw,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_array_len=min(max_items, max_bytes),
            max_map_len=min(max_items, max_bytes),
            max_ext_len=0,
        )
    except Exception as exc:  # ExtraData, FormatError, StackError, UnicodeDecodeError, OutOfData, ValueError
        raise DecodeError(f"{what} is not a msgpack value ({type(exc).__name__})") from None
    check_shape(obj, what=what, max_depth=max_depth, max_items=max_items)
    return obj


def check_shape(obj: Any, *, what: str, max_depth: int = DEFAULT_DEPTH, max_items: int = DEFAULT_ITEMS) -> None:
    """Raise `DecodeError` if `obj` (lists, tuples and dicts of scalars) nests deeper than `max_depth` or
    holds more than `max_items` values. Iterative: no recursion, whatever the depth."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > max_items:
            raise DecodeError(f"{what} holds more than {max_items} values")
        if isinstance(value, (list, tuple)):
            children: Any = value
        elif isinstance(value, dict):
            children = [*value.keys(), *value.values()]
        else:
            continue
        if depth + 1 > max_depth:
            raise DecodeError(f"{what} nests more than {max_depth} levels deep")
        stack.extend((c, depth + 1) for c in children)
