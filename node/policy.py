"""Policy versions on the network: the coordinator's signed announcements and what nodes keep of them.

The coordinator publishes on the pool's `policy` gossip topic (signed envelopes, so only the pool's
coordinator can announce) its current version, the manifest hash of that checkpoint, where to fetch it
(its origin and the relays that heartbeat), and the hashes of the last few versions, so a node that
joins late can still fetch and verify the version a rollout claims. Version 0 is the pool's base
model, which every node already has.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import protocol

HISTORY = 8
MAX_SOURCES = 16
RELAY_MAX_AGE = 60.0  # seconds since a relay's last heartbeat for it to count as live


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
            return cls(version, str(obj.get("model", "")), str(obj.get("manifest_hash", "")), sources, history)
        except (KeyError, TypeError, ValueError):
            raise protocol.ProtocolError("malformed policy announcement") from None


class PolicyBook:
    """What a node knows about policy versions: manifest hashes (from signed announcements only)
    and the current download sources."""

    def __init__(self) -> None:
        self.latest = 0
        self.hashes: dict[int, str] = {}
        self.sources: list[str] = []

    def update(self, ann: PolicyAnnouncement) -> bool:
        """Record an announcement; True if it names a newer version than known before."""
        for v, h in ann.history.items():
            self.hashes.setdefault(v, h)
        if ann.manifest_hash:
            self.hashes[ann.version] = ann.manifest_hash
        if ann.sources:
            self.sources = list(ann.sources)
        if ann.version > self.latest:
            self.latest = ann.version
            return True
        return False


def checkpoint_folder(base_model: Path, weights: Path, out: Path) -> Path:
    """An HF model folder for a downloaded checkpoint: the base model's config and tokenizer files
    next to the new `model.safetensors` (what `HfPrefill` and vLLM load)."""
    if (out / "model.safetensors").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in base_model.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, tmp / f.name)
    shutil.copy2(weights, tmp / "model.safetensors")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def announcement_sources(
    origin: str | None, relays: dict[str, float], now: float, max_age: float = RELAY_MAX_AGE
) -> list[str]:
    """The origin first, then relays heard from within `max_age` seconds (most recent first)."""
    fresh = sorted((t, url) for url, t in relays.items() if now - t <= max_age)
    out = [origin] if origin else []
    out += [url for _, url in reversed(fresh) if url != origin]
    return out[:MAX_SOURCES]


def parse_heartbeat(body: bytes) -> dict[str, Any]:
    try:
        return protocol.unpack(body, "heartbeat")
    except protocol.ProtocolError:
        return {}
