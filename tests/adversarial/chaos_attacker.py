"""The chaos test's attacking member, in a process of its own (as it would be on its own machine): several
of issue 36's attacks at once against a live coordinator, until it is killed. It writes how many of each
it made to a JSON file every second.

Run by `tests/adversarial/test_chaos.py` as `python -m tests.adversarial.chaos_attacker ARGS_JSON`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import msgpack
import trio
from eth_account import Account

from node import protocol
from node.chain.signing import RolloutClaim
from node.p2p.blobs import UPLOAD_PROTOCOL, upload_blob
from node.p2p.host import P2PError
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from tests.adversarial.test_chaos import _header_bomb


async def attack(a: dict[str, Any]) -> None:
    me = Account.from_key(bytes.fromhex(a["key"]))
    peer, pid = a["peer"], int(a["pool"])
    parse_bomb = Path(a["parse_bomb"]).read_bytes()
    counts: dict[str, int] = {}

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    def membership() -> Membership:
        return Membership(pid, a["coordinator"], frozenset(), frozenset(a["members"]))

    async with PoolNetwork(private_key=bytes(me.key), pool=pid, membership=membership) as net:
        await net.connect(peer)

        async def bombs() -> None:  # depth bombs and parse bombs, submitted for its own task
            n = 0
            while True:
                n += 1
                stage = "task"
                try:
                    raw = await net.node.request(peer, protocol.TASK_PROTOCOL, protocol.pack({}), timeout=60)
                    task = protocol.reply_body(raw, "task")["task"]
                    data = _header_bomb(os.urandom(8)) if n % 2 else parse_bomb
                    stage = "upload"
                    key = await upload_blob(net.node, peer, data)
                    sig = RolloutClaim(key, pid, int(a["chain_id"]), a["ledger"]).sign(me)
                    body = protocol.pack({"work_key": key, "task_id": task["task_id"], "signature": sig})
                    stage = "submit"
                    for _ in range(100):  # a passing refusal (budget, a parse of its own in progress): again
                        reply = protocol.unpack(
                            await net.node.request(peer, protocol.SUBMIT_PROTOCOL, body, timeout=90), "r"
                        )
                        if not reply.get("retry"):
                            break
                        count("bomb-busy")
                        await trio.sleep(0.5)
                    # refused after the coordinator read it: what the test needs to see happen
                    count("bomb" if reply.get("ok") is False and not reply.get("retry") else "bomb-ACCEPTED")
                except (P2PError, protocol.ProtocolError) as exc:
                    count(f"bomb-failed-{stage}")  # the coordinator's defences before the parse, or the transport
                    why = f"why-{stage}: {str(exc)[:60]}"
                    if why in counts or len([k for k in counts if k.startswith("why-")]) < 6:
                        count(why)
                await trio.sleep(0.2)

        async def trickle() -> None:  # an upload slot held with a few bytes a second
            while True:
                blob = os.urandom(1 << 20)
                key = "0x" + hashlib.sha256(blob).hexdigest()
                with contextlib.suppress(P2PError):
                    off = 0
                    while off < len(blob):
                        req = msgpack.packb([key, off, len(blob), blob[off : off + 64]])
                        off = msgpack.unpackb(await net.node.request(peer, UPLOAD_PROTOCOL, req, timeout=20))[0]
                        await trio.sleep(1.0)
                count("trickle")
                await trio.sleep(0.5)

        async def junk_submits() -> None:  # submissions for tasks never issued, 60 KiB task ids
            body = protocol.pack({"work_key": "0x" + "ab" * 32, "task_id": "t" * 60_000, "signature": None})
            while True:
                with contextlib.suppress(P2PError):
                    await net.node.request(peer, protocol.SUBMIT_PROTOCOL, body, timeout=20)
                count("junk")  # answered or refused
                await trio.sleep(0)

        async def resets(port: int, path: bytes) -> None:  # read a few bytes of a page, then reset
            while True:
                with contextlib.suppress(OSError, trio.BrokenResourceError):
                    s = await trio.open_tcp_stream("127.0.0.1", port)
                    await s.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                    with trio.move_on_after(2):
                        await s.receive_some(64)
                    s.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    await s.aclose()
                    count("reset")
                await trio.sleep(0.05)

        async def idle_sockets(port: int) -> None:  # 16 idle sockets from each of 4 addresses
            held = []
            for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
                for _ in range(16):
                    with contextlib.suppress(OSError):
                        s = trio.socket.socket()
                        await s.bind((source, 0))
                        await s.connect(("127.0.0.1", port))
                        held.append(s)
                        count("idle")
            await trio.sleep_forever()

        async def report() -> None:
            path = Path(a["counts"])
            while True:
                path.write_text(json.dumps(counts))
                await trio.sleep(1.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(report)
            nursery.start_soon(bombs)
            nursery.start_soon(trickle)  # one slot of its two: the bombs' uploads need the other
            for _ in range(4):
                nursery.start_soon(junk_submits)
            nursery.start_soon(resets, int(a["explorer_port"]), f"/pool/{pid}".encode())
            nursery.start_soon(idle_sockets, int(a["explorer_port"]))


if __name__ == "__main__":
    trio.run(attack, json.loads(sys.argv[1]))
