"""The pool's task spec: the terms every task of the pool is generated and checked under.

A pool's on-chain record holds a URI and the sha256 of a JSON document (model, environment, sampling
parameters, group size, async level). `sampling.exact: true` makes every completion a seeded
Gumbel-max draw that validators replay token by token (`node.rollout.exact`); without it a pool's
files are checked statistically (a temperature test over the file). It is the only source of these terms a validator may trust:
the coordinator hands tasks out under them and the validator checks work against them, never against
what a rollout file's header claims. `parse_spec` is pure; `fetch_spec` reads the bytes from a
``file://`` or ``http(s)://`` URI, bounded in size and time, and checks them against the hash.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import httpx

from node.decoding import DecodeError, loads_json
from node.errors import IntellectError
from node.tasks.envs import env_names

MAX_SPEC_BYTES = 64 * 1024
# the sampling keys a spec may set; any other key is refused (a key nobody checks is a key to lie with)
SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_tokens", "exact"}


class TaskSpecError(IntellectError, ValueError):
    """The pool's task spec cannot be fetched, does not match its on-chain hash, or is malformed."""


@dataclass(frozen=True)
class TaskSpec:
    model: str
    env: str
    sampling: dict[str, Any]
    group_size: int = 4
    async_level: int = 2
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    env_version: str | None = None  # pins of the environment (`node.tasks.envs.get_env` checks them)
    env_hash: str | None = None

    def environment(self) -> Any:
        """This node's environment of the spec's name, refused (`EnvironmentMismatch`) unless it is the
        version and content the spec pins."""
        from .tasks import get_env

        return get_env(self.env, version=self.env_version, pinned_hash=self.env_hash)

    @property
    def max_tokens(self) -> int:
        return int(self.sampling["max_tokens"])

    def sampling_params(self) -> Any:
        from .rollout.checks import SamplingParams

        s = self.sampling
        return SamplingParams(
            float(s["temperature"]),
            float(s.get("top_p", 1.0)),
            int(s.get("top_k", -1)),
            int(s["max_tokens"]),
            bool(s.get("exact", False)),
        )


def _number(v: Any, what: str, lo: float, hi: float, integer: bool = False) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise TaskSpecError(f"task spec: {what} must be {'an integer' if integer else 'a number'}")
    if not (math.isfinite(v) and lo <= v <= hi):
        raise TaskSpecError(f"task spec: {what} = {v} outside {lo}..{hi}")
    return v


def parse_spec(data: bytes, expected_hash: str | None = None) -> TaskSpec:
    """The spec in `data`, after checking its sha256 against `expected_hash` (0x-hex) when given."""
    if len(data) > MAX_SPEC_BYTES:
        raise TaskSpecError(f"task spec of {len(data)} bytes exceeds {MAX_SPEC_BYTES}")
    if expected_hash is not None:
        got = "0x" + hashlib.sha256(data).hexdigest()
        if got.lower() != expected_hash.lower():
            raise TaskSpecError(
                f"task spec hash {got} does not match the pool's on-chain hash {expected_hash}",
                "the file at the spec URI was changed after the pool was created",
            )
    try:
        obj = loads_json(data, what="task spec", max_bytes=MAX_SPEC_BYTES)
    except DecodeError as exc:
        raise TaskSpecError(str(exc)) from None
    if not isinstance(obj, dict):
        raise TaskSpecError("task spec must be a JSON object")
    model, env, sampling = obj.get("model"), obj.get("environment"), obj.get("sampling")
    if not isinstance(model, str) or not model:
        raise TaskSpecError("task spec: 'model' must be a non-empty string")
    known_envs = env_names()
    if env not in known_envs:
        raise TaskSpecError(
            f"task spec: 'environment' must be one of {', '.join(known_envs)} (built in or installed here), not {env!r}"
        )
    env_version, env_hash = obj.get("environment_version"), obj.get("environment_hash")
    if env_version is not None and (not isinstance(env_version, str) or not 0 < len(env_version) <= 64):
        raise TaskSpecError("task spec: 'environment_version' must be a short string")
    if env_hash is not None and (not isinstance(env_hash, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", env_hash)):
        raise TaskSpecError("task spec: 'environment_hash' must be 64 hex digits (sha256)")
    if not isinstance(sampling, dict):
        raise TaskSpecError("task spec: 'sampling' must be an object")
    unknown = set(sampling) - SAMPLING_KEYS
    if unknown:
        raise TaskSpecError(f"task spec: unknown sampling key(s) {sorted(unknown)}")
    s: dict[str, Any] = {
        "temperature": _number(sampling.get("temperature"), "sampling.temperature", 0.0, 100.0),
        "max_tokens": _number(sampling.get("max_tokens"), "sampling.max_tokens", 1, 32768, integer=True),
    }
    if "top_p" in sampling:
        s["top_p"] = _number(sampling["top_p"], "sampling.top_p", 1e-6, 1.0)
    if "top_k" in sampling:
        s["top_k"] = _number(sampling["top_k"], "sampling.top_k", -1, 1 << 20, integer=True)
    if "exact" in sampling:
        if not isinstance(sampling["exact"], bool):
            raise TaskSpecError("task spec: sampling.exact must be true or false")
        if sampling["exact"] and s["temperature"] == 0:
            raise TaskSpecError("task spec: sampling.exact needs a positive temperature (greedy decoding is exact)")
        s["exact"] = sampling["exact"]
    group = _number(obj.get("group_size", 4), "group_size", 1, 64, integer=True)
    level = _number(obj.get("async_level", 2), "async_level", 0, 1000, integer=True)
    known = {"model", "environment", "environment_version", "environment_hash", "sampling", "group_size",
             "async_level", "name"}  # fmt: skip
    name = obj.get("name", "")
    extra = {k: v for k, v in obj.items() if k not in known}
    return TaskSpec(model, env, s, group, level, str(name), extra, env_version, env_hash)


async def fetch_spec(uri: str, expected_hash: str, *, timeout: float = 15.0) -> TaskSpec:
    """Fetch the spec at `uri` (``file://`` or ``http(s)://``) and check it against `expected_hash`."""
    u = urlparse(uri)
    if u.scheme == "file":
        path = Path(unquote(u.path))
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_SPEC_BYTES + 1)
        except OSError as exc:
            raise TaskSpecError(
                f"cannot read the task spec {uri}: {exc.strerror or exc}", "is the URI right?"
            ) from None
    elif u.scheme in ("http", "https"):
        try:
            async with (
                httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
                client.stream("GET", uri) as r,
            ):
                if r.status_code != 200:
                    raise TaskSpecError(f"task spec {uri}: HTTP {r.status_code}")
                buf = bytearray()
                async for piece in r.aiter_bytes():
                    buf += piece
                    if len(buf) > MAX_SPEC_BYTES:
                        break
                data = bytes(buf)
        except httpx.HTTPError as exc:
            raise TaskSpecError(f"cannot fetch the task spec {uri}: {type(exc).__name__}: {exc}") from None
    else:
        raise TaskSpecError(f"task spec URI {uri!r}: only file:// and http(s):// are supported")
    return parse_spec(data, expected_hash)


async def pool_spec(info: dict[str, Any]) -> TaskSpec:
    """The spec of a pool, from its on-chain record (`ops.pool_info`)."""
    h = info["specHash"]
    hex_hash = "0x" + (h.hex() if isinstance(h, (bytes, bytearray)) else str(h).removeprefix("0x"))
    try:
        return await fetch_spec(str(info["specURI"]), hex_hash)
    except TaskSpecError as exc:
        raise TaskSpecError(f"pool {info.get('poolId')}: {exc.message}", exc.hint or "ask the pool owner") from None
