"""A provider's standing in one pool, explained from contract state and event history.

`provider_status` reads one snapshot (every call and event query pinned to the same block): the
provider's stake, its nodes (from the registry's NodeAdded/NodeRemoved events) and their membership,
its work records in the pool (replayed from the pool's WorkLedger events, as `node.audit` does), and
every slash of the provider (from the registry's Slashed events, each with its transaction).
No loop walks an on-chain array; per-item calls are per node or per slash only.
`format_status` turns the result into readable lines. Both are shared by the CLI and the daemons.
"""

from __future__ import annotations

from typing import Any

import trio

from .audit import rebuild
from .chain.abi import DecodedEvent, topic
from .chain.client import ChainClient
from .chain.errors import ChainError
from .chain.messages import POOL_STATUS, tokens, when
from .errors import ConfigError
from .ops import checksum

ZERO_ADDRESS = "0x" + "00" * 20
CONCURRENCY = 16
HUMAN_LIMIT = 20  # records listed per group in the human output (JSON lists all)


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


async def resolve_provider(c: ChainClient, provider: str | None, node: str | None, signer: str | None) -> str:
    """The provider to explain: --provider, else the provider --node is bound to, else the signing key."""
    if provider:
        return checksum(provider, "provider")
    if node:
        bound = checksum(await c.call("ProviderRegistry", "providerOf", checksum(node, "node")))
        if bound == checksum(ZERO_ADDRESS):
            raise ChainError(
                f"node {checksum(node)} is not bound to any provider",
                "pass --provider ADDR to see a removed node's history",
            )
        return bound
    if signer:
        return checksum(signer)
    raise ConfigError("no provider to show", "pass --provider ADDR or --node ADDR, or a signing key (--keystore)")


async def provider_status(
    c: ChainClient,
    pool_id: int,
    *,
    provider: str | None = None,
    node: str | None = None,
    signer: str | None = None,
) -> dict[str, Any]:
    """Everything `intellect-node status` shows, as a JSON-able dict (amounts in base units)."""
    block = await c.rpc.block_number()
    tag = hex(block)
    now = await c.timestamp(block)
    pool = await c.call("PoolManager", "getPool", pool_id, block=tag)
    if int(pool["status"]) == 0:
        raise ChainError(f"pool {pool_id} does not exist", "check the pool id (`intellect-node pool info ID`)")
    who = await resolve_provider(c, provider, node, signer)
    only_node = checksum(node, "node") if node else None
    rate = int(pool["rewardRate"])

    info = await c.call("ProviderRegistry", "getProvider", who, block=tag)
    required = int(await c.call("ProviderRegistry", "requiredStake", who, block=tag))
    locked_until = int(await c.call("WorkLedger", "lockedUntil", who, block=tag))
    balance = int(await c.call("IntellectToken", "balanceOf", who, block=tag))

    reg_events = await c.events(["ProviderRegistry"], to_block=block, topics=[None, topic(who)])
    reg_events = [e for e in reg_events if e.args.get("provider") == who]
    pool_events = await c.events(["WorkLedger"], to_block=block, topics=[None, topic(pool_id)])

    # Nodes: bound now (added and not removed since), plus any that did work here before removal.
    bound: dict[str, int] = {}
    for e in reg_events:
        if e.name == "NodeAdded":
            bound[e.args["node"]] = int(e.args["computeUnits"])
        elif e.name == "NodeRemoved":
            bound.pop(e.args["node"], None)
    ledger = rebuild(pool_id, pool_events, reg_events, {})
    records = [r for r in ledger.records.values() if r.provider == who and (only_node is None or r.node == only_node)]
    node_list = [only_node] if only_node else sorted(set(bound) | {r.node for r in records})

    limiter = trio.CapacityLimiter(CONCURRENCY)
    nodes: dict[str, dict[str, Any]] = {}

    async def fetch_node(n: str) -> None:
        async with limiter:
            member = bool(await c.call("PoolManager", "isMember", pool_id, n, block=tag))
            ms = await c.call("PoolManager", "membershipOf", n, block=tag)
            black = bool(await c.call("PoolManager", "isBlacklisted", pool_id, n, block=tag))
            owner = checksum(await c.call("ProviderRegistry", "providerOf", n, block=tag))
        nodes[n] = {
            "node": n,
            "bound": owner == who,
            "provider": owner if owner != checksum(ZERO_ADDRESS) else None,
            "compute_units": bound.get(n, 0),
            "member": member,
            "joined_at": int(ms["joinedAt"]) if member else None,
            "in_pool": int(ms["poolId"]) or None,
            "blacklisted": black,
        }

    # Slashes: every Slashed event of the provider. Those from this pool's invalidations are matched
    # by (tx, work key); others are looked up in their transaction's receipt (one per slash).
    invalidated_here = {(r.settled_tx, r.work_key): r for r in ledger.records.values() if r.status == "invalidated"}
    slash_events = [e for e in reg_events if e.name == "Slashed"]
    slash_pool: dict[str, int | None] = {}

    async def fetch_slash_pool(e: DecodedEvent) -> None:
        async with limiter:
            receipt = await c.rpc.request("eth_getTransactionReceipt", [e.tx_hash])
        found = None
        for ev in c.decode_logs(list((receipt or {}).get("logs", []))):
            if ev.name == "WorkInvalidated" and ev.args["workKey"] == e.args["reason"]:
                found = int(ev.args["poolId"])
        slash_pool[e.tx_hash + e.args["reason"]] = found

    async with trio.open_nursery() as nursery:
        for n in node_list:
            nursery.start_soon(fetch_node, n)
        for e in slash_events:
            if (e.tx_hash, e.args["reason"]) not in invalidated_here:
                nursery.start_soon(fetch_slash_pool, e)

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
                "validator": a["validator"],
                "reason": a["reason"],
                "work_key": a["reason"],
                "pool": pool_id if here is not None else slash_pool.get(e.tx_hash + a["reason"]),
                "node": here.node if here is not None else None,
                "evidence": here.evidence if here is not None else None,
                "tx": e.tx_hash,
                "block": e.block_number,
            }
        )
    # With --node: that node's slashes here, plus those whose node is unknown (other pools).
    slashes_shown = slashes if only_node is None else [s for s in slashes if s["node"] in (None, only_node)]

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
        "block": block,
        "timestamp": now,
        "provider": {
            "address": who,
            "registered": bool(info["registered"]),
            "staked": staked,
            "unbonding": int(info["unbonding"]),
            "unbonding_end": int(info["unbondingEnd"]),
            "locked_until": locked_until,
            "required": required,
            "pool_min_stake": int(pool["minStake"]),
            "meets_required": staked >= required,
            "meets_pool_minimum": staked >= int(pool["minStake"]),
            "deposited": int(info["deposited"]),
            "withdrawn": int(info["withdrawn"]),
            "slashed": int(info["slashed"]),
            "token_balance": balance,
            "node_count": int(info["nodeCount"]),
            "compute_units": int(info["computeUnits"]),
        },
        "nodes": [nodes[n] for n in node_list],
        "work": groups,
        "totals": {
            "pending": total("pending", "expected_reward"),
            "claimable": total("claimable", "reward"),
            "claimed": total("claimed", "reward"),
            "invalidated": total("invalidated", "slashed"),
            "disputed": total("disputed", None),
        },
        "slashes": slashes_shown,
        "slashed_total": sum(s["amount"] for s in slashes_shown),
    }


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
