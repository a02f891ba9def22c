"""The coordinator's trainer: verified rollouts into GRPO steps (`pool.grpo`), each new version published
to the weight broadcast before it is committed, the files the trainer's checks refused reported to the
validators, and the checkpoints rollouts may still claim kept served. A mixin of `Coordinator`."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import trio

from node import protocol
from node.rollout.file import RolloutFile, RolloutFormatError
from node.store import evidence_hash, write_evidence

from . import rules

log = logging.getLogger("intellect.coordinator")


class TrainingMixin:
    """State set up by `Coordinator.__init__`."""

    cfg: Any
    store: Any

    def _load_trainer(self) -> Any:
        from pool.grpo import Trainer

        assert self.tools is not None
        v = self.cfg.policy_version
        ckpts = self.cfg.data_dir / "checkpoints"
        source = ckpts / f"v{v}" if v > 0 else self.tools.path
        trainer = Trainer(source, lr=self.cfg.lr, async_level=self.cfg.async_level, seed=v, checks=self.checks)
        if trainer.load_optimizer(source):
            log.info("resumed the optimizer state of policy version %d", v)
        elif v > 0:
            log.warning("no optimizer state saved with policy version %d: AdamW starts afresh", v)
        # after a restart: the weights of the versions rollouts may still come from, for their old log-probs
        for old in range(max(0, v - self.cfg.async_level), v):
            folder = ckpts / f"v{old}" if old > 0 else self.tools.path
            if (folder / "model.safetensors").is_file():
                trainer.remember(old, folder)
        return trainer

    def retained_versions(self, new: int, now: float) -> set[int]:
        """Versions whose checkpoints stay served (beyond the newest `keep_checkpoints`) once `new` is
        published: every version that was current within the last `keep_checkpoint_seconds`. Rollouts
        come from such versions, and a validator that was down or behind must still be able to fetch
        the weights a rollout claims before its validation deadline."""
        return rules.retained_versions(new, self.state.recent_versions(now - self.cfg.keep_checkpoint_seconds))

    async def _train_loop(self) -> None:
        while True:
            await trio.sleep(1.0)
            try:
                await self.train_step()
            except Exception as exc:
                self.last_error = f"training: {exc!r}"
                log.exception("training step failed (will retry)")
                await trio.sleep(5.0)

    async def train_step(self) -> bool:
        """One GRPO step on the oldest untrained rollouts, if there are enough; publishes the new version.

        Rollouts more than `async_level` versions behind are marked stale and never trained on. The
        new version is committed (rows marked trained, the step recorded, the version bumped) in one
        sqlite transaction after its checkpoint is saved and published; a crash before that commit
        retrains the same rollouts (the version it may have published is dropped first), a crash after
        it only delays the announcement. A step that fails in between (a full disk) leaves the trainer at
        the last committed version."""
        cfg = self.cfg
        v = cfg.policy_version
        for key in self.state.mark_stale(v - cfg.async_level):
            await self._ask_check(key, "stale: too old to train on")
        rows = self.state.to_train(v - cfg.async_level, cfg.train_files)
        if len(rows) < cfg.train_files:
            return False
        keys, files = [], []
        for k in rows:
            data = self.blobs.get(k)
            try:
                if data is None:
                    raise RolloutFormatError("its blob is gone")
                files.append(RolloutFile.from_bytes(data, max_bytes=cfg.max_rollout_bytes))
                keys.append(k)
            except RolloutFormatError as exc:  # never retried for ever: dropped from training, once
                log.error("rollout %s cannot be trained on (%s); dropped from training", k[:12], exc)
                self.state.never_train(k, str(exc)[:200])
                await self._ask_check(k, f"unreadable here: {str(exc)[:80]}")
        if len(files) < cfg.train_files:
            return False
        new = v + 1
        if new in self.weights.versions():  # published by an attempt that died before its commit
            log.warning("dropping policy version %d, published but never committed by an earlier attempt", new)
            self.weights.remove(new)
        stats = await trio.to_thread.run_sync(self.trainer.step, files, v)
        failed = {keys[i]: verdict for i, verdict in stats.rejected}
        protect = self.retained_versions(new, time.time())
        try:
            manifest = await self._publish_step(new, protect)
            self._commit_step(new, keys, files, stats, manifest.manifest_hash(), failed)
        except Exception:
            # The trainer in memory has taken a step that is not committed (a full disk, say): go back to
            # the last committed version, so that the retry trains on these rollouts once, not twice.
            self.weights.remove(new)
            self.trainer = await trio.to_thread.run_sync(self._load_trainer)
            raise
        from pool.grpo import OPTIMIZER_FILE

        self._announce_now.set()
        for key, verdict in failed.items():
            await self._report_failed(key, verdict)
        for i in stats.unchecked:
            await self._ask_check(keys[i], "its version's weights were gone")
        for old in sorted((cfg.data_dir / "checkpoints").glob("v*")):
            n = int(old.name[1:]) if old.name[1:].isdigit() else None
            if n is not None and n <= new - cfg.keep_checkpoints and n not in protect:
                shutil.rmtree(old, ignore_errors=True)
            elif n is not None and n < new:  # the optimizer state is only needed to resume from the newest
                (old / OPTIMIZER_FILE).unlink(missing_ok=True)
        log.info(
            "policy step -> version %d: mean reward %.3f over %d files (versions %s), %d samples trained, %.1f s",
            new, stats.mean_reward, len(files), sorted({f.header.policy_version for f in files}),
            stats.samples_trained, stats.seconds,
        )  # fmt: skip
        return True

    async def _report_failed(self, key: str, verdict: dict[str, Any]) -> None:
        """A rollout the trainer's checks refused: logged, its verdict kept, and published on the verdict
        topic, where validators take it as a reason to check that record themselves, whatever their
        sample rate. It is still recorded on chain: the node signed it, and a validator that agrees
        invalidates it and slashes the node (dropping it would make cheating free to try). The
        coordinator's word slashes nobody: validators judge the file themselves."""
        reason = verdict["verdict"]["reason"]
        record = {"work_key": key, "pool": self.cfg.pool_id, "by": "trainer", **verdict}
        folder = self.cfg.data_dir / "evidence"
        try:
            folder.mkdir(exist_ok=True)
            digest = write_evidence(folder, record)
        except OSError as exc:
            digest = evidence_hash(record)
            log.warning("could not keep the trainer's verdict on %s: %s", key[:12], exc)
        log.warning(
            "rollout %s of node %s failed the trainer's checks (%s): not trained on; reported to the validators",
            key[:12], (self.state.rollout(key) or {}).get("node"), reason,
        )  # fmt: skip
        self._count("trainer_rejected")
        if self.net is not None:
            msg = {"work_key": key, "ok": False, "reason": reason, "evidence": digest, "by": "trainer"}
            try:
                await self.net.publish("verdict", protocol.pack(msg))
            except Exception as exc:  # no peers: the validators still check it by their sample rate
                log.info("could not publish the trainer's verdict on %s: %r", key[:12], exc)

    async def _ask_check(self, key: str, why: str) -> None:
        """A recorded rollout the trainer's checks never covered (too old to train on, or its version's
        weights gone): the validators are asked to check it whatever their sample rate, so that nothing is
        paid on the strength of a check nobody ran. A request to look, not a verdict (`take_hint`)."""
        log.info("rollout %s was not checked by the trainer (%s): asking the validators to check it", key[:12], why)
        self._count("trainer_unchecked")
        if self.net is not None:
            msg = {"work_key": key, "check": True, "reason": f"unchecked: {why}", "by": "trainer"}
            try:
                await self.net.publish("verdict", protocol.pack(msg))
            except Exception as exc:  # no peers: the validators still check it by their sample rate
                log.info("could not ask the validators to check %s: %r", key[:12], exc)

    async def _publish_step(self, new: int, protect: set[int]) -> Any:
        """Save the trainer's weights (and optimizer state) as checkpoint `new` and publish it on the
        weight server (pruning old versions but those in `protect`); returns the manifest."""
        trainer = self.trainer

        def save() -> Path:
            folder = trainer.save(self.cfg.data_dir / "checkpoints" / f"v{new}")
            trainer.save_optimizer(folder)
            return folder

        ckpt = await trio.to_thread.run_sync(save)
        # split in a worker thread; the store's maps and events change only here, in trio's thread (the
        # weight server reads them between our awaits, and a relay's waiters are trio events)
        manifest = await trio.to_thread.run_sync(self.weights.split_version, ckpt / "model.safetensors", new)
        gone = self.weights.adopt(manifest, protect)
        await trio.to_thread.run_sync(lambda: [shutil.rmtree(d, ignore_errors=True) for d in gone])
        return manifest

    def _commit_step(
        self,
        new: int,
        keys: list[str],
        files: list[Any],
        stats: Any,
        manifest_hash: str,
        failed: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """One transaction: the rollouts marked trained (or failed: never trained on; still recorded, so
        that validators slash their nodes), the step recorded, the version bumped."""
        cfg = self.cfg
        failed = failed or {}
        versions = sorted({f.header.policy_version for f in files})
        why = {k: f"failed the trainer's checks: {v['verdict']['reason']}" for k, v in failed.items()}
        self.state.commit_step(new, keys, why, stats, len(files), versions, manifest_hash)
        cfg.policy_version = new
        if self.metrics is not None:
            self.metrics.policy_version.set(new)
