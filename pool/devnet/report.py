"""The devnet's outcome: disputes decided, the report built from every role's status and the chain's
audit, the outcome checked (honest paid, cheaters invalidated), the chain summary and its print."""

from __future__ import annotations

import time
from typing import Any

import trio

from node import ops
from node.chain import ChainClient
from node.chain.abi import topic
from node.chain.messages import tokens
from node.runtime import run_trio

from .procs import Proc
from .setup import DevnetOptions, Roles, resolve_train

APPEAL_GRACE = 20.0


async def decide_disputes(reader: ChainClient, pool_id: int, wait_until: Any) -> None:
    """Before time moves on: every accusation has had `APPEAL_GRACE` seconds to be appealed, and every
    appeal and challenge has been decided by its committee (a vote period that ran out under the
    fast-forward would decide nothing)."""
    first_seen: dict[str, float] = {}
    state = {"done": False}

    async def poll() -> None:
        events = await reader.events(["WorkLedger"], topics=[None, topic(pool_id)])
        now = time.monotonic()
        contested, resolved = set(), set()
        for e in events:
            k = str(e.args.get("workKey"))
            if e.name in ("WorkAccused", "WorkSoftInvalidated"):  # a soft accusation is appealable too
                first_seen.setdefault(k, now)
            elif e.name in ("WorkAppealed", "WorkChallenged"):
                contested.add(k)
            elif e.name == "DisputeResolved":
                resolved.add(k)
        graced = all(now - t >= APPEAL_GRACE for k, t in first_seen.items() if k not in contested)
        state["done"] = graced and contested <= resolved

    await poll()
    while not state["done"]:
        await wait_until(lambda: True, "appeals of accused work decided by their committees")
        await trio.sleep(2.0)
        await poll()


def dispute_summary(nodes: dict[str, Any], bond: int, roles: Roles) -> dict[str, Any]:
    """Every dispute of the pool, from the audit's replay of its events (`nodes`: the audit report's
    ledgers): who accused or challenged, whether it was appealed, and the verdict; per accuser, how
    many of its accusations stood and the bonds it lost (its `bond` for each one overturned)."""
    names = {v.address: n for n, v in [("validator", roles.validator), ("liar", roles.liar)]}
    names |= {j.address: f"juror{i + 1}" for i, j in enumerate(roles.jurors)}
    by_key: dict[str, dict[str, Any]] = {}
    for ledger in nodes.values():
        for d in ledger["disputes"]:
            if d["kind"] == "soft invalidation":
                continue
            by_key[d["work_key"]] = {
                "by": names.get(d["by"], d["by"]), "provider": ledger["provider"], "appealed": d["kind"] == "appeal",
                "verdict": d["verdict"], "kind": "challenge" if d["kind"] == "challenge" else "accusation",
                "soft": bool(d.get("soft")),
            }  # fmt: skip
    per: dict[str, dict[str, int]] = {}
    for d in by_key.values():
        p = per.setdefault(d["by"], {"accused": 0, "upheld": 0, "overturned": 0, "bonds_lost": 0})
        p["accused"] += 1
        if d["verdict"] in ("upheld", "overturned"):
            p[d["verdict"]] += 1
        if d["verdict"] == "overturned" and not d["soft"]:  # a soft accuser puts up no bond
            p["bonds_lost"] += bond
    return {"records": by_key, "by_accuser": per}


def build_report(opts: DevnetOptions, roles: Roles, pool_id: int, procs: list[Proc], rep: Any) -> dict[str, Any]:
    opts = resolve_train(opts)
    coord = next(p for p in procs if p.role == "coordinator")
    per_node = coord.status.get("per_node", {})
    nodes = {}
    for p in procs:
        if p.role != "worker":
            continue
        node = p.status.get("node", "")
        ledger = rep.nodes.get(node, {})
        acc = per_node.get(node, {})
        nodes[p.name] = {
            "node": node,
            "provider": p.status.get("provider"),
            "cheater": p.name.startswith("cheater"),
            "rollouts_accepted": acc.get("recorded", 0) + acc.get("accepted", 0),
            "rollouts_invalidated": ledger.get("invalidated_records", 0),
            "trainer_refused": coord.status.get("trainer_refused", {}).get(node, 0),
            "trainer_took": coord.status.get("trainer_took", {}).get(node, 0),
            "units_recorded": ledger.get("recorded_units", 0),
            "units_invalidated": ledger.get("invalidated_units", 0),
            "units_claimed": ledger.get("claimed_units", 0),
            "tokens_claimed": ledger.get("claimed_tokens", 0),
            "slashes": ledger.get("slashes", []),
            "slashed_tokens": ledger.get("slashed_tokens", 0),
        }
    return {
        "pool": pool_id,
        "model": opts.model,
        "steps": opts.steps,
        "seed": opts.seed,
        "adversary": "+".join(opts.adversary_kinds) if opts.adversary else None,
        "nodes": nodes,
        "validator": next(p for p in procs if p.role == "validator").status.get("checks", {}),
        "coordinator": {k: coord.status.get(k) for k in ("rollouts", "rejected", "mean_reward", "txs")},
        "training": {
            "enabled": opts.train,
            "policy_version": coord.status.get("policy_version", 0),
            "reward_curve": coord.status.get("reward_curve", []),
            "trained_versions": coord.status.get("trained_versions", []),
            "stale_never_trained": coord.status.get("stale_never_trained", 0),
            "samples_trained": coord.status.get("samples_trained", 0),
            "samples_verified": coord.status.get("samples_verified", 0),
            "rollout_versions": coord.status.get("rollout_versions", {}),
            "relays": coord.status.get("relays", []),
            "relays_refused": coord.status.get("relays_refused", {}),
        },
        "audit": {
            "block": rep.block,
            "consistent": rep.consistent,
            "mismatches": rep.mismatches,
            "totals": rep.totals,
            "providers": rep.providers,
        },
    }


def check_outcome(report: dict[str, Any]) -> list[str]:
    """What went wrong, if anything: honest work claimed, cheating invalidated and slashed, audit clean."""
    problems = []
    ex = report.get("explorer")
    if ex is not None and not ex.get("matches_audit"):
        problems.append(f"the explorer at {ex.get('url')} (block {ex.get('block')}) does not show the audit's figures")
    for name, n in report["nodes"].items():
        if n["cheater"]:
            if n["rollouts_invalidated"] == 0 or n["slashed_tokens"] == 0:
                problems.append(f"{name} cheated but was not invalidated and slashed")
            if n["units_claimed"]:
                problems.append(f"{name} cheated but claimed {n['units_claimed']} units")
        else:
            if n["rollouts_invalidated"]:
                problems.append(f"honest {name} had {n['rollouts_invalidated']} rollout(s) invalidated")
            if n.get("trainer_refused"):
                problems.append(f"the trainer refused {n['trainer_refused']} honest rollout(s) of {name}")
            if n["units_claimed"] == 0 or n["units_claimed"] != n["units_recorded"]:
                problems.append(f"honest {name} claimed {n['units_claimed']} of {n['units_recorded']} units")
    d = report.get("disputes", {"records": {}, "by_accuser": {}})
    if report.get("adversary") == "lying-validator":
        liar = d["by_accuser"].get("liar", {})
        if not liar.get("accused"):
            problems.append("the lying validator accused nothing")
        elif liar.get("upheld") or liar.get("overturned") != liar.get("accused"):
            problems.append(f"the lying validator's accusations were not all overturned on appeal: {liar}")
        elif not liar.get("bonds_lost"):
            problems.append("the lying validator lost no bond")
    for k, rec in d["records"].items():
        if rec["appealed"] and rec["verdict"] == "open":
            problems.append(f"the appeal of {k} was never decided")
    t = report.get("training", {})
    if t.get("samples_verified", 0) != t.get("samples_trained", 0):
        problems.append(f"trained on {t['samples_trained']} samples, only {t['samples_verified']} verified first")
    if not report["audit"]["consistent"]:
        problems.append("audit found mismatches: " + "; ".join(report["audit"]["mismatches"][:5]))
    return problems


def chain_summary(url: str, opts: DevnetOptions, roles: Roles, pool_id: int, dep: Any) -> dict[str, Any]:
    async def info() -> dict[str, Any]:
        c = await ChainClient.connect(url, dep)
        try:
            return await ops.pool_info(c, pool_id)
        finally:
            await c.aclose()

    pinfo = run_trio(info)
    return {
        "rpc_url": url,
        "chain_id": dep.chain_id,
        "deployment": str(opts.workdir / "deployment.json"),
        "contracts": dep.contracts,
        "pool": pool_id,
        "pool_status": pinfo["statusName"],
        "members": pinfo["members"],
        "roles": {
            "owner": roles.owner.address,
            "coordinator": roles.coordinator.address,
            "validator": roles.validator.address,
            "provider": roles.provider.address,
            "node": roles.node.address,
        },
    }


def print_summary(report: dict[str, Any], say: Any) -> None:
    say("")
    say(f"devnet summary (pool {report['pool']}, model {report['model']}, {report['steps']} step(s) per worker)")
    for name, n in report["nodes"].items():
        say(
            f"  {name:<9} accepted {n['rollouts_accepted']:>2}  invalidated {n['rollouts_invalidated']:>2}  "
            f"units {n['units_recorded']:>5}  claimed {tokens(n['tokens_claimed'])}  "
            f"slashed {tokens(n['slashed_tokens'])}"
        )
        for s in n["slashes"]:
            say(f"            slash {tokens(s['amount'])} for work {s['work_key'][:14]}... in tx {s['tx']}")
    t = report.get("training", {})
    if t.get("enabled"):
        curve = " ".join(f"{x:.3f}" for x in t.get("reward_curve", []))
        say(f"  training: policy version {t.get('policy_version')}, mean reward per step: {curve or '-'}")
        say(
            f"  trained on {t.get('samples_trained', 0)} samples, {t.get('samples_verified', 0)} verified first; "
            f"rollouts refused by the trainer's checks: "
            + (", ".join(f"{k} {n['trainer_refused']}" for k, n in report["nodes"].items() if n.get("trainer_refused"))
               or "none")
        )  # fmt: skip
        if t.get("reward_plot"):
            say(f"  reward curve plotted in {t['reward_plot']}")
    d = report.get("disputes", {}).get("by_accuser", {})
    for who, n in d.items():
        say(
            f"  disputes by {who}: {n['accused']} accusation(s), {n['upheld']} upheld, {n['overturned']} overturned"
            + (f" (lost {tokens(n['bonds_lost'])} in bonds)" if n["bonds_lost"] else "")
        )
    a = report["audit"]
    say(f"  audit: {'consistent' if a['consistent'] else 'MISMATCHES: ' + '; '.join(a['mismatches'][:3])}")
    ex = report.get("explorer")
    if ex:
        agrees = "shows the audit's figures" if ex.get("matches_audit") else "does NOT show the audit's figures"
        say(f"  explorer: {ex['url']} {agrees} (served by the coordinator while the devnet ran)")
    if report["problems"]:
        say("  PROBLEMS: " + "; ".join(report["problems"]))
    else:
        if report.get("adversary") == "lying-validator":
            say("  outcome as expected: honest work claimed, the lying validator's accusations overturned on appeal")
        elif report.get("adversary"):
            say("  outcome as expected: honest work claimed, cheating invalidated and slashed")
        else:
            say("  outcome as expected: honest work recorded, verified and claimed")
    if "seconds" in report:
        m, s = divmod(round(float(report["seconds"])), 60)
        say(f"  finished in {m} min {s:02d} s")
