"""Manifest format of the weight broadcast: split/assemble, canonical hash, strict parsing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from node.weights.manifest import (
    MAX_SHARDS,
    IntegrityError,
    Manifest,
    assemble,
    missing_shards,
    shard_file,
    split,
)

SHARD = 4096


def _checkpoint(tmp_path: Path, size: int = 3 * SHARD + 123) -> Path:
    path = tmp_path / "model.safetensors"
    path.write_bytes(os.urandom(size))
    return path


def test_split_assemble_round_trip(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path)
    m = split(src, tmp_path / "out", version=7, shard_size=SHARD)
    assert (m.version, m.name, m.total_size, m.shard_size) == (7, "model.safetensors", 3 * SHARD + 123, SHARD)
    assert [s.size for s in m.shards] == [SHARD, SHARD, SHARD, 123]
    assert Manifest.from_json((tmp_path / "out" / "manifest.json").read_bytes()) == m
    out = assemble(m, tmp_path / "out", tmp_path / "copy" / "model.safetensors")
    assert out.read_bytes() == src.read_bytes()
    assert missing_shards(m, tmp_path / "out") == []


def test_exact_multiple_and_empty(tmp_path: Path) -> None:
    m = split(_checkpoint(tmp_path, 2 * SHARD), tmp_path / "a", 1, SHARD)
    assert [s.size for s in m.shards] == [SHARD, SHARD]
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    e = split(empty, tmp_path / "b", 2, SHARD)
    assert e.shards == () and e.total_size == 0
    assert assemble(e, tmp_path / "b", tmp_path / "e.bin").read_bytes() == b""


def test_canonical_hash_stable(tmp_path: Path) -> None:
    m = split(_checkpoint(tmp_path), tmp_path / "out", 3, SHARD)
    raw = m.to_json()
    assert b" " not in raw and raw == Manifest.from_json(raw).to_json()
    # the same content with other key order / whitespace parses to the same canonical hash
    pretty = json.dumps(json.loads(raw), indent=2).encode()
    assert Manifest.from_json(pretty).manifest_hash() == m.manifest_hash()
    assert len(m.manifest_hash()) == 64
    other = split(tmp_path / "model.safetensors", tmp_path / "out2", 4, SHARD)
    assert other.manifest_hash() != m.manifest_hash()


def _mutate(m: Manifest, **changes: object) -> bytes:
    d = m.to_dict()
    d.update(changes)
    return json.dumps(d).encode()


@pytest.mark.parametrize(
    "change",
    [
        {"version": -1},
        {"version": "1"},
        {"version": True},
        {"name": "../evil"},
        {"name": ""},
        {"sha256": "ab"},
        {"sha256": "A" * 64},
        {"shard_size": 0},
        {"shard_size": 10},
        {"total_size": 1},
        {"total_size": -5},
        {"shards": "x"},
        {"format": "other/1"},
        {"extra": 1},
    ],
)
def test_malformed_rejected(tmp_path: Path, change: dict[str, object]) -> None:
    m = split(_checkpoint(tmp_path), tmp_path / "out", 1, SHARD)
    with pytest.raises(ValueError):
        Manifest.from_json(_mutate(m, **change))


def test_malformed_shards_and_bytes(tmp_path: Path) -> None:
    m = split(_checkpoint(tmp_path), tmp_path / "out", 1, SHARD)
    shards = m.to_dict()["shards"]
    for bad in (
        shards[:-1],  # missing one
        [*shards, {"index": 4, "size": 1, "sha256": "0" * 64}],  # one too many
        [shards[1], shards[0], *shards[2:]],  # out of order
        [{**shards[0], "size": SHARD - 1}, *shards[1:]],  # inconsistent size
        [{**shards[0], "extra": 1}, *shards[1:]],
        [[0, SHARD, "0" * 64], *shards[1:]],
    ):
        with pytest.raises(ValueError):
            Manifest.from_json(_mutate(m, shards=bad))
    for raw in (b"", b"not json", b"[]", b"\xff\xfe", b"null", b"{}"):
        with pytest.raises(ValueError):
            Manifest.from_json(raw)
    # too many shards for the bounds
    with pytest.raises(ValueError):
        Manifest.from_json(_mutate(m, total_size=(MAX_SHARDS + 1) * SHARD))


def test_wrong_shard_detected(tmp_path: Path) -> None:
    m = split(_checkpoint(tmp_path), tmp_path / "out", 1, SHARD)
    p = shard_file(tmp_path / "out", 1)
    good = p.read_bytes()
    assert m.verify_shard(1, good) and not m.verify_shard(1, good[:-1] + bytes([good[-1] ^ 1]))
    assert not m.verify_shard(9, good)
    p.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    dest = tmp_path / "copy" / "model.safetensors"
    with pytest.raises(IntegrityError, match="shard 1"):
        assemble(m, tmp_path / "out", dest)
    assert not dest.exists() and list((tmp_path / "copy").iterdir()) == []
    assert missing_shards(m, tmp_path / "out") == [1]  # the bad shard is deleted
    assert not p.exists()
    with pytest.raises(IntegrityError, match="missing"):
        assemble(m, tmp_path / "out", dest)


def test_whole_file_hash_checked(tmp_path: Path) -> None:
    m = split(_checkpoint(tmp_path), tmp_path / "out", 1, SHARD)
    forged = Manifest(m.version, m.name, m.total_size, "0" * 64, m.shard_size, m.shards)
    with pytest.raises(IntegrityError, match="assembled"):
        assemble(forged, tmp_path / "out", tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()


def test_split_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        split(tmp_path / "nope", tmp_path / "out", 1, SHARD)
    with pytest.raises(ValueError):
        split(_checkpoint(tmp_path), tmp_path / "out", 1, 10)
