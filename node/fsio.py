"""Durable file and folder writes: the one place that knows how to replace a file or a folder so that a
crash (or a full disk, or an exception) leaves the old version or the new one, never half of one, and no
temp file behind.

- `write_file(path, data)`: bytes, fsync'd, renamed over `path`;
- `atomic_file(path)`: the same for a writer that streams (yields the open binary file);
- `atomic_dir(path)`: a temp sibling folder to fill, renamed over `path` (replacing what was there);
- `write_output(path, data)`: a file a user named (`--out`): atomic and with the umask's permissions for
  a regular file, written straight through for `/dev/stdout`, a pipe or another non-regular file.

Temp names start with a dot and sit beside the target (the rename stays on one filesystem).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes `path` when the block ends without an exception (fsync'd first
    unless `fsync=False`: a file that is cheap to rebuild); on an exception the temp file is removed.
    The folder must exist (a missing one is the caller's error, not made here)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_file(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` durably: a temp file beside it, fsync, rename. Nothing is left on error.
    The file is private (mode 0600): the node's own state."""
    with atomic_file(path, fsync=fsync) as fh:
        fh.write(data)


def write_output(path: Path, data: bytes) -> None:
    """Write a file the user asked for (`--out FILE`): a regular file (or a new one) is replaced
    atomically and gets the permissions the umask gives new files (or keeps those it had); anything else
    that exists (`/dev/stdout`, a pipe, a terminal) is written straight through, as a shell redirect would."""
    path = Path(path)
    if path.exists() and not path.is_file():
        with open(path, "wb") as fh:
            fh.write(data)
        return
    if path.exists():
        mode = path.stat().st_mode & 0o7777
    else:
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    with atomic_file(path) as fh:
        fh.write(data)
        os.fchmod(fh.fileno(), mode)


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield an empty temp folder beside `path`; when the block ends without an exception, whatever was at
    `path` is removed and the folder takes its place in one rename. On an exception it is removed.
    The parent folder is made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.rename(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
