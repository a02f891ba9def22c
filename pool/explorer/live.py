"""The explorer's table of daemons' status pages, pure. A status page is anybody's: each row is drawn on
its own from what `pool.explorer.status.clean` left (plain, finite, bounded JSON), and a row that cannot
be drawn is shown as such, never the page's failure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .render import short, table, td


def live_table(live: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "Live" section: one row per status page (none: no section)."""
    if not live:
        return []
    rows = []
    for s in live:
        try:
            rows.append(_live_row(s))
        except Exception:  # whatever the page held: this row says so, the page is drawn
            rows.append([td(_text(s.get("url", ""))), td("unreadable"), td(""), td(""), td(""), td("")])
    return [
        "<h2>Live</h2>",
        table(["status page", "role", "address", "peers", "gossip rejected", "phase"], rows, cls="live"),
    ]


def conflicts_table(live: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "Policy versions announced twice" section: every (version, hashes) a status page reports in
    `policy_conflicts` (a validator heard the coordinator announce one version with other weights: the
    coordinator's lie, `node.policy.PolicyBook.conflicts`), with the page that reports it (none: no section).
    A status page is anybody's, so this is its daemon's word: each validator keeps the two signed
    announcements, which anyone can check."""
    rows = []
    for s in live:
        got = s.get("policy_conflicts")
        if not isinstance(got, Mapping):
            continue
        for version, hashes in list(got.items())[:100]:
            if isinstance(hashes, Sequence) and not isinstance(hashes, str):
                shown = ", ".join(short(_text(h, 80), 8) for h in list(hashes)[:4])
                rows.append([td(_text(s.get("url", ""))), td(_text(s.get("address", ""), 100)), td(_text(version)),
                             td(shown)])  # fmt: skip
    if not rows:
        return []
    return [
        "<h2>Policy versions announced with other weights</h2>",
        "<p>The coordinator announced these versions with more than one weight hash. Work is judged against "
        "the weights its worker signed for; these are evidence against the coordinator, never against a worker.</p>",
        table(["reported by", "address", "version", "weight hashes (first heard first)"], rows, cls="conflicts"),
    ]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _count(v: Any) -> int:
    """A count from a status page: a finite non-negative number (capped), else 0."""
    if not _is_number(v) or (isinstance(v, float) and not math.isfinite(v)):
        return 0
    return max(0, min(int(v), 2**63))


def _text(v: Any, limit: int = 200) -> str:
    """A short string from a status page: strings cut, numbers counted, anything else a mark."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v[:limit]
    return str(_count(v)) if _is_number(v) else "?"


def _live_row(s: Mapping[str, Any]) -> list[str]:
    url = _text(s.get("url", ""))
    if "error" in s and "role" not in s:
        return [td(url), td("unreachable"), td(""), td(""), td(""), td(_text(s["error"]))]
    rejected = s.get("gossip_rejected")
    dropped = sum(_count(x) for x in rejected.values()) if isinstance(rejected, Mapping) else 0
    return [
        td(url),
        td(_text(s.get("role", "?"))),
        td(short(_text(s.get("address", ""), 100))),
        td(_text(s.get("peers")), True),
        td(f"{dropped:,}", True),
        td(_text(s.get("phase") or s.get("last_error") or "")),
    ]
