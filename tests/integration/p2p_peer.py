"""A P2PNode in its own process, for the multi-process tests of node/p2p/host.py.

Prints JSON lines on stdout so the parent can follow it without sharing memory:
``{"ready": <multiaddr>, "address": <eth address>}`` once listening, then ``{"count": n}`` after every
received message on the topic.  Exits when stdin closes (graceful stop) or on a signal.

Run as ``python -m tests.integration.p2p_peer --bootstrap <multiaddr> --topic t``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import trio

from node.p2p.host import P2PNode


def _emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _main(port: int, bootstrap: list[str], topic: str) -> None:
    async with P2PNode(
        private_key=os.urandom(32), listen=f"/ip4/127.0.0.1/tcp/{port}", topics=[topic], bootstrap=bootstrap
    ) as node:
        received = node.subscribe(topic)
        _emit({"ready": node.listen_addrs[0], "address": node.address})
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))

        async def watch_stdin(cancel: trio.CancelScope) -> None:
            while await stdin.receive_some(1024):
                pass
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_stdin, nursery.cancel_scope)
            count = 0
            async for _data, _sender in received:
                count += 1
                _emit({"count": count})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--topic", default="test")
    args = parser.parse_args()
    trio.run(_main, args.port, args.bootstrap, args.topic)


if __name__ == "__main__":
    main()
