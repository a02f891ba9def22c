"""Reward audit: rebuild a pool's ledger from events alone, then check it against contract state.

`rebuild`, `compare` and `report` are pure (events and state in, findings out), so every rule is tested
without a chain; `node.audit_read.audit` fetches one consistent snapshot (events and state at the same
block) and runs them. No I/O here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .chain.abi import DecodedEvent
from .chain.messages import RECORD_STATUS


@dataclass
class Rec:
    work_key: str
    node: str
    provider: str
    units: int
    policy_version: int
    proof_commitment: str
    deadline: int
    recorded_tx: str
    status: str = "pending"
    validator: str = ""
    evidence: str = ""
    slashed: int = 0
    bounty: int = 0
    settled_tx: str = ""
    reward: int = 0
    soft: bool = False
    dispute: str = ""  # accusation / appeal / challenge, while or after one ran
    verdict: str = ""  # open / upheld / overturned / lapsed
    appeal_end: int = 0
    vote_end: int = 0
    dispute_txs: list[str] = field(default_factory=list)

    def final(self, now: int) -> bool:
        """Whether the record is final at chain time `now`: still pending (not claimed, disputed or
        invalidated) and past a known deadline. The one rule audit, claims and status share; a record
        whose deadline no event gave (-1) is never final."""
        return self.status == "pending" and 0 <= self.deadline <= now


@dataclass
class NodeLedger:
    node: str
    provider: str
    records: int = 0
    recorded_units: int = 0
    pending_units: int = 0
    finalized_units: int = 0
    invalidated_units: int = 0
    invalidated_records: int = 0
    claimed_units: int = 0
    claimed_tokens: int = 0
    slashed_tokens: int = 0
    slashes: list[dict[str, Any]] = field(default_factory=list)
    disputes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PoolTotals:
    funded: int = 0
    surplus_withdrawn: int = 0
    recorded_units: int = 0
    pending_units: int = 0
    invalidated_units: int = 0
    claimed_units: int = 0
    claimed_tokens: int = 0
    forfeited_tokens: int = 0  # revoked records' rewards, sent to the treasury


@dataclass
class ProviderTotals:
    deposited: int = 0
    unstaked: int = 0
    withdrawn: int = 0
    slashed: int = 0
    slashed_from_unbonding: int = 0
    slashed_from_staked: int = 0

    @property
    def staked(self) -> int:
        return self.deposited - self.unstaked - self.slashed_from_staked

    @property
    def unbonding(self) -> int:
        return self.unstaked - self.withdrawn - self.slashed_from_unbonding


@dataclass
class Rebuilt:
    pool_id: int
    reward_rate: int | None
    records: dict[str, Rec]
    totals: PoolTotals
    providers: dict[str, ProviderTotals]
    problems: list[str]


def rebuild(
    pool_id: int,
    pool_events: Iterable[DecodedEvent],
    registry_events: Iterable[DecodedEvent],
    block_time: dict[int, int],
) -> Rebuilt:
    """Replay the pool's events in order. `block_time` maps block numbers to timestamps (for the
    deadline rules); `registry_events` are the registry events of this pool's providers."""
    records: dict[str, Rec] = {}
    totals = PoolTotals()
    problems: list[str] = []
    rate: int | None = None
    pending_by_tx: dict[str, list[Rec]] = defaultdict(list)
    slashes_by_tx: dict[tuple[str, str], DecodedEvent] = {}
    reg = list(registry_events)
    for e in reg:
        if e.name == "Slashed":
            slashes_by_tx[(e.tx_hash, e.args["reason"])] = e

    for e in pool_events:
        a = e.args
        if a.get("poolId") not in (None, pool_id):
            continue
        if e.name == "PoolCreated":
            rate = int(a["rewardRate"])
        elif e.name == "WorkRecorded":
            key = a["workKey"]
            if key in records:
                problems.append(f"work {key} recorded twice (tx {e.tx_hash})")
                continue
            rec = Rec(
                key,
                a["node"],
                a["provider"],
                int(a["units"]),
                int(a["policyVersion"]),
                a["proofCommitment"],
                -1,
                e.tx_hash,
            )
            records[key] = rec
            pending_by_tx[e.tx_hash].append(rec)
            totals.recorded_units += rec.units
        elif e.name == "WorkBatchRecorded":
            batch = pending_by_tx.pop(e.tx_hash, [])
            if len(batch) != int(a["count"]) or sum(r.units for r in batch) != int(a["units"]):
                problems.append(
                    f"batch in tx {e.tx_hash} announces {a['count']} records / {a['units']} units, events show {len(batch)}"
                )
            for r in batch:
                r.deadline = int(a["deadline"])
        elif e.name in ("WorkAccused", "WorkChallenged", "WorkSoftInvalidated"):
            key = a["workKey"]
            rec = records.get(key)
            if rec is None:
                problems.append(f"work {key} disputed but never recorded (tx {e.tx_hash})")
                continue
            # one dispute at a time; one that did not stand leaves the record pending, open to another
            if rec.status != "pending":
                problems.append(f"work {key} disputed while {rec.status} (tx {e.tx_hash})")
                continue
            t = block_time.get(e.block_number)
            if t is not None and t >= rec.deadline:
                problems.append(f"work {key} disputed at {t}, at or after its deadline {rec.deadline}")
            rec.evidence = a["evidenceHash"]
            rec.dispute_txs.append(e.tx_hash)
            rec.status, rec.verdict, rec.soft = "disputed", "open", e.name == "WorkSoftInvalidated"
            if e.name == "WorkSoftInvalidated":
                rec.dispute, rec.validator, rec.appeal_end = "accusation", a["validator"], int(a["appealEnd"])
            elif e.name == "WorkAccused":
                rec.dispute, rec.validator, rec.appeal_end = "accusation", a["accuser"], int(a["appealEnd"])
            else:
                rec.dispute, rec.validator, rec.vote_end = "challenge", a["challenger"], int(a["voteEnd"])
        elif e.name == "WorkAppealed":
            rec = records.get(a["workKey"])
            if rec is None or rec.dispute != "accusation" or rec.verdict != "open":
                problems.append(f"work {a['workKey']} appealed without an open accusation (tx {e.tx_hash})")
                continue
            rec.dispute, rec.vote_end = "appeal", int(a["voteEnd"])
            rec.dispute_txs.append(e.tx_hash)
        elif e.name == "DisputeResolved":
            rec = records.get(a["workKey"])
            if rec is None or rec.verdict != "open":
                problems.append(f"work {a['workKey']}: a dispute resolved that was not open (tx {e.tx_hash})")
                continue
            rec.verdict = ("open", "upheld", "overturned", "lapsed")[int(a["verdict"])]
            rec.dispute_txs.append(e.tx_hash)
            # a hard accusation superseding a soft dispute ends it as lapsed, its bond (if any) to the provider
            superseded = rec.verdict == "lapsed" and rec.soft and a["bondsTo"] == a["provider"]
            if not superseded and ((rec.verdict, rec.dispute) == ("lapsed", "appeal") or
                                   (rec.verdict == "upheld" and rec.soft)):  # fmt: skip
                rec.status, rec.soft, rec.settled_tx = "invalidated", True, e.tx_hash  # revoked, not slashed
                rec.validator = a["accuser"]
                totals.invalidated_units += rec.units
            elif rec.verdict in ("overturned", "lapsed"):
                rec.status = "pending"
            elif rec.status != "invalidated":
                problems.append(f"work {a['workKey']}: upheld without an invalidation (tx {e.tx_hash})")
        elif e.name == "WorkReopened":
            rec = records.get(a["workKey"])
            if rec is None or int(a["deadline"]) <= rec.deadline:
                problems.append(f"work {a['workKey']}: reopened without a later deadline (tx {e.tx_hash})")
                continue
            rec.deadline = int(a["deadline"])
        elif e.name == "RewardForfeited":
            totals.forfeited_tokens += int(a["amount"])
        elif e.name == "WorkInvalidated":
            key = a["workKey"]
            rec = records.get(key)
            if rec is None:
                problems.append(f"work {key} invalidated but never recorded (tx {e.tx_hash})")
                continue
            if rec.status != "disputed" or rec.verdict != "open":
                problems.append(f"work {key} invalidated while {rec.status} (tx {e.tx_hash})")
                continue
            if rec.dispute == "accusation":
                t = block_time.get(e.block_number)
                if t is not None and t < rec.appeal_end:
                    problems.append(f"work {key} slashed at {t}, before its appeal period ended at {rec.appeal_end}")
            rec.status = "invalidated"
            rec.validator = a["validator"]
            rec.slashed = int(a["slashed"])
            rec.bounty = int(a["bounty"])
            rec.settled_tx = e.tx_hash
            totals.invalidated_units += rec.units
            s = slashes_by_tx.get((e.tx_hash, key))
            if s is None and rec.slashed:
                problems.append(
                    f"work {key}: invalidation reports a slash of {rec.slashed} but the registry logged none"
                )
            elif s is not None and (int(s.args["amount"]) != rec.slashed or int(s.args["bounty"]) != rec.bounty):
                problems.append(f"work {key}: invalidation and registry disagree on the slash")
            if int(a["units"]) != rec.units or a["provider"] != rec.provider:
                problems.append(f"work {key}: invalidation names other units/provider than the record")
        elif e.name == "WorkClaimed":
            key = a["workKey"]
            rec = records.get(key)
            if rec is None:
                problems.append(f"work {key} claimed but never recorded (tx {e.tx_hash})")
                continue
            if rec.status != "pending":
                problems.append(f"work {key} claimed while {rec.status} (tx {e.tx_hash})")
                continue
            t = block_time.get(e.block_number)
            if t is not None and t < rec.deadline:
                problems.append(f"work {key} claimed at {t}, before its deadline {rec.deadline}")
            if a["provider"] != rec.provider:
                problems.append(f"work {key} claimed by {a['provider']}, recorded for {rec.provider}")
            rec.status = "claimed"
            rec.reward = int(a["reward"])
            rec.settled_tx = e.tx_hash
            if rate is not None and rec.reward != rec.units * rate:
                problems.append(f"work {key}: reward {rec.reward} != units {rec.units} x rate {rate}")
            totals.claimed_units += rec.units
            totals.claimed_tokens += rec.reward
        elif e.name == "PoolFunded":
            totals.funded += int(a["amount"])
        elif e.name == "SurplusWithdrawn":
            totals.surplus_withdrawn += int(a["amount"])
    for r in records.values():
        if r.deadline < 0:
            problems.append(f"work {r.work_key}: no batch event gives its deadline")
    totals.pending_units = totals.recorded_units - totals.invalidated_units - totals.claimed_units

    providers: dict[str, ProviderTotals] = defaultdict(ProviderTotals)
    for e in reg:
        a = e.args
        p = providers[a["provider"]]
        if e.name == "Staked":
            p.deposited += int(a["amount"])
        elif e.name == "UnstakeRequested":
            p.unstaked += int(a["amount"])
        elif e.name == "Withdrawn":
            p.withdrawn += int(a["amount"])
        elif e.name == "Slashed":
            p.slashed += int(a["amount"])
            p.slashed_from_unbonding += int(a["fromUnbonding"])
            p.slashed_from_staked += int(a["fromStaked"])
    return Rebuilt(pool_id, rate, records, totals, dict(providers), problems)


def node_ledgers(rebuilt: Rebuilt, now: int) -> dict[str, NodeLedger]:
    out: dict[str, NodeLedger] = {}
    for r in rebuilt.records.values():
        n = out.setdefault(r.node, NodeLedger(r.node, r.provider))
        n.records += 1
        n.recorded_units += r.units
        if r.status == "pending":
            n.pending_units += r.units
            if r.final(now):
                n.finalized_units += r.units
        elif r.status == "invalidated":
            n.invalidated_units += r.units
            n.invalidated_records += 1
            n.slashed_tokens += r.slashed
            if not r.soft:
                n.slashes.append(
                    {
                        "work_key": r.work_key,
                        "amount": r.slashed,
                        "bounty": r.bounty,
                        "validator": r.validator,
                        "tx": r.settled_tx,
                    }
                )
        elif r.status == "claimed":
            n.claimed_units += r.units
            n.claimed_tokens += r.reward
        if r.dispute or r.soft:
            n.disputes.append(
                {
                    "work_key": r.work_key,
                    "kind": "soft invalidation" if r.soft and r.dispute in ("", "accusation") else r.dispute,
                    "soft": r.soft,
                    "by": r.validator,
                    "verdict": r.verdict or "final",
                    "evidence": r.evidence,
                    "txs": r.dispute_txs,
                }
            )
    return out


def compare(
    rebuilt: Rebuilt,
    record_state: dict[str, dict[str, Any]],
    account_state: dict[str, Any],
    provider_state: dict[str, dict[str, Any]],
    reward_rate_state: int,
) -> list[str]:
    """Differences between the event-built ledger and what the contracts hold now."""
    out: list[str] = []
    if rebuilt.reward_rate is not None and rebuilt.reward_rate != reward_rate_state:
        out.append(f"reward rate: events say {rebuilt.reward_rate}, contract says {reward_rate_state}")
    for key, rec in rebuilt.records.items():
        s = record_state.get(key)
        if s is None:
            out.append(f"work {key}: no state fetched")
            continue
        status = RECORD_STATUS[int(s["status"])]
        if status != rec.status:
            out.append(f"work {key}: events say {rec.status}, contract says {status}")
        if int(s["units"]) != rec.units:
            out.append(f"work {key}: events say {rec.units} units, contract says {s['units']}")
        if s["provider"] != rec.provider:
            out.append(f"work {key}: events say provider {rec.provider}, contract says {s['provider']}")
        if int(s["deadline"]) != rec.deadline:
            out.append(f"work {key}: events say deadline {rec.deadline}, contract says {s['deadline']}")
    t = rebuilt.totals
    expect = {
        "recordedUnits": t.recorded_units,
        "pendingUnits": t.pending_units,
        "invalidatedUnits": t.invalidated_units,
        "claimedUnits": t.claimed_units,
        "claimedTokens": t.claimed_tokens,
        "budget": t.funded - t.claimed_tokens - t.surplus_withdrawn - t.forfeited_tokens,
        "forfeitedTokens": t.forfeited_tokens,
    }
    for k, v in expect.items():
        if int(account_state.get(k, 0)) != v:
            out.append(f"pool account {k}: events say {v}, contract says {account_state.get(k, 0)}")
    for addr, p in rebuilt.providers.items():
        s = provider_state.get(addr)
        if s is None:
            out.append(f"provider {addr}: no state fetched")
            continue
        for k, v in (
            ("deposited", p.deposited),
            ("withdrawn", p.withdrawn),
            ("slashed", p.slashed),
            ("staked", p.staked),
            ("unbonding", p.unbonding),
        ):
            if int(s[k]) != v:
                out.append(f"provider {addr} {k}: events say {v}, contract says {s[k]}")
        if int(s["deposited"]) != int(s["staked"]) + int(s["unbonding"]) + int(s["withdrawn"]) + int(s["slashed"]):
            out.append(f"provider {addr}: stake not conserved in contract state")
    return out


@dataclass
class AuditReport:
    pool_id: int
    block: int
    timestamp: int
    consistent: bool
    mismatches: list[str]
    reward_rate: int
    totals: dict[str, int]
    nodes: dict[str, dict[str, Any]]
    providers: dict[str, dict[str, int]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuditSnapshot:
    """What one audit read: the report, the rebuilt ledger (every record, with its transactions), the
    pool's state, its events and its account at `report.block`."""

    report: AuditReport
    rebuilt: Rebuilt
    pool: dict[str, Any]
    events: list[DecodedEvent]
    account: dict[str, Any]


def report(
    rebuilt: Rebuilt,
    pool: dict[str, Any],
    block: int,
    now: int,
    records: dict[str, dict[str, Any]],
    account: dict[str, Any],
    providers: dict[str, dict[str, Any]],
    node: str | None = None,
) -> AuditReport:
    """The audit of pool `rebuilt.pool_id` from its rebuilt ledger and the contract state read at `block`
    (`records`: work key -> WorkLedger.getRecord, `providers`: address -> ProviderRegistry.getProvider)."""
    mismatches = rebuilt.problems + compare(rebuilt, records, account, providers, int(pool["rewardRate"]))
    ledgers = node_ledgers(rebuilt, now)
    if node is not None:
        ledgers = {k: v for k, v in ledgers.items() if k.lower() == node.lower()}
    return AuditReport(
        pool_id=rebuilt.pool_id,
        block=block,
        timestamp=now,
        consistent=not mismatches,
        mismatches=mismatches,
        reward_rate=int(pool["rewardRate"]),
        totals=asdict(rebuilt.totals),
        nodes={k: asdict(v) for k, v in ledgers.items()},
        providers={
            k: {
                "deposited": v.deposited,
                "staked": v.staked,
                "unbonding": v.unbonding,
                "withdrawn": v.withdrawn,
                "slashed": v.slashed,
            }
            for k, v in rebuilt.providers.items()
        },
    )
