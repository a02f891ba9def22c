"""The explorer's pages, pure: what a pool's chain snapshot says (`PoolView`, built from the audit's read)
and the HTML that shows it. No I/O; `pool.explorer.server` reads the chain and the daemons and serves.

Every string shown comes from someone else (a spec URI and bootstrap address written by a pool owner, a
daemon's status page, a worker's reason text) and is escaped; numbers are formatted here. Pages are
self-contained (inline CSS and SVG, no script, no external asset) and refresh themselves. Every list that
can grow (pools, records, members, work per node, slashes and disputes, former members, validators) is
shown `PAGE_ROWS` rows a page with links to the others, so a page costs the same in any pool: the pool
page holds the first page of each, `section_page` the rest (`/pool/N/<section>?page=K`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from node.audit import AuditSnapshot, Rec, node_ledgers

from .live import conflicts_table, live_table
from .render import PAGE_ROWS, code, duration, e, line_chart, page, page_count, pages, raw, short, table, td, tokens

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
    # derived once (a view is never changed after it is built, and pages are drawn from it in threads)
    disputes: list[Rec] = field(init=False, repr=False)  # slashed, softly invalidated or disputed; newest first
    by_node: dict[str, list[Rec]] = field(init=False, repr=False)  # lower-case node -> its records
    slashed: int = field(init=False, repr=False)  # tokens slashed from all nodes
    member_list: list[tuple[str, str]] = field(init=False, repr=False)  # (node, provider), sorted
    node_list: list[str] = field(init=False, repr=False)  # nodes with a ledger, sorted
    left_list: list[tuple[str, str]] = field(init=False, repr=False)  # (node, how), sorted

    def __post_init__(self) -> None:
        self.disputes = [r for r in self.records if r.status == "invalidated" or r.dispute]
        self.by_node = {}
        for r in self.records:
            self.by_node.setdefault(r.node.lower(), []).append(r)
        self.slashed = sum(int(n.get("slashed_tokens", 0)) for n in self.nodes.values())
        self.member_list = sorted(self.members.items())
        self.node_list = sorted(self.nodes)
        self.left_list = sorted(self.left.items())

    def records_of(self, node: str) -> list[Rec]:
        return self.by_node.get(node.lower(), [])


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


def pools_page(pools: Sequence[Mapping[str, Any]], *, page_no: int = 1, updated: str = "") -> str:
    """The index: every pool of the deployment with its status, members and budget, `PAGE_ROWS` a page."""
    start, end, nav = pages(len(pools), page_no, "/?")
    rows = [
        [
            raw(f'<a href="/pool/{int(p["pool_id"])}">pool {int(p["pool_id"])}</a>'),
            td(p.get("status", "")),
            td(p.get("members", ""), True),
            td(tokens(int(p.get("budget", 0))), True),
            raw(code(p.get("owner", ""))),
            raw(code(p.get("spec_uri", ""), title=False)),
        ]
        for p in pools[start:end]
    ]
    body = f"<h1>Pools ({len(pools):,})</h1>" + (
        nav + table(["pool", "status", "members", "budget", "owner", "task spec"], rows) + nav
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
        ("slashed", tokens(v.slashed) + " INTL"),
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
    for _, draw in SECTIONS.values():  # the first page of each list, with links to the others
        out += draw(v, 1)
    out += [
        "<h2>Reward per policy version</h2>",
        line_chart(reward_curve, label=f"pool {v.pool_id} mean reward per policy version"),
        '<p class="muted">from the coordinator\'s status page; empty without one (--status)</p>'
        if not reward_curve
        else "",
    ]
    out += live_table(live)
    out += conflicts_table(live)
    start, end, nav = pages(len(v.records), page_no, f"/pool/{v.pool_id}?")
    out += [
        f"<h2>Records ({len(v.records):,}, newest first)</h2>",
        nav,
        table(_RECORD_HEAD, _record_rows(v.records[start:end], v.timestamp, v.pool_id), cls="records"),
        nav,
    ]
    return page(f"pool {v.pool_id}", "".join(out), updated=updated)


def _node_link(v: PoolView, n: str) -> str:
    return raw(f'<a href="/pool/{v.pool_id}/node/{quote(n)}">{code(n)}</a>')


def _members(v: PoolView, page_no: int) -> list[str]:
    start, end, nav = pages(len(v.member_list), page_no, f"/pool/{v.pool_id}/members?")
    prov = v.providers
    rows = [
        [
            _node_link(v, n),
            raw(code(pr)),
            td(tokens(prov.get(pr, {}).get("staked", 0)), True),
            td(tokens(prov.get(pr, {}).get("unbonding", 0)), True),
            td(tokens(prov.get(pr, {}).get("slashed", 0)), True),
        ]
        for n, pr in v.member_list[start:end]
    ]
    head = ["node", "provider", "provider's stake", "unbonding", "slashed"]
    return [
        f"<h2>Members ({len(v.member_list):,})</h2>",
        nav + table(head, rows, cls="members") + nav if rows else '<p class="muted">no members</p>',
    ]


def _left(v: PoolView, page_no: int) -> list[str]:
    if not v.left_list:
        return []
    start, end, nav = pages(len(v.left_list), page_no, f"/pool/{v.pool_id}/left?")
    gone = ", ".join(f"{code(n)} ({e(how)})" for n, how in v.left_list[start:end])
    return [f'<p class="muted">no longer members ({len(v.left_list):,}): {gone}</p>', nav]


def _validators(v: PoolView, page_no: int) -> list[str]:
    start, end, nav = pages(len(v.validators), page_no, f"/pool/{v.pool_id}/validators?")
    shown = ", ".join(code(x) for x in v.validators[start:end]) or '<span class="muted">none</span>'
    return [f"<h2>Validators ({len(v.validators):,})</h2>", f"<p>{shown}</p>", nav]


def _work(v: PoolView, page_no: int) -> list[str]:
    start, end, nav = pages(len(v.node_list), page_no, f"/pool/{v.pool_id}/work?")
    rows = []
    for n in v.node_list[start:end]:
        led = v.nodes[n]
        rows.append(
            [
                _node_link(v, n),
                td(led["records"], True),
                td(f"{led['recorded_units']:,}", True),
                td(f"{led['pending_units']:,}", True),
                td(f"{led['finalized_units']:,}", True),
                td(f"{led['invalidated_units']:,}", True),
                td(f"{led['claimed_units']:,}", True),
                td(tokens(led["claimed_tokens"]), True),
                td(tokens(led["slashed_tokens"]), True),
            ]
        )
    head = ["node", "records", "recorded", "pending", "final", "invalidated", "claimed", "rewards", "slashed"]
    return [f"<h2>Work per node ({len(v.node_list):,})</h2>", nav, table(head, rows, cls="per-node"), nav]


def _disputes(v: PoolView, page_no: int) -> list[str]:
    start, end, nav = pages(len(v.disputes), page_no, f"/pool/{v.pool_id}/disputes?")
    rows = []
    for r in v.disputes[start:end]:
        txs = list(dict.fromkeys(([r.settled_tx] if r.settled_tx else []) + list(r.dispute_txs)))
        what = "soft invalidation" if r.soft else ("slash" if r.status == "invalidated" else "accusation")
        rows.append(
            [
                raw(code(r.work_key)),
                _node_link(v, r.node),
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
        f"<h2>Slashes and disputes ({len(v.disputes):,})</h2>",
        nav + table(head, rows, cls="disputes") + nav if rows else '<p class="muted">none</p>',
    ]


#: the lists of a pool page that have pages of their own: name -> (title, the section's markup)
SECTIONS: dict[str, tuple[str, Callable[[PoolView, int], list[str]]]] = {
    "members": ("members", _members),
    "left": ("former members", _left),
    "validators": ("validators", _validators),
    "work": ("work per node", _work),
    "disputes": ("slashes and disputes", _disputes),
}


def section_page(v: PoolView, section: str, *, page_no: int = 1, updated: str = "") -> str:
    """One list of a pool, page `page_no` (`SECTIONS`)."""
    title, draw = SECTIONS[section]
    head = f"<h1><a href='/pool/{v.pool_id}'>Pool {v.pool_id}</a>: {e(title)}</h1>"
    return page(
        f"pool {v.pool_id} {title}", head + "".join(draw(v, page_no) or ['<p class="muted">none</p>']), updated=updated
    )


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


__all__ = [
    "PAGE_ROWS", "SECTIONS", "PoolView", "line_chart", "node_page", "page_count", "pool_page", "pool_view",
    "pools_page", "section_page", "tokens",
]  # fmt: skip
