"""The coordinator's durable state: the tasks it issued, the rollouts it accepted (and their fate on
chain and in training), every accepted completion (to judge copies), bounded refusals, the trainer's
steps, the pool's invalidations, invites and validators' evidence. Named methods, one statement or one
transaction each, so the coordinator's modules hold no SQL."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from node.rollout.file import RolloutFile
from node.rollout.intake import completion_hashes
from node.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'issued',     -- issued | submitted | superseded
    work_key TEXT,
    expires_at REAL NOT NULL,
    issued_at REAL,
    ended_at REAL,                             -- when it was superseded
    lapses INTEGER NOT NULL DEFAULT 1          -- supersessions it counts for (`rules.replacement`)
);
CREATE INDEX IF NOT EXISTS tasks_node ON tasks(node, status);
CREATE TABLE IF NOT EXISTS rollouts (
    work_key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    node TEXT NOT NULL,
    units INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    proof_commitment TEXT NOT NULL,
    mean_reward REAL NOT NULL,
    accepted_at REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'accepted',   -- accepted | recorded | dropped
    tx TEXT,
    note TEXT,
    trained INTEGER NOT NULL DEFAULT 0,        -- 0 not yet | 1 trained on | -1 never (stale, unreadable) | -2 failed the trainer's checks
    signature TEXT                             -- the node's RolloutClaim signature of the work key
);
CREATE TABLE IF NOT EXISTS completions (       -- every accepted completion, to judge copies across files
    prompt TEXT NOT NULL,                      -- sha256 of the prompt token ids
    completion TEXT NOT NULL,                  -- sha256 of prompt and completion token ids
    work_key TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS completions_prompt ON completions(prompt);
CREATE INDEX IF NOT EXISTS completions_completion ON completions(completion);
CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts(status);
CREATE TABLE IF NOT EXISTS rejections (
    at REAL NOT NULL, node TEXT NOT NULL, reason TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    version INTEGER PRIMARY KEY,               -- the version this step produced
    mean_reward REAL NOT NULL,
    files INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    stale INTEGER NOT NULL,
    versions TEXT NOT NULL,                    -- policy versions of the rollouts trained on
    seconds REAL NOT NULL,
    manifest_hash TEXT NOT NULL,
    at REAL NOT NULL,
    verified INTEGER NOT NULL DEFAULT 0        -- of the samples, those the trainer's checks passed
);
CREATE TABLE IF NOT EXISTS invalidated (       -- WorkInvalidated events of this pool, with the node we accepted it from
    work_key TEXT PRIMARY KEY, node TEXT, block INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS invites (
    node TEXT PRIMARY KEY, nonce TEXT NOT NULL, expiry INTEGER NOT NULL, signature TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (          -- the pool's validators' evidence documents we keep and serve
    hash TEXT PRIMARY KEY, work_key TEXT NOT NULL, sender TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_work_key ON evidence(work_key);
"""

Stmts = list[tuple[str, tuple[Any, ...]]]


class CoordinatorState:
    def __init__(self, path: Path) -> None:
        self.store = Store(path, SCHEMA)
        self.store.add_column("rollouts", "signature", "TEXT")
        self.store.add_column("steps", "verified", "INTEGER NOT NULL DEFAULT 0")
        self.store.add_column("tasks", "issued_at", "REAL")
        self.store.add_column("tasks", "ended_at", "REAL")
        self.store.add_column("tasks", "lapses", "INTEGER NOT NULL DEFAULT 1")

    # -- invites

    def invite(self, node: str) -> dict[str, Any] | None:
        row = self.store.one("SELECT * FROM invites WHERE node = ?", (node,))
        return dict(row) if row is not None else None

    def keep_invite(self, node: str, nonce: int, expiry: int, signature: str) -> None:
        self.store.execute(
            "INSERT INTO invites(node, nonce, expiry, signature) VALUES(?, ?, ?, ?) "
            "ON CONFLICT(node) DO UPDATE SET nonce=excluded.nonce, expiry=excluded.expiry, "
            "signature=excluded.signature",
            (node, str(nonce), expiry, signature),
        )

    # -- tasks

    def open_task(self, node: str, valid_after: float) -> dict[str, Any] | None:
        """The node's newest issued task still valid after `valid_after`."""
        row = self.store.one(
            "SELECT task_id, body FROM tasks WHERE node = ? AND status = 'issued' AND expires_at > ? "
            "ORDER BY expires_at DESC",
            (node, valid_after),
        )
        return dict(row) if row is not None else None

    def lapsed(self, node: str, since: float, now: float, soon: float) -> list[tuple[float | None, float]]:
        """The lives (issued, ended) of the node's tasks that ended unsubmitted in (since, now]: those
        that expired, or expire by `soon` (too late to be sent again, so the node is given another while
        it still holds this one), ended at their expiry or now; and those superseded while the node held
        them unsubmitted (it asked again only once the policy had moved past them), ended then, once per
        version the node let pass (`rules.replacement`)."""
        rows = self.store.query(
            "SELECT issued_at, MIN(expires_at, ?) AS ended, 1 AS n FROM tasks WHERE node = ? AND status = 'issued' "
            "AND expires_at > ? AND expires_at <= ? "
            "UNION ALL SELECT issued_at, ended_at, lapses FROM tasks WHERE node = ? AND status = 'superseded' "
            "AND ended_at > ? AND ended_at <= ?",
            (now, node, since, soon, node, since, now),
        )
        return [(r["issued_at"], float(r["ended"])) for r in rows for _ in range(max(1, int(r["n"])))]

    def replace_task(
        self, old: str, lapses: int, task_id: str, node: str, body: bytes, expires_at: float, now: float
    ) -> bool:
        """A task the policy moved past superseded (counting `lapses`) and its replacement issued, in one
        transaction; False (nothing written) when the old task is no longer open (a submission for it
        was accepted meanwhile)."""
        return self.store.execute_many(
            [
                (
                    "UPDATE tasks SET status = 'superseded', ended_at = ?, lapses = ? "
                    "WHERE task_id = ? AND status = 'issued'",
                    (now, lapses, old),
                ),
                self._insert_task(task_id, node, body, expires_at, now),
            ],
            guarded=True,
        )

    def downtimes(self) -> list[tuple[float, float]]:
        """The coordinator's recent outages, (from, to) (`rules.recent_downtimes`)."""
        return [(float(a), float(b)) for a, b in json.loads(self.store.get("downtimes") or "[]")]

    def keep_downtimes(self, spans: list[tuple[float, float]]) -> None:
        self.store.put("downtimes", json.dumps(spans))

    def add_task(self, task_id: str, node: str, body: bytes, expires_at: float) -> None:
        self.store.execute(*self._insert_task(task_id, node, body, expires_at, time.time()))

    @staticmethod
    def _insert_task(
        task_id: str, node: str, body: bytes, expires_at: float, now: float
    ) -> tuple[str, tuple[Any, ...]]:
        return (
            "INSERT INTO tasks(task_id, node, body, expires_at, issued_at) VALUES(?, ?, ?, ?, ?)",
            (task_id, node, body.hex(), expires_at, now),
        )

    def task(self, task_id: str) -> dict[str, Any] | None:
        row = self.store.one("SELECT * FROM tasks WHERE task_id = ?", (task_id,))
        return dict(row) if row is not None else None

    def tasks_issued(self) -> int:
        return int(self.store.scalar("SELECT COUNT(*) FROM tasks") or 0)

    def backlog(self, now: float) -> int:
        """Rollouts the trainer has not consumed yet: accepted-untrained plus tasks still open."""
        untrained = self.store.scalar(
            "SELECT COUNT(*) FROM rollouts WHERE trained = 0 AND status IN ('accepted', 'recorded')"
        )
        open_tasks = self.store.scalar("SELECT COUNT(*) FROM tasks WHERE status = 'issued' AND expires_at > ?", (now,))
        return int(untrained or 0) + int(open_tasks or 0)

    # -- refusals

    def add_rejection(self, node: str, reason: str, detail: str, keep: int) -> None:
        """A refused submission, keeping the newest `keep` rows only."""
        self.store.execute_many(
            [
                ("INSERT INTO rejections(at, node, reason, detail) VALUES(?, ?, ?, ?)",
                 (time.time(), node, reason, detail)),
                ("DELETE FROM rejections WHERE rowid <= (SELECT MAX(rowid) FROM rejections) - ?", (keep,)),
            ]
        )  # fmt: skip

    # -- rollouts

    def rollout(self, key: str) -> dict[str, Any] | None:
        row = self.store.one("SELECT * FROM rollouts WHERE work_key = ?", (key,))
        return dict(row) if row is not None else None

    def has_rollout(self, key: str) -> bool:
        """Whether a submission of `key` was accepted (its file is no sender's unsubmitted upload)."""
        return self.store.one("SELECT 1 FROM rollouts WHERE work_key = ?", (key,)) is not None

    def prior_draws(self, prompt_hash: str) -> int:
        """Accepted completions of a prompt (its draws)."""
        return int(self.store.scalar("SELECT COUNT(*) FROM completions WHERE prompt = ?", (prompt_hash,)) or 0)

    def prior_copies(self, completion_hash: str) -> int:
        """Accepted completions identical to one (prompt and completion)."""
        return int(self.store.scalar("SELECT COUNT(*) FROM completions WHERE completion = ?", (completion_hash,)) or 0)

    def accept(
        self, key: str, task_id: str, node: str, f: RolloutFile, commitment: str, mean_reward: float, signature: str
    ) -> bool:
        """An accepted rollout, its task closed and its completions counted, in one transaction; False
        (nothing written) when the task is no longer open: another submission for it was accepted, or it
        was superseded, while this one was being checked."""
        return self.store.execute_many(
            [
                (
                    "UPDATE tasks SET status = 'submitted', work_key = ? WHERE task_id = ? AND status = 'issued'",
                    (key, task_id),
                ),
                (
                    "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, "
                    "mean_reward, accepted_at, signature) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, task_id, node, f.units, f.header.policy_version, commitment, mean_reward, time.time(),
                     signature),
                ),
            ]
            + [
                ("INSERT INTO completions(prompt, completion, work_key) VALUES(?, ?, ?)", (*completion_hashes(s), key))
                for s in f.samples
            ],
            guarded=True,
        )  # fmt: skip

    def to_record(self, node: str | None, limit: int) -> list[dict[str, Any]]:
        """Accepted rollouts not yet recorded on chain (of `node` only, when given), oldest first."""
        rows = self.store.query(
            "SELECT * FROM rollouts WHERE status = 'accepted' AND (? IS NULL OR node = ?) ORDER BY accepted_at LIMIT ?",
            (node, node, limit),
        )
        return [dict(r) for r in rows]

    def unrecorded(self, node: str) -> int:
        return int(
            self.store.scalar("SELECT COUNT(*) FROM rollouts WHERE status = 'accepted' AND node = ?", (node,)) or 0
        )

    def set_recorded(self, keys: list[str], tx: str | None = None) -> None:
        self.store.execute_many(
            [
                ("UPDATE rollouts SET status = 'recorded', tx = COALESCE(?, tx) WHERE work_key = ?", (tx, k))
                for k in keys
            ]
        )

    def set_dropped(self, key: str, note: str) -> None:
        self.store.execute("UPDATE rollouts SET status = 'dropped', note = ? WHERE work_key = ?", (note, key))

    # -- invalidations

    def invalidations(self, node: str) -> int:
        return int(self.store.scalar("SELECT COUNT(*) FROM invalidated WHERE node = ?", (node,)) or 0)

    @staticmethod
    def forget_invalidations_after(block: int) -> Stmts:
        """The statements that drop invalidations read from blocks after `block` (a reorganisation took
        them; those still in the chain are read again)."""
        return [("DELETE FROM invalidated WHERE block > ?", (block,))]

    def add_invalidations(self, found: list[tuple[str, str | None, int]], move: Stmts) -> None:
        """`WorkInvalidated` events as (work key, node we accepted it from, block), with the cursor, in one
        transaction; each such node's untrained rollouts are never trained on."""
        stmts: Stmts = []
        for key, node, block in found:
            stmts.append(
                ("INSERT OR IGNORE INTO invalidated(work_key, node, block) VALUES(?, ?, ?)", (key, node, block))
            )
            if node is not None:
                stmts.append(
                    (
                        # a dropped row keeps the note that says why it was never recorded
                        "UPDATE rollouts SET trained = -1, note = CASE WHEN status = 'dropped' THEN note "
                        "ELSE 'node had work invalidated' END WHERE node = ? AND trained = 0",
                        (node,),
                    )
                )
        self.store.execute_many(stmts + move)

    # -- evidence

    def add_evidence(self, digest: str, key: str, sender: str) -> None:
        self.store.execute(
            "INSERT OR IGNORE INTO evidence(hash, work_key, sender, at) VALUES(?, ?, ?, ?)",
            (digest, key, sender.lower(), time.time()),
        )

    # -- training

    def mark_stale(self, min_version: int) -> list[str]:
        """Untrained rollouts older than `min_version`, marked never to be trained on; their keys."""
        rows = self.store.query(
            "SELECT work_key FROM rollouts WHERE trained = 0 AND policy_version < ? ORDER BY accepted_at",
            (min_version,),
        )
        self.store.execute("UPDATE rollouts SET trained = -1 WHERE trained = 0 AND policy_version < ?", (min_version,))
        return [str(r[0]) for r in rows]

    def to_train(self, min_version: int, n: int) -> list[str]:
        """The oldest `n` untrained rollouts, once those older than `min_version` are marked never to be."""
        self.store.execute("UPDATE rollouts SET trained = -1 WHERE trained = 0 AND policy_version < ?", (min_version,))
        rows = self.store.query(
            "SELECT work_key FROM rollouts WHERE trained = 0 AND status IN ('accepted', 'recorded') "
            "ORDER BY accepted_at LIMIT ?",
            (n,),
        )
        return [str(r[0]) for r in rows]

    def never_train(self, key: str, note: str) -> None:
        self.store.execute("UPDATE rollouts SET trained = -1, note = ? WHERE work_key = ?", (note, key))

    def commit_step(
        self,
        new: int,
        trained: list[str],
        failed: dict[str, str],
        stats: Any,
        files: int,
        versions: list[int],
        manifest_hash: str,
    ) -> None:
        """One transaction: the rollouts marked trained (or failed the trainer's checks, with why), the
        step recorded, the policy version bumped."""
        marks: Stmts = [
            ("UPDATE rollouts SET trained = -2, note = ? WHERE work_key = ?", (failed[k], k))
            if k in failed
            else ("UPDATE rollouts SET trained = 1 WHERE work_key = ?", (k,))
            for k in trained
        ]
        self.store.execute_many(
            [
                *marks,
                (
                    "INSERT OR REPLACE INTO steps(version, mean_reward, files, samples, stale, versions, seconds, "
                    "manifest_hash, at, verified) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        new,
                        float(stats.mean_reward),
                        files,
                        int(stats.samples_trained),
                        int(stats.stale_rejected),
                        json.dumps(versions),
                        float(stats.seconds),
                        manifest_hash,
                        time.time(),
                        int(stats.verified),
                    ),
                ),
                (
                    "INSERT INTO kv(k, v) VALUES('policy_version', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                    (str(new),),
                ),
            ]
        )

    def recent_versions(self, since: float) -> list[int]:
        return [int(r[0]) for r in self.store.query("SELECT version FROM steps WHERE at >= ?", (since,))]

    def version_hash(self, version: int) -> str | None:
        """The manifest hash policy `version` was committed (and announced) with; None if it never was."""
        h = self.store.scalar("SELECT manifest_hash FROM steps WHERE version = ?", (version,))
        return None if h is None else str(h)

    def history(self, n: int) -> dict[int, str]:
        """Manifest hashes of the last `n` policy versions."""
        rows = self.store.query("SELECT version, manifest_hash FROM steps ORDER BY version DESC LIMIT ?", (n,))
        return {int(r[0]): str(r[1]) for r in rows}

    # -- figures for /status

    def figures(self) -> dict[str, Any]:
        per_node: dict[str, dict[str, int]] = {}
        for r in self.store.query("SELECT node, status, COUNT(*), SUM(units) FROM rollouts GROUP BY node, status"):
            d = per_node.setdefault(r[0], {})
            d[r[1]] = int(r[2])
            d[f"{r[1]}_units"] = int(r[3] or 0)
        rewards = self.store.query("SELECT AVG(mean_reward) FROM rollouts WHERE status IN ('accepted','recorded')")
        versions: dict[str, list[int]] = {}
        for node, v in self.store.query("SELECT node, policy_version FROM rollouts ORDER BY accepted_at"):
            versions.setdefault(node, []).append(int(v))

        def per(trained: int) -> dict[str, int]:
            rows = self.store.query("SELECT node, COUNT(*) FROM rollouts WHERE trained = ? GROUP BY node", (trained,))
            return {str(r[0]): int(r[1]) for r in rows}

        return {
            "tasks_issued": self.tasks_issued(),
            "rollouts": self.store.counts("rollouts"),
            "per_node": per_node,
            "mean_reward": rewards[0][0] if rewards and rewards[0][0] is not None else None,
            "reward_curve": [
                round(float(r[0]), 4) for r in self.store.query("SELECT mean_reward FROM steps ORDER BY version")
            ],
            "trained_versions": [
                json.loads(r[0]) for r in self.store.query("SELECT versions FROM steps ORDER BY version")
            ],
            "stale_never_trained": int(self.store.scalar("SELECT COUNT(*) FROM rollouts WHERE trained = -1") or 0),
            # rollouts the trainer's checks refused, per node, and the samples trained / verified before training
            "trainer_refused": per(-2),
            # rollouts that went into a policy step having passed the trainer's checks, per node (a group
            # whose rewards are all equal has no advantage and trains no sample, but was still taken)
            "trainer_took": per(1),
            "samples_trained": int(self.store.scalar("SELECT COALESCE(SUM(samples), 0) FROM steps") or 0),
            "samples_verified": int(self.store.scalar("SELECT COALESCE(SUM(verified), 0) FROM steps") or 0),
            "rollout_versions": versions,
        }
