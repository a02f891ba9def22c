"""Depth bombs against every decoder of another party's bytes, in a process that imports what the daemons
import (one dependency raises the recursion limit to 100,000 at import: the JSON parser's C stack then
overflows before Python can raise `RecursionError`, and the daemon dies with SIGSEGV).

Found on main: a rollout file whose header JSON nests 100,000 levels deep (about 200 KB) passes the
coordinator's task-id and signature checks, then kills the coordinator's process in its parse (and the
validator's intake likewise). Each decoder must refuse such input with its own error; the process lives.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: the imports of the coordinator and the validator daemons, then each
# decoder on a 100,000-deep document. It prints one line per decoder; a SIGSEGV ends it early.
PROBE = textwrap.dedent(
    """
    import io, json, socket, sys, threading
    import pool.coordinator, node.validator, node.worker  # the daemons' imports (and their dependencies')
    import pyarrow as pa
    import pyarrow.parquet as pq
    import trio
    from node.rollout.file import FORMAT, SCHEMA, RolloutFile
    from node.chain.rpc import RpcClient

    print("recursion limit", sys.getrecursionlimit(), flush=True)
    N = 100_000
    nest = "[" * N + "]" * N

    def outcome(name, fn):
        try:
            fn()
        except Exception as exc:  # the decoder's own refusal
            print(name, "refused", type(exc).__name__, str(exc)[-200:], flush=True)
        else:
            print(name, "ACCEPTED", flush=True)

    # a rollout file (no rows) whose header nests N deep, in a footer of about 200 KB: the metadata is
    # written once, as a file key-value (the arrow schema's copy of it is left out)
    meta = json.dumps({"format": FORMAT, "header": {"pool_id": 1}})[:-2] + ', "extra": ' + nest + "}}"
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, SCHEMA, compression="zstd", write_statistics=False, store_schema=False) as w:
        w.write_table(pa.Table.from_pydict({n: [] for n in SCHEMA.names}, schema=SCHEMA))
        w.add_key_value_metadata({"intellect": meta})
    print("rollout file of", len(buf.getvalue()), "bytes", flush=True)
    outcome("rollout-header", lambda: RolloutFile.from_bytes(buf.getvalue()))

    # an RPC endpoint (a plain HTTP server on 127.0.0.1) whose answer nests N deep
    body = ('{"jsonrpc": "2.0", "id": 1, "result": %s}' % nest).encode()
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        for _ in range(8):
            conn, _ = srv.accept()
            got = b""
            while b"\\r\\n\\r\\n" not in got:
                got += conn.recv(65536)
            head, rest = got.split(b"\\r\\n\\r\\n", 1)
            length = int(head.lower().split(b"content-length:")[1].split(b"\\r\\n")[0])
            while len(rest) < length:
                rest += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n"
                         b"Connection: close\\r\\n\\r\\n" % len(body) + body)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()

    async def ask():
        async with RpcClient(f"http://127.0.0.1:{srv.getsockname()[1]}") as rpc:
            await rpc.request("eth_blockNumber", [])

    outcome("rpc-answer", lambda: trio.run(ask))

    # evidence a validator serves by hash, in UTF-16: a byte scan read the brackets as string text
    from node.evidence import MAX_SERVED_EVIDENCE_BYTES, parse_evidence
    doc = ('["\\u2200", ' + "[" * 110_000 + "]" * 110_000 + "]").encode("utf-16-le")
    outcome("evidence-utf16", lambda: parse_evidence(doc, max_bytes=MAX_SERVED_EVIDENCE_BYTES))
    print("alive", flush=True)
    """
)


def test_depth_bombs_are_refused_by_every_decoder_in_a_daemons_process() -> None:
    p = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=str(ROOT), timeout=300, check=False
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"the process died (exit {p.returncode}) on a depth bomb:\n{out[-3000:]}"
    assert "alive" in p.stdout, out[-3000:]
    lines = {ln.split()[0]: ln for ln in p.stdout.splitlines() if " refused " in ln or " ACCEPTED" in ln}
    for name in ("rollout-header", "rpc-answer", "evidence-utf16"):
        assert name in lines, out[-3000:]
        assert " refused " in lines[name], lines[name]
    # each refusal names what it refused (its size or its depth), not an unrelated error
    assert "exceeds the limit" in lines["rollout-header"] or "levels deep" in lines["rollout-header"], out
    assert "levels deep" in lines["rpc-answer"], out
