"""Daemons' `/status` pages as the explorer shows them: read under a time and size bound, and cleaned.

A status page is anybody's (`--status URL`): its JSON may hold NaN or Infinity (Python's parser takes
them, no strict parser does), integers of hundreds of digits (no float holds them), nesting deep enough
to overflow the parser's C stack (a dependency, py_ecc, raises the recursion limit to 100,000 at import,
so `json.loads` of 100,000 brackets is a segmentation fault, not a RecursionError: the depth is found
from the bytes before they are parsed), or megabytes of one string. `clean` turns whatever was read into
plain JSON the pages can always draw and `/api/status` can always send: non-finite floats and integers
beyond 2**256 become null, nesting past `MAX_DEPTH` becomes null, strings and lists are cut, and the
whole value holds at most `MAX_NODES` values. A page that cannot be read at all is shown as its error (`pool.explorer.live` draws the rows).
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import trio

from node.decoding import DecodeError, json_shape, utf8_text

MAX_STATUS_BYTES = 256 * 1024
STATUS_TIMEOUT = 3.0
MAX_DEPTH = 12
MAX_STR = 2000
MAX_ITEMS = 10_000  # of one list or object (a reward curve: one per policy version)
MAX_NODES = 50_000  # values in one status page, all levels together
MAX_INT = 2**256  # a uint256 is the largest number a daemon has a reason to send
MAX_PARSE_DEPTH = 64  # deeper JSON is not parsed at all


def json_depth(body: bytes) -> int:
    """How deeply a JSON document's arrays and objects nest, from its bytes alone (`node.decoding`)."""
    return json_shape(body)[0]


def clean(value: Any) -> Any:
    """`value` as plain, finite, bounded JSON (see the module's docstring); never raises."""
    budget = [MAX_NODES]

    def go(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            return v if -MAX_INT <= v <= MAX_INT else None
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, str):
            return v[:MAX_STR]
        if depth >= MAX_DEPTH:
            return None
        if isinstance(v, dict):
            return {str(k)[:200]: go(x, depth + 1) for k, x in list(v.items())[:MAX_ITEMS]}
        if isinstance(v, (list, tuple)):
            return [go(x, depth + 1) for x in list(v)[:MAX_ITEMS]]
        try:
            return str(v)[:MAX_STR]
        except Exception:  # an object of a daemon's own whose str() fails
            return None

    return go(value, 0)


def parse(body: bytes) -> dict[str, Any]:
    """A status page's body as a cleaned JSON object, or `{"error": ...}`."""
    try:
        text = utf8_text(body, "status page")  # what is scanned is what is parsed (never UTF-16)
    except DecodeError as exc:
        return {"error": str(exc)[:200]}
    depth = json_depth(body)
    if depth > MAX_PARSE_DEPTH:
        return {"error": f"JSON nested {depth:,} levels deep"}
    try:
        data = json.loads(text)
    except RecursionError:  # not at MAX_PARSE_DEPTH, but never the poller's death
        return {"error": "JSON nested too deep"}
    except ValueError as exc:  # also: an integer of over 4,300 digits
        return {"error": f"not JSON: {exc}"[:200]}
    if not isinstance(data, dict):
        return {"error": "not a JSON object"}
    out = clean(data)
    return out if isinstance(out, dict) else {"error": "not a JSON object"}


async def fetch_status(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """A daemon's `/status` (a JSON object, cleaned), read under a time and size bound; its failure as
    `error`. Never raises, whatever the page answers."""
    try:
        with trio.fail_after(STATUS_TIMEOUT):
            async with client.stream("GET", url) as r:
                if r.status_code != 200:
                    return {"error": f"HTTP {r.status_code}"}
                body = b""
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_STATUS_BYTES:
                        return {"error": f"answer over {MAX_STATUS_BYTES} bytes"}
    except trio.TooSlowError:
        return {"error": f"no answer within {STATUS_TIMEOUT:g} s"}
    except (httpx.HTTPError, ValueError, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return parse(body)
