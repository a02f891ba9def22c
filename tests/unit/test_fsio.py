"""Durable writes: the old version or the new one, never half of one, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.fsio import atomic_dir, atomic_file, write_file


def test_write_file_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    write_file(p, b"one")
    write_file(p, b"two")
    assert p.read_bytes() == b"two"
    assert sorted(x.name for x in p.parent.iterdir()) == ["f.json"]


def test_a_failed_streaming_write_keeps_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    write_file(p, b"old")
    with pytest.raises(RuntimeError), atomic_file(p) as fh:
        fh.write(b"half of the new")
        raise RuntimeError("crash mid-write")
    assert p.read_bytes() == b"old"
    assert [x.name for x in tmp_path.iterdir()] == ["f.bin"]


def test_atomic_dir_replaces_a_folder_or_keeps_the_old_one(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    with atomic_dir(d) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(OSError), atomic_dir(d) as tmp:
        (tmp / "b").write_text("2")
        raise OSError(28, "No space left on device")
    assert sorted(x.name for x in d.iterdir()) == ["a"]
    with atomic_dir(d) as tmp:
        (tmp / "c").write_text("3")
    assert sorted(x.name for x in d.iterdir()) == ["c"]
    assert [x.name for x in tmp_path.iterdir()] == ["ckpt"]
