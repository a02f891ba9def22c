"""A provider's standing in one pool, explained from contract state and event history: the pure half.

`node.status_read.provider_status` reads one snapshot (every call and event query pinned to the same
block) into a `Snapshot`; `explain` turns it into the JSON-able standing (stake, nodes and their
membership, work records by state, slashes) and `format_status` into readable lines. Both are shared by
the CLI and the daemons. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eth_utils import to_checksum_address

from .audit import Rebuilt, rebuild
from .chain.abi import DecodedEvent
from .chain.messages import POOL_STATUS, tokens, when

ZERO_ADDRESS = "0x" + "00" * 20
HUMAN_LIMIT = 20  # records listed per group in the human output (JSON lists all)


@dataclass
class Snapshot:
    """What `provider_status` reads from the chain at one block for provider `who` in pool `pool_id`."""

    pool_id: int
    block: int
    now: int
    pool: dict[str, Any]  # PoolManager.getPool
    who: str
    only_node: str | None  # --node: that node only
    info: dict[str, Any]  # ProviderRegistry.getProvider
    required: int
    locked_until: int
    balance: int
    reg_events: list[DecodedEvent]  # the provider's registry events
    pool_events: list[DecodedEvent]  # the pool's WorkLedger events
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> `node_row`
    slash_pools: dict[str, int | None] = field(default_factory=dict)  # tx + reason -> pool of a slash


@dataclass
class Plan:
    """What the snapshot's events say is worth a second read: the nodes to show and the slashes whose
    pool only their transaction's receipt names."""

    ledger: Rebuilt
    bound: dict[str, int]  # nodes bound now -> compute units
    records: list[Any]
    nodes: list[str]
    invalidated_here: dict[tuple[str, str], Any]
    slashes: list[DecodedEvent]
    slashes_elsewhere: list[DecodedEvent]


def plan(s: Snapshot) -> Plan:
    """Nodes: bound now (added and not removed since), plus any that did work here before removal."""
    bound: dict[str, int] = {}
    for e in s.reg_events:
        if e.name == "NodeAdded":
            bound[e.args["node"]] = int(e.args["computeUnits"])
        elif e.name == "NodeRemoved":
            bound.pop(e.args["node"], None)
    ledger = rebuild(s.pool_id, s.pool_events, s.reg_events, {})
    records = [
        r for r in ledger.records.values() if r.provider == s.who and (s.only_node is None or r.node == s.only_node)
    ]
    nodes = [s.only_node] if s.only_node else sorted(set(bound) | {r.node for r in records})
    # Slashes: every Slashed event of the provider. Those from this pool's invalidations are matched
    # by (tx, work key); others are looked up in their transaction's receipt (one per slash).
    here = {(r.settled_tx, r.work_key): r for r in ledger.records.values() if r.status == "invalidated"}
    slashes = [e for e in s.reg_events if e.name == "Slashed"]
    elsewhere = [e for e in slashes if (e.tx_hash, e.args["reason"]) not in here]
    return Plan(ledger, bound, records, nodes, here, slashes, elsewhere)


def node_row(
    node: str, who: str, units: int, member: bool, membership: dict[str, Any], blacklisted: bool, owner: str
) -> dict[str, Any]:
    """One node's line of the standing, from its on-chain state."""
    owner = to_checksum_address(owner)
    return {
        "node": node,
        "bound": owner == who,
        "provider": owner if owner != to_checksum_address(ZERO_ADDRESS) else None,
        "compute_units": units,
        "member": member,
        "joined_at": int(membership["joinedAt"]) if member else None,
        "in_pool": int(membership["poolId"]) or None,
        "blacklisted": blacklisted,
    }


def slash_pool(receipt_events: list[DecodedEvent], work_key: str) -> int | None:
    """The pool of a slash, from the decoded logs of its transaction (None when none names it)."""
    found = None
    for ev in receipt_events:
        if ev.name == "WorkInvalidated" and ev.args["workKey"] == work_key:
            found = int(ev.args["poolId"])
    return found


def explain(s: Snapshot, p: Plan) -> dict[str, Any]:
    """Everything `intellect-node status` shows, as a JSON-able dict (amounts in base units)."""
    pool_id, pool, now, who, info = s.pool_id, s.pool, s.now, s.who, s.info
    rate = int(pool["rewardRate"])
    records, invalidated_here, slash_events, only_node = p.records, p.invalidated_here, p.slashes, s.only_node
    slashes = []
    for e in slash_events:
        a = e.args
        here = invalidated_here.get((e.tx_hash, a["reason"]))
        slashes.append(
            {
                "amount": int(a["amount"]),
                "from_staked": int(a["fromStaked"]),
                "from_unbonding": int(a["fromUnbonding"]),
                "bounty": int(a["bounty"]),
                # the accuser (a slash no vote decided names no bounty hunter in the registry's event)
                "validator": here.validator if here is not None else a["validator"],
                "reason": a["reason"],
                "work_key": a["reason"],
                "pool": pool_id if here is not None else s.slash_pools.get(e.tx_hash + a["reason"]),
                "node": here.node if here is not None else None,
                "evidence": here.evidence if here is not None else None,
                "tx": e.tx_hash,
                "block": e.block_number,
            }
        )
    # With --node: that node's slashes here, plus those whose node is unknown (other pools).
    slashes_shown = slashes if only_node is None else [x for x in slashes if x["node"] in (None, only_node)]

    groups: dict[str, list[dict[str, Any]]] = {
        "pending": [], "claimable": [], "claimed": [], "invalidated": [], "disputed": []
    }  # fmt: skip
    for r in sorted(records, key=lambda r: (r.deadline, r.work_key)):
        base = {
            "work_key": r.work_key,
            "node": r.node,
            "units": r.units,
            "policy_version": r.policy_version,
            "deadline": r.deadline,
            "recorded_tx": r.recorded_tx,
        }
        if r.final(now):
            groups["claimable"].append(base | {"reward": r.units * rate})
        elif r.status == "pending":
            groups["pending"].append(base | {"time_left": max(r.deadline - now, 0), "expected_reward": r.units * rate})
        elif r.status == "claimed":
            groups["claimed"].append(base | {"reward": r.reward, "tx": r.settled_tx})
        elif r.status == "disputed":
            groups["disputed"].append(
                base
                | {
                    "dispute": r.dispute,
                    "by": r.validator,
                    "evidence": r.evidence,
                    "appeal_end": r.appeal_end,
                    "vote_end": r.vote_end,
                    "txs": r.dispute_txs,
                }
            )
        else:
            groups["invalidated"].append(
                base
                | {
                    "slashed": r.slashed,
                    "bounty": r.bounty,
                    "validator": r.validator,
                    "evidence": r.evidence,
                    "tx": r.settled_tx,
                    "soft": r.soft,
                    "dispute": r.dispute,
                    "verdict": r.verdict,
                }
            )

    def total(name: str, amount_key: str | None) -> dict[str, int]:
        g = groups[name]
        out = {"records": len(g), "units": sum(x["units"] for x in g)}
        if amount_key:
            out[amount_key] = sum(x[amount_key] for x in g)
        return out

    staked = int(info["staked"])
    return {
        "pool": pool_id,
        "pool_status": POOL_STATUS[int(pool["status"])],
        "reward_rate": rate,
        "validation_window": int(pool["validationWindow"]),
        "block": s.block,
        "timestamp": now,
        "provider": {
            "address": who,
            "registered": bool(info["registered"]),
            "staked": staked,
            "unbonding": int(info["unbonding"]),
            "unbonding_end": int(info["unbondingEnd"]),
            "locked_until": s.locked_until,
            "required": s.required,
            "pool_min_stake": int(pool["minStake"]),
            "meets_required": staked >= s.required,
            "meets_pool_minimum": staked >= int(pool["minStake"]),
            "deposited": int(info["deposited"]),
            "withdrawn": int(info["withdrawn"]),
            "slashed": int(info["slashed"]),
            "token_balance": s.balance,
            "node_count": int(info["nodeCount"]),
            "compute_units": int(info["computeUnits"]),
        },
        "nodes": [s.nodes[n] for n in p.nodes],
        "work": groups,
        "totals": {
            "pending": total("pending", "expected_reward"),
            "claimable": total("claimable", "reward"),
            "claimed": total("claimed", "reward"),
            "invalidated": total("invalidated", "slashed"),
            "disputed": total("disputed", None),
        },
        "slashes": slashes_shown,
        "slashed_total": sum(x["amount"] for x in slashes_shown),
    }


def _duration(seconds: int) -> str:
    s = max(int(seconds), 0)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h}h {m}m"
    if h:
        return f"{h}h {m}m"
    if m:
        return f"{m}m {s}s"
    return f"{s}s"


def format_status(st: dict[str, Any], limit: int = HUMAN_LIMIT) -> list[str]:
    """Readable lines for a `provider_status` result."""
    p = st["provider"]
    pid = st["pool"]
    lines = [
        f"provider {p['address']} in pool {pid} ({st['pool_status']}) at block {st['block']}, {when(st['timestamp'])}",
    ]
    if not p["registered"]:
        lines.append("  stake: not a registered provider")
    else:
        ok = "ok" if p["meets_required"] and p["meets_pool_minimum"] else "TOO LOW"
        lines.append(
            f"  stake: staked {tokens(p['staked'])} ({ok}: required {tokens(p['required'])},"
            f" pool minimum {tokens(p['pool_min_stake'])}), unbonding {tokens(p['unbonding'])}"
            + (f" until {when(p['unbonding_end'])}" if p["unbonding"] else "")
        )
        if p["locked_until"] > st["timestamp"]:
            lines.append(
                f"         withdrawals locked until {when(p['locked_until'])}: recorded work can be invalidated"
                " until then"
            )
        lines.append(
            f"         token balance {tokens(p['token_balance'])}; deposited {tokens(p['deposited'])},"
            f" withdrawn {tokens(p['withdrawn'])}, slashed {tokens(p['slashed'])}"
        )
    if not st["nodes"]:
        lines.append("  nodes: none bound")
    for n in st["nodes"]:
        if n["member"]:
            where = f"member of pool {pid} since {when(n['joined_at'])}"
        elif n["in_pool"]:
            where = f"NOT a member of pool {pid} (member of pool {n['in_pool']})"
        else:
            where = f"NOT a member of pool {pid}"
        if n["blacklisted"]:
            where += ", BLACKLISTED here"
        binding = f"{n['compute_units']} compute units" if n["bound"] else "no longer bound to this provider"
        lines.append(f"  node {n['node']}: {where}; {binding}")

    t = st["totals"]
    lines.append(
        f"  work: {t['pending']['records']} pending ({t['pending']['units']} units),"
        f" {t['claimable']['records']} claimable ({t['claimable']['units']} units, {tokens(t['claimable']['reward'])}),"
        f" {t['claimed']['records']} claimed ({t['claimed']['units']} units, {tokens(t['claimed']['reward'])}),"
        f" {t['invalidated']['records']} invalidated ({t['invalidated']['units']} units),"
        f" {t['disputed']['records']} disputed"
    )

    def listed(name: str, fmt: Any) -> None:
        items = st["work"][name]
        for x in items[:limit]:
            lines.append("    " + fmt(x))
        if len(items) > limit:
            lines.append(f"    ... and {len(items) - limit} more {name} (see --json)")

    listed(
        "pending",
        lambda x: (
            f"pending     {x['work_key']} node {x['node']}: {x['units']} units, final at"
            f" {when(x['deadline'])} ({_duration(x['time_left'])} left), then {tokens(x['expected_reward'])}"
        ),
    )
    listed(
        "claimable",
        lambda x: (
            f"claimable   {x['work_key']} node {x['node']}: {x['units']} units, {tokens(x['reward'])}"
            " (claim with `intellect-node provider claim --pool " + str(pid) + "`)"
        ),
    )
    listed(
        "claimed",
        lambda x: (
            f"claimed     {x['work_key']} node {x['node']}: {x['units']} units, {tokens(x['reward'])} (tx {x['tx']})"
        ),
    )
    listed(
        "invalidated",
        lambda x: (
            f"invalidated {x['work_key']} node {x['node']}: {x['units']} units, "
            + ("revoked without a slash" if x["soft"] else f"slashed {tokens(x['slashed'])}")
            + (f" ({x['dispute']} {x['verdict']})" if x["dispute"] else "")
            + f" (tx {x['tx']})"
        ),
    )

    def disputed(x: dict[str, Any]) -> str:
        if x["dispute"] == "accusation":
            what = (
                f"accused by validator {x['by']}: slashed at {when(x['appeal_end'])} unless appealed "
                f"(`intellect-node work appeal --pool {pid} --key {x['work_key']}`)"
            )
        else:
            what = f"{x['dispute']} (by {x['by']}) before a committee until {when(x['vote_end'])}"
        return f"disputed    {x['work_key']} node {x['node']}: {x['units']} units, {what}"

    listed("disputed", disputed)

    sl = st["slashes"]
    lines.append(f"  slashes: {len(sl)}" + (f", {tokens(st['slashed_total'])} in all" if sl else ""))
    for s in sl[:limit]:
        where = f"pool {s['pool']}" if s["pool"] is not None else "unknown pool"
        lines.append(
            f"    slash {tokens(s['amount'])} for work {s['work_key']} in {where} by {s['validator']}"
            f" (bounty {tokens(s['bounty'])}; tx {s['tx']})"
        )
    if len(sl) > limit:
        lines.append(f"    ... and {len(sl) - limit} more slashes (see --json)")
    return lines
