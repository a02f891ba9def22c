"""The worker's durable state: the rollouts it built and their fate at the coordinator, its claims, the
evidence documents against its work and its answers to accusations. Named methods, so the daemon holds
no SQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..store import Store

#: Blocks a claimed (or gone) record is kept after the newest one read, for a reorganisation to reopen it.
KEEP_DONE_BLOCKS = 10_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    work_key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    path TEXT NOT NULL,
    units INTEGER NOT NULL,
    mean_reward REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'built',   -- built | accepted | rejected
    detail TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS recorded (       -- the provider's recorded work not yet claimed or gone
    work_key TEXT PRIMARY KEY,
    deadline INTEGER NOT NULL,              -- chain time its validation window ends
    block INTEGER NOT NULL,
    next_check INTEGER NOT NULL,            -- chain time to look at it again (a dispute: later)
    done_block INTEGER                      -- the block it was claimed or found gone at (NULL: open);
                                            -- kept a while, so a reorganisation can reopen it
);
CREATE TABLE IF NOT EXISTS claims (tx TEXT PRIMARY KEY, keys INTEGER NOT NULL, reward TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS evidence (
    hash TEXT PRIMARY KEY,                  -- sha256 of the document: the evidence hash on chain
    work_key TEXT NOT NULL,                 -- one of our rollouts, found failing by a validator
    sender TEXT NOT NULL,
    doc BLOB NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS appeals (
    work_key TEXT PRIMARY KEY,              -- a hard invalidation of our work
    status TEXT NOT NULL,                   -- appealed | declined | failed-self-check | too-late
    detail TEXT,
    tx TEXT,
    at REAL NOT NULL
);
"""


class WorkerState:
    def __init__(self, path: Path) -> None:
        self.store = Store(path, SCHEMA)

    # -- rollouts

    def add_rollout(self, key: str, task_id: str, path: Path, units: int, mean_reward: float) -> None:
        self.store.execute(
            "INSERT OR IGNORE INTO rollouts(work_key, task_id, path, units, mean_reward, created) "
            "VALUES(?, ?, ?, ?, ?, ?)",
            (key, task_id, str(path), units, mean_reward, time.time()),
        )

    def has_rollout(self, key: str) -> bool:
        return self.store.one("SELECT 1 FROM rollouts WHERE work_key = ?", (key,)) is not None

    def rollout_path(self, key: str) -> Path | None:
        row = self.store.one("SELECT path FROM rollouts WHERE work_key = ?", (key,))
        return Path(row["path"]) if row is not None else None

    def unsubmitted(self) -> list[dict[str, Any]]:
        """Rollouts built but not yet answered by the coordinator (a restart came between)."""
        return [dict(r) for r in self.store.query("SELECT * FROM rollouts WHERE status = 'built' ORDER BY created")]

    def set_accepted(self, key: str) -> None:
        self.store.execute("UPDATE rollouts SET status = 'accepted' WHERE work_key = ?", (key,))

    def set_rejected(self, key: str, detail: str) -> None:
        self.store.execute("UPDATE rollouts SET status = 'rejected', detail = ? WHERE work_key = ?", (detail, key))

    def accepted_count(self) -> int:
        return int(self.store.scalar("SELECT COUNT(*) FROM rollouts WHERE status = 'accepted'") or 0)

    def accepted_units(self) -> int:
        return int(self.store.scalar("SELECT SUM(units) FROM rollouts WHERE status = 'accepted'") or 0)

    # -- the claim scan (incremental: event pages after a durable cursor, then only due records)

    def track_recorded(self, rows: list[tuple[str, int, int]], move: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Keep `rows` (key, deadline, block) and move the event cursor, in one transaction; rows done
        long ago (more than KEEP_DONE_BLOCKS before the newest) are dropped."""
        newest = max((b for _, _, b in rows), default=None)
        self.store.execute_many(
            [
                *(
                    ("INSERT OR REPLACE INTO recorded(work_key, deadline, block, next_check) VALUES(?, ?, ?, ?)",
                     (k, d, b, d))
                    for k, d, b in rows
                ),
                *move,
                *([("DELETE FROM recorded WHERE done_block < ?", (newest - KEEP_DONE_BLOCKS,))] if newest else []),
            ]
        )  # fmt: skip

    @staticmethod
    def reopen_recorded_after(block: int) -> list[tuple[str, tuple[Any, ...]]]:
        """Statements that reopen records claimed or found gone after `block` (a reorganisation may
        have undone that)."""
        return [("UPDATE recorded SET done_block = NULL, next_check = 0 WHERE done_block > ?", (block,))]

    def due_recorded(self, now: int, limit: int) -> list[tuple[str, int]]:
        rows = self.store.query(
            "SELECT work_key, deadline FROM recorded WHERE done_block IS NULL AND next_check <= ? "
            "ORDER BY next_check LIMIT ?",
            (now, limit),
        )
        return [(r["work_key"], int(r["deadline"])) for r in rows]

    def check_later(self, key: str, at: int) -> None:
        self.store.execute("UPDATE recorded SET next_check = ? WHERE work_key = ?", (at, key))

    def done_recorded(self, keys: list[str], block: int) -> None:
        self.store.execute_many(("UPDATE recorded SET done_block = ? WHERE work_key = ?", (block, k)) for k in keys)

    def tracked_count(self) -> int:
        return int(self.store.scalar("SELECT COUNT(*) FROM recorded WHERE done_block IS NULL") or 0)

    # -- claims

    def add_claims(self, receipts: list[Any]) -> None:
        self.store.execute_many(
            (
                "INSERT OR IGNORE INTO claims(tx, keys, reward, at) VALUES(?, ?, ?, ?)",
                (
                    r.tx_hash,
                    len(r.all("WorkClaimed")),
                    str(sum(int(e.args["reward"]) for e in r.all("WorkClaimed"))),
                    time.time(),
                ),
            )
            for r in receipts
        )

    def claimed_tokens(self) -> int:
        """Rewards claimed so far (base units), from the claims this worker recorded."""
        return sum(int(r[0]) for r in self.store.query("SELECT reward FROM claims"))

    # -- evidence and appeals

    def keep_evidence(self, digest: str, key: str, sender: str, doc: bytes) -> None:
        self.store.execute(
            "INSERT OR IGNORE INTO evidence(hash, work_key, sender, doc, at) VALUES(?, ?, ?, ?, ?)",
            (digest, key, sender.lower(), doc, time.time()),
        )

    def evidence_doc(self, digest: str) -> bytes | None:
        row = self.store.one("SELECT doc FROM evidence WHERE hash = ?", (digest,))
        return bytes(row["doc"]) if row is not None else None

    def answered(self, key: str) -> bool:
        """Whether the accusation of work `key` was answered already (appealed or not)."""
        return self.store.one("SELECT 1 FROM appeals WHERE work_key = ?", (key,)) is not None

    def add_answer(self, key: str, status: str, detail: str, tx: str | None) -> None:
        self.store.execute(
            "INSERT OR IGNORE INTO appeals(work_key, status, detail, tx, at) VALUES(?, ?, ?, ?, ?)",
            (key, status, detail[:500], tx, time.time()),
        )
