"""Policy versions on the network: the coordinator's signed announcements and what nodes keep of them.

The coordinator publishes on the pool's `policy` gossip topic (signed envelopes, so only the pool's
coordinator can announce) its current version, the manifest hash of that checkpoint, where to fetch it
(its origin and the relays listed in its `RelayBook`), and the hashes of the last few versions, so a node that
joins late can still fetch and verify the version a rollout claims. Version 0 is the pool's base
model, which every node already has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from . import protocol

HISTORY = 8
_HASH = re.compile(r"[0-9a-f]{64}")
MAX_SOURCES = 16
RELAY_MAX_AGE = 60.0  # seconds since a relay's last heartbeat for it to count as live
RELAY_RECHECK = 60.0  # a listed relay is probed again this often
RELAY_RETRY = 15.0  # a relay whose probe failed (or that held nothing of ours yet) is probed again this often


@dataclass(frozen=True)
class PolicyAnnouncement:
    version: int
    model: str
    manifest_hash: str = ""
    sources: list[str] = field(default_factory=list)
    history: dict[int, str] = field(default_factory=dict)

    def to_body(self) -> bytes:
        return protocol.pack(
            {
                "version": self.version,
                "model": self.model,
                "manifest_hash": self.manifest_hash,
                "sources": self.sources[:MAX_SOURCES],
                "history": {str(k): v for k, v in self.history.items()},
            }
        )

    @classmethod
    def from_body(cls, data: bytes) -> PolicyAnnouncement:
        obj = protocol.unpack(data, "policy announcement")
        try:
            version = obj["version"]
            if type(version) is not int or version < 0:
                raise ValueError
            sources = [str(s) for s in obj.get("sources", [])][:MAX_SOURCES]
            if not all(s.startswith(("http://", "https://")) for s in sources):
                raise ValueError
            history = {int(k): str(v) for k, v in dict(obj.get("history", {})).items()}
            if len(history) > 4 * HISTORY:
                raise ValueError
            manifest_hash = str(obj.get("manifest_hash", ""))
            # hashes are sha256 hex; history names only versions up to the announced one
            if any(not _HASH.fullmatch(h) for h in (*history.values(), *([manifest_hash] if manifest_hash else []))):
                raise ValueError
            if any(not 0 <= v <= version for v in history):
                raise ValueError
            return cls(version, str(obj.get("model", "")), manifest_hash, sources, history)
        except (KeyError, TypeError, ValueError):
            raise protocol.ProtocolError("malformed policy announcement") from None


MAX_HASHES_PER_VERSION = 4  # announced hashes kept per version: one is honest, two already prove a lie


class PolicyBook:
    """What a node knows about policy versions: manifest hashes (from signed announcements only)
    and the current download sources.

    A version's weights are fixed by the first hash heard for it (`hashes`: what a worker downloads and
    signs for in its files' headers, `weights_of`). Every hash announced for a version is kept
    (`announced`), so that a file is judged against the weights its worker signed for even after the
    coordinator announced others for that version; two hashes for one version (`conflicts`) are the
    coordinator's lie, never a worker's: a validator shows them on its status page and the explorer."""

    def __init__(self) -> None:
        self.latest = 0
        self.hashes: dict[int, str] = {}
        self.announced: dict[int, list[str]] = {}
        self.sources: list[str] = []

    def heard(self, version: int, h: str) -> bool:
        """A hash announced for `version`; True if it is new for that version."""
        if not h:
            return False
        self.hashes.setdefault(version, h)
        known = self.announced.setdefault(version, [])
        if h in known or len(known) >= MAX_HASHES_PER_VERSION:
            return False
        known.append(h)
        return True

    def update(self, ann: PolicyAnnouncement) -> bool:
        """Record an announcement; True if it names a newer version than known before."""
        for v, h in ann.history.items():
            self.heard(v, h)
        self.heard(ann.version, ann.manifest_hash)
        if ann.sources:
            self.sources = list(ann.sources)
        if ann.version > self.latest:
            self.latest = ann.version
            return True
        return False

    def signed_for(self, version: int, h: str) -> bool:
        """Whether `h` was announced for `version` (version 0, the base model, carries no hash)."""
        return version == 0 or h in self.announced.get(version, ())

    def conflicts(self) -> dict[int, list[str]]:
        """Versions announced with more than one hash -> those hashes, first heard first."""
        return {v: list(hs) for v, hs in sorted(self.announced.items()) if len(hs) > 1}


def weights_of(header: Any) -> str | None:
    """The manifest hash of the weights a rollout file's worker generated with and signed for (its
    header's `extra.weights`: 64 lowercase hex); None for version 0 (the base model) or when the header
    names none or something else."""
    h = (header.extra or {}).get("weights")
    if header.policy_version == 0 or not isinstance(h, str) or not _HASH.fullmatch(h):
        return None
    return h


def announcement_sources(origin: str | None, relays: dict[str, float]) -> list[str]:
    """The origin first, then the listed relays (`RelayBook.live`: URL -> last heard), most recent first."""
    out = [origin] if origin else []
    out += [url for _, url in sorted(((t, u) for u, t in relays.items()), reverse=True) if url != origin]
    return out[:MAX_SOURCES]


@dataclass
class _Check:
    ok: bool
    at: float
    detail: str = ""


class RelayBook:
    """The relays a coordinator lists as download sources, and whose requests its origin serves first.

    A member names its relay URL in its heartbeats; the book keeps one URL per member (the latest), so it
    stays as small as the pool, and forgets claims not heard for `max_age` seconds. A claimed URL is
    listed only after a probe showed that it serves one of the pool's recent checkpoints: its manifest,
    with the hash the coordinator recorded (`node.weights.client.probe_relay`). Otherwise a typo, or a
    member naming somebody else's server, would send every worker of the pool there. Listed relays are
    probed again every `recheck` seconds, failed ones every `retry` seconds; a failed probe unlists.
    A relay holds nothing until it has fetched a version from the origin, so a new relay gets its first
    version without priority and is listed from then on.
    """

    def __init__(
        self, max_age: float = RELAY_MAX_AGE, recheck: float = RELAY_RECHECK, retry: float = RELAY_RETRY
    ) -> None:
        self.max_age, self.recheck, self.retry = max_age, recheck, retry
        self.claims: dict[str, tuple[str, float]] = {}  # member -> (relay URL, last heard)
        self.checks: dict[str, _Check] = {}  # relay URL -> last probe

    def heard(self, member: str, url: str, now: float) -> None:
        self.claims[member] = (url, now)

    def record(self, url: str, ok: bool, now: float, detail: str = "") -> None:
        """The outcome of a probe of `url` (ignored if nobody claims it any more)."""
        if any(u == url for u, _ in self.claims.values()):
            self.checks[url] = _Check(ok, now, detail)

    def _fresh(self, now: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for url, t in self.claims.values():
            if now - t <= self.max_age:
                out[url] = max(t, out.get(url, t))
        return out

    def _prune(self, now: float) -> None:
        self.claims = {m: (u, t) for m, (u, t) in self.claims.items() if now - t <= self.max_age}
        claimed = {u for u, _ in self.claims.values()}
        self.checks = {u: c for u, c in self.checks.items() if u in claimed}

    def due(self, now: float) -> list[str]:
        """Claimed relay URLs to probe now: never probed, or last probed `recheck`/`retry` seconds ago.
        (Also forgets members not heard from for `max_age`: the probe loop calls this every few seconds.)"""
        self._prune(now)
        out = []
        for url in self._fresh(now):
            c = self.checks.get(url)
            if c is None or now - c.at >= (self.recheck if c.ok else self.retry):
                out.append(url)
        return sorted(out)

    def live(self, now: float) -> dict[str, float]:
        """Listed relays: heard from within `max_age` and their last probe succeeded -> last heard."""
        return {u: t for u, t in self._fresh(now).items() if (c := self.checks.get(u)) is not None and c.ok}

    def hosts(self, now: float) -> set[str]:
        """Host names of the listed relays (the origin serves requests from these first)."""
        return {h for url in self.live(now) if (h := urlsplit(url).hostname)}

    def refused(self, now: float) -> dict[str, str]:
        """Claimed relay URLs whose last probe failed -> why."""
        fresh = self._fresh(now)
        return {u: c.detail for u, c in self.checks.items() if not c.ok and u in fresh}


def relay_url(value: Any) -> str | None:
    """A heartbeat's relay URL if it is a plain `http://host:port` (an optional path, nothing else), else None.

    Members choose this text, so it is checked before anything parses it again: at most 200 printable
    ASCII characters, scheme http, a host and a port, no user info, query or fragment.
    """
    if not isinstance(value, str) or not value.startswith("http://") or len(value) > 200:
        return None
    if not value.isascii() or not value.isprintable() or " " in value:
        return None
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or port is None or port == 0 or "@" in parts.netloc or parts.query or parts.fragment:
        return None
    return value.rstrip("/")


def parse_heartbeat(body: bytes) -> dict[str, Any]:
    try:
        return protocol.unpack(body, "heartbeat")
    except protocol.ProtocolError:
        return {}
