"""The audit's rules on synthetic event streams: no chain needed."""

from __future__ import annotations

import itertools

from node.audit import compare, node_ledgers, rebuild
from node.chain.abi import DecodedEvent

POOL = 1
NODE = "0x" + "0A" * 20
PROV = "0x" + "0B" * 20
VAL = "0x" + "0C" * 20
RATE = 10
DEADLINE = 1_000
_seq = itertools.count()


def ev(name, tx, block, **args):
    return DecodedEvent("X", name, {"poolId": POOL, **args}, "0x" + "00" * 20, block, tx, next(_seq))


def key(i):
    return "0x" + f"{i:064x}"


def base_stream():
    return [
        ev("PoolCreated", "t0", 1, rewardRate=RATE),
        ev("PoolFunded", "t1", 2, amount=10_000),
        ev(
            "WorkRecorded",
            "t2",
            3,
            node=NODE,
            workKey=key(1),
            provider=PROV,
            units=5,
            policyVersion=1,
            proofCommitment="0x",
        ),
        ev(
            "WorkRecorded",
            "t2",
            3,
            node=NODE,
            workKey=key(2),
            provider=PROV,
            units=7,
            policyVersion=1,
            proofCommitment="0x",
        ),
        ev("WorkBatchRecorded", "t2", 3, count=2, units=12, deadline=DEADLINE),
    ]


def registry_stream(slashed=0):
    out = [DecodedEvent("R", "Staked", {"provider": PROV, "amount": 100, "staked": 100}, "0x", 1, "r1", 0)]
    if slashed:
        out.append(
            DecodedEvent(
                "R",
                "Slashed",
                {
                    "provider": PROV,
                    "validator": VAL,
                    "reason": key(1),
                    "amount": slashed,
                    "fromUnbonding": 0,
                    "fromStaked": slashed,
                    "bounty": 1,
                },
                "0x",
                5,
                "t3",
                0,
            )
        )
    return out


APPEAL_END = 600


def accusation(block=5, k=1):
    return ev(
        "WorkAccused", f"t3a{k}", block, workKey=key(k), accuser=VAL, provider=PROV, evidenceHash="0xee",
        appealEnd=APPEAL_END, bond=2,
    )  # fmt: skip


def invalidation(block=5, final_block=6):
    """A hard invalidation: the accusation, then (unappealed) its finalization."""
    return [
        accusation(block),
        ev(
            "WorkInvalidated",
            "t3",
            final_block,
            workKey=key(1),
            validator=VAL,
            provider=PROV,
            units=5,
            evidenceHash="0x" + "00" * 32,
            slashed=3,
            bounty=1,
        ),
        ev("DisputeResolved", "t3", final_block, workKey=key(1), verdict=1, kind=1, accuser=VAL, provider=PROV,
           bondsTo=VAL, bonds=2),
    ]  # fmt: skip


def claim(block=9, reward=7 * RATE):
    return ev("WorkClaimed", "t4", block, workKey=key(2), provider=PROV, units=7, reward=reward)


TIMES = {5: 500, 6: 700, 9: 1_000, 4: 1_000, 8: 999, 3: 100}


def test_consistent_stream_gives_per_node_ledger():
    r = rebuild(POOL, [*base_stream(), *invalidation(), claim()], registry_stream(3), TIMES)
    assert r.problems == []
    n = node_ledgers(r, now=2_000)[NODE]
    assert (n.records, n.recorded_units, n.invalidated_units, n.claimed_units, n.claimed_tokens) == (2, 12, 5, 7, 70)
    assert n.slashes[0]["amount"] == 3 and n.slashed_tokens == 3
    rec = r.records[key(1)]
    assert (rec.dispute, rec.verdict, rec.evidence, rec.validator) == ("accusation", "upheld", "0xee", VAL)
    state = {
        key(1): {"status": 2, "units": 5, "provider": PROV, "deadline": DEADLINE},
        key(2): {"status": 3, "units": 7, "provider": PROV, "deadline": DEADLINE},
    }
    account = {
        "recordedUnits": 12,
        "pendingUnits": 0,
        "invalidatedUnits": 5,
        "claimedUnits": 7,
        "claimedTokens": 70,
        "budget": 10_000 - 70,
    }
    providers = {PROV: {"deposited": 100, "staked": 97, "unbonding": 0, "withdrawn": 0, "slashed": 3}}
    assert compare(r, state, account, providers, RATE) == []
    # and every single deviation of state is reported
    assert compare(r, {**state, key(2): {**state[key(2)], "status": 1}}, account, providers, RATE)
    assert compare(r, state, {**account, "budget": 1}, providers, RATE)
    assert compare(r, state, account, {PROV: {**providers[PROV], "slashed": 4}}, RATE)
    assert compare(r, state, account, providers, RATE + 1)


def test_pending_work_is_final_only_after_deadline():
    r = rebuild(POOL, base_stream(), [], {})
    assert node_ledgers(r, now=DEADLINE - 1)[NODE].finalized_units == 0
    assert node_ledgers(r, now=DEADLINE)[NODE].finalized_units == 12


def test_a_record_without_a_known_deadline_is_never_final():
    """The one finality rule (audit, claims, status): a deadline no event gave (-1) is not in the past."""
    r = rebuild(POOL, base_stream(), [], {})
    for rec in r.records.values():
        assert rec.final(DEADLINE) and not rec.final(DEADLINE - 1)
        rec.deadline = -1
        assert not rec.final(DEADLINE) and not rec.final(10**12)
    assert node_ledgers(r, now=10**12)[NODE].finalized_units == 0


def test_claim_before_deadline_is_flagged():
    r = rebuild(POOL, [*base_stream(), claim(block=8)], [], TIMES)
    assert any("before its deadline" in p for p in r.problems)


def test_invalidation_at_deadline_is_flagged():
    r = rebuild(POOL, [*base_stream(), *invalidation(block=4)], registry_stream(3), TIMES)
    assert any("at or after its deadline" in p for p in r.problems)


def test_double_settlement_is_flagged():
    r = rebuild(POOL, [*base_stream(), claim(), claim()], [], TIMES)
    assert any("claimed while claimed" in p for p in r.problems)
    r = rebuild(
        POOL,
        [
            *base_stream(),
            *invalidation(),
            ev("WorkClaimed", "t9", 9, workKey=key(1), provider=PROV, units=5, reward=50),
        ],
        registry_stream(3),
        TIMES,
    )
    assert any("claimed while invalidated" in p for p in r.problems)


def test_double_record_and_unknown_work_are_flagged():
    s = base_stream()
    r = rebuild(POOL, [*s, s[2]], [], TIMES)
    assert any("recorded twice" in p for p in r.problems)
    r = rebuild(POOL, [ev("WorkClaimed", "t", 9, workKey=key(9), provider=PROV, units=1, reward=RATE)], [], TIMES)
    assert any("never recorded" in p for p in r.problems)


def test_wrong_reward_and_missing_slash_are_flagged():
    r = rebuild(POOL, [*base_stream(), claim(reward=1)], [], TIMES)
    assert any("reward 1 != units 7 x rate" in p for p in r.problems)
    r = rebuild(POOL, [*base_stream(), *invalidation()], registry_stream(0), TIMES)
    assert any("registry logged none" in p for p in r.problems)


def test_events_of_other_pools_are_ignored():
    other = ev(
        "WorkRecorded", "x", 3, node=NODE, workKey=key(1), provider=PROV, units=5, policyVersion=1, proofCommitment="0x"
    )
    other.args["poolId"] = 2
    r = rebuild(POOL, [*base_stream(), other], [], TIMES)
    assert r.problems == [] and len(r.records) == 2


def test_slash_before_the_appeal_period_ended_is_flagged():
    r = rebuild(POOL, [*base_stream(), *invalidation(final_block=5)], registry_stream(3), TIMES)
    assert any("before its appeal period ended" in p for p in r.problems)


def test_an_overturned_appeal_leaves_the_record_pending_and_claimable():
    stream = [
        *base_stream(),
        accusation(),
        ev("WorkAppealed", "t5", 5, workKey=key(1), provider=PROV, voteEnd=800, bond=2),
        ev("DisputeResolved", "t6", 6, workKey=key(1), verdict=2, kind=2, accuser=VAL, provider=PROV, bondsTo=PROV,
           bonds=4),
        ev("WorkClaimed", "t7", 9, workKey=key(1), provider=PROV, units=5, reward=5 * RATE),
    ]  # fmt: skip
    r = rebuild(POOL, stream, registry_stream(), TIMES)
    assert r.problems == []
    rec = r.records[key(1)]
    assert (rec.status, rec.dispute, rec.verdict, len(rec.dispute_txs)) == ("claimed", "appeal", "overturned", 3)


def test_a_disputed_record_is_neither_pending_nor_claimable():
    r = rebuild(POOL, [*base_stream(), accusation()], registry_stream(), TIMES)
    assert r.records[key(1)].status == "disputed"
    r = rebuild(
        POOL, [*base_stream(), accusation(), ev("WorkClaimed", "t9", 9, workKey=key(1), provider=PROV, units=5,
                                               reward=50)], registry_stream(), TIMES
    )  # fmt: skip
    assert any("claimed while disputed" in p for p in r.problems)


def test_soft_invalidation_is_an_accusation_revoked_at_its_end_with_the_reward_forfeited():
    soft = ev("WorkSoftInvalidated", "t3", 5, workKey=key(1), validator=VAL, provider=PROV, units=5, evidenceHash="0x1",
              appealEnd=APPEAL_END)  # fmt: skip
    r = rebuild(POOL, [*base_stream(), soft], registry_stream(), TIMES)
    assert r.problems == []
    assert (r.records[key(1)].status, r.records[key(1)].dispute) == ("disputed", "accusation")
    final = ev("DisputeResolved", "t6", 9, workKey=key(1), verdict=1, kind=1, accuser=VAL, provider=PROV,
               bondsTo=VAL, bonds=0)  # fmt: skip
    forfeit = ev("RewardForfeited", "t6", 9, workKey=key(1), to="0x" + "77" * 20, amount=50)
    r = rebuild(POOL, [*base_stream(), soft, forfeit, final], registry_stream(), TIMES)
    assert r.problems == []
    rec = r.records[key(1)]
    assert (rec.status, rec.soft, rec.slashed, rec.validator) == ("invalidated", True, 0, VAL)
    assert (r.totals.invalidated_units, r.totals.forfeited_tokens) == (5, 50)


def test_a_challenge_that_lapses_reopens_the_record_and_a_lapsed_appeal_revokes():
    challenged = ev("WorkChallenged", "t3", 5, workKey=key(1), challenger=VAL, provider=PROV, evidenceHash="0x1",
                    voteEnd=900, bond=2)  # fmt: skip
    lapsed_challenge = ev("DisputeResolved", "t4", 6, workKey=key(1), verdict=3, kind=3, accuser=VAL, provider=PROV,
                          bondsTo="0x" + "00" * 20, bonds=2)  # fmt: skip
    accused = ev("WorkAccused", "t5", 7, workKey=key(1), accuser=VAL, provider=PROV, evidenceHash="0xee",
                 appealEnd=APPEAL_END, bond=2)  # fmt: skip
    appealed = ev("WorkAppealed", "t6", 7, workKey=key(1), provider=PROV, voteEnd=800, bond=2)
    lapsed = ev("DisputeResolved", "t7", 9, workKey=key(1), verdict=3, kind=2, accuser=VAL, provider=PROV,
                bondsTo="0x" + "00" * 20, bonds=4)  # fmt: skip
    r = rebuild(POOL, [*base_stream(), challenged, lapsed_challenge, accused, appealed, lapsed], registry_stream(),
                TIMES)  # fmt: skip
    assert r.problems == []
    rec = r.records[key(1)]
    assert (rec.status, rec.soft, rec.dispute, rec.verdict) == ("invalidated", True, "appeal", "lapsed")
    assert r.totals.invalidated_units == 5
    # a second dispute while the first is open is not allowed
    r = rebuild(POOL, [*base_stream(), challenged, accused], registry_stream(), TIMES)
    assert any("disputed while" in p for p in r.problems)


def test_a_hard_accusation_superseding_a_soft_one_is_followed():
    soft = ev("WorkSoftInvalidated", "t3", 5, workKey=key(1), validator=VAL, provider=PROV, units=5, evidenceHash="0x1",
              appealEnd=APPEAL_END)  # fmt: skip
    ended = ev("DisputeResolved", "t4", 6, workKey=key(1), verdict=3, kind=1, accuser=VAL, provider=PROV,
               bondsTo=PROV, bonds=0)  # fmt: skip
    accused = ev("WorkAccused", "t4", 6, workKey=key(1), accuser=VAL, provider=PROV, evidenceHash="0xee",
                 appealEnd=APPEAL_END, bond=2)  # fmt: skip
    r = rebuild(POOL, [*base_stream(), soft, ended, accused], registry_stream(), TIMES)
    assert r.problems == []
    rec = r.records[key(1)]
    assert (rec.status, rec.soft, rec.dispute, rec.verdict) == ("disputed", False, "accusation", "open")
    assert r.totals.invalidated_units == 0
