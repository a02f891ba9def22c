"""The explorer's pages, pure: what a pool's chain snapshot says (`PoolView`, built from the audit's read)
and the HTML that shows it. No I/O; `pool.explorer.server` reads the chain and the daemons and serves.

Every string shown comes from someone else (a spec URI and bootstrap address written by a pool owner, a
daemon's status page, a worker's reason text) and is escaped; numbers are formatted here. Pages are
self-contained (inline CSS and SVG, no script, no external asset) and refresh themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from node.audit import AuditSnapshot, Rec, node_ledgers

from .render import PAGE_ROWS, code, duration, e, line_chart, page, pages, raw, short, table, td, tokens

POOL_STATUS = {0: "none", 1: "created", 2: "active", 3: "ended"}


@dataclass
class PoolView:
    """One pool at one block: its parameters, account, members, validators and every record."""

    pool_id: int
    block: int
    timestamp: int
    consistent: bool
    mismatches: list[str]
    params: dict[str, Any]
    account: dict[str, int]
    totals: dict[str, int]
    nodes: dict[str, dict[str, Any]]  # node -> the audit's ledger
    providers: dict[str, dict[str, int]]  # provider -> stake figures
    members: dict[str, str]  # node -> provider, members now
    left: dict[str, str]  # node -> how it left (left / ejected / blacklisted)
    validators: list[str]
    records: list[Rec] = field(default_factory=list)  # newest first

    def records_of(self, node: str) -> list[Rec]:
        return [r for r in self.records if r.node.lower() == node.lower()]


def pool_view(snap: AuditSnapshot) -> PoolView:
    """The view of a pool from one audit read (`node.audit_read.audit_snapshot`)."""
    rep = snap.report
    members: dict[str, str] = {}
    left: dict[str, str] = {}
    validators: list[str] = []
    for ev in snap.events:
        a = ev.args
        if ev.name == "NodeJoined":
            members[a["node"]] = a["provider"]
            left.pop(a["node"], None)
        elif ev.name in ("NodeLeft", "NodeEjected", "NodeBlacklisted"):
            if members.pop(a["node"], None) is not None or ev.name == "NodeBlacklisted":
                left[a["node"]] = {"NodeLeft": "left", "NodeEjected": "ejected"}.get(ev.name, "blacklisted")
        elif ev.name == "ValidatorAdded" and a["validator"] not in validators:
            validators.append(a["validator"])
        elif ev.name == "ValidatorRemoved" and a["validator"] in validators:
            validators.remove(a["validator"])
    p = snap.pool
    params = {
        "owner": p["owner"],
        "status": POOL_STATUS.get(int(p["status"]), str(p["status"])),
        "coordinator": p["coordinator"],
        "reward_rate": int(p["rewardRate"]),
        "validation_window": int(p["validationWindow"]),
        "slash_amount": int(p["slashAmount"]),
        "min_stake": int(p["minStake"]),
        "spec_uri": str(p["specURI"]),
        "spec_hash": _hex(p["specHash"]),
        "bootstrap": str(p["bootstrap"]),
        "created_at": int(p["createdAt"]),
    }
    ledgers = {k: v.__dict__ for k, v in node_ledgers(snap.rebuilt, rep.timestamp).items()}
    return PoolView(
        pool_id=rep.pool_id,
        block=rep.block,
        timestamp=rep.timestamp,
        consistent=rep.consistent,
        mismatches=list(rep.mismatches),
        params=params,
        account={k: int(v) for k, v in snap.account.items()},
        totals=dict(rep.totals),
        nodes=ledgers,
        providers=rep.providers,
        members=members,
        left=left,
        validators=validators,
        records=list(reversed(snap.rebuilt.records.values())),
    )


def _hex(v: Any) -> str:
    return "0x" + v.hex() if isinstance(v, (bytes, bytearray)) else str(v)


def _record_rows(recs: Sequence[Rec], now: int, pool_id: int) -> list[list[str]]:
    rows = []
    for r in recs:
        state = r.status
        if r.status == "pending":
            state = "final" if r.final(now) else f"in window ({duration(max(0, r.deadline - now))} left)"
        if r.soft:
            state += " (soft)"
        if r.dispute:
            state += f"; {r.dispute}: {r.verdict or 'open'}"
        txs = [("recorded", r.recorded_tx)] + ([("settled", r.settled_tx)] if r.settled_tx else [])
        txs += [("dispute", t) for t in dict.fromkeys(r.dispute_txs) if t != r.settled_tx]
        rows.append(
            [
                raw(code(r.work_key)),
                raw(f'<a href="/pool/{pool_id}/node/{quote(r.node)}">{code(r.node)}</a>'),
                td(f"{r.units:,}", True),
                td(r.policy_version, True),
                td(state),
                td(tokens(r.reward) if r.reward else ""),
                td(tokens(r.slashed) if r.slashed else ""),
                raw(code(r.evidence) if r.evidence else ""),
                raw("<br>".join(f"{e(k)} {code(t)}" for k, t in txs if t)),
            ]
        )
    return rows


_RECORD_HEAD = ["work key", "node", "units", "version", "state", "reward", "slashed", "evidence", "transactions"]


def pools_page(pools: Sequence[Mapping[str, Any]], *, updated: str = "") -> str:
    """The index: every pool of the deployment with its status, members and budget."""
    rows = [
        [
            raw(f'<a href="/pool/{int(p["pool_id"])}">pool {int(p["pool_id"])}</a>'),
            td(p.get("status", "")),
            td(p.get("members", ""), True),
            td(tokens(int(p.get("budget", 0))), True),
            raw(code(p.get("owner", ""))),
            raw(code(p.get("spec_uri", ""), title=False)),
        ]
        for p in pools
    ]
    body = "<h1>Pools</h1>" + (
        table(["pool", "status", "members", "budget", "owner", "task spec"], rows)
        if rows
        else '<p class="muted">no pool created yet</p>'
    )
    return page("pools", body, updated=updated)


def pool_page(
    v: PoolView,
    *,
    page_no: int = 1,
    live: Sequence[Mapping[str, Any]] = (),
    reward_curve: Sequence[float] = (),
    updated: str = "",
) -> str:
    """A pool: parameters, budget, the audit's verdict, members with stake, validators, work per node,
    every slash and dispute with its evidence, the reward per policy version, live daemons, then every
    record (newest first, `PAGE_ROWS` a page)."""
    t, a, p = v.totals, v.account, v.params
    verdict = (
        '<span class="ok" id="audit">audit consistent</span>'
        if v.consistent
        else '<span class="bad" id="audit">audit MISMATCH</span><ul>'
        + "".join(f"<li>{e(m)}</li>" for m in v.mismatches[:50])
        + "</ul>"
    )
    cards = [
        ("budget", tokens(a.get("budget", 0)) + " INTL"),
        ("recorded units", f"{t.get('recorded_units', 0):,}"),
        ("pending units", f"{t.get('pending_units', 0):,}"),
        ("invalidated units", f"{t.get('invalidated_units', 0):,}"),
        ("claimed units", f"{t.get('claimed_units', 0):,}"),
        ("rewards claimed", tokens(t.get("claimed_tokens", 0)) + " INTL"),
        ("slashed", tokens(sum(int(n.get("slashed_tokens", 0)) for n in v.nodes.values())) + " INTL"),
        ("records", f"{len(v.records):,}"),
    ]
    out = [
        f"<h1>Pool {v.pool_id} <small class='muted'>({e(p['status'])})</small></h1>",
        f"<p>{verdict} at block {v.block:,}</p>",
        '<div class="cards">'
        + "".join(f'<div class="card" data-k="{e(k)}">{e(k)}<b>{e(val)}</b></div>' for k, val in cards)
        + "</div>",
        "<h2>Parameters</h2>",
        table(
            ["parameter", "value"],
            [
                [td(k), td(val)]
                for k, val in (
                    ("owner", p["owner"]),
                    ("coordinator", p["coordinator"]),
                    ("reward rate", f"{tokens(p['reward_rate'])} INTL per unit"),
                    ("validation window", duration(p["validation_window"])),
                    ("slash", f"{tokens(p['slash_amount'])} INTL"),
                    ("minimum stake", f"{tokens(p['min_stake'])} INTL"),
                    ("task spec", p["spec_uri"]),
                    ("spec hash", p["spec_hash"]),
                    ("bootstrap", p["bootstrap"] or "(none)"),
                )
            ],
        ),
    ]
    prov = v.providers
    out += [
        f"<h2>Members ({len(v.members)})</h2>",
        table(
            ["node", "provider", "provider's stake", "unbonding", "slashed"],
            [
                [
                    raw(f'<a href="/pool/{v.pool_id}/node/{quote(n)}">{code(n)}</a>'),
                    raw(code(pr)),
                    td(tokens(prov.get(pr, {}).get("staked", 0)), True),
                    td(tokens(prov.get(pr, {}).get("unbonding", 0)), True),
                    td(tokens(prov.get(pr, {}).get("slashed", 0)), True),
                ]
                for n, pr in sorted(v.members.items())
            ],
        )
        if v.members
        else '<p class="muted">no members</p>',
    ]
    if v.left:
        out.append(
            '<p class="muted">no longer members: '
            + ", ".join(f"{code(n)} ({e(how)})" for n, how in sorted(v.left.items()))
            + "</p>"
        )
    out += [
        f"<h2>Validators ({len(v.validators)})</h2>",
        "<p>" + (", ".join(code(x) for x in v.validators) or '<span class="muted">none</span>') + "</p>",
        "<h2>Work per node</h2>",
        table(
            ["node", "records", "recorded", "pending", "final", "invalidated", "claimed", "rewards", "slashed"],
            [
                [
                    raw(f'<a href="/pool/{v.pool_id}/node/{quote(n)}">{code(n)}</a>'),
                    td(led["records"], True),
                    td(f"{led['recorded_units']:,}", True),
                    td(f"{led['pending_units']:,}", True),
                    td(f"{led['finalized_units']:,}", True),
                    td(f"{led['invalidated_units']:,}", True),
                    td(f"{led['claimed_units']:,}", True),
                    td(tokens(led["claimed_tokens"]), True),
                    td(tokens(led["slashed_tokens"]), True),
                ]
                for n, led in sorted(v.nodes.items())
            ],
            cls="per-node",
        ),
    ]
    out += _disputes(v)
    out += [
        "<h2>Reward per policy version</h2>",
        line_chart(reward_curve, label=f"pool {v.pool_id} mean reward per policy version"),
        '<p class="muted">from the coordinator\'s status page; empty without one (--status)</p>'
        if not reward_curve
        else "",
    ]
    out += _live(live)
    start, end, nav = pages(len(v.records), page_no, f"/pool/{v.pool_id}?")
    out += [
        f"<h2>Records ({len(v.records):,}, newest first)</h2>",
        nav,
        table(_RECORD_HEAD, _record_rows(v.records[start:end], v.timestamp, v.pool_id), cls="records"),
        nav,
    ]
    return page(f"pool {v.pool_id}", "".join(out), updated=updated)


def _disputes(v: PoolView) -> list[str]:
    rows = []
    for r in v.records:
        if r.status != "invalidated" and not r.dispute:
            continue
        txs = list(dict.fromkeys(([r.settled_tx] if r.settled_tx else []) + list(r.dispute_txs)))
        what = "soft invalidation" if r.soft else ("slash" if r.status == "invalidated" else "accusation")
        rows.append(
            [
                raw(code(r.work_key)),
                raw(f'<a href="/pool/{v.pool_id}/node/{quote(r.node)}">{code(r.node)}</a>'),
                td(what),
                td(tokens(r.slashed) if r.slashed else ""),
                raw(code(r.validator) if r.validator else ""),
                raw(code(r.evidence) if r.evidence else ""),
                td(f"{r.dispute}: {r.verdict or 'open'}" if r.dispute else ""),
                raw("<br>".join(code(t) for t in txs)),
            ]
        )
    head = ["work key", "node", "what", "slashed", "by", "evidence", "appeal / challenge", "transactions"]
    return [
        f"<h2>Slashes and disputes ({len(rows)})</h2>",
        table(head, rows, cls="disputes") if rows else '<p class="muted">none</p>',
    ]


def _live(live: Sequence[Mapping[str, Any]]) -> list[str]:
    if not live:
        return []
    rows = []
    for s in live:
        if "error" in s and "role" not in s:
            rows.append([td(s.get("url", "")), td("unreachable"), td(""), td(""), td(""), td(s["error"])])
            continue
        rejected = s.get("gossip_rejected") or {}
        dropped = (
            sum(int(x) for x in rejected.values() if isinstance(x, (int, float))) if isinstance(rejected, dict) else 0
        )
        rows.append(
            [
                td(s.get("url", "")),
                td(s.get("role", "?")),
                td(short(str(s.get("address", "")))),
                td(s.get("peers", ""), True),
                td(dropped, True),
                td(s.get("phase") or s.get("last_error") or ""),
            ]
        )
    return [
        "<h2>Live</h2>",
        table(["status page", "role", "address", "peers", "gossip rejected", "phase"], rows, cls="live"),
    ]


def node_page(v: PoolView, node: str, *, page_no: int = 1, updated: str = "") -> str:
    """One node of a pool: its ledger (what `status` explains), membership, and every record of it."""
    key = next((k for k in v.nodes if k.lower() == node.lower()), None)
    led = v.nodes.get(key) if key else None
    member = next((pr for n, pr in v.members.items() if n.lower() == node.lower()), None)
    gone = next((how for n, how in v.left.items() if n.lower() == node.lower()), None)
    out = [f"<h1>Node {code(node, title=False)} in <a href='/pool/{v.pool_id}'>pool {v.pool_id}</a></h1>"]
    out.append(
        f"<p>member, provider {code(member)}</p>"
        if member
        else f"<p class='muted'>not a member{(' (' + e(gone) + ')') if gone else ''}</p>"
    )
    if led is None:
        out.append('<p class="muted">no work recorded for this node</p>')
        return page(f"node {short(node)}", "".join(out), updated=updated)
    cards = [
        ("records", f"{led['records']:,}"),
        ("recorded units", f"{led['recorded_units']:,}"),
        ("pending units", f"{led['pending_units']:,}"),
        ("final units (claimable)", f"{led['finalized_units']:,}"),
        ("invalidated units", f"{led['invalidated_units']:,}"),
        ("claimed units", f"{led['claimed_units']:,}"),
        ("rewards claimed", tokens(led["claimed_tokens"]) + " INTL"),
        ("slashed", tokens(led["slashed_tokens"]) + " INTL"),
    ]
    out.append(
        '<div class="cards">'
        + "".join(f'<div class="card" data-k="{e(k)}">{e(k)}<b>{e(val)}</b></div>' for k, val in cards)
        + "</div>"
    )
    recs = v.records_of(node)
    start, end, nav = pages(len(recs), page_no, f"/pool/{v.pool_id}/node/{quote(node)}?")
    out += [
        f"<h2>Records ({len(recs):,}, newest first)</h2>",
        nav,
        table(_RECORD_HEAD, _record_rows(recs[start:end], v.timestamp, v.pool_id), cls="records"),
        nav,
    ]
    return page(f"node {short(node)}", "".join(out), updated=updated)


def loading_page(what: str) -> str:
    return page(what, f'<p class="muted">reading the chain for {e(what)}; this page reloads itself</p>', refresh=2)


__all__ = ["PAGE_ROWS", "PoolView", "line_chart", "node_page", "pool_page", "pool_view", "pools_page", "tokens"]
