"""The metrics registry and its HTTP server: a real trio + h11 server on 127.0.0.1, fetched with httpx
and with raw sockets for the malformed, oversize, idle and over-the-cap cases."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx
import pytest
import trio

from node.metrics import Metrics, serve_http


async def _start(nursery: trio.Nursery, m: Metrics, status: Any = None, **kw: Any) -> str:
    port = await nursery.start(lambda task_status: serve_http(m, "127.0.0.1", 0, status, task_status=task_status, **kw))
    assert isinstance(port, int) and port > 0
    return f"http://127.0.0.1:{port}"


async def _raw(base: str, data: bytes, wait: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (or `wait` passes)."""
    port = int(base.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    out = b""
    try:
        with trio.move_on_after(wait):
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(data)
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                if not chunk:
                    break
                out += chunk
    finally:
        await stream.aclose()
    return out


def test_separate_registries_do_not_clash() -> None:
    a, b = Metrics("worker"), Metrics("validator")
    a.rollouts_generated.inc(3)
    b.rollouts_generated.inc()
    assert b"intellect_rollouts_generated_total 3.0" in a.render()
    assert b"intellect_rollouts_generated_total 1.0" in b.render()
    assert b'intellect_node_info{role="worker"} 1.0' in a.render()


async def test_metrics_and_status_endpoints() -> None:
    m = Metrics("worker")
    m.rollouts_generated.inc(5)
    m.tokens_generated.inc(1234)
    m.rejected("bad_proof")
    m.verdict(True)
    m.verdict(False)
    m.verdict(False)
    m.gossip_reject("stale")
    m.gossip_dropped.inc()
    m.tx("work_record")
    m.tx("claim", ok=False)
    m.set_stake(95 * 10**18)
    m.add_rewards(9 * 10**18)
    m.policy_version.set(7)
    m.heartbeats.inc()
    calls = []

    def status() -> dict[str, Any]:
        calls.append(1)
        return {"role": "worker", "policy_version": 7, "peers": len(calls)}

    async with trio.open_nursery() as nursery:
        base = await _start(nursery, m, status)
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            r = await http.get("/metrics")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain")
            text = r.text
            for line in (
                "intellect_rollouts_generated_total 5.0",
                "intellect_tokens_generated_total 1234.0",
                'intellect_rollouts_rejected_total{reason="bad_proof"} 1.0',
                'intellect_verdicts_total{result="ok"} 1.0',
                'intellect_verdicts_total{result="failed"} 2.0',
                'intellect_gossip_rejected_total{reason="stale"} 1.0',
                "intellect_gossip_dropped_total 1.0",
                'intellect_chain_tx_sent_total{kind="work_record"} 1.0',
                'intellect_chain_tx_sent_total{kind="claim"} 1.0',
                'intellect_chain_tx_failed_total{kind="claim"} 1.0',
                "intellect_stake_tokens 95.0",
                "intellect_rewards_claimed_tokens_total 9.0",
                "intellect_policy_version 7.0",
                "intellect_heartbeats_total 1.0",
            ):
                assert line in text, line

            # Counters move between scrapes on the same keep-alive connection.
            m.rollouts_generated.inc()
            assert "intellect_rollouts_generated_total 6.0" in (await http.get("/metrics")).text

            s = await http.get("/status")
            assert s.status_code == 200 and s.headers["content-type"] == "application/json"
            assert s.json() == {"role": "worker", "policy_version": 7, "peers": 1}
            assert (await http.get("/status?x=1")).json()["peers"] == 2

            nf = await http.get("/nope")
            assert nf.status_code == 404 and "not found" in nf.json()["error"]
            assert (await http.post("/metrics", content=b"x")).status_code == 405
        nursery.cancel_scope.cancel()


async def test_status_failure_is_a_500_not_a_crash() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("boom")

    async with trio.open_nursery() as nursery:
        base = await _start(nursery, Metrics(), broken)
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            r = await http.get("/status")
            assert r.status_code == 500 and "RuntimeError" in r.json()["error"]
            assert (await http.get("/metrics")).status_code == 200
        nursery.cancel_scope.cancel()


async def test_garbage_and_oversize_requests_do_not_crash_the_server() -> None:
    m = Metrics()
    m.heartbeats.inc(2)
    async with trio.open_nursery() as nursery:
        base = await _start(nursery, m, lambda: {"ok": True}, max_head_bytes=4096)

        garbage = await _raw(base, b"\x00\x01\x02 not http at all\r\n\r\n")
        assert garbage == b"" or garbage.startswith(b"HTTP/1.1 400")

        huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
        answer = await _raw(base, huge)
        assert answer == b"" or answer.split(b" ", 2)[1] in (b"400", b"431"), answer[:80]

        long_target = b"GET /" + b"x" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        answer = await _raw(base, long_target)
        assert answer == b"" or answer.split(b" ", 2)[1] in (b"400", b"431"), answer[:80]

        body = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b"z" * 200_000
        answer = await _raw(base, body)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 413"), answer[:80]

        # Still serving.
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            r = await http.get("/metrics")
            assert r.status_code == 200 and "intellect_heartbeats_total 2.0" in r.text
            assert (await http.get("/status")).json() == {"ok": True}
        nursery.cancel_scope.cancel()


async def test_idle_connections_time_out_and_the_cap_holds() -> None:
    async with trio.open_nursery() as nursery:
        base = await _start(nursery, Metrics(), None, max_connections=2, timeout=0.5)
        port = int(base.rsplit(":", 1)[1])

        # An idle connection (slowloris) is closed after the per-connection timeout.
        with trio.fail_after(3):
            assert await _raw(base, b"GET /metrics HTTP/1.1\r\nHost:", wait=3) == b""

        # Two idle connections fill the cap; a third is refused with 503 while they are open.
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        await trio.sleep(0.05)
        refused = await _raw(base, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", wait=0.4)
        assert refused.startswith(b"HTTP/1.1 503"), refused[:80]
        for s in idle:
            await s.aclose()
        await trio.sleep(0.1)
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.get("/status")).status_code == 404  # no status callable given
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("path", ["/", "/metricsx", "/status/extra"])
async def test_unknown_paths_are_404(path: str) -> None:
    async with trio.open_nursery() as nursery:
        base = await _start(nursery, Metrics(), lambda: {})
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            assert (await http.get(path)).status_code == 404
        nursery.cancel_scope.cancel()
