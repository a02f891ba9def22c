"""Durable writes: the old version or the new one, never half of one, and nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node.fsio import atomic_dir, atomic_file, write_file, write_output


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


def test_write_output_gives_a_new_file_the_umasks_permissions_and_keeps_an_old_ones(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        p = tmp_path / "invite.json"
        write_output(p, b"one")
        assert p.stat().st_mode & 0o777 == 0o640  # 0o666 less the umask, not mkstemp's 0600
        p.chmod(0o604)
        write_output(p, b"two")
        assert (p.read_bytes(), p.stat().st_mode & 0o777) == (b"two", 0o604)
    finally:
        os.umask(old)
    assert [x.name for x in tmp_path.iterdir()] == ["invite.json"]


def test_write_output_writes_through_a_pipe_as_a_shell_redirect_would(tmp_path: Path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that opening the pipe for writing succeeds
    try:
        write_output(fifo, b"thresholds")
        assert os.read(r, 100) == b"thresholds"
    finally:
        os.close(r)
    assert fifo.is_fifo()  # not replaced by a regular file
