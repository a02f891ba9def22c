"""Who may say what, and what to do with peers that misbehave: membership rules, replay windows, peer
scores and the full per-message validator. Pure: the caller passes `now` and a membership snapshot, so
every rule is testable without a network, a chain or a clock."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .envelope import (
    MAX_ENVELOPE_BYTES,
    Envelope,
    EnvelopeError,
    RejectReason,
    check_signature_form,
    checksum_address,
    decode,
    recover_sender,
)

ROLE_COORDINATOR = "coordinator"
ROLE_VALIDATOR = "validator"
ROLE_MEMBER = "member"


def normalize_address(addr: str) -> str | None:
    """EIP-55 form of `addr` (any case accepted), or None if it is not a 20-byte hex address. Chain data,
    peer ids and envelopes may spell the same address differently; comparisons go through this."""
    if type(addr) is not str:
        return None
    text = addr if addr.startswith(("0x", "0X")) else "0x" + addr
    if len(text) != 42:
        return None
    try:
        return checksum_address("0x" + text[2:].lower())
    except Exception:
        return None


def _normalize_all(addrs: frozenset[str] | set[str] | list[str] | tuple[str, ...]) -> frozenset[str]:
    out = set()
    for a in addrs:
        n = normalize_address(a)
        if n is None:
            raise ValueError(f"not an address: {a!r}")
        out.add(n)
    return frozenset(out)


@dataclass(frozen=True)
class Membership:
    """A snapshot of one pool's on-chain roles (refreshed by the host on chain events, never per message).

    Addresses are normalised to checksum form on construction, so lookups are case-insensitive."""

    pool: int
    coordinator: str
    validators: frozenset[str]
    members: frozenset[str]

    def __post_init__(self) -> None:
        coordinator = normalize_address(self.coordinator)
        if coordinator is None:
            raise ValueError(f"coordinator is not an address: {self.coordinator!r}")
        object.__setattr__(self, "coordinator", coordinator)
        object.__setattr__(self, "validators", _normalize_all(self.validators))
        object.__setattr__(self, "members", _normalize_all(self.members))

    def role(self, addr: str) -> str | None:
        """Highest role of `addr` in the pool (coordinator > validator > member), None for outsiders."""
        a = normalize_address(addr)
        if a is None:
            return None
        if a == self.coordinator:
            return ROLE_COORDINATOR
        if a in self.validators:
            return ROLE_VALIDATOR
        if a in self.members:
            return ROLE_MEMBER
        return None

    def may_send(self, addr: str, kind: str) -> bool:
        """Whether `addr` may publish messages of `kind`: tasks and policy versions only come from the
        coordinator (it alone trains and assigns work); verdicts from validators or the coordinator;
        rollouts from members (the workers that generate them); heartbeats from anyone with a role."""
        a = normalize_address(addr)
        if a is None:
            return False
        is_coord = a == self.coordinator
        if kind in ("task", "policy"):
            return is_coord
        if kind == "verdict":
            return is_coord or a in self.validators
        if kind == "rollout":
            return a in self.members
        if kind == "heartbeat":
            return is_coord or a in self.validators or a in self.members
        return False


class ReplayWindow:
    """Sliding anti-replay window per sender (as in IPsec/DTLS): the highest seq seen plus a bitmap of
    the `size` seqs ending at it. A seq is accepted once; seqs at or below `highest - size` are too old
    to tell apart from replays and are refused. Memory: `size` bits per sender, at most `max_senders`
    senders (least recently used evicted). An evicted sender starts afresh, so `max_senders` should
    exceed the pool's size; the time-skew check still bounds how old a replayed message can be."""

    def __init__(self, size: int = 1024, *, max_senders: int = 4096) -> None:
        if size < 1 or max_senders < 1:
            raise ValueError("size and max_senders must be positive")
        self.size = size
        self.max_senders = max_senders
        self._mask_all = (1 << size) - 1
        # sender -> (highest seq, bitmap: bit i set <=> seq highest - i was seen)
        self._state: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._state)

    def seen(self, sender: str, seq: int) -> bool:
        """Whether `accept(sender, seq)` would refuse, without recording anything."""
        state = self._state.get(sender)
        if state is None:
            return False
        highest, mask = state
        if seq > highest:
            return False
        offset = highest - seq
        return offset >= self.size or bool((mask >> offset) & 1)

    def accept(self, sender: str, seq: int) -> bool:
        """Record `seq` for `sender` and return True, or return False (recording nothing) for a seq
        already seen or too old."""
        state = self._state.get(sender)
        if state is None:
            self._state[sender] = (seq, 1)
            if len(self._state) > self.max_senders:
                self._state.popitem(last=False)
            return True
        highest, mask = state
        if seq > highest:
            shift = seq - highest
            # A huge jump must not build a huge integer: past `size` the old bitmap is entirely stale.
            mask = 1 if shift >= self.size else ((mask << shift) | 1) & self._mask_all
            self._state[sender] = (seq, mask)
        else:
            offset = highest - seq
            if offset >= self.size or (mask >> offset) & 1:
                return False
            self._state[sender] = (highest, mask | (1 << offset))
        self._state.move_to_end(sender)
        return True


# Score added per rejection. Heavy: things an honest peer never sends (garbage, forgeries, relaying
# someone else's message as its own, oversize). Light: things that happen to honest peers through clock
# drift, gossip duplicates, version upgrades or a membership cache lagging the chain.
DEFAULT_WEIGHTS: dict[RejectReason, float] = {
    RejectReason.MALFORMED: 10.0,
    RejectReason.OVERSIZE: 10.0,
    RejectReason.BAD_SIGNATURE: 10.0,
    RejectReason.SENDER_MISMATCH: 10.0,
    RejectReason.KIND: 4.0,
    RejectReason.NOT_ALLOWED: 4.0,
    RejectReason.NOT_MEMBER: 2.0,
    RejectReason.POOL: 2.0,
    RejectReason.VERSION: 1.0,
    RejectReason.REPLAY: 1.0,
    # Over its budget: an honest burst may overrun by a few messages, a flood by thousands (40 excess
    # messages within the decay make a ban).
    RejectReason.RATE: 0.5,
    # Not charged: a message arrives late through network delay, an overloaded relay or a third party
    # re-sending it, none of which is its author's doing (under overload, charging it banned honest
    # nodes). It is still dropped and counted.
    RejectReason.SKEW: 0.0,
    RejectReason.BANNED: 0.0,
}


class _Peer:
    __slots__ = ("ban_until", "counts", "last", "score")

    def __init__(self, now: float) -> None:
        self.score = 0.0
        self.last = now
        self.ban_until = -math.inf
        self.counts: Counter[RejectReason] = Counter()


class PeerScore:
    """Misbehaviour score per libp2p peer: each rejection adds its reason's weight, the score decays
    linearly by `decay_per_second`, and reaching `threshold` bans the peer for `ban_seconds` (the host
    then disconnects it and refuses it). Memory is bounded by `max_peers` (least recently penalised
    evicted), so the host's connection limit should stay below it."""

    def __init__(
        self,
        threshold: float = 20,
        ban_seconds: float = 300.0,
        decay_per_second: float = 0.1,
        *,
        weights: dict[RejectReason, float] | None = None,
        max_peers: int = 10_000,
    ) -> None:
        if threshold <= 0 or ban_seconds < 0 or decay_per_second < 0 or max_peers < 1:
            raise ValueError("threshold and max_peers must be positive, ban_seconds and decay non-negative")
        self.threshold = float(threshold)
        self.ban_seconds = float(ban_seconds)
        self.decay_per_second = float(decay_per_second)
        self.weights = {**DEFAULT_WEIGHTS, **(weights or {})}
        self.max_peers = max_peers
        self._peers: OrderedDict[str, _Peer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._peers)

    def _decay(self, p: _Peer, now: float) -> None:
        elapsed = max(0.0, now - p.last)  # a clock going backwards never raises a score
        p.score = max(0.0, p.score - elapsed * self.decay_per_second)
        p.last = max(p.last, now)

    def penalize(self, peer_id: str, reason: RejectReason, now: float) -> bool:
        """Count a rejection; True exactly when this one makes the peer banned (so the host disconnects
        it once). Rejections while banned are counted but do not extend the ban."""
        p = self._peers.get(peer_id)
        if p is None:
            p = _Peer(now)
            self._peers[peer_id] = p
            if len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer_id)
        p.counts[reason] += 1
        if now < p.ban_until:
            return False
        self._decay(p, now)
        p.score += self.weights.get(reason, 0.0)
        if p.score >= self.threshold:
            p.score = 0.0
            p.ban_until = now + self.ban_seconds
            return True
        return False

    def banned(self, peer_id: str, now: float) -> bool:
        """Whether `peer_id` is inside a ban at time `now`."""
        p = self._peers.get(peer_id)
        return p is not None and now < p.ban_until

    def score(self, peer_id: str, now: float) -> float:
        """Current (decayed) score, for metrics; does not modify state."""
        p = self._peers.get(peer_id)
        if p is None:
            return 0.0
        return max(0.0, p.score - max(0.0, now - p.last) * self.decay_per_second)

    def rejections(self, peer_id: str) -> dict[RejectReason, int]:
        """A copy of the per-reason rejection counters of `peer_id` (empty if unknown or evicted)."""
        p = self._peers.get(peer_id)
        return dict(p.counts) if p is not None else {}


# Per-sender budget of each kind: (messages per second, burst). An honest node sends a heartbeat every
# few seconds, a rollout announcement per file, a verdict per check (validators catch up in bursts);
# the coordinator a policy announcement every few seconds and tasks on demand. The rest of a flood is
# dropped at the first hop, so one member cannot crowd the others out of anyone's validation queue.
DEFAULT_BUDGETS: dict[str, tuple[float, float]] = {
    "heartbeat": (5.0, 50.0),
    "rollout": (20.0, 200.0),
    "verdict": (50.0, 500.0),
    "task": (100.0, 500.0),
    "policy": (5.0, 50.0),
}


class SenderBudget:
    """A token bucket per (sender, kind): `take` spends one message of the bucket, refilled at the
    kind's rate up to its burst. Kinds without a budget are unlimited. Memory is bounded by
    `max_buckets` (least recently used forgotten; a forgotten bucket starts full again, which only
    members, a set the chain bounds, can use)."""

    def __init__(self, budgets: dict[str, tuple[float, float]] | None = None, *, max_buckets: int = 16_384) -> None:
        self.budgets = dict(DEFAULT_BUDGETS if budgets is None else budgets)
        for kind, (rate, burst) in self.budgets.items():
            if not (rate > 0 and burst >= 1):
                raise ValueError(f"budget of {kind!r}: rate must be > 0 and burst >= 1, got {rate}, {burst}")
        self.max_buckets = max_buckets
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()  # -> (tokens, at)

    def take(self, sender: str, kind: str, now: float) -> bool:
        budget = self.budgets.get(kind)
        if budget is None:
            return True
        rate, burst = budget
        key = (sender, kind)
        tokens, at = self._buckets.pop(key, (burst, now))
        tokens = min(burst, tokens + max(0.0, now - at) * rate)  # a clock going backwards adds nothing
        ok = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if ok else tokens, max(at, now))
        if len(self._buckets) > self.max_buckets:
            self._buckets.popitem(last=False)
        return ok


class MessageValidator:
    """The topic validator's logic: bytes in, a trusted Envelope out, or EnvelopeError with the reason.

    Checks run cheapest-first up to the signature, then the identity and role checks, and the replay
    window is updated only once everything else passed, so a rejected message never burns a seq."""

    def __init__(
        self,
        pool: int,
        membership: Callable[[], Membership],
        *,
        max_bytes: int = MAX_ENVELOPE_BYTES,
        max_skew: float = 30.0,
        window: int = 1024,
        max_senders: int = 4096,
        budget: SenderBudget | None = None,
    ) -> None:
        self.pool = pool
        self.membership = membership
        self.max_bytes = max_bytes
        self.max_skew = max_skew
        self.replay = ReplayWindow(window, max_senders=max_senders)
        self.budget = budget

    def check(self, data: bytes, *, peer_address: str | None, now: float, author_verified: bool = False) -> Envelope:
        """Validate one received message. `peer_address` is the Ethereum address bound to the libp2p
        peer that sent it (None to skip that check, e.g. for locally published messages).

        `author_verified=True` states that `peer_address` is the author of a transport signature already
        verified over these exact bytes (GossipSub strict signing: the author's libp2p key is the same
        secp256k1 key as its Ethereum key). Then, when the envelope's sender is that address, the
        envelope signature adds no authenticity and its (costly) recovery is skipped; only its canonical
        form is checked. Any other case, a sender/author mismatch above all, takes the full check. The
        envelope's own signature is then not proven: to hand it on outside gossip, `verify_envelope` it."""
        try:
            size = len(data)
        except Exception:
            raise EnvelopeError(RejectReason.MALFORMED, "message is not bytes") from None
        if size > self.max_bytes:
            raise EnvelopeError(RejectReason.OVERSIZE, f"message is {size} bytes, limit {self.max_bytes}")
        env = decode(data, max_bytes=self.max_bytes)
        if env.pool != self.pool:
            raise EnvelopeError(RejectReason.POOL, f"message for pool {env.pool}, this topic is pool {self.pool}")
        peer = normalize_address(peer_address) if peer_address is not None else None
        if author_verified and peer is not None and peer == env.sender:
            check_signature_form(env.signature)
        else:
            signer = recover_sender(env)
            if signer != env.sender:
                raise EnvelopeError(RejectReason.BAD_SIGNATURE, f"signed by {signer}, claims sender {env.sender}")
            if peer_address is not None and peer != env.sender:
                raise EnvelopeError(
                    RejectReason.SENDER_MISMATCH,
                    f"libp2p source is bound to {peer_address}, envelope claims {env.sender}",
                )
        members = self.membership()
        if members.pool != env.pool or members.role(env.sender) is None:
            raise EnvelopeError(RejectReason.NOT_MEMBER, f"{env.sender} has no role in pool {env.pool}")
        if not members.may_send(env.sender, env.kind):
            raise EnvelopeError(
                RejectReason.NOT_ALLOWED, f"{env.sender} ({members.role(env.sender)}) may not send {env.kind}"
            )
        if not abs(env.time - now) <= self.max_skew:
            raise EnvelopeError(
                RejectReason.SKEW,
                f"message time {env.time:.3f} is {env.time - now:+.3f}s from now (max {self.max_skew}s)",
            )
        if self.replay.seen(env.sender, env.seq):
            raise EnvelopeError(RejectReason.REPLAY, f"seq {env.seq} from {env.sender} already seen or too old")
        # after the signature (nobody spends another's budget) and the replay check (a copy costs nothing)
        if self.budget is not None and not self.budget.take(env.sender, env.kind, now):
            raise EnvelopeError(RejectReason.RATE, f"{env.sender} is over its budget of {env.kind} messages")
        if not self.replay.accept(env.sender, env.seq):
            raise EnvelopeError(RejectReason.REPLAY, f"seq {env.seq} from {env.sender} already seen or too old")
        return env
