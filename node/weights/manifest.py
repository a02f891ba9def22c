"""Checkpoint manifests: one file split into fixed-size, individually hashed shards (pure, no network).

A checkpoint is **one file** (e.g. ``model.safetensors``; ``VllmEngine.reload_weights`` accepts a single
``.safetensors`` file). It is cut into shards of ``shard_size`` bytes (the last one shorter); the
manifest lists every shard's size and sha256 plus the whole file's size and sha256.

The manifest's canonical JSON (sorted keys, no whitespace, ASCII) is what is hashed:
``manifest_hash()`` is the sha256 hex of those bytes and is what the coordinator announces on gossip
next to the version. A node that downloads a manifest whose hash differs from the announced one
refuses it; every shard is checked against the manifest, and the assembled file against the
whole-file hash, so nothing unverified is ever loaded.

On disk (``split`` and the stores): ``<dir>/manifest.json`` and ``<dir>/shard-000000`` ... .
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.decoding import DecodeError, loads_json
from node.errors import IntellectError
from node.fsio import atomic_file, write_file

FORMAT = "intellect-weights/1"
DEFAULT_SHARD_SIZE = 16 * 1024 * 1024
MIN_SHARD_SIZE = 1024
MAX_SHARD_SIZE = 256 * 1024 * 1024
MAX_SHARDS = 65_536
MAX_MANIFEST_BYTES = 8 * 1024 * 1024
MAX_VERSION = 2**63 - 1
MANIFEST_FILE = "manifest.json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_READ = 1024 * 1024


class IntegrityError(IntellectError, ValueError):
    """Bytes that do not match their manifest (a shard or the whole file)."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shard_file(directory: Path, index: int) -> Path:
    """Where shard ``index`` lives inside a version directory."""
    return Path(directory) / f"shard-{index:06d}"


@dataclass(frozen=True)
class ShardInfo:
    index: int
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    version: int
    name: str
    total_size: int
    sha256: str
    shard_size: int
    shards: tuple[ShardInfo, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "name": self.name,
            "total_size": self.total_size,
            "sha256": self.sha256,
            "shard_size": self.shard_size,
            "shards": [{"index": s.index, "size": s.size, "sha256": s.sha256} for s in self.shards],
        }

    def to_json(self) -> bytes:
        """Canonical JSON bytes: sorted keys, no whitespace, ASCII only."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    def manifest_hash(self) -> str:
        """sha256 hex of the canonical JSON: the value announced on gossip."""
        return sha256_hex(self.to_json())

    def verify_shard(self, index: int, data: bytes) -> bool:
        """True when ``data`` is exactly shard ``index`` (size and sha256)."""
        if not 0 <= index < len(self.shards):
            return False
        info = self.shards[index]
        return len(data) == info.size and sha256_hex(data) == info.sha256

    @classmethod
    def from_json(cls, data: bytes | str) -> Manifest:
        """Parse and validate strictly; ValueError naming the problem on anything malformed."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray):
            raise ValueError("manifest must be bytes")
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            obj = loads_json(data, what="manifest", max_bytes=MAX_MANIFEST_BYTES, max_items=1_000_000)
        except DecodeError as exc:
            raise ValueError(str(exc)) from None
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, obj: Any) -> Manifest:
        if not isinstance(obj, dict):
            raise ValueError("manifest must be a JSON object")
        keys = {"format", "version", "name", "total_size", "sha256", "shard_size", "shards"}
        if set(obj) != keys:
            missing, extra = sorted(keys - set(obj)), sorted(set(obj) - keys)
            raise ValueError(f"manifest keys wrong: missing {missing}, unexpected {extra}")
        if obj["format"] != FORMAT:
            raise ValueError(f"manifest format {obj['format']!r} is not {FORMAT!r}")
        version = _int(obj["version"], "version", 0, MAX_VERSION)
        name = obj["name"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"manifest name {name!r} is not a plain file name")
        shard_size = _int(obj["shard_size"], "shard_size", MIN_SHARD_SIZE, MAX_SHARD_SIZE)
        total = _int(obj["total_size"], "total_size", 0, MAX_SHARDS * shard_size)
        digest = _hex(obj["sha256"], "sha256")
        raw = obj["shards"]
        if not isinstance(raw, list):
            raise ValueError("manifest shards must be a list")
        expected = -(-total // shard_size)
        if len(raw) != expected:
            raise ValueError(
                f"manifest has {len(raw)} shards, {total} bytes in {shard_size}-byte shards need {expected}"
            )
        shards = []
        for i, s in enumerate(raw):
            if not isinstance(s, dict) or set(s) != {"index", "size", "sha256"}:
                raise ValueError(f"shard {i}: must be an object with index, size, sha256")
            if _int(s["index"], f"shard {i} index", 0, MAX_SHARDS) != i:
                raise ValueError(f"shard {i}: index {s['index']} out of order")
            want = min(shard_size, total - i * shard_size)
            if _int(s["size"], f"shard {i} size", 1, shard_size) != want:
                raise ValueError(f"shard {i}: size {s['size']} but the layout needs {want}")
            shards.append(ShardInfo(i, want, _hex(s["sha256"], f"shard {i} sha256")))
        return cls(version, name, total, digest, shard_size, tuple(shards))


def _int(v: Any, what: str, lo: int, hi: int) -> int:
    if type(v) is not int:
        raise ValueError(f"manifest {what} must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"manifest {what} {v} outside {lo}..{hi}")
    return v


def _hex(v: Any, what: str) -> str:
    if not isinstance(v, str) or not _HEX64.match(v):
        raise ValueError(f"manifest {what} must be 64 lowercase hex digits")
    return v


def write_shard(directory: Path, index: int, data: bytes) -> Path:
    """Write one shard atomically (temp file + rename); the caller has verified it."""
    path = shard_file(directory, index)
    write_file(path, data, fsync=False)  # a lost shard is fetched again
    return path


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    path = Path(directory) / MANIFEST_FILE
    write_file(path, manifest.to_json(), fsync=False)
    return path


def split(path: Path, out_dir: Path, version: int, shard_size: int = DEFAULT_SHARD_SIZE) -> Manifest:
    """Cut ``path`` into shards under ``out_dir`` (created), write ``manifest.json``, return the manifest."""
    path, out_dir = Path(path), Path(out_dir)
    if not MIN_SHARD_SIZE <= shard_size <= MAX_SHARD_SIZE:
        raise ValueError(f"shard_size {shard_size} outside {MIN_SHARD_SIZE}..{MAX_SHARD_SIZE}")
    if not path.is_file():
        raise ValueError(f"{path} is not a file (a checkpoint is one file, e.g. model.safetensors)")
    total = path.stat().st_size
    if -(-total // shard_size) > MAX_SHARDS:
        raise ValueError(f"{total} bytes need more than {MAX_SHARDS} shards of {shard_size}; use larger shards")
    out_dir.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    shards: list[ShardInfo] = []
    with path.open("rb") as fh:
        while True:
            data = fh.read(shard_size)
            if not data:
                break
            whole.update(data)
            write_shard(out_dir, len(shards), data)
            shards.append(ShardInfo(len(shards), len(data), sha256_hex(data)))
    manifest = Manifest(version, path.name, total, whole.hexdigest(), shard_size, tuple(shards))
    Manifest.from_dict(manifest.to_dict())  # same rules as a downloaded one (name, bounds)
    write_manifest(out_dir, manifest)
    return manifest


def missing_shards(manifest: Manifest, shard_dir: Path, *, verify: bool = True) -> list[int]:
    """Indices of shards absent from ``shard_dir`` (or, with ``verify``, present but wrong: deleted)."""
    out = []
    for info in manifest.shards:
        p = shard_file(shard_dir, info.index)
        try:
            ok = p.stat().st_size == info.size
            if ok and verify:
                ok = sha256_hex(p.read_bytes()) == info.sha256
        except FileNotFoundError:
            ok = False
        if not ok:
            with contextlib.suppress(OSError):
                p.unlink()
            out.append(info.index)
    return out


def assemble(manifest: Manifest, shard_dir: Path, dest: Path) -> Path:
    """Join the shards of ``shard_dir`` into ``dest``, checking every shard and the whole file.

    Writes to a temp file next to ``dest`` and renames only once everything matched; raises
    ``IntegrityError`` (a ValueError) naming the first bad shard, or the whole-file mismatch.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    with atomic_file(dest, fsync=False) as out:  # rebuilt from the shards if lost
        for info in manifest.shards:
            try:
                data = shard_file(shard_dir, info.index).read_bytes()
            except FileNotFoundError:
                raise IntegrityError(f"shard {info.index} missing") from None
            if len(data) != info.size or sha256_hex(data) != info.sha256:
                raise IntegrityError(f"shard {info.index} does not match the manifest")
            whole.update(data)
            out.write(data)
        if whole.hexdigest() != manifest.sha256:
            raise IntegrityError("assembled file does not match the manifest's sha256")
    return dest
