"""Hash-checked blob transfer over the host's request-response streams.

Blobs are content-addressed by sha256 (keys are ``0x`` + 64 lowercase hex).  Two protocols:

- ``/intellect/blob/1``: request msgpack ``[key_hex, offset]``, response ``[total_size, chunk]``;
  the client pulls chunks in order and checks the hash before returning anything.
- ``/intellect/upload/1``: request msgpack ``[key_hex, offset, total_size, chunk]``, response
  ``[received_bytes, done]``; the server assembles into a bounded set of temp files and stores the
  blob only once its sha256 equals the declared key.
- ``/intellect/evidence/1``: the blob protocol again, over a node's evidence documents (validators
  serve their own; the coordinator those its pool's validators published), so the accused worker and
  a committee member can have a verdict's evidence by the hash on chain when they missed its gossip.

Errors on the serving side go through the host's error path (the handler raises), which the client
sees as a ``P2PError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from node.decoding import DecodeError, unpack_msgpack
from node.fsio import write_file
from node.p2p.host import DEFAULT_MAX_RESPONSE, P2PError, P2PNode, Refused
from node.p2p.uploads import _KEY_RE, MIN_UPLOAD_RATE, UPLOAD_GRACE, UploadState, _digest_hex

logger = logging.getLogger(__name__)

BLOB_PROTOCOL = "/intellect/blob/1"
UPLOAD_PROTOCOL = "/intellect/upload/1"
EVIDENCE_PROTOCOL = "/intellect/evidence/1"
DEFAULT_CHUNK = 256 * 1024
_ENVELOPE_OVERHEAD = 256  # msgpack framing around a chunk, generously
_MIN_AVG_CHUNK = 4096  # a peer answering in tinier chunks than this on average is cut off


def blob_key(data: bytes) -> str:
    """``0x``-hex sha256 of ``data``: the blob's key."""
    return "0x" + hashlib.sha256(data).hexdigest()


class BlobStore:
    """Content-addressed files under ``root``, named by their sha256 hex; at most ``max_bytes`` each."""

    def __init__(self, root: Path, max_bytes: int, suffix: str = "") -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.suffix = suffix  # file names are <sha256 hex><suffix> (a worker's rollouts end in .parquet)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / (_digest_hex(key) + self.suffix)

    def put(self, data: bytes) -> str:
        """Store ``data`` (atomically: temp file + ``os.replace``) and return its ``0x`` key."""
        if len(data) > self.max_bytes:
            raise ValueError(f"blob of {len(data)} bytes exceeds the store limit of {self.max_bytes} bytes")
        key = blob_key(data)
        path = self._path(key)
        if not path.exists():
            write_file(path, data)
        return key

    def put_file(self, key: str, tmp_path: Path) -> None:
        """Move an already verified temp file (same filesystem) into place under ``key``."""
        os.replace(tmp_path, self._path(key))

    def get(self, key: str) -> bytes | None:
        """The blob's bytes, or None when absent (or the key is malformed)."""
        try:
            path = self._path(key)
        except ValueError:
            return None
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def has(self, key: str) -> bool:
        try:
            return self._path(key).is_file()
        except ValueError:
            return False

    def read(self, key: str, offset: int, size: int) -> tuple[int, bytes] | None:
        """(the blob's total size, up to `size` bytes from `offset`), or None when absent; reads only
        those bytes, so serving a blob chunk by chunk reads it once, not once per chunk."""
        try:
            path = self._path(key)
        except ValueError:
            return None
        try:
            with path.open("rb") as fh:
                total = os.fstat(fh.fileno()).st_size
                if offset < 0 or offset > total:
                    raise ValueError("offset out of range")
                fh.seek(offset)
                return total, fh.read(size)
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        with contextlib.suppress(ValueError, FileNotFoundError):
            self._path(key).unlink()

    def keys_older_than(self, age: float) -> list[str]:
        """Keys of the blobs stored more than `age` seconds ago (by file time)."""
        cutoff = time.time() - age
        out = []
        for p in self.root.iterdir():
            if p.is_file() and p.name.endswith(self.suffix) and _KEY_RE.match(p.name.removesuffix(self.suffix)):
                with contextlib.suppress(FileNotFoundError):
                    if p.stat().st_mtime < cutoff:
                        out.append("0x" + p.name.removesuffix(self.suffix))
        return out


def serve_blobs(
    node: P2PNode,
    store: BlobStore,
    *,
    chunk: int = DEFAULT_CHUNK,
    max_uploads: int = 8,
    max_uploads_per_sender: int = 2,
    max_sender_bytes: int | None = None,
    stale_after: float = 120.0,
    allow: Callable[[str], bool] | None = None,
    accept_uploads: bool = True,
    protocol: str = BLOB_PROTOCOL,
    may_upload: Callable[[str], str | None] | None = None,
    submitted: Callable[[str], bool] | None = None,
    min_rate: float = MIN_UPLOAD_RATE,
    grace: float = UPLOAD_GRACE,
) -> UploadState | None:
    """Serve ``store`` on ``protocol`` (``/intellect/blob/1``) and (with `accept_uploads`) accept
    verified uploads on ``/intellect/upload/1``.

    `allow(sender)` is asked first, before any byte is read from disk or written: a sender it refuses
    gets a one-line refusal and costs nothing else (the coordinator passes its membership check).
    Uploads are bounded: at most ``max_uploads`` in progress, ``max_uploads_per_sender`` per sender, at
    most ``max_sender_bytes`` declared bytes in progress per sender (default: twice the store's blob
    limit); idle ones expire after ``stale_after`` seconds, and when room is needed those that average
    under ``min_rate`` bytes a second after ``grace`` seconds give their slots up. `may_upload(sender)`
    (None, or why not) is asked before an upload starts: the coordinator takes files only from a node
    with an open task. A sender keeps at most `MAX_UNSUBMITTED` finished uploads that `submitted(key)`
    does not know: a further one deletes its oldest."""
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    # only a store that takes uploads gets their temp folder (a read-only one, an evidence folder say,
    # holds its blobs and nothing else)
    uploads = (
        UploadState(
            store,
            max_uploads,
            max_sender_bytes or 2 * store.max_bytes,
            stale_after,
            max_uploads_per_sender,
            min_rate=min_rate,
            grace=grace,
            submitted=submitted,
        )
        if accept_uploads
        else None
    )

    def check_sender(sender: str) -> None:
        if allow is not None and not allow(sender):
            raise Refused("not a member of this pool")

    async def on_blob(request: bytes, sender: str) -> bytes:
        check_sender(sender)
        req = unpack_msgpack(request, what="blob request", max_bytes=len(request), max_depth=1, max_items=8)
        if not (isinstance(req, list) and len(req) == 2 and isinstance(req[0], str) and type(req[1]) is int):
            raise ValueError("malformed blob request")
        key, offset = req
        _digest_hex(key)
        got = store.read(key, offset, chunk)
        if got is None:
            raise KeyError("unknown blob")
        total, piece = got
        return msgpack.packb([total, piece], use_bin_type=True)

    async def on_upload(request: bytes, sender: str) -> bytes:
        check_sender(sender)
        req = unpack_msgpack(request, what="upload request", max_bytes=len(request), max_depth=1, max_items=8)
        if not (
            isinstance(req, list)
            and len(req) == 4
            and isinstance(req[0], str)
            and type(req[1]) is int
            and type(req[2]) is int
            and isinstance(req[3], bytes)
        ):
            raise ValueError("malformed upload request")
        assert uploads is not None  # registered only with `accept_uploads`
        # a new upload (or a restart) needs the server's leave, unless the file is here already (its
        # sender then costs nothing, and learns that its file arrived: say, it was accepted before a crash)
        if req[1] == 0 and may_upload is not None and not store.has(req[0]):
            why_not = may_upload(sender)
            if why_not is not None:
                raise Refused(why_not)
        received, done = uploads.handle(sender, req[0], req[1], req[2], req[3])
        return msgpack.packb([received, done], use_bin_type=True)

    node.set_handler(protocol, on_blob, allow=allow)
    if accept_uploads:
        # one chunk per request (uploaders send DEFAULT_CHUNK), with room for its key and offsets; a sender
        # `allow` refuses is turned away before its chunk is read
        node.set_handler(UPLOAD_PROTOCOL, on_upload, max_request=DEFAULT_CHUNK + 4096, allow=allow)
    return uploads


def _unpack_pair(body: bytes, what: str) -> list[Any]:
    try:
        resp = unpack_msgpack(body, what=f"{what} response", max_bytes=len(body), max_depth=1, max_items=8)
    except DecodeError as exc:
        raise P2PError(f"malformed {what} response: {exc}") from None
    if not (isinstance(resp, list) and len(resp) == 2):
        raise P2PError(f"malformed {what} response")
    return resp


async def fetch_blob(
    node: P2PNode,
    peer: Any,
    key: str,
    *,
    max_bytes: int,
    timeout_per_chunk: float = 10,
    max_chunks: int | None = None,
    protocol: str = BLOB_PROTOCOL,
) -> bytes:
    """Pull blob ``key`` from ``peer`` chunk by chunk; return it only if its sha256 equals ``key``.

    Refuses (``P2PError``) as soon as the peer announces more than ``max_bytes``, sends an
    inconsistent size, too many chunks (default: average under 4 KiB), or bytes with another hash."""
    try:
        digest = _digest_hex(key)
    except ValueError as exc:
        raise P2PError(str(exc)) from exc
    # One response may carry a default-sized chunk even when max_bytes is smaller, so an oversize
    # blob is refused on its announced size after one chunk, not on a bare frame-size error.
    max_response = max(min(max_bytes, DEFAULT_MAX_RESPONSE), DEFAULT_CHUNK) + _ENVELOPE_OVERHEAD
    buf = bytearray()
    hasher = hashlib.sha256()
    total: int | None = None
    limit = max_chunks
    requests = 0
    while True:
        requests += 1
        try:
            body = await node.request(
                peer,
                protocol,
                msgpack.packb([key, len(buf)], use_bin_type=True),
                timeout=timeout_per_chunk,
                max_response=max_response,
            )
        except P2PError as exc:
            raise P2PError(f"fetching blob {key} at offset {len(buf)}: {exc}") from exc
        size, chunk = _unpack_pair(body, "blob")
        if type(size) is not int or not isinstance(chunk, bytes):
            raise P2PError("malformed blob response")
        if total is None:
            if size < 0 or size > max_bytes:
                raise P2PError(f"blob {key} is {size} bytes, over the limit of {max_bytes}")
            total = size
            if limit is None:
                limit = total // _MIN_AVG_CHUNK + 2
        elif size != total:
            raise P2PError("peer changed the blob size mid-transfer")
        if len(buf) + len(chunk) > total:
            raise P2PError("peer sent more bytes than the announced size")
        buf += chunk
        hasher.update(chunk)
        if len(buf) == total:
            break
        if not chunk:
            raise P2PError("peer sent an empty chunk before the end")
        if requests >= limit:
            raise P2PError(f"blob transfer exceeded {limit} chunks")
    if hasher.hexdigest() != digest:
        raise P2PError(f"hash mismatch for blob {key}: got 0x{hasher.hexdigest()}")
    return bytes(buf)


async def upload_blob(
    node: P2PNode,
    peer: Any,
    data: bytes,
    *,
    chunk: int = DEFAULT_CHUNK,
    timeout_per_chunk: float = 10,
) -> str:
    """Push ``data`` to ``peer`` in chunks; return its key once the peer has verified and stored it."""
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    key = blob_key(data)
    total = len(data)
    offset = 0
    while True:
        piece = data[offset : offset + chunk]
        body = await node.request(
            peer,
            UPLOAD_PROTOCOL,
            msgpack.packb([key, offset, total, piece], use_bin_type=True),
            timeout=timeout_per_chunk,
            max_response=_ENVELOPE_OVERHEAD,
        )
        received, done = _unpack_pair(body, "upload")
        if done is True:
            return key
        offset += len(piece)
        if received != offset or offset >= total:
            raise P2PError(f"upload of {key} went wrong: peer has {received} of {total} bytes, not done")
