"""The validator's durable state: the records it follows (`checks`), the committee duties of its pool
(`duties`) and what it keeps in the store's key-value table. Named methods, one statement each (or one
transaction with the event cursor), so the daemon holds no SQL."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from ..chain.abi import DecodedEvent
from ..store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS checks (
    work_key TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    provider TEXT NOT NULL,
    units INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    block INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',  -- see node.validator.rules
    reason TEXT,
    evidence TEXT,
    tx TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,      -- internal errors while checking (ours, not the worker's)
    checked_at REAL
);
CREATE INDEX IF NOT EXISTS checks_status ON checks(status);
CREATE TABLE IF NOT EXISTS duties (
    work_key TEXT PRIMARY KEY,              -- an appeal or a challenge in this pool
    kind TEXT NOT NULL,
    block INTEGER NOT NULL DEFAULT 0,       -- where it opened: its committee comes from the validators then
    status TEXT NOT NULL DEFAULT 'open',    -- open | voted | not-drawn | closed
    vote TEXT,
    tx TEXT
);
"""

Move = list[tuple[str, tuple[Any, ...]]]  # the event cursor's statements (`node.daemon.new_ledger_events`)


class ValidatorState:
    def __init__(self, path: Path) -> None:
        self.store = Store(path, SCHEMA)
        self.store.add_column("checks", "errors", "INTEGER NOT NULL DEFAULT 0")
        self.store.add_column("duties", "block", "INTEGER NOT NULL DEFAULT 0")

    # -- identity and policy hashes (key-value)

    def sampling_secret(self) -> bytes:
        """This validator's secret for choosing which records it checks (made on first use)."""
        secret = self.store.get("sampling_secret")
        if secret is None:
            secret = secrets.token_hex(32)
            self.store.put("sampling_secret", secret)
        return bytes.fromhex(secret)

    def policy_hashes(self) -> dict[int, list[str]]:
        """Every hash heard announced per policy version, first heard first (`PolicyBook.announced`)."""
        rows = self.store.query("SELECT k, v FROM kv WHERE k LIKE 'policy:%'")
        return {int(k.split(":")[1]): str(v).split() for k, v in rows if k.count(":") == 1}

    def add_policy_hash(self, version: int, manifest_hash: str, envelope: bytes | None = None) -> None:
        """A hash announced for `version`, after those heard before; with `envelope`, the coordinator's
        signed announcement that carried it (kept: two of them for one version prove the lie to anyone)."""
        known = (self.store.get(f"policy:{version}") or "").split()
        if manifest_hash not in known:
            self.store.put(f"policy:{version}", " ".join([*known, manifest_hash]))
        if envelope is not None and self.store.get(f"policyann:{version}:{manifest_hash}") is None:
            self.store.put(f"policyann:{version}:{manifest_hash}", envelope.hex())

    def policy_announcement(self, version: int, manifest_hash: str) -> bytes | None:
        """The signed gossip envelope (`node.p2p.envelope.encode`) that announced `manifest_hash` for `version`."""
        raw = self.store.get(f"policyann:{version}:{manifest_hash}")
        return bytes.fromhex(raw) if raw else None

    def suspect(self, key: str) -> str | None:
        """The coordinator's reason for refusing work `key` in training, if it did."""
        return self.store.get(f"suspect:{key}")

    # -- records

    def add_records(self, events: list[DecodedEvent], move: Move) -> int:
        """`WorkRecorded` events as pending checks, with the cursor, in one transaction. A record read
        again (a reorganisation) stays as it was, unless it had gone from the chain: then it is checked
        again."""
        stmts: Move = [
            (
                "INSERT INTO checks(work_key, node, provider, units, policy_version, block) VALUES(?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(work_key) DO UPDATE SET status = 'pending', reason = NULL, block = excluded.block "
                "WHERE checks.status = 'settled' AND checks.reason = 'gone'",
                (
                    str(ev.args["workKey"]),
                    str(ev.args["node"]),
                    str(ev.args["provider"]),
                    int(ev.args["units"]),
                    int(ev.args["policyVersion"]),
                    ev.block_number,
                ),
            )
            for ev in events
        ]
        self.store.execute_many(stmts + move)
        return len(stmts)

    def open_checks(self, statuses: tuple[str, ...]) -> list[dict[str, Any]]:
        marks = ", ".join("?" * len(statuses))
        rows = self.store.query(f"SELECT * FROM checks WHERE status IN ({marks}) ORDER BY block", statuses)
        return [dict(r) for r in rows]

    def check(self, key: str) -> dict[str, Any] | None:
        r = self.store.one("SELECT * FROM checks WHERE work_key = ?", (key,))
        return dict(r) if r is not None else None

    def set_status(self, key: str, status: str, reason: str | None = None) -> None:
        if reason is None:
            self.store.execute("UPDATE checks SET status = ? WHERE work_key = ?", (status, key))
        else:
            self.store.execute("UPDATE checks SET status = ?, reason = ? WHERE work_key = ?", (status, reason, key))

    def set_verdict(self, key: str, status: str, reason: str, evidence: str) -> None:
        self.store.execute(
            "UPDATE checks SET status = ?, reason = ?, evidence = ?, checked_at = ? WHERE work_key = ?",
            (status, reason, evidence, time.time(), key),
        )

    def count_error(self, key: str) -> int:
        """One more internal error while checking `key`; returns how many there were."""
        errors = int(self.store.scalar("SELECT errors FROM checks WHERE work_key = ?", (key,)) or 0) + 1
        self.store.execute("UPDATE checks SET errors = ? WHERE work_key = ?", (errors, key))
        return errors

    def count_fetch_attempt(self, key: str, attempts: int) -> None:
        self.store.execute("UPDATE checks SET attempts = ? WHERE work_key = ?", (attempts, key))

    def set_sent(self, key: str, status: str, tx: str) -> None:
        self.store.execute("UPDATE checks SET status = ?, tx = ? WHERE work_key = ?", (status, tx, key))

    def mark_suspect(self, key: str, reason: str) -> None:
        """The coordinator's trainer refused `key`: checked even if it was skipped."""
        self.store.put(f"suspect:{key}", reason)
        self.store.execute("UPDATE checks SET status = 'pending' WHERE work_key = ? AND status = 'skipped'", (key,))

    def add_stops(self, node: str, stopped: float, expected: float, variance: float) -> tuple[float, float, float]:
        """A checked file's stop figures added to its node's totals (statistical pools); the new totals."""
        raw = self.store.get(f"stops:{node.lower()}")
        have = [float(x) for x in raw.split()] if raw else [0.0, 0.0, 0.0]
        tot = (have[0] + stopped, have[1] + expected, have[2] + variance)
        self.store.put(f"stops:{node.lower()}", " ".join(repr(x) for x in tot))
        return tot

    def mark_node_suspect(self, node: str, reason: str) -> None:
        """Every record of `node` is checked from now on, whatever the sample rate (skipped ones too)."""
        self.store.put(f"suspect-node:{node.lower()}", reason)
        self.store.execute("UPDATE checks SET status = 'pending' WHERE lower(node) = ? AND status = 'skipped'",
                           (node.lower(),))  # fmt: skip

    def node_suspect(self, node: str) -> str | None:
        return self.store.get(f"suspect-node:{node.lower()}")

    def accused(self) -> list[str]:
        return [str(r["work_key"]) for r in self.store.query("SELECT work_key FROM checks WHERE status = 'accused'")]

    # -- committee duties

    def add_duties(self, events: list[DecodedEvent], move: Move) -> None:
        stmts: Move = [
            ("INSERT OR IGNORE INTO duties(work_key, kind, block) VALUES(?, ?, ?)",
             (str(ev.args["workKey"]), "appeal" if ev.name == "WorkAppealed" else "challenge", ev.block_number))
            for ev in events
        ]  # fmt: skip
        self.store.execute_many(stmts + move)

    def open_duties(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.store.query("SELECT * FROM duties WHERE status = 'open'")]

    def set_duty(self, key: str, status: str, vote: str | None = None, tx: str | None = None) -> None:
        if vote is None:
            self.store.execute("UPDATE duties SET status = ? WHERE work_key = ?", (status, key))
        else:
            self.store.execute(
                "UPDATE duties SET status = ?, vote = ?, tx = ? WHERE work_key = ?", (status, vote, tx, key)
            )
