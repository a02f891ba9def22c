"""Durable state of a daemon: one sqlite file per role, written so that `kill -9` loses nothing.

Every write is its own committed transaction in WAL mode with ``synchronous=FULL``: once a method
returns, the change survives a crash of the process (and of the machine). The daemons call these
methods from trio tasks directly; each is a few hundred microseconds, far below anything that would
need a thread.

`SqliteTxJournal` is the `TxJournal` of `node.chain.tx.TxSender`: the signed bytes of every
transaction are committed *before* they are broadcast, so a restarted daemon first waits for what it
already sent (re-broadcasting the same bytes) and only then decides what is left to do. That is what
makes "no duplicate transaction" hold across crashes.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.errors import IntellectError
from node.fsio import write_file

from .chain.errors import ChainError, NonceTaken
from .chain.pending import Pending
from .chain.tx import Receipt, TxSender
from .evidence import encode_evidence

log = logging.getLogger(__name__)

# A write the disk cannot take for want of room (full, quota, the file size limit): it may fit later.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
DISK_FULL_PREFIX = "cannot write "  # how `write_file_when_room` reports


def evidence_hash(record: dict[str, Any]) -> str:
    """The 0x-prefixed sha256 of a verdict record's canonical JSON: the evidence hash that goes on chain
    or on gossip (`node.evidence.encode_evidence`)."""
    return encode_evidence(record)[1]


def write_evidence(folder: Path, record: dict[str, Any]) -> str:
    """Write a verdict record as canonical JSON to `folder`/<hash>.json (durably); returns its hash."""
    body, digest = encode_evidence(record)
    write_file(folder / f"{digest[2:]}.json", body)
    return digest


async def write_file_when_room(
    path: Path, data: bytes, report: Callable[[str], None], retry_every: float = 30.0
) -> None:
    """``write_file``, waiting out a full disk: each failure for want of room is reported and the write
    retried every ``retry_every`` seconds, so the caller's data (in memory) is not lost. Other errors raise."""
    while True:
        try:
            write_file(path, data)
            return
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            report(
                f"{DISK_FULL_PREFIX}{path}: {exc.strerror} (is the disk full?); trying again every {retry_every:.0f} s"
            )
        await trio.sleep(retry_every)


_JOURNAL_SCHEMA = """
CREATE TABLE IF NOT EXISTS txs (
    hash TEXT PRIMARY KEY,
    nonce INTEGER NOT NULL,
    raw TEXT NOT NULL,
    label TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'sent',      -- sent | mined | failed | replaced (a bump of its nonce was mined)
    block INTEGER,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS txs_status ON txs(status);
CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL);
"""


class StoreError(IntellectError):
    """The state file cannot be opened or written (disk full, permissions, corruption)."""


class Store:
    """A sqlite database with the daemon's tables (`schema`), the transaction journal and a key-value table."""

    def __init__(self, path: str | Path, schema: str = "") -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_JOURNAL_SCHEMA + schema)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open state file {self.path}: {exc}") from exc

    def close(self) -> None:
        self.db.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement in its own committed transaction; returns the number of changed rows."""
        try:
            cur = self.db.execute(sql, tuple(params))
        except sqlite3.OperationalError as exc:
            raise StoreError(f"writing {self.path} failed: {exc} (is the disk full?)") from exc
        return cur.rowcount

    def execute_many(self, statements: Iterable[tuple[str, Sequence[Any]]], guarded: bool = False) -> bool:
        """Several statements as one atomic transaction. `guarded`: the first statement is a condition
        (an UPDATE ... WHERE the row is still in the state the caller read): when it changes no row,
        nothing is written and the answer is False."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for i, (sql, params) in enumerate(statements):
                    changed = self.db.execute(sql, tuple(params)).rowcount
                    if guarded and i == 0 and changed == 0:
                        self.db.execute("ROLLBACK")
                        return False
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
            return True
        except sqlite3.OperationalError as exc:
            raise StoreError(f"writing {self.path} failed: {exc} (is the disk full?)") from exc

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return list(self.db.execute(sql, tuple(params)).fetchall())

    def one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        return self.db.execute(sql, tuple(params)).fetchone()

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self.db.execute(sql, tuple(params)).fetchone()
        return None if row is None else row[0]

    def counts(self, table: str) -> dict[str, int]:
        """Rows of `table` (one of this daemon's own tables) per `status`."""
        return {r[0]: int(r[1]) for r in self.query(f"SELECT status, COUNT(*) FROM {table} GROUP BY status")}

    def add_column(self, table: str, column: str, decl: str) -> None:
        """Add `column` to `table` if a state file written by an older version lacks it."""
        if column not in {r[1] for r in self.query(f"PRAGMA table_info({table})")}:
            self.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    def get(self, key: str, default: str | None = None) -> str | None:
        v = self.scalar("SELECT v FROM kv WHERE k = ?", (key,))
        return default if v is None else str(v)

    def put(self, key: str, value: str) -> None:
        self.execute(*self.put_statement(key, value))

    @staticmethod
    def put_statement(key: str, value: str) -> tuple[str, tuple[Any, ...]]:
        """`put` as a statement, for `execute_many` (a cursor moved in the same transaction as its rows)."""
        return ("INSERT INTO kv(k, v) VALUES(?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (key, value))

    def evidence_wanted(self, key: str, digest: str, sender: str, per_key: int) -> bool:
        """For a daemon with `rollouts` and `evidence` tables (worker, coordinator): whether an evidence
        document `digest` about rollout `key` from `sender` is worth keeping: the rollout is ours, the
        document is not held, it is the sender's first on that rollout and the rollout has fewer than
        `per_key` documents."""
        return (
            self.one("SELECT 1 FROM rollouts WHERE work_key = ?", (key,)) is not None
            and self.one("SELECT 1 FROM evidence WHERE hash = ?", (digest,)) is None
            and self.one("SELECT 1 FROM evidence WHERE work_key = ? AND sender = ?", (key, sender.lower())) is None
            and int(self.scalar("SELECT COUNT(*) FROM evidence WHERE work_key = ?", (key,)) or 0) < per_key
        )

    @property
    def journal(self) -> SqliteTxJournal:
        return SqliteTxJournal(self)


@dataclass(frozen=True)
class JournaledTx:
    hash: str
    nonce: int
    raw: str
    label: str
    status: str
    block: int | None


class SqliteTxJournal:
    """`TxJournal` on a `Store`: signed bytes committed before broadcast, outcome after mining."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def signed(self, tx_hash: str, nonce: int, raw: str, label: str) -> None:
        self.store.execute(
            "INSERT OR IGNORE INTO txs(hash, nonce, raw, label, created) VALUES(?, ?, ?, ?, ?)",
            (tx_hash, nonce, raw, label, time.time()),
        )

    def mined(self, tx_hash: str, block_number: int, status: int) -> None:
        """`tx_hash` is in block `block_number`; the other signatures of its nonce (fee bumps) never will be."""
        self.store.execute(
            "UPDATE txs SET status = ?, block = ? WHERE hash = ?",
            ("mined" if status == 1 else "failed", block_number, tx_hash),
        )
        self.store.execute(
            "UPDATE txs SET status = 'replaced' WHERE status = 'sent' AND hash != ?"
            " AND nonce = (SELECT nonce FROM txs WHERE hash = ?)",
            (tx_hash, tx_hash),
        )

    def unconfirmed(self) -> list[JournaledTx]:
        rows = self.store.query("SELECT * FROM txs WHERE status = 'sent' ORDER BY nonce")
        return [JournaledTx(r["hash"], r["nonce"], r["raw"], r["label"], r["status"], r["block"]) for r in rows]

    def all(self) -> list[JournaledTx]:
        rows = self.store.query("SELECT * FROM txs ORDER BY nonce, created")
        return [JournaledTx(r["hash"], r["nonce"], r["raw"], r["label"], r["status"], r["block"]) for r in rows]

    def counts(self) -> dict[str, int]:
        return self.store.counts("txs")


async def settle_journal(journal: SqliteTxJournal, sender: TxSender) -> list[Receipt]:
    """Wait for every journaled intent that has no known outcome: one of its signatures (the first,
    or a fee bump) is mined, re-broadcast and bumped further while it waits.

    A daemon calls this at start, before sending anything new, so that a transaction signed just
    before a crash (or a kill during a bump) is mined or known dead before the daemon looks at chain
    state again; it is never signed again under another nonce. An intent whose nonce another
    transaction took can never be mined; it is marked failed."""
    out: list[Receipt] = []
    by_nonce: dict[int, list[JournaledTx]] = {}
    for tx in journal.unconfirmed():
        by_nonce.setdefault(tx.nonce, []).append(tx)
    for nonce, txs in sorted(by_nonce.items()):
        p = Pending.from_journal(nonce, txs[-1].label, [(t.hash, t.raw) for t in txs])
        log.info("waiting for %s sent before a restart: %s (%d signature(s))", p.what, p.tx_hash, len(txs))
        try:
            out.append(await sender.wait_pending(p, resign=False))
        except NonceTaken:
            log.warning("%s (nonce %d) was replaced by another transaction of this key", p.what, nonce)
            for t in txs:
                journal.store.execute("UPDATE txs SET status = 'failed' WHERE hash = ?", (t.hash,))
        except ChainError as exc:
            raise ChainError(f"{p.what} sent before the restart is still not mined: {exc}", exc.hint) from exc
    return out
