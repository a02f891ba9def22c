"""py-libp2p 0.8.1 patches (see `node.p2p.patches`, which imports this module): pubsub's reader cuts RPCs
from a per-stream read buffer, the service manager drops a task scheduled while it stops, and remembers
each trio task's parent instead of walking its whole task tree for every task it starts."""

from __future__ import annotations

import importlib
import logging
import weakref
from typing import Any

from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.utils.varint import decode_uvarint

from .patches import _PATCH_LIBP2P

# Pubsub's reader takes each RPC's varint length prefix with one `read(1)` per byte, then the body: two or
# three muxer reads per RPC, each through the stream's state lock, Yamux's stream lock and its window
# accounting. Here a pubsub stream is read in chunks of what has arrived (up to `PUBSUB_READ_CHUNK`) into a
# buffer of its own, and the RPCs are cut from that: one read serves every RPC that arrived together. The
# bounds stay: the prefix is at most 10 bytes, a length over the limit is refused before its body is read,
# and a buffer holds at most one RPC plus one chunk. Only the pubsub module's reader is switched.
PUBSUB_READ_CHUNK = 64 << 10
_pubsub_buffers: weakref.WeakKeyDictionary[Any, bytearray] = weakref.WeakKeyDictionary()


async def _read_more(reader: Any, buf: bytearray, n: int, expected: int) -> None:
    chunk = await reader.read(n)
    if not chunk:
        raise IncompleteReadError(
            f"stream ended with {len(buf)} of {expected} bytes", expected_bytes=expected, received_bytes=len(buf)
        )
    buf.extend(chunk)


async def read_varint_prefixed_buffered(reader: Any, max_length: int) -> bytes:
    """`libp2p.utils.varint.read_varint_prefixed_bytes_limited` over a per-stream read buffer (same errors:
    ParseError for a prefix over 10 bytes, MessageTooLarge before reading a body over `max_length`,
    IncompleteReadError when the stream ends inside an RPC)."""
    if max_length <= 0:
        raise ValueError("max_length must be greater than 0")
    buf = _pubsub_buffers.get(reader)
    if buf is None:
        buf = _pubsub_buffers[reader] = bytearray()
    while True:
        end = next((i for i, b in enumerate(buf[:10]) if not b & 0x80), -1)
        if end >= 0:
            break
        if len(buf) >= 10:
            raise ParseError("Varint decoding error: integer exceeds maximum size of 64 bits")
        await _read_more(reader, buf, PUBSUB_READ_CHUNK, len(buf) + 1)
    length = decode_uvarint(bytes(buf[: end + 1]))
    if length > max_length:
        raise MessageTooLarge(f"Message length {length} exceeds maximum allowed {max_length}")
    del buf[: end + 1]
    while len(buf) < length:
        await _read_more(reader, buf, max(length - len(buf), PUBSUB_READ_CHUNK), length)
    data = bytes(buf[:length])
    del buf[:length]
    return data


if _PATCH_LIBP2P:
    _pubsub_module.read_varint_prefixed_bytes_limited = read_varint_prefixed_buffered  # type: ignore[attr-defined]


# Shutdown. py-libp2p 0.8.1's service manager schedules a task for each incoming pubsub message; one that
# arrives while the host is stopping (the manager still running, its task nursery already closed) makes
# trio raise "Nursery is closed to new arrivals", and that error ends the host's whole `__aexit__` (a daemon
# that was stopping cleanly exits with a traceback). Such a task is dropped: its service is going away.
_trio_manager_module = importlib.import_module("libp2p.tools.anyio_service.trio_manager")
_schedule_task = _trio_manager_module.TrioManager._schedule_task


def _schedule_task_while_open(self: Any, task: Any) -> None:
    try:
        _schedule_task(self, task)
    except RuntimeError as exc:
        if "closed to new arrivals" not in str(exc):
            raise
        logging.getLogger(__name__).debug("dropped task %s: its service is stopping", task)


if _PATCH_LIBP2P:
    _trio_manager_module.TrioManager._schedule_task = _schedule_task_while_open  # type: ignore[method-assign]


# Task parents. py-libp2p 0.8.1's service manager starts a task per gossip message received (pubsub's
# `push_msg`), and finds the new task's parent by walking its whole task tree (every connection's, stream's
# and message's task) for the one running in the current trio task; the readers are not the manager's
# tasks, so the walk visited every task and found nothing, every time. Small at an even pace (0.2 % of a
# node's samples with 20 nodes), it grows with the tasks in flight, i.e. the further behind a node is.
# The answer for a trio task never changes while it runs, so it is remembered (weakly, per manager), a
# task checked against its trio task before use; a miss walks the tree as before.
_original_find_parent = _trio_manager_module.TrioManager._find_parent_task
_task_parents: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, Any]] = weakref.WeakKeyDictionary()


def _no_parent() -> None:
    return None


def _find_parent_task_cached(self: Any, trio_task: Any) -> Any:
    known = _task_parents.get(self)
    if known is None:
        known = _task_parents[self] = weakref.WeakKeyDictionary()
    ref = known.get(trio_task)
    if ref is _no_parent:
        return None
    task = ref() if ref is not None else None
    if task is not None and task.has_trio_task and task.trio_task is trio_task and not task.is_done:
        return task
    task = _original_find_parent(self, trio_task)
    # weak both ways (the task holds its trio task). "None" is remembered too: a trio task that runs none of
    # this manager's tasks never will (a task takes a new trio task when it starts), and that is the common
    # case: pubsub's readers run in the swarm's stream handlers, and each walked the whole tree per message.
    known[trio_task] = weakref.ref(task) if task is not None else _no_parent
    return task


if _PATCH_LIBP2P:
    _trio_manager_module.TrioManager._find_parent_task = _find_parent_task_cached  # type: ignore[method-assign]
