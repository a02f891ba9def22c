"""The rollout file: what a worker uploads for one task, as parquet.

One row per completion (prompt tokens, completion tokens, sampled-token logprobs, reward, finish
reason, TOPLOC proofs); the header (pool, node, policy version, environment, task seed, sampling
parameters, model) lives in the parquet schema metadata. The sha256 of the file's bytes is its work
key on chain. Reading validates everything, so a malformed upload is a clear error, never a crash.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from node.decoding import loads_json
from node.errors import IntellectError
from node.rollout.budget import PARSES, PY_BYTES_PER_VALUE, FileLimits, MemoryBudget
from node.rollout.footer import Footer, FooterError, Template, read_footer, read_pages, template

FORMAT = "intellect-rollout/1"
PROOF_BYTES = 258
CHUNK = 32
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_ROWS = 4096
#: The JSON header in the file's key-value metadata (pool, node, version, sampling, model, extra).
MAX_HEADER_BYTES = 64 * 1024
MAX_TOKENS = 32768
# Decoded size bound. Checked first from the parquet footer (plainly encoded pages that zstd squeezed
# from gigabytes are refused before any read), then while the rows are decoded, batch by batch: dictionary
# and RLE pages report their encoded size in the footer, and a 22 KB file of one repeated token id decodes
# to gigabytes. A file may decode to DECODED_FLOOR + DECODED_RATIO x its size (honest files, zstd over
# token ids and logprobs, decode to about 4x), never more than MAX_DECODED_BYTES.
MAX_DECODED_BYTES = 256 * 1024 * 1024
DECODED_FLOOR = 16 * 1024 * 1024
DECODED_RATIO = 16
READ_BATCH_ROWS = 32

SCHEMA = pa.schema(
    [
        ("group", pa.int32()),
        ("sample", pa.int32()),
        ("task_id", pa.string()),
        ("prompt_tokens", pa.list_(pa.int32())),
        ("completion_tokens", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("finish_reason", pa.string()),
        ("proofs", pa.binary()),
    ]
)


class RolloutFormatError(IntellectError, ValueError):
    """The bytes are not a valid rollout file."""


def _write(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return buf.getvalue()


@functools.cache
def _footer_shape() -> Template:
    """The footer shape of what `_write` writes, from a one-row file with every column filled."""
    row = {
        "group": [0],
        "sample": [0],
        "task_id": ["t"],
        "prompt_tokens": [[1]],
        "completion_tokens": [[1]],
        "logprobs": [[-1.0]],
        "reward": [0.0],
        "finish_reason": ["stop"],
        "proofs": [b"p"],
    }
    return template(_write(pa.Table.from_pydict(row, schema=SCHEMA)))


@dataclass(frozen=True)
class RolloutHeader:
    pool_id: int
    node: str
    policy_version: int
    env: str
    task_seed: int
    sampling: dict[str, Any]
    model: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutSample:
    group: int
    sample: int
    task_id: str
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    reward: float
    finish_reason: str
    proofs: list[bytes]

    @property
    def units(self) -> int:
        return len(self.completion_tokens)


def chunks_for(n_tokens: int) -> int:
    return (n_tokens + CHUNK - 1) // CHUNK


@dataclass(frozen=True)
class RolloutFile:
    header: RolloutHeader
    samples: list[RolloutSample]

    @property
    def units(self) -> int:
        """Work units on chain: generated tokens."""
        return sum(s.units for s in self.samples)

    def to_bytes(self) -> bytes:
        """Deterministic for equal content, so the work key is a function of the rollouts."""
        for s in self.samples:
            _validate_sample(s)
        cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
        for s in self.samples:
            cols["group"].append(s.group)
            cols["sample"].append(s.sample)
            cols["task_id"].append(s.task_id)
            cols["prompt_tokens"].append(s.prompt_tokens)
            cols["completion_tokens"].append(s.completion_tokens)
            cols["logprobs"].append(s.logprobs)
            cols["reward"].append(float(s.reward))
            cols["finish_reason"].append(s.finish_reason)
            cols["proofs"].append(b"".join(s.proofs))
        meta = {"format": FORMAT, "header": asdict(self.header)}
        schema = SCHEMA.with_metadata({"intellect": json.dumps(meta, sort_keys=True)})
        return _write(pa.Table.from_pydict(cols, schema=schema))

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        max_bytes: int = MAX_FILE_BYTES,
        limits: FileLimits | None = None,
        memory: MemoryBudget = PARSES,
    ) -> RolloutFile:
        """Parse and validate a file from another party. Its footer and page headers are checked against
        `limits` (what a file for its task may hold) before a value is decoded; its rows are decoded a
        batch at a time, each batch's lengths checked before it becomes Python objects, within a share of
        `memory` (the budget every parse of the process shares: `ParseBusy` if it stays spent)."""
        if len(data) > max_bytes:
            raise RolloutFormatError(f"rollout file is {len(data)} bytes, the limit is {max_bytes}")
        try:  # pyarrow's per-column metadata accessors abort the process on some corrupt footers
            footer = read_footer(data, _footer_shape())
            if footer.num_rows > MAX_ROWS:
                raise RolloutFormatError(f"rollout file has {footer.num_rows} rows, the limit is {MAX_ROWS}")
            if limits is not None and footer.num_rows > limits.rows:
                raise RolloutFormatError(f"rollout file has {footer.num_rows} rows, its task has {limits.rows}")
            pages = read_pages(data, footer)  # what pyarrow will decode, from the page headers themselves
        except FooterError as exc:
            raise RolloutFormatError(f"not a readable parquet file: {exc}") from None
        decoded = max(footer.uncompressed_bytes, pages.uncompressed_bytes)
        if decoded > MAX_DECODED_BYTES:
            raise RolloutFormatError(f"rollout file decodes to {decoded} bytes, the limit is {MAX_DECODED_BYTES}")
        budget = min(MAX_DECODED_BYTES, DECODED_FLOOR + DECODED_RATIO * len(data))
        if pages.values * 4 > budget or decoded > budget:  # one row of 2**31 repeated ids: refused before decoding
            raise RolloutFormatError(
                f"rollout file of {len(data)} bytes declares {pages.values} values in {decoded} bytes, more than "
                "it may decode to (a bomb?)"
            )
        if limits is not None and pages.values > limits.values:
            raise RolloutFormatError(
                f"rollout file declares {pages.values} values; a file of its task ({limits.rows} rows, prompts of "
                f"at most {limits.prompt_tokens} tokens, completions of {limits.completion_tokens}) holds at most "
                f"{limits.values}"
            )
        need = pages.values * PY_BYTES_PER_VALUE + 2 * len(data)  # its rows as Python objects, and the proofs
        if not memory.fits(need):
            raise RolloutFormatError(
                f"rollout file declares {pages.values} values: {need >> 20} MiB as rows, more than the "
                f"{memory.total >> 20} MiB this process parses with"
            )
        with memory.reserve(need, "rollout file"):
            return cls._decode(data, footer, budget, limits)

    @classmethod
    def _decode(cls, data: bytes, footer: Footer, budget: int, limits: FileLimits | None) -> RolloutFile:
        try:
            pf = pq.ParquetFile(io.BytesIO(data))
            md = pf.metadata
            schema = pf.schema_arrow
            if (md.num_rows, md.num_row_groups) != (footer.num_rows, len(footer.row_groups)):
                raise RolloutFormatError("pyarrow reads the footer differently (a malformed footer)")
        except RolloutFormatError:
            raise
        except Exception as exc:  # pyarrow raises many types for corrupt input
            raise RolloutFormatError(f"not a readable parquet file ({type(exc).__name__}: {exc})") from None
        header = _header(schema.metadata or {})
        if not schema.remove_metadata().equals(SCHEMA):
            raise RolloutFormatError(f"rollout columns {schema.names} do not match the format")
        samples: list[RolloutSample] = []
        try:
            used = 0
            for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, use_threads=False):
                used += batch.nbytes
                if used > budget:
                    raise RolloutFormatError(
                        f"rollout file of {len(data)} bytes decodes to more than {budget} bytes (a dictionary "
                        "or run-length bomb?)"
                    )
                _check_lengths(batch, len(samples), limits)  # before any of its values is a Python object
                samples += _samples(batch.to_pylist(), len(samples))
        except RolloutFormatError:
            raise
        except Exception as exc:  # corrupt pages, invalid UTF-8 in a string column, ...
            raise RolloutFormatError(f"unreadable rollout rows ({type(exc).__name__}: {exc})") from None
        return cls(header, samples)


def _check_lengths(batch: pa.RecordBatch, first: int, limits: FileLimits | None) -> None:
    """The list lengths of a batch of rows (numbered from `first`), from arrow's offsets: completions of
    1..MAX_TOKENS tokens (at most the task's), as many logprobs, prompts within bounds, whole proofs."""
    most_completion = min(MAX_TOKENS, limits.completion_tokens) if limits else MAX_TOKENS
    most_prompt = min(MAX_TOKENS, limits.prompt_tokens) if limits else MAX_TOKENS
    if batch.num_rows == 0:
        return
    t = _lengths(batch.column("completion_tokens"))
    p = _lengths(batch.column("prompt_tokens"))
    lp = _lengths(batch.column("logprobs"))
    proofs = _lengths(batch.column("proofs"))
    bad = (t < 1) | (t > most_completion) | (p > most_prompt) | (lp != t) | (proofs != -(-t // CHUNK) * PROOF_BYTES)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise RolloutFormatError(
            f"row {first + i}: completion of {t[i]} tokens (1..{most_completion}), prompt of {p[i]} (at most "
            f"{most_prompt}), {lp[i]} logprobs, {proofs[i]} bytes of proofs ({chunks_for(max(int(t[i]), 0))} "
            f"proofs of {PROOF_BYTES} expected)"
        )


def _lengths(column: pa.Array) -> np.ndarray:
    """Length of each value of a list or binary column (-1 where null), without decoding the values."""
    n = pc.fill_null(pc.binary_length(column) if pa.types.is_binary(column.type) else pc.list_value_length(column), -1)
    return n.to_numpy(zero_copy_only=False).astype(np.int64)


def _samples(rows: list[dict[str, Any]], first: int) -> list[RolloutSample]:
    samples = []
    for i, r in enumerate(rows, start=first):
        blob = r["proofs"] or b""
        if len(blob) % PROOF_BYTES:
            raise RolloutFormatError(f"row {i}: proofs are {len(blob)} bytes, not a multiple of {PROOF_BYTES}")
        if any(r[k] is None for k in SCHEMA.names):
            raise RolloutFormatError(f"row {i}: missing values")
        s = RolloutSample(
            group=r["group"],
            sample=r["sample"],
            task_id=r["task_id"],
            prompt_tokens=list(r["prompt_tokens"]),
            completion_tokens=list(r["completion_tokens"]),
            logprobs=[float(x) for x in r["logprobs"]],
            reward=float(r["reward"]),
            finish_reason=r["finish_reason"],
            proofs=[blob[j : j + PROOF_BYTES] for j in range(0, len(blob), PROOF_BYTES)],
        )
        try:
            _validate_sample(s)
        except RolloutFormatError as exc:
            raise RolloutFormatError(f"row {i}: {exc}") from None
        samples.append(s)
    return samples


def _header(metadata: dict[bytes, bytes]) -> RolloutHeader:
    raw_meta = metadata.get(b"intellect")
    if raw_meta is None:
        raise RolloutFormatError("rollout file has no intellect header")
    try:
        meta = loads_json(raw_meta, what="rollout header", max_bytes=MAX_HEADER_BYTES)
        if meta.get("format") != FORMAT:
            raise RolloutFormatError(f"unknown rollout format {meta.get('format')!r}, expected {FORMAT}")
        h = meta["header"]
        return RolloutHeader(
            pool_id=int(h["pool_id"]),
            node=str(h["node"]),
            policy_version=int(h["policy_version"]),
            env=str(h["env"]),
            task_seed=int(h["task_seed"]),
            sampling=dict(h["sampling"]),
            model=str(h["model"]),
            extra=dict(h.get("extra", {})),
        )
    except RolloutFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RolloutFormatError(f"malformed rollout header ({exc})") from None


def _validate_sample(s: RolloutSample) -> None:
    t = len(s.completion_tokens)
    if t == 0 or t > MAX_TOKENS or len(s.prompt_tokens) > MAX_TOKENS:
        raise RolloutFormatError(f"completion of {t} tokens, prompt of {len(s.prompt_tokens)} (1..{MAX_TOKENS})")
    if len(s.logprobs) != t:
        raise RolloutFormatError(f"{len(s.logprobs)} logprobs for {t} tokens")
    if len(s.proofs) != chunks_for(t):
        raise RolloutFormatError(f"{len(s.proofs)} proofs for {t} tokens (expected {chunks_for(t)})")
    if any(len(p) != PROOF_BYTES for p in s.proofs):
        raise RolloutFormatError(f"a proof is not {PROOF_BYTES} bytes")
    if s.finish_reason not in ("stop", "length"):
        raise RolloutFormatError(f"finish reason {s.finish_reason!r} is not 'stop' or 'length'")
    if any(not (0 <= x < 2**31) for x in s.completion_tokens) or any(not (0 <= x < 2**31) for x in s.prompt_tokens):
        raise RolloutFormatError("token ids must be non-negative 32-bit integers")


def work_key(data: bytes) -> str:
    """The on-chain work key of a rollout file: 0x-prefixed sha256 of its bytes."""
    return "0x" + hashlib.sha256(data).hexdigest()
