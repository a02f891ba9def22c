"""The evidence document of a verdict: what a validator's check found in one rollout file.

A validator writes it as canonical JSON (sorted keys); its sha256 is the evidence hash that goes on
chain with an invalidation, an accusation or a challenge, and the document itself goes on gossip with
the verdict. Whoever receives it (the accused worker, a committee member, an auditor) checks it against
the on-chain hash and re-checks the file with `rollout verify --evidence`: the document names the
failing check of the file and of each completion (group, sample, reason, the TOPLOC figures of each
chunk), so a re-check can say, claim by claim, whether it agrees. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from node.decoding import DecodeError, loads_json
from node.errors import IntellectError

# Published inside a verdict message (at most `node.protocol.MAX_MESSAGE`, 64 KiB): a verdict of a
# file of a few hundred completions with their per-chunk figures fits; a larger one is not put on
# gossip, only served by its hash.
MAX_EVIDENCE_BYTES = 48 * 1024
# Documents a worker or the coordinator keeps per rollout: one per validator that finds it failing, a
# few at most (a validator flooding documents on one record fills these slots, no more).
MAX_EVIDENCE_PER_KEY = 8
# Served by hash (`node.p2p.blobs.EVIDENCE_PROTOCOL`, from the validator that wrote it and from the
# coordinator): a verdict of the largest rollout file, with every chunk's figures, fits with room.
MAX_SERVED_EVIDENCE_BYTES = 1 << 20


class EvidenceError(IntellectError, ValueError):
    """A document that is not the evidence it claims to be (wrong hash, work key, size or shape)."""


def encode_evidence(record: dict[str, Any]) -> tuple[bytes, str]:
    """The canonical bytes of a verdict record and their 0x-prefixed sha256 (the evidence hash)."""
    body = json.dumps(record, sort_keys=True).encode()
    return body, "0x" + hashlib.sha256(body).hexdigest()


def parse_evidence(
    doc: bytes,
    *,
    expected_hash: str | None = None,
    work_key: str | None = None,
    max_bytes: int = MAX_EVIDENCE_BYTES,
) -> dict[str, Any]:
    """A received evidence document, checked: at most `max_bytes` (a gossip copy's limit by default),
    hashing to `expected_hash` (the one on chain) and naming `work_key`, when given; a JSON object with
    a verdict and samples."""
    if not isinstance(doc, (bytes, bytearray)):
        raise EvidenceError("the evidence document is not bytes")
    if len(doc) > max_bytes:
        raise EvidenceError(f"evidence document of {len(doc)} bytes, at most {max_bytes} accepted")
    digest = "0x" + hashlib.sha256(doc).hexdigest()
    if expected_hash is not None and digest != expected_hash.lower():
        raise EvidenceError(f"the document hashes to {digest}, not to the evidence hash {expected_hash}")
    try:
        d = loads_json(doc, what="the evidence document", max_bytes=max_bytes)
    except DecodeError as exc:
        raise EvidenceError(str(exc)) from None
    if not isinstance(d, dict):
        raise EvidenceError("the evidence document is not a JSON object")
    if work_key is not None and str(d.get("work_key", "")).lower() != work_key.lower():
        raise EvidenceError(f"the evidence is about {str(d.get('work_key'))[:80]!r}, not work {work_key}")
    v = d.get("verdict")
    if not isinstance(v, dict) or not isinstance(v.get("reason"), str) or not isinstance(d.get("ok"), bool):
        raise EvidenceError("the evidence document has no verdict (ok, verdict.reason)")
    samples = d.get("samples", [])
    if not isinstance(samples, list) or not all(
        isinstance(s, dict) and isinstance(s.get("group"), int) and isinstance(s.get("sample"), int) for s in samples
    ):
        raise EvidenceError("the evidence document's samples are not a list of {group, sample, ...}")
    return d


def failed_verdict(body: bytes) -> tuple[str, str, Any] | None:
    """(work key, evidence hash in lower case, the document as sent) of a verdict message that finds a
    file failing and names its evidence; None for anything else (a passing verdict, a malformed one).
    The document is still unchecked: `parse_evidence` it against the hash before keeping it."""
    from .protocol import ProtocolError, unpack

    try:
        msg = unpack(body, "verdict")
    except ProtocolError:
        return None
    key, digest = msg.get("work_key"), msg.get("evidence")
    if msg.get("ok") is not False or not isinstance(key, str) or not isinstance(digest, str):
        return None
    return key, digest.lower(), msg.get("doc")


def failing(verdict: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(group, sample) -> reason of each completion a verdict dict (`FileVerdict.to_dict`) finds failing."""
    return {
        (int(s["group"]), int(s["sample"])): str(s.get("reason", ""))
        for s in verdict.get("samples", [])
        if isinstance(s, dict) and s.get("reason", "ok") != "ok"
    }


def compare(evidence: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """Claim by claim, what our own check (`ours`, a verdict dict of the same file) says of an evidence
    document's findings: one line for the file and one per completion the evidence finds failing.
    Lines starting with "agree" mean our check finds the same; "DISPUTE" that it does not."""
    theirs_r, ours_r = str(evidence["verdict"]["reason"]), str(ours["verdict"]["reason"])
    file_line = f"file: evidence says {theirs_r}, our check says {ours_r}"
    lines = [("agree  " if (theirs_r == "ok") == (ours_r == "ok") else "DISPUTE ") + file_line]
    mine = failing(ours)
    for (g, s), reason in sorted(failing(evidence).items()):
        got = mine.get((g, s), "ok")
        lines.append(
            ("agree  " if got != "ok" else "DISPUTE ") + f"group {g} sample {s}: evidence says {reason}, ours {got}"
        )
    return lines
