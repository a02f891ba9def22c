"""The worker's submission of a rollout file: upload (retried while the coordinator does not answer,
not when it refuses), submit (retried while the coordinator is busy), then the announcement."""

from __future__ import annotations

import logging
from typing import Any

import trio

from .. import protocol
from ..errors import PeerError
from ..p2p.blobs import upload_blob
from ..p2p.host import P2PError

log = logging.getLogger("intellect.worker")


class SubmittingMixin:
    """A mixin of `Worker` (its `claim`, `_count`, `_retry_p2p` and `_request` too)."""

    net: Any
    coordinator_peer: Any
    state: Any
    node: Any
    phase: str

    async def submit(self, key: str, task_id: str, data: bytes) -> None:
        assert self.net is not None and self.coordinator_peer is not None
        signature = self.claim(key).sign(self.node)  # deterministic (RFC 6979): the same bytes after a restart
        self.phase = f"uploading {key[:12]}"
        node, peer = self.net.node, self.coordinator_peer

        async def upload() -> str | None:
            try:
                return await upload_blob(node, peer, data)
            except P2PError as exc:
                if protocol.UPLOAD_REFUSED in str(exc):
                    return None  # final (its task expired, say): not retried, the rollout is rejected
                raise

        try:  # as long as any other request waits for the coordinator (--connect-wait)
            uploaded = await self._retry_p2p(upload, f"upload of {key[:12]}")
        except P2PError as exc:
            raise PeerError(f"upload of rollout {key} failed: {exc}", "the coordinator may be down") from None
        if uploaded is None:
            self.state.set_rejected(key, "the coordinator refused its upload (no open task)")
            self._count("rollouts_rejected", reason="coordinator")
            log.warning("rollout %s: the coordinator refused its upload (its task is no longer open)", key[:12])
            return
        self._count("rollouts_uploaded")
        delay = 2.0
        while True:
            try:
                reply = await self._request(
                    protocol.SUBMIT_PROTOCOL,
                    {"work_key": key, "task_id": task_id, "signature": signature},
                    "submission",
                    timeout=60.0,
                )
                break
            except protocol.ProtocolBusy as exc:  # busy, over budget, no chain: the same file, later (a
                # task that expires meanwhile ends it with a final refusal)
                self.phase = f"submission of {key[:12]} waits: {exc}"
                log.info("submission of %s waits %.0f s: %s", key[:12], delay, exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 60.0)
            except protocol.ProtocolError as exc:
                self.state.set_rejected(key, str(exc))
                self._count("rollouts_rejected", reason="coordinator")
                log.warning("rollout %s rejected: %s", key[:12], exc)
                return
        self.state.set_accepted(key)
        self._count("rollouts_accepted")
        log.info("rollout %s %s (%s units)", key[:12], reply.get("status"), reply.get("units", "?"))
        try:
            body = {"work_key": key, "task_id": task_id, "signature": signature, "addrs": self.net.listen_addrs[:4]}
            await self.net.publish("rollout", protocol.pack(body))
        except Exception as exc:
            log.debug("announcement failed: %r", exc)
