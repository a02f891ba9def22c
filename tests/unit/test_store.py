"""The daemons' sqlite state: committed on return (reopen, SIGKILL), atomic batches, the transaction
journal, and a readable `StoreError` when the state file cannot be opened."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from node.store import JournaledTx, SqliteTxJournal, Store, StoreError, write_file_when_room
from tests.conftest import file_size_limit

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "CREATE TABLE IF NOT EXISTS items (k TEXT PRIMARY KEY, n INTEGER NOT NULL);"


def test_data_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.db"  # parent folders are created
    s = Store(path, SCHEMA)
    assert s.execute("INSERT INTO items(k, n) VALUES(?, ?)", ("a", 1)) == 1
    s.put("cursor", "41")
    s.put("cursor", "42")
    s.close()
    s = Store(path, SCHEMA)  # the schema is idempotent
    try:
        assert s.scalar("SELECT n FROM items WHERE k = ?", ("a",)) == 1
        assert s.get("cursor") == "42"
        assert s.get("missing") is None and s.get("missing", "d") == "d"
        row = s.one("SELECT * FROM items")
        assert row is not None and row["k"] == "a"
        assert s.scalar("PRAGMA journal_mode") == "wal"
    finally:
        s.close()


def test_reader_sees_writes_without_close(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    writer = Store(path, SCHEMA)
    reader = Store(path, SCHEMA)
    try:
        writer.execute("INSERT INTO items(k, n) VALUES('x', 7)")
        assert reader.scalar("SELECT n FROM items WHERE k = 'x'") == 7
    finally:
        writer.close()
        reader.close()


def test_execute_many_is_atomic(tmp_path: Path) -> None:
    s = Store(tmp_path / "state.db", SCHEMA)
    try:
        s.execute_many(
            [("INSERT INTO items(k, n) VALUES(?, ?)", ("a", 1)), ("INSERT INTO items(k, n) VALUES(?, ?)", ("b", 2))]
        )
        assert s.scalar("SELECT COUNT(*) FROM items") == 2
        # a constraint violation mid-way: nothing of the batch stays
        with pytest.raises(sqlite3.IntegrityError):
            s.execute_many(
                [
                    ("INSERT INTO items(k, n) VALUES(?, ?)", ("c", 3)),
                    ("UPDATE items SET n = 100", ()),
                    ("INSERT INTO items(k, n) VALUES(?, ?)", ("a", 9)),
                ]
            )
        assert [tuple(r) for r in s.query("SELECT k, n FROM items ORDER BY k")] == [("a", 1), ("b", 2)]

        # a Python exception raised while the statements are produced: rolled back as well
        def gen() -> Iterator[tuple[str, tuple[str, int]]]:
            yield ("INSERT INTO items(k, n) VALUES(?, ?)", ("d", 4))
            raise KeyError("boom")

        with pytest.raises(KeyError):
            s.execute_many(gen())
        assert s.scalar("SELECT COUNT(*) FROM items WHERE k = 'd'") == 0
        # and the connection is usable afterwards (no transaction left open)
        s.execute("INSERT INTO items(k, n) VALUES('e', 5)")
        assert not s.db.in_transaction
        s.close()
        s = Store(tmp_path / "state.db", SCHEMA)
        assert [r[0] for r in s.query("SELECT k FROM items ORDER BY k")] == ["a", "b", "e"]
    finally:
        s.close()


def test_a_guarded_batch_writes_only_while_its_condition_holds(tmp_path: Path) -> None:
    """`execute_many(guarded=True)`: the first statement is the condition (the coordinator closes a task
    only if it is still open); when it changes no row, nothing of the batch is written."""
    s = Store(tmp_path / "state.db", SCHEMA)
    try:
        s.execute("INSERT INTO items(k, n) VALUES('task', 0)")

        def close_and_keep(tag: str) -> bool:
            return s.execute_many(
                [
                    ("UPDATE items SET n = 1 WHERE k = 'task' AND n = 0", ()),
                    ("INSERT INTO items(k, n) VALUES(?, 2)", (tag,)),
                ],
                guarded=True,
            )

        assert close_and_keep("first") is True
        assert close_and_keep("second") is False  # the task is closed: the second file is not kept
        assert [r[0] for r in s.query("SELECT k FROM items ORDER BY k")] == ["first", "task"]
        assert not s.db.in_transaction
    finally:
        s.close()


def test_journal_lifecycle(tmp_path: Path) -> None:
    s = Store(tmp_path / "state.db")
    j = s.journal
    assert isinstance(j, SqliteTxJournal)
    assert j.unconfirmed() == [] and j.counts() == {}
    j.signed("0xaa", 3, "0xraw3", "stake")
    j.signed("0xbb", 1, "0xraw1", "registration")
    j.signed("0xcc", 2, "0xraw2", "join")
    j.signed("0xaa", 3, "0xother", "again")  # the same hash twice is one entry, the first bytes kept
    assert [t.hash for t in j.unconfirmed()] == ["0xbb", "0xcc", "0xaa"]  # nonce order
    assert j.unconfirmed()[2] == JournaledTx("0xaa", 3, "0xraw3", "stake", "sent", None)
    assert j.counts() == {"sent": 3}
    j.mined("0xbb", 10, 1)
    j.mined("0xcc", 11, 0)
    assert [t.hash for t in j.unconfirmed()] == ["0xaa"]
    assert j.counts() == {"sent": 1, "mined": 1, "failed": 1}
    s.close()
    # after a restart the journal still knows what was sent and what was mined
    s = Store(tmp_path / "state.db")
    try:
        j = s.journal
        assert [t.hash for t in j.unconfirmed()] == ["0xaa"]
        by_hash = {t.hash: t for t in j.all()}
        assert by_hash["0xbb"].status == "mined" and by_hash["0xbb"].block == 10
        assert by_hash["0xcc"].status == "failed" and by_hash["0xcc"].block == 11
        assert [t.nonce for t in j.all()] == [1, 2, 3]
    finally:
        s.close()


CHILD = textwrap.dedent(
    """
    import sys, time
    from node.store import Store
    s = Store(sys.argv[1], "CREATE TABLE IF NOT EXISTS items (k TEXT PRIMARY KEY, n INTEGER NOT NULL);")
    s.execute("INSERT INTO items(k, n) VALUES('before', 1)")
    s.journal.signed("0x01", 0, "0xraw", "label")
    s.execute_many([("INSERT INTO items(k, n) VALUES('batch1', 2)", ()), ("INSERT INTO items(k, n) VALUES('batch2', 3)", ())])
    sys.stdout.write("written\\n")
    sys.stdout.flush()
    time.sleep(60)
    """
)


def test_sigkill_right_after_a_write_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = b""
        # a blocking readline, bounded by a watchdog that kills the child
        watchdog = threading.Timer(60.0, proc.kill)
        watchdog.start()
        try:
            line = proc.stdout.readline()
        finally:
            watchdog.cancel()
        assert line == b"written\n", proc.stderr.read() if proc.stderr else b""
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    s = Store(path, SCHEMA)
    try:
        assert [tuple(r) for r in s.query("SELECT k, n FROM items ORDER BY n")] == [
            ("before", 1),
            ("batch1", 2),
            ("batch2", 3),
        ]
        assert [t.hash for t in s.journal.unconfirmed()] == ["0x01"]
    finally:
        s.close()


def test_state_file_under_a_regular_file_is_a_readable_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(StoreError) as info:
        Store(blocker / "state" / "worker.db")
    msg = str(info.value)
    assert msg.startswith(f"cannot open state file {blocker / 'state' / 'worker.db'}: ")
    assert "\n" not in msg


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_state_file_in_an_unwritable_directory_is_a_readable_error(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(StoreError, match=r"cannot open state file .*ro/worker\.db: "):
            Store(d / "worker.db")
    finally:
        d.chmod(0o700)


def test_state_file_in_an_unwritable_system_directory_is_a_readable_error() -> None:
    # /proc refuses new files even to root: the unwritable-directory case on any uid.
    with pytest.raises(StoreError, match=r"cannot open state file /proc/intellect-test/worker\.db: "):
        Store("/proc/intellect-test/worker.db")


def test_corrupt_state_file_is_a_readable_error(tmp_path: Path) -> None:
    path = tmp_path / "worker.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"cannot open state file .*worker\.db: file is not a database"):
        Store(path)


def test_a_full_disk_is_a_readable_error_and_loses_nothing(tmp_path: Path) -> None:
    """A write the disk cannot take (here: the kernel's file size limit, as ENOSPC would) is a StoreError
    saying so; the failed transaction leaves no part of itself, and what was committed before stays."""
    s = Store(tmp_path / "w.db", "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);")
    try:
        s.execute("INSERT INTO t VALUES(0, 'kept')")
        rows = [("INSERT INTO t VALUES(?, ?)", (i, "x" * 4096)) for i in range(1, 200)]
        with file_size_limit(128 * 1024), pytest.raises(StoreError, match=r"writing .*w\.db failed: .*disk full"):
            s.execute_many(rows)
        assert [tuple(r) for r in s.query("SELECT k, v FROM t")] == [(0, "kept")]
        s.execute_many(rows)  # room again: the same transaction goes through
        assert s.scalar("SELECT COUNT(*) FROM t") == 200
    finally:
        s.close()
    reopened = Store(tmp_path / "w.db")
    try:
        assert reopened.scalar("SELECT v FROM t WHERE k = 0") == "kept"
    finally:
        reopened.close()


async def test_a_file_write_waits_out_a_full_disk(tmp_path: Path) -> None:
    """`write_file_when_room` keeps the data and retries while the disk has no room (reporting why),
    leaves no partial file meanwhile, and finishes once room is back; other errors raise at once."""
    reports: list[str] = []
    path = tmp_path / "rollout.bin"
    data = os.urandom(256 * 1024)
    done = trio.Event()

    async def write() -> None:
        await write_file_when_room(path, data, reports.append, retry_every=0.05)
        done.set()

    async with trio.open_nursery() as nursery:
        with file_size_limit(64 * 1024):
            nursery.start_soon(write)
            with trio.move_on_after(0.5):
                await done.wait()
            assert not done.is_set()
            assert len(reports) >= 2 and f"cannot write {path}: File too large (is the disk full?)" in reports[0]
            assert list(tmp_path.iterdir()) == []
        with trio.fail_after(10):
            await done.wait()
    assert path.read_bytes() == data and [p.name for p in tmp_path.iterdir()] == ["rollout.bin"]
    with pytest.raises(FileNotFoundError):
        await write_file_when_room(tmp_path / "missing" / "x", data, reports.append)
