"""Pure p2p core: envelopes, membership rules, replay windows, peer scores and the message validator."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.p2p import (
    KINDS,
    VERSION,
    Envelope,
    EnvelopeError,
    Membership,
    MessageValidator,
    PeerScore,
    RejectReason,
    ReplayWindow,
    SenderBudget,
    decode,
    encode,
    recover_sender,
    seal,
    signing_payload,
    verify_envelope,
)

POOL = 7
NOW = 1_700_000_000.0
COORD = Account.from_key(b"\x01" * 32)
VALIDATOR = Account.from_key(b"\x02" * 32)
MEMBER = Account.from_key(b"\x03" * 32)
OUTSIDER = Account.from_key(b"\x04" * 32)
MEMBERSHIP = Membership(
    pool=POOL,
    coordinator=COORD.address.lower(),  # deliberately not checksummed: comparisons are case-insensitive
    validators=frozenset({VALIDATOR.address}),
    members=frozenset({MEMBER.address.upper().replace("0X", "0x")}),
)


def make(
    account: LocalAccount = MEMBER,
    *,
    kind: str = "rollout",
    pool: int = POOL,
    seq: int = 1,
    time: float = NOW,
    body: bytes = b"hash",
) -> bytes:
    return encode(seal(account, kind=kind, pool=pool, seq=seq, time=time, body=body))


def validator(**kw: Any) -> MessageValidator:
    return MessageValidator(POOL, lambda: MEMBERSHIP, **kw)


def reason_of(v: MessageValidator, data: bytes, *, peer: str | None = None, now: float = NOW) -> RejectReason | None:
    try:
        v.check(data, peer_address=peer, now=now)
    except EnvelopeError as exc:
        return exc.reason
    return None


def raw(fields: list[Any]) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def forged() -> bytes:
    """Signed by OUTSIDER over a payload that claims MEMBER as the sender."""
    payload = signing_payload(VERSION, "rollout", POOL, MEMBER.address, 1, NOW, b"hash")
    sig = OUTSIDER.sign_message(encode_defunct(primitive=keccak(payload))).signature
    return encode(Envelope(VERSION, "rollout", POOL, MEMBER.address, 1, NOW, b"hash", bytes(sig)))


# --- envelopes ---------------------------------------------------------------------------------------


def test_roundtrip_and_recovery() -> None:
    env = seal(MEMBER, kind="rollout", pool=POOL, seq=3, time=NOW, body=b"\x00\x01")
    data = encode(env)
    assert decode(data) == env
    assert recover_sender(env) == MEMBER.address
    assert env.sender == MEMBER.address and len(env.signature) == 65


def test_signing_payload_is_domain_separated_and_covers_every_field() -> None:
    base = signing_payload(VERSION, "task", 1, MEMBER.address, 2, 3.0, b"x")
    assert base.startswith(b"intellect-node/envelope/v1\x00")
    variants = [
        signing_payload(VERSION, "policy", 1, MEMBER.address, 2, 3.0, b"x"),
        signing_payload(VERSION, "task", 2, MEMBER.address, 2, 3.0, b"x"),
        signing_payload(VERSION, "task", 1, COORD.address, 2, 3.0, b"x"),
        signing_payload(VERSION, "task", 1, MEMBER.address, 3, 3.0, b"x"),
        signing_payload(VERSION, "task", 1, MEMBER.address, 2, 3.5, b"x"),
        signing_payload(VERSION, "task", 1, MEMBER.address, 2, 3.0, b"y"),
    ]
    assert len({base, *variants}) == 7


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", RejectReason.MALFORMED),
        (b"\xc1", RejectReason.MALFORMED),
        (raw({"a": 1}), RejectReason.MALFORMED),
        (raw([]), RejectReason.MALFORMED),
        (raw([1, "task"]), RejectReason.MALFORMED),
        (raw([True, "task", 7, MEMBER.address, 1, NOW, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", True, MEMBER.address, 1, NOW, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 1, float("nan"), b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 1, float("inf"), b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 1, 5, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, -1, NOW, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 2**63, NOW, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address.lower(), 1, NOW, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, "0x" + "zz" * 20, 1, NOW, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 1, NOW, "text", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 1, NOW, b"", b"\x00" * 64]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 1, NOW, b"", b"\x00" * 65, 0]), RejectReason.MALFORMED),
        (raw([1, "task", 7, MEMBER.address, 1, NOW, b"", b"\x00" * 65]) + b"\x00", RejectReason.MALFORMED),
        (raw([1, b"task", 7, MEMBER.address, 1, NOW, b"", b"\x00" * 65]), RejectReason.MALFORMED),
        (raw([2, "task", 7, MEMBER.address, 1, NOW, b"", b"\x00" * 65]), RejectReason.VERSION),
        (raw([2, "new", "layout"]), RejectReason.VERSION),
        (raw([1, "gossip", 7, MEMBER.address, 1, NOW, b"", b"\x00" * 65]), RejectReason.KIND),
    ],
)
def test_decode_rejects(data: bytes, reason: RejectReason) -> None:
    with pytest.raises(EnvelopeError) as exc:
        decode(data)
    assert exc.value.reason == reason
    assert str(exc.value).startswith(reason.value)


def test_decode_rejects_non_canonical_encoding() -> None:
    env = seal(MEMBER, kind="rollout", pool=POOL, seq=1, time=NOW, body=b"")
    data = encode(env)
    # pool 7 as a uint64 (0xcf + 8 bytes) instead of a positive fixint: same value, different bytes.
    wide = data.replace(b"\xa7rollout\x07", b"\xa7rollout\xcf" + (7).to_bytes(8, "big"), 1)
    assert wide != data
    with pytest.raises(EnvelopeError) as exc:
        decode(wide)
    assert exc.value.reason == RejectReason.MALFORMED


def test_decode_checks_size_before_unpacking() -> None:
    data = make(body=b"x" * 2000)
    with pytest.raises(EnvelopeError) as exc:
        decode(data, max_bytes=1000)
    assert exc.value.reason == RejectReason.OVERSIZE
    # a 4-byte header claiming a 4 GiB bin is refused by the unpacker limits, not allocated
    with pytest.raises(EnvelopeError) as exc:
        decode(b"\xc6\xff\xff\xff\xff")
    assert exc.value.reason == RejectReason.MALFORMED


def test_non_canonical_signature_rejected() -> None:
    env = seal(MEMBER, kind="rollout", pool=POOL, seq=1, time=NOW, body=b"")
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    s = int.from_bytes(env.signature[32:64], "big")
    v = env.signature[64]
    twin = env.signature[:32] + (n - s).to_bytes(32, "big") + bytes([55 - v])  # the malleable high-s twin
    for sig in (twin, env.signature[:64] + b"\x00", b"\x00" * 65):
        with pytest.raises(EnvelopeError) as exc:
            recover_sender(Envelope(**{**env.__dict__, "signature": sig}))
        assert exc.value.reason == RejectReason.BAD_SIGNATURE


# --- membership ----------------------------------------------------------------------------------------


def test_membership_roles_are_case_insensitive() -> None:
    assert MEMBERSHIP.role(COORD.address) == "coordinator"
    assert MEMBERSHIP.role(VALIDATOR.address.lower()) == "validator"
    assert MEMBERSHIP.role(MEMBER.address) == "member"
    assert MEMBERSHIP.role(OUTSIDER.address) is None
    assert MEMBERSHIP.role("not an address") is None
    assert MEMBERSHIP.coordinator == COORD.address


def test_may_send_rules() -> None:
    allowed = {
        "coordinator": {"task", "policy", "verdict", "heartbeat"},
        "validator": {"verdict", "heartbeat"},
        "member": {"rollout", "heartbeat"},
    }
    for acct, role in ((COORD, "coordinator"), (VALIDATOR, "validator"), (MEMBER, "member")):
        for kind in KINDS:
            assert MEMBERSHIP.may_send(acct.address, kind) == (kind in allowed[role]), (role, kind)
    assert not any(MEMBERSHIP.may_send(OUTSIDER.address, k) for k in KINDS)
    assert not MEMBERSHIP.may_send(COORD.address, "unknown")
    # a validator that also runs a worker may announce rollouts
    both = Membership(POOL, COORD.address, frozenset({VALIDATOR.address}), frozenset({VALIDATOR.address}))
    assert both.role(VALIDATOR.address) == "validator" and both.may_send(VALIDATOR.address, "rollout")


def test_membership_rejects_bad_addresses() -> None:
    with pytest.raises(ValueError):
        Membership(POOL, "nope", frozenset(), frozenset())
    with pytest.raises(ValueError):
        Membership(POOL, COORD.address, frozenset({"0x1234"}), frozenset())


# --- the validator: each reason from a crafted message, and only from it --------------------------------


def test_valid_message_passes() -> None:
    env = validator().check(make(), peer_address=MEMBER.address.lower(), now=NOW)
    assert env.sender == MEMBER.address and env.kind == "rollout"


def test_verdict_from_validator_and_task_from_coordinator_accepted() -> None:
    v = validator()
    assert v.check(make(VALIDATOR, kind="verdict"), peer_address=VALIDATOR.address, now=NOW).kind == "verdict"
    assert v.check(make(COORD, kind="task"), peer_address=COORD.address, now=NOW).kind == "task"
    assert v.check(make(COORD, kind="policy", seq=2), peer_address=None, now=NOW).kind == "policy"


# (message, peer address, now, validator kwargs, expected reason, the one change under which it passes)
CASES: dict[RejectReason, tuple[Any, ...]] = {
    RejectReason.MALFORMED: (lambda: make()[:-1], MEMBER.address, NOW, {}, None),
    RejectReason.VERSION: (
        lambda: raw([2, "rollout", POOL, MEMBER.address, 1, NOW, b"hash", b"\x00" * 65]),
        MEMBER.address,
        NOW,
        {},
        None,
    ),
    RejectReason.KIND: (
        lambda: raw([1, "chat", POOL, MEMBER.address, 1, NOW, b"hash", b"\x00" * 65]),
        MEMBER.address,
        NOW,
        {},
        None,
    ),
    RejectReason.POOL: (lambda: make(pool=POOL + 1), MEMBER.address, NOW, {}, None),
    RejectReason.OVERSIZE: (
        lambda: make(body=b"x" * 5000),
        MEMBER.address,
        NOW,
        {"max_bytes": 4096},
        {"max_bytes": 8192},
    ),
    RejectReason.BAD_SIGNATURE: (forged, MEMBER.address, NOW, {}, None),
    RejectReason.SENDER_MISMATCH: (make, VALIDATOR.address, NOW, {}, {"peer": MEMBER.address}),
    RejectReason.NOT_MEMBER: (lambda: make(OUTSIDER), OUTSIDER.address, NOW, {}, None),
    RejectReason.NOT_ALLOWED: (lambda: make(kind="task"), MEMBER.address, NOW, {}, None),
    RejectReason.SKEW: (lambda: make(time=NOW + 31), MEMBER.address, NOW, {}, {"now": NOW + 1}),
}


@pytest.mark.parametrize("reason", list(CASES))
def test_each_reason_from_its_crafted_message(reason: RejectReason) -> None:
    build, peer, now, kw, relaxed = CASES[reason]
    data = build()
    assert reason_of(validator(**kw), data, peer=peer, now=now) == reason
    if relaxed is not None:  # the message is otherwise valid: relaxing that one condition lets it through
        kw2 = {**kw, **{k: v for k, v in relaxed.items() if k not in ("peer", "now")}}
        assert reason_of(validator(**kw2), data, peer=relaxed.get("peer", peer), now=relaxed.get("now", now)) is None


def test_every_reason_except_banned_is_covered() -> None:
    # REPLAY and RATE need a message before: test_replay_* and test_validator_drops_messages_over_the_budget_*
    assert set(CASES) | {RejectReason.REPLAY, RejectReason.RATE, RejectReason.BANNED} == set(RejectReason)


def test_replay_of_same_bytes_rejected() -> None:
    v = validator()
    data = make(seq=10)
    assert reason_of(v, data) is None
    assert reason_of(v, data) == RejectReason.REPLAY


def test_seq_reuse_with_different_body_rejected() -> None:
    v = validator()
    assert reason_of(v, make(seq=10, body=b"a")) is None
    assert reason_of(v, make(seq=10, body=b"b")) == RejectReason.REPLAY
    assert reason_of(v, make(seq=9, body=b"c")) is None  # out of order but inside the window: fine


def test_out_of_window_seq_rejected() -> None:
    v = validator(window=16)
    assert reason_of(v, make(seq=100)) is None
    assert reason_of(v, make(seq=84)) == RejectReason.REPLAY
    assert reason_of(v, make(seq=85)) is None


def test_time_skew_both_directions() -> None:
    v = validator(max_skew=30.0)
    assert reason_of(v, make(seq=1, time=NOW + 30.5)) == RejectReason.SKEW
    assert reason_of(v, make(seq=2, time=NOW - 30.5)) == RejectReason.SKEW
    assert reason_of(v, make(seq=3, time=NOW + 29.5)) is None
    assert reason_of(v, make(seq=4, time=NOW - 29.5)) is None


def test_rejected_message_does_not_burn_its_seq() -> None:
    v = validator()
    assert reason_of(v, make(seq=5, time=NOW + 100)) == RejectReason.SKEW
    assert reason_of(v, make(seq=5), peer=VALIDATOR.address) == RejectReason.SENDER_MISMATCH
    assert reason_of(v, make(seq=5, kind="task")) == RejectReason.NOT_ALLOWED
    assert reason_of(v, make(seq=5)) is None


def test_membership_is_read_per_message() -> None:
    current = {"m": MEMBERSHIP}
    v = MessageValidator(POOL, lambda: current["m"])
    assert reason_of(v, make(OUTSIDER, seq=1)) == RejectReason.NOT_MEMBER
    current["m"] = Membership(POOL, COORD.address, frozenset(), frozenset({OUTSIDER.address}))
    assert reason_of(v, make(OUTSIDER, seq=1)) is None
    current["m"] = Membership(POOL + 1, COORD.address, frozenset(), frozenset({OUTSIDER.address}))
    assert reason_of(v, make(OUTSIDER, seq=2)) == RejectReason.NOT_MEMBER  # snapshot of another pool


# --- replay window and peer scores -----------------------------------------------------------------------


def test_replay_window_semantics() -> None:
    w = ReplayWindow(size=8)
    assert w.accept("a", 0) and not w.accept("a", 0)
    assert w.accept("a", 20)
    assert not w.accept("a", 12)  # 20 - 8: out of the window
    assert w.accept("a", 13) and not w.accept("a", 13)
    assert w.seen("a", 13) and not w.seen("a", 14) and not w.seen("a", 21)
    assert w.accept("b", 13)  # windows are per sender


def test_replay_window_memory_is_bounded() -> None:
    w = ReplayWindow(size=1024, max_senders=100)
    for i in range(1000):
        assert w.accept(f"s{i}", 1)
    assert len(w) == 100
    assert not w.accept("s999", 1)  # recent ones are kept
    # a huge jump must not create a huge bitmap
    assert w.accept("j", 0) and w.accept("j", 2**63 - 1) and not w.accept("j", 0)
    assert max(mask.bit_length() for _, mask in w._state.values()) <= 1024


def test_peer_score_bans_after_bad_signatures_and_unbans() -> None:
    s = PeerScore(threshold=20, ban_seconds=300.0)
    assert not s.penalize("p", RejectReason.BAD_SIGNATURE, NOW)
    assert not s.penalize("p", RejectReason.BAD_SIGNATURE, NOW + 1)  # 19.9 after one second of decay
    assert not s.banned("p", NOW + 1)
    assert s.penalize("p", RejectReason.BAD_SIGNATURE, NOW + 2)
    assert s.banned("p", NOW + 3)
    assert not s.penalize("p", RejectReason.BAD_SIGNATURE, NOW + 3)  # already banned: reported once
    assert s.banned("p", NOW + 301)
    assert not s.banned("p", NOW + 302.5)
    assert s.rejections("p") == {RejectReason.BAD_SIGNATURE: 4}
    assert not s.banned("other", NOW)


def test_peer_score_tolerates_a_few_replays_and_decays() -> None:
    s = PeerScore(threshold=20, decay_per_second=0.1)
    for i in range(5):
        assert not s.penalize("p", RejectReason.REPLAY, NOW + i)
        assert not s.penalize("p", RejectReason.SKEW, NOW + i)
    assert not s.banned("p", NOW + 5)
    assert s.rejections("p") == {RejectReason.REPLAY: 5, RejectReason.SKEW: 5}
    t = NOW + 1000
    assert not s.penalize("q", RejectReason.MALFORMED, t)
    assert not s.penalize("q", RejectReason.MALFORMED, t + 100)  # 100 s at 0.1/s decayed the first one
    assert s.score("q", t + 100) == pytest.approx(10.0)
    assert s.penalize("q", RejectReason.OVERSIZE, t + 100)


def test_sender_budget_allows_a_burst_then_the_rate() -> None:
    b = SenderBudget({"heartbeat": (2.0, 5.0)})
    assert [b.take("a", "heartbeat", NOW) for _ in range(7)] == [True] * 5 + [False] * 2
    assert b.take("b", "heartbeat", NOW)  # per sender
    assert b.take("a", "rollout", NOW)  # kinds without a budget are not limited
    assert not b.take("a", "heartbeat", NOW + 0.4)  # 0.8 of a message earned
    assert b.take("a", "heartbeat", NOW + 0.5) and not b.take("a", "heartbeat", NOW + 0.5)
    assert [b.take("a", "heartbeat", NOW + 100) for _ in range(6)] == [True] * 5 + [False]  # refills to the burst
    assert not b.take("a", "heartbeat", NOW - 50)  # a clock going backwards earns nothing
    with pytest.raises(ValueError, match="rate must be > 0"):
        SenderBudget({"heartbeat": (0.0, 5.0)})


def test_sender_budget_memory_is_bounded() -> None:
    b = SenderBudget({"heartbeat": (1.0, 1.0)}, max_buckets=3)
    for i in range(10):
        b.take(f"s{i}", "heartbeat", NOW)
    assert len(b._buckets) == 3


def test_validator_drops_messages_over_the_budget_without_burning_their_seq() -> None:
    v = validator(budget=SenderBudget({"heartbeat": (1.0, 2.0)}))
    got = [reason_of(v, make(kind="heartbeat", seq=i)) for i in range(4)]
    assert got == [None, None, RejectReason.RATE, RejectReason.RATE]
    assert reason_of(v, make(kind="heartbeat", seq=0)) is RejectReason.REPLAY  # a copy spends nothing
    assert reason_of(v, make(kind="heartbeat", seq=2), now=NOW + 1.0) is None  # dropped, not burnt: it fits later
    # a forgery in MEMBER's name does not spend MEMBER's budget
    v2 = validator(budget=SenderBudget({"rollout": (1.0, 1.0)}))
    assert reason_of(v2, forged()) is RejectReason.BAD_SIGNATURE
    assert reason_of(v2, make(seq=5)) is None


def test_peer_score_memory_is_bounded() -> None:
    s = PeerScore(max_peers=100)
    for i in range(1000):
        s.penalize(f"p{i}", RejectReason.REPLAY, NOW)
    assert len(s) == 100
    assert s.rejections("p0") == {} and s.rejections("p999") == {RejectReason.REPLAY: 1}


# --- fuzzing -------------------------------------------------------------------------------------------

# --- the gossip fast path: author-verified messages skip the envelope signature recovery -------------


def _fast(v: MessageValidator, data: bytes, *, peer: str | None, now: float = NOW) -> RejectReason | None:
    try:
        v.check(data, peer_address=peer, now=now, author_verified=True)
    except EnvelopeError as exc:
        return exc.reason
    return None


@pytest.fixture
def recoveries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the envelope signature recoveries the validator performs (the real function still runs)."""
    import node.p2p.rules as rules_module

    calls: list[str] = []
    real = rules_module.recover_sender

    def counting(env: Envelope) -> str:
        calls.append(env.sender)
        return real(env)

    monkeypatch.setattr(rules_module, "recover_sender", counting)
    return calls


def test_fast_path_accepts_honest_messages_without_recovery(recoveries: list[str]) -> None:
    v = validator()
    for seq, (account, kind) in enumerate(
        [(MEMBER, "rollout"), (MEMBER, "heartbeat"), (VALIDATOR, "verdict"), (COORD, "task"), (COORD, "policy")]
    ):
        # Any spelling of the author's address matches the checksummed sender.
        env = v.check(
            make(account, kind=kind, seq=seq), peer_address=account.address.lower(), now=NOW, author_verified=True
        )
        assert (env.sender, env.kind) == (account.address, kind)
    assert recoveries == []


def test_fast_path_author_sender_mismatch_takes_the_full_check(recoveries: list[str]) -> None:
    # C's honest envelope relayed by B as B's own gossip: the envelope signature is valid, the author is not C.
    assert _fast(validator(), make(MEMBER), peer=VALIDATOR.address) == RejectReason.SENDER_MISMATCH
    # OUTSIDER's gossip carrying an envelope that claims MEMBER, signed by OUTSIDER: a forgery.
    assert _fast(validator(), forged(), peer=OUTSIDER.address) == RejectReason.BAD_SIGNATURE
    # A member forging another member's envelope is caught the same way.
    payload = signing_payload(VERSION, "rollout", POOL, MEMBER.address, 5, NOW, b"x")
    sig = VALIDATOR.sign_message(encode_defunct(primitive=keccak(payload))).signature
    fake = encode(Envelope(VERSION, "rollout", POOL, MEMBER.address, 5, NOW, b"x", bytes(sig)))
    assert _fast(validator(), fake, peer=VALIDATOR.address) == RejectReason.BAD_SIGNATURE
    # Without an author (local messages) or without the flag, nothing is taken on trust.
    assert _fast(validator(), forged(), peer=None) == RejectReason.BAD_SIGNATURE
    assert reason_of(validator(), forged(), peer=MEMBER.address) == RejectReason.BAD_SIGNATURE
    assert len(recoveries) == 5


@pytest.mark.parametrize("reason", [r for r in CASES if r is not RejectReason.BAD_SIGNATURE])
def test_fast_path_keeps_every_other_check(reason: RejectReason) -> None:
    build, peer, now, kw, relaxed = CASES[reason]
    data = build()
    assert _fast(validator(**kw), data, peer=peer, now=now) == reason
    if relaxed is not None:
        kw2 = {**kw, **{k: val for k, val in relaxed.items() if k not in ("peer", "now")}}
        assert _fast(validator(**kw2), data, peer=relaxed.get("peer", peer), now=relaxed.get("now", now)) is None


def test_fast_path_keeps_replay_and_canonical_signature_checks() -> None:
    v = validator()
    data = make(seq=9)
    assert _fast(v, data, peer=MEMBER.address) is None
    assert _fast(v, data, peer=MEMBER.address) == RejectReason.REPLAY
    # The high-s twin of a valid signature (equally valid as ECDSA) is refused without any recovery.
    env = decode(make(seq=10))
    r, s_, v_ = env.signature[:32], int.from_bytes(env.signature[32:64], "big"), env.signature[64]
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    twin = r + (n - s_).to_bytes(32, "big") + bytes([55 - v_])
    high_s = encode(
        Envelope(*[getattr(env, f) for f in ("version", "kind", "pool", "sender", "seq", "time", "body")], twin)
    )
    assert _fast(v, high_s, peer=MEMBER.address) == RejectReason.BAD_SIGNATURE
    assert _fast(v, make(seq=10), peer=MEMBER.address) is None  # the rejected twin did not burn seq 10


def test_verify_envelope_checks_the_envelope_signature_alone() -> None:
    env = seal(VALIDATOR, kind="verdict", pool=POOL, seq=1, time=NOW, body=b"ok")
    assert verify_envelope(env) is env
    with pytest.raises(EnvelopeError) as info:
        verify_envelope(decode(forged()))
    assert info.value.reason == RejectReason.BAD_SIGNATURE
    tampered = Envelope(
        *[getattr(env, f) for f in ("version", "kind", "pool", "sender", "seq", "time")], b"no", env.signature
    )
    with pytest.raises(EnvelopeError) as info:
        verify_envelope(tampered)
    assert info.value.reason == RejectReason.BAD_SIGNATURE


VALID = make(body=b"some rollout hash", seq=42)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_or_reason(data: bytes) -> None:
    try:
        decode(data)
    except EnvelopeError as exc:
        assert isinstance(exc.reason, RejectReason)


def _check_or_reason(data: bytes) -> None:
    try:
        validator().check(data, peer_address=MEMBER.address, now=NOW)
    except EnvelopeError as exc:
        assert isinstance(exc.reason, RejectReason)


def _flip(bits: set[int]) -> bytes:
    out = bytearray(VALID)
    for i in bits:
        out[i // 8] ^= 1 << (i % 8)
    return bytes(out)


mutations = st.one_of(
    st.sets(st.integers(0, len(VALID) * 8 - 1), min_size=1, max_size=8).map(_flip),
    st.integers(0, len(VALID) - 1).map(lambda n: VALID[:n]),
    st.binary(min_size=1, max_size=64).map(lambda extra: VALID + extra),
    st.tuples(st.integers(0, len(VALID)), st.binary(max_size=16)).map(lambda t: VALID[: t[0]] + t[1] + VALID[t[0] :]),
)


@FUZZ
@given(st.binary(max_size=512))
def test_fuzz_decode_arbitrary_bytes(data: bytes) -> None:
    _decode_or_reason(data)


@FUZZ
@given(mutations)
def test_fuzz_decode_and_check_mutated_envelopes(data: bytes) -> None:
    _decode_or_reason(data)
    _check_or_reason(data)


@FUZZ
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.text(max_size=50)
        | st.binary(max_size=80),
        lambda kids: st.lists(kids, max_size=9) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
        max_leaves=20,
    )
)
def test_fuzz_decode_and_check_structured_msgpack(value: object) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    _decode_or_reason(data)
    _check_or_reason(data)


@FUZZ
@given(
    kind=st.sampled_from(KINDS),
    pool=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**63 - 1),
    time=st.floats(allow_nan=False, allow_infinity=False),
    body=st.binary(max_size=200),
)
def test_fuzz_roundtrip(kind: str, pool: int, seq: int, time: float, body: bytes) -> None:
    env = seal(MEMBER, kind=kind, pool=pool, seq=seq, time=time, body=body)
    assert decode(encode(env)) == env
    assert recover_sender(env) == MEMBER.address


@settings(max_examples=60, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), payload=st.binary(max_size=300))
def test_sign_payload_gives_eth_accounts_signature(key: bytes, payload: bytes) -> None:
    """The cached signer signs exactly what `LocalAccount.sign_message` signs, byte for byte (recoverable,
    low-s, v in 27/28), so envelopes from nodes of either version check the same."""
    from node.p2p.envelope import _signable, sign_payload

    try:
        account = Account.from_key(key)
    except Exception:
        return  # not a valid secp256k1 secret (0 or >= the group order)
    assert sign_payload(account, payload) == bytes(account.sign_message(_signable(payload)).signature)


# --- bootstrap list from the pool record ---------------------------------------------------------------


def _peer_id(seed: int) -> str:
    from libp2p.peer.id import ID

    from node.p2p.host import identity_from_eth_key

    return str(ID.from_pubkey(identity_from_eth_key(bytes([seed]) * 32).public_key))


def test_parse_bootstrap_splits_validates_and_dedupes() -> None:
    from node.p2p.discovery import parse_bootstrap

    a, b = _peer_id(1), _peer_id(2)
    text = f"  /ip4/127.0.0.1/tcp/4001/p2p/{a},/dns4/boot.example.org/tcp/4001/p2p/{b}\n\t/ip4/127.0.0.1/tcp/4001/p2p/{a} ,, "
    assert parse_bootstrap(text) == [f"/ip4/127.0.0.1/tcp/4001/p2p/{a}", f"/dns4/boot.example.org/tcp/4001/p2p/{b}"]
    assert parse_bootstrap("") == []
    assert parse_bootstrap(" , \n ") == []
    assert parse_bootstrap(f"/ip6/::1/tcp/9/p2p/{b}") == [f"/ip6/::1/tcp/9/p2p/{b}"]


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("/ip4/127.0.0.1/tcp/4001", "/p2p/"),
        ("/p2p/{a}", "no transport"),
        ("/ip4/127.0.0.1/tcp/4001/p2p/notapeerid", "not a valid multiaddr"),
        ("/ip4/127.0.0.1/tcp/4001/p2p/QmX", "not a valid multiaddr"),
        ("127.0.0.1:4001", "must start with '/'"),
        ("/ip4/300.0.0.1/tcp/4001/p2p/{a}", "not a valid multiaddr"),
        ("/ip4/127.0.0.1/tcp/4001/p2p/{a}/p2p/{a}", "exactly one"),
        ("/ip4/127.0.0.1/tcp/4001/p2p/{a}/tcp/5", "exactly one"),
    ],
)
def test_parse_bootstrap_names_the_bad_entry(entry: str, why: str) -> None:
    from node.p2p.discovery import parse_bootstrap

    good = f"/ip4/127.0.0.1/tcp/1/p2p/{_peer_id(2)}"
    bad = entry.format(a=_peer_id(1))
    with pytest.raises(ValueError) as info:
        parse_bootstrap(f"{good}, {bad}")
    message = str(info.value)
    assert "entry 2" in message and bad[:100] in message and why in message, message


def test_parse_bootstrap_is_bounded() -> None:
    from node.p2p.discovery import MAX_BOOTSTRAP_ENTRIES, parse_bootstrap

    many = " ".join(f"/ip4/127.0.0.1/tcp/{4000 + i}/p2p/{_peer_id(1)}" for i in range(MAX_BOOTSTRAP_ENTRIES + 1))
    with pytest.raises(ValueError, match="limit"):
        parse_bootstrap(many)
    with pytest.raises(ValueError, match="limit"):
        parse_bootstrap("," * 20_000)
    with pytest.raises(ValueError, match="string"):
        parse_bootstrap(b"/ip4/127.0.0.1")  # type: ignore[arg-type]


def test_per_peer_bookkeeping_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh identities (one per connection, at no cost) cannot grow a node's rejection counts or bans."""
    import node.p2p.gate as gate_module
    from node.p2p.host import BoundedCounts, P2PNode

    counts = BoundedCounts(3)
    for i in range(10):
        counts[f"p{i}"] += 1
    counts["p9"] += 1
    assert dict(counts) == {"p7": 1, "p8": 1, "p9": 2} and counts["unknown"] == 0

    monkeypatch.setattr(gate_module, "MAX_TRACKED_PEERS", 5)
    node = P2PNode(private_key=bytes(Account.create().key))
    node.ban(MEMBER.address, 3600)
    for _ in range(20):
        node.ban(Account.create().address, 0.0)  # already expired: forgotten first
    assert len(node._bans) <= 5 and node.is_banned(MEMBER.address)
    for _ in range(20):
        node.ban(Account.create().address, 60.0)
    assert len(node._bans) <= 5 and node.is_banned(MEMBER.address)  # the longest ban is kept
