"""py-libp2p 0.8.1 patch (see `node.p2p.patches`, which imports this module): a TCP connection is read
ahead into a buffer of its own.

Every layer above TCP reads in small pieces: Noise reads each frame's 2-byte length and then its body,
Yamux each 12-byte header and then the frame's data, multistream its varints. Each piece was one
`recv()` and one trip through trio's scheduler (a lock and a wait for the socket), two or three per
gossip message. Here one `recv()` takes what has arrived, up to `TCP_READ_AHEAD` bytes, and the reads
that follow are answered from it without a system call; a read of more than is buffered returns what
is buffered (a short read, as `recv()` may give). Bounded: a connection holds at most one read-ahead
chunk; a read larger than the chunk is passed through with its own size."""

from __future__ import annotations

from typing import Any

import trio
from libp2p.io import trio as _io_trio_module
from libp2p.io.exceptions import ConnectionClosedError

from .patches import _PATCH_LIBP2P

TCP_READ_AHEAD = 16 << 10


async def read_ahead(self: Any, n: int | None = None) -> bytes:
    """`TrioTCPStream.read` over a per-connection read-ahead buffer; the same errors (ConnectionClosedError
    for a reset, b"" at EOF or for a locally closed socket)."""
    if n == 0:
        return b""
    buf: bytearray | None = getattr(self, "_read_ahead", None)
    if buf:
        # served from memory: a cancellation still lands here, but no scheduling round trip
        await trio.lowlevel.checkpoint_if_cancelled()
        if n is None or n >= len(buf):
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(buf[:n])
            del buf[:n]
        return data
    async with self.read_lock:
        buf = getattr(self, "_read_ahead", None)
        if buf:  # another reader filled it while we waited for the lock
            return await read_ahead(self, n)
        try:
            chunk: bytes = await self.stream.receive_some(max(n or 0, TCP_READ_AHEAD))
        except trio.BrokenResourceError as error:
            raise ConnectionClosedError(f"TCP connection reset by remote peer: {error}", transport="tcp") from error
        except trio.ClosedResourceError:
            return b""
    if n is None or len(chunk) <= n:
        return chunk
    if buf is None:
        buf = bytearray()
        self._read_ahead = buf
    buf.extend(memoryview(chunk)[n:])
    return chunk[:n]


if _PATCH_LIBP2P:
    _io_trio_module.TrioTCPStream.read = read_ahead  # type: ignore[method-assign]
