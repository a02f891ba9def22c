"""The validator's status rules (`node.validator.rules`), each transition on its own."""

from __future__ import annotations

from node.validator import rules


def test_a_record_that_left_the_window_is_settled_unless_it_is_our_accusation() -> None:
    # our accusation, still disputed: we follow it to its end
    assert rules.after_record_left("invalid", True, "accusation", "disputed") == "accused"
    assert rules.after_record_left("invalid", True, "appeal", "disputed") == "accused"
    # our invalidation landed (a soft one, or a challenge we won)
    assert rules.after_record_left("invalid", True, "none", "invalidated") == "invalidated"
    # someone else invalidated what we found invalid too
    assert rules.after_record_left("invalid", False, "accusation", "invalidated") == "invalidated"
    # claimed, or disputed by someone else, or invalidated though we never found it invalid
    assert rules.after_record_left("pending", False, "none", "claimed") == "settled"
    # another party's open challenge: unchanged (looked at again once it ends; one that fails reopens it)
    assert rules.after_record_left("invalid", False, "challenge", "disputed") == "invalid"
    assert rules.after_record_left("pending", False, "challenge", "disputed") == "pending"
    assert rules.after_record_left("invalid", False, "accusation", "disputed") == "settled"
    assert rules.after_record_left("pending", False, "accusation", "invalidated") == "settled"


def test_deadlines_and_margins() -> None:
    assert not rules.too_late(now=100, margin=30, deadline=131)
    assert rules.too_late(now=101, margin=30, deadline=131)
    assert not rules.last_chance(now=70, margin=30, deadline=131)
    assert rules.last_chance(now=71, margin=30, deadline=131)
    # every record too late to act on was given its last chance before
    for now in range(0, 200):
        assert not rules.too_late(now, 30, 131) or rules.last_chance(now, 30, 131)


def test_verdicts_errors_and_invalidations() -> None:
    assert (rules.after_check(True), rules.after_check(False)) == ("ok", "invalid")
    assert rules.after_internal_error(1, 3, "pending") == "pending"
    assert rules.after_internal_error(2, 3, "invalid") == "invalid"
    assert rules.after_internal_error(3, 3, "pending") == "error"


def test_disputes_and_duties() -> None:
    assert rules.after_dispute("open") is None
    assert rules.after_dispute("upheld") == "invalidated"
    assert rules.after_dispute("overturned") == "overturned"
    assert rules.after_dispute("lapsed") == "settled"
    assert rules.duty_after_juror_state(1) is None  # drawn: still to vote
    assert rules.duty_after_juror_state(2) == "voted"
    assert rules.duty_after_juror_state(0) == "not-drawn"
    assert set(rules.OPEN) == {"pending", "invalid", "unsigned"}


def test_the_state_keeps_records_duties_and_the_cursor_together(tmp_path) -> None:
    from node.chain.abi import DecodedEvent
    from node.validator.state import ValidatorState

    def recorded(i: int) -> DecodedEvent:
        args = {"workKey": f"0x{i:064x}", "node": "0xN", "provider": "0xP", "units": 5, "policyVersion": 0}
        return DecodedEvent("WorkLedger", "WorkRecorded", args, "0x", 10 + i, f"0xt{i}", 0)

    st = ValidatorState(tmp_path / "v.db")
    move = [("INSERT OR REPLACE INTO kv(k, v) VALUES(?, ?)", ("cursor", "12"))]
    assert st.add_records([recorded(1), recorded(2), recorded(1)], move) == 3
    assert st.store.get("cursor") == "12"
    assert [r["work_key"] for r in st.open_checks(rules.OPEN)] == [f"0x{1:064x}", f"0x{2:064x}"]
    k1 = f"0x{1:064x}"
    st.set_status(k1, "skipped")
    assert [r["work_key"] for r in st.open_checks(rules.OPEN)] == [f"0x{2:064x}"]
    st.mark_suspect(k1, "the trainer refused it")
    assert st.check(k1)["status"] == "pending" and st.suspect(k1) == "the trainer refused it"
    assert (st.count_error(k1), st.count_error(k1)) == (1, 2)
    st.set_sent(k1, "accused", "0xtx")
    assert st.accused() == [k1] and st.check(k1)["tx"] == "0xtx"
    assert st.sampling_secret() == ValidatorState(tmp_path / "v.db").sampling_secret()


def test_failures_near_their_threshold_and_unserved_files_are_invalidated_softly() -> None:
    def verdict(reason: str, **figures: float) -> dict:
        return {"ok": reason == "ok", "verdict": {"reason": reason, "detail": "", "figures": figures}}

    far, near = verdict("replay_mismatch", near_threshold=0.0), verdict("replay_mismatch", near_threshold=1.0)
    assert rules.stored_reason(far) == "replay_mismatch" and rules.invalidation_is_hard("replay_mismatch")
    assert rules.stored_reason(near) == "replay_mismatch:near-threshold"
    assert not rules.invalidation_is_hard(rules.stored_reason(near))  # honest hardware may be an outlier
    assert not rules.invalidation_is_hard("data_unavailable")  # nobody can show what it held
    assert rules.invalidation_is_hard(rules.stored_reason(verdict("toploc_exponent_mismatch")))
    # a committee member upholds only what it would have invalidated hard itself
    assert rules.vote_upholds(far) and not rules.vote_upholds(near) and not rules.vote_upholds(verdict("ok"))


def test_validators_take_turns_to_invalidate_a_record_in_an_order_all_of_them_compute() -> None:
    """A trainer's hint reaches every validator at once; two accusations estimated before either was mined
    left one mined as a revert (seen in test_crash.py). Each validator's turn is its place in an order drawn
    from the work key: the same on every validator, a permutation, and not always the same validator first."""
    from node.validator.rules import invalidation_turn

    vals = frozenset({"0x" + f"{i:040x}" for i in range(1, 4)})
    firsts = set()
    for n in range(40):
        key = "0x" + f"{n:064x}"
        turns = {v: invalidation_turn(key, v.upper().replace("0X", "0x"), vals) for v in vals}
        assert sorted(turns.values()) == [0, 1, 2], turns  # one turn each, whatever the address's case
        firsts |= {v for v, t in turns.items() if t == 0}
    assert firsts == vals  # the first turn moves between validators with the key
    # a validator not (yet) in the snapshot still gets a turn of its own
    assert invalidation_turn("0x" + "ab" * 32, "0x" + "ff" * 20, vals) in range(4)
