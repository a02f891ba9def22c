"""Prometheus metrics of the daemons (worker, validator, coordinator) and a small HTTP server for them.

Each `Metrics` holds its own `CollectorRegistry`, so several daemons in one process (as in the tests)
never clash over metric names. `serve_http` is a trio + h11 server with bounded resources: a cap on
the request head, on the request body, on concurrent connections and on each connection's lifetime.
It serves `GET /metrics` (Prometheus text format) and `GET /status` (JSON from a caller's callable).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import h11
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import httpd

log = logging.getLogger(__name__)

TOKEN = 10**18
MAX_HEAD_BYTES = httpd.MAX_HEAD_BYTES
MAX_CONNECTIONS = 64
CONNECTION_TIMEOUT = httpd.CONNECTION_TIMEOUT

StatusFn = Callable[[], dict[str, Any]]


def _tokens(amount: int) -> float:
    """Base units (18 decimals) as a float number of tokens, for gauges and counters."""
    return int(amount) / TOKEN


class Metrics:
    """The counters and gauges of one daemon, in a registry of its own.

    Counters are exposed with the `_total` suffix Prometheus adds (`intellect_heartbeats_total`).
    """

    def __init__(self, role: str = "") -> None:
        self.role = role
        r = self.registry = CollectorRegistry(auto_describe=True)
        # Role of the daemon: a constant 1 with the role as a label (empty when not given).
        self.info = Gauge("intellect_node_info", "The daemon's role (constant 1).", ["role"], registry=r)
        self.info.labels(role=role).set(1)

        # worker
        self.rollouts_generated = Counter("intellect_rollouts_generated", "Rollouts generated.", registry=r)
        self.rollouts_uploaded = Counter("intellect_rollouts_uploaded", "Rollouts uploaded.", registry=r)
        self.tokens_generated = Counter("intellect_tokens_generated", "Completion tokens generated.", registry=r)
        self.proofs_built = Counter("intellect_proofs_built", "TOPLOC proofs built.", registry=r)
        self.self_checks = Counter(
            "intellect_self_checks", "Own rollouts run through the validators' checks before submitting.", registry=r
        )
        # validator / coordinator
        self.rollouts_accepted = Counter("intellect_rollouts_accepted", "Rollouts accepted.", registry=r)
        self.rollouts_rejected = Counter(
            "intellect_rollouts_rejected", "Rollouts rejected, by reason.", ["reason"], registry=r
        )
        self.verdicts = Counter(
            "intellect_verdicts", "Verification verdicts, by result (ok / failed).", ["result"], registry=r
        )
        self.work_records_submitted = Counter(
            "intellect_work_records_submitted", "Work records submitted on chain.", registry=r
        )
        self.work_records_unfunded = Counter(
            "intellect_work_records_unfunded",
            "Accepted rollouts held back because the pool's budget could not reserve their rewards.",
            registry=r,
        )
        self.invalidations = Counter("intellect_invalidations", "Work invalidations sent.", registry=r)
        self.tasks_issued = Counter("intellect_tasks_issued", "Rollout tasks handed to workers.", registry=r)
        self.tasks_held_back = Counter(
            "intellect_tasks_held_back",
            "Task requests answered with a wait because the node let too many tasks lapse unsubmitted.",
            registry=r,
        )
        self.trainer_rejected = Counter(
            "intellect_trainer_rejected", "Rollouts the trainer's checks refused to train on.", registry=r
        )
        self.trainer_unchecked = Counter(
            "intellect_trainer_unchecked",
            "Recorded rollouts the trainer's checks did not cover (too old, weights gone): validators asked to check.",
            registry=r,
        )
        self.claims = Counter("intellect_claims", "Reward claims sent.", registry=r)
        # gossip
        self.gossip_rejected = Counter(
            "intellect_gossip_rejected", "Gossip messages rejected, by reason.", ["reason"], registry=r
        )
        self.gossip_dropped = Counter("intellect_gossip_dropped", "Gossip messages dropped (queues full).", registry=r)
        # chain
        self.chain_tx_sent = Counter(
            "intellect_chain_tx_sent", "Chain transactions sent, by kind.", ["kind"], registry=r
        )
        self.chain_tx_failed = Counter(
            "intellect_chain_tx_failed", "Chain transactions that failed, by kind.", ["kind"], registry=r
        )
        self.stake_tokens = Gauge("intellect_stake_tokens", "The provider's active stake, in tokens.", registry=r)
        self.rewards_claimed_tokens = Counter(
            "intellect_rewards_claimed_tokens", "Rewards claimed, in tokens.", registry=r
        )
        self.policy_version = Gauge("intellect_policy_version", "The policy version in use.", registry=r)
        self.heartbeats = Counter("intellect_heartbeats", "Heartbeats sent.", registry=r)

    # ------------------------------------------------------------------ helpers

    def verdict(self, ok: bool) -> None:
        self.verdicts.labels(result="ok" if ok else "failed").inc()

    def rejected(self, reason: str) -> None:
        self.rollouts_rejected.labels(reason=reason).inc()

    def gossip_reject(self, reason: str) -> None:
        self.gossip_rejected.labels(reason=reason).inc()

    def tx(self, kind: str, ok: bool = True) -> None:
        """Count one chain transaction of `kind` as sent, and as failed when not `ok`."""
        self.chain_tx_sent.labels(kind=kind).inc()
        if not ok:
            self.chain_tx_failed.labels(kind=kind).inc()

    def set_stake(self, base_units: int) -> None:
        self.stake_tokens.set(_tokens(base_units))

    def add_rewards(self, base_units: int) -> None:
        self.rewards_claimed_tokens.inc(_tokens(base_units))

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)


# ---------------------------------------------------------------------- HTTP


def _json(status: int, data: Any, close: bool = False) -> list[h11.Event]:
    return httpd.json_response(status, data, close)


def _route(metrics: Metrics, status_fn: StatusFn | None, method: bytes, target: bytes) -> list[h11.Event]:
    path = target.split(b"?", 1)[0]
    if method != b"GET":
        return _json(405, {"error": "method not allowed", "allow": "GET"})
    if path == b"/metrics":
        return httpd.response(200, metrics.render(), CONTENT_TYPE_LATEST)
    if path == b"/status":
        if status_fn is None:
            return _json(404, {"error": "no status"})
        try:
            return _json(200, status_fn())
        except Exception as exc:  # the caller's callable: report, never crash the server
            log.exception("status callable failed")
            return _json(500, {"error": f"status failed: {type(exc).__name__}"})
    return _json(404, {"error": "not found", "paths": ["/metrics", "/status"]})


async def serve_http(
    metrics: Metrics,
    host: str,
    port: int,
    status_fn: StatusFn | None = None,
    *,
    max_connections: int = MAX_CONNECTIONS,
    max_head_bytes: int = MAX_HEAD_BYTES,
    timeout: float = CONNECTION_TIMEOUT,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `GET /metrics` and `GET /status` on `host:port` until cancelled.

    `port` 0 picks a free port; the bound port is reported with `task_status.started(port)`, so
    `port = await nursery.start(serve_http, metrics, "127.0.0.1", 0, status_fn)`. `status_fn` is a
    plain (sync) callable returning a JSON-able dict; its failures become 500 answers. Each
    connection lives at most `timeout` seconds; at most `max_connections` are served at once (more
    get a 503 and are closed); a request head over `max_head_bytes` gets a 431/400 and is closed.
    """

    async def handle(stream: trio.SocketStream) -> None:
        await httpd.serve_routes(
            stream, lambda m, t: _route(metrics, status_fn, m, t), max_head_bytes=max_head_bytes, timeout=timeout
        )

    await httpd.serve(
        host, port, handle, max_connections=max_connections, what="metrics server", task_status=task_status
    )
