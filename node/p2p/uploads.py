"""Uploads in progress to a blob store: bounded in count, in bytes and in time per sender.

A slot is held only while its upload moves: an idle one expires, and when room is needed one that
averages under the rate floor gives its slot up (a member trickling a few bytes a minute held a slot for
hours). A sender keeps few finished uploads it has not submitted: a further one deletes its oldest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.p2p.blobs import BlobStore

_KEY_RE = re.compile(r"^(?:0x)?([0-9a-fA-F]{64})$")


def _digest_hex(key: str) -> str:
    """The 64 lowercase hex digits of a blob key (with or without ``0x``); ValueError otherwise."""
    m = _KEY_RE.match(key) if isinstance(key, str) else None
    if m is None:
        raise ValueError(f"not a sha256 blob key: {key!r}")
    return m.group(1).lower()


#: An upload must average at least this many bytes a second after its first `UPLOAD_GRACE` seconds, or
#: it gives its slot up to whoever needs one (a trickle of a few bytes a minute held a slot for hours).
MIN_UPLOAD_RATE = 64 * 1024
UPLOAD_GRACE = 10.0
#: Finished uploads a sender may keep that it has not submitted: a further one deletes its oldest.
MAX_UNSUBMITTED = 2


@dataclass
class _Upload:
    path: Path
    total: int
    received: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)
    last_seen: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)

    def behind(self, now: float, min_rate: float, grace: float) -> bool:
        """Whether it sends more slowly than `min_rate` on average, once `grace` seconds have passed."""
        return self.received < self.total and self.received < min_rate * (now - self.started - grace)


class UploadState:
    """In-progress uploads, keyed by (sender, digest); bounded in count and in bytes per sender."""

    def __init__(
        self,
        store: BlobStore,
        max_uploads: int,
        max_sender_bytes: int,
        stale_after: float,
        max_per_sender: int = 2,
        *,
        min_rate: float = MIN_UPLOAD_RATE,
        grace: float = UPLOAD_GRACE,
        max_unsubmitted: int = MAX_UNSUBMITTED,
        submitted: Callable[[str], bool] | None = None,
    ) -> None:
        self.store = store
        self.max_uploads = max_uploads
        self.max_per_sender = max_per_sender
        self.max_sender_bytes = max_sender_bytes
        self.stale_after = stale_after
        self.min_rate = min_rate
        self.grace = grace
        self.max_unsubmitted = max_unsubmitted
        self.submitted = submitted
        self.uploads: dict[tuple[str, str], _Upload] = {}
        self.finished: dict[str, list[str]] = {}  # sender -> keys it uploaded, oldest first (not yet submitted)
        self.evicted = 0  # uploads that lost their slot for sending too slowly
        self.tmp_dir = store.root / ".uploads"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def _drop(self, ident: tuple[str, str]) -> None:
        up = self.uploads.pop(ident, None)
        if up is not None:
            with contextlib.suppress(OSError):
                up.path.unlink()

    def _evict_stale(self) -> None:
        now = time.monotonic()
        for ident, up in list(self.uploads.items()):
            if now - up.last_seen > self.stale_after:
                self._drop(ident)
        if len(self.uploads) >= self.max_uploads:  # room is needed: one upload below the rate floor gives
            # its slot up, of a sender holding the most slots first, then the slowest (many trickling identities
            # then take each other's slots before an honest slow uploader's)
            held: dict[str, int] = {}
            for s, _ in self.uploads:
                held[s] = held.get(s, 0) + 1
            behind = [(i, u) for i, u in self.uploads.items() if u.behind(now, self.min_rate, self.grace)]
            if behind:
                ident, _ = max(
                    behind, key=lambda iu: (held[iu[0][0]], -iu[1].received / max(now - iu[1].started, 1e-3))
                )
                self.evicted += 1
                self._drop(ident)

    def _finished(self, sender: str, key: str) -> None:
        """Keep the sender's finished, unsubmitted uploads to `max_unsubmitted`: its oldest goes first
        (never another sender's, never a file somebody submitted)."""
        keys = [k for k in self.finished.get(sender, []) if k != key and self.store.has(k)]
        if self.submitted is not None:
            keys = [k for k in keys if not self.submitted(k)]
        while len(keys) >= self.max_unsubmitted:
            self.store.delete(keys.pop(0))
        self.finished[sender] = [*keys, key]
        if len(self.finished) > 4 * self.max_uploads:  # senders' lists are pruned as they upload again
            for s in [s for s, ks in self.finished.items() if not any(self.store.has(k) for k in ks)]:
                del self.finished[s]

    def _begin(self, sender: str, digest: str, total: int) -> _Upload:
        self._evict_stale()
        if len(self.uploads) >= self.max_uploads:
            raise ValueError(f"too many concurrent uploads (limit {self.max_uploads})")
        if sum(1 for s, _ in self.uploads if s == sender) >= self.max_per_sender:
            raise ValueError(f"sender has {self.max_per_sender} uploads in progress already")
        pending = sum(u.total for (s, _), u in self.uploads.items() if s == sender)
        if pending + total > self.max_sender_bytes:
            raise ValueError(f"sender would exceed {self.max_sender_bytes} in-progress upload bytes")
        fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix=f"{digest[:16]}-", suffix=".part")
        os.close(fd)
        up = _Upload(path=Path(tmp), total=total)
        self.uploads[(sender, digest)] = up
        return up

    def handle(self, sender: str, key: str, offset: int, total: int, chunk: bytes) -> tuple[int, bool]:
        digest = _digest_hex(key)
        if total < 0 or total > self.store.max_bytes:
            raise ValueError(f"declared size {total} outside 0..{self.store.max_bytes}")
        ident = (sender, digest)
        if offset == 0 and self.store.has(key):
            self._drop(ident)
            return total, True
        up = self.uploads.get(ident)
        if offset == 0 and up is not None:
            self._drop(ident)  # a restart from scratch replaces the old attempt
            up = None
        if up is None:
            if offset != 0:
                raise ValueError("upload must start at offset 0 (or it was dropped: idle, or below the rate floor)")
            up = self._begin(sender, digest, total)
        if up.total != total or offset != up.received:
            self._drop(ident)
            raise ValueError("upload out of order or inconsistent size")
        if up.received + len(chunk) > up.total or (not chunk and up.total > 0):
            self._drop(ident)
            raise ValueError("chunk runs past the declared size")
        with up.path.open("ab") as fh:
            fh.write(chunk)
        up.hasher.update(chunk)
        up.received += len(chunk)
        up.last_seen = time.monotonic()
        if up.received < up.total:
            return up.received, False
        ok = up.hasher.hexdigest() == digest
        if not ok:
            self._drop(ident)
            raise ValueError("uploaded bytes do not match the declared sha256 key")
        self.uploads.pop(ident, None)
        self.store.put_file(key, up.path)
        self._finished(sender, key)
        return up.received, True
