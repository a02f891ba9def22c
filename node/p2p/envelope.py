"""Signed gossip envelopes: canonical msgpack encoding, strict decoding and signer recovery.

Everything here is pure (no I/O, no clock): the libp2p/trio host only moves the bytes produced by
`encode` and hands received bytes to `decode` / `node.p2p.rules.MessageValidator`. Anyone can join the
network, so `decode` must turn *any* byte string into either an `Envelope` or an `EnvelopeError`; no
other exception may escape, or a peer could crash a topic validator with crafted bytes.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

import coincurve
import msgpack
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address

from node.errors import PeerError

VERSION = 1
KINDS = ("task", "rollout", "verdict", "heartbeat", "policy")
MAX_ENVELOPE_BYTES = 256 * 1024
DOMAIN = b"intellect-node/envelope/v1\x00"
SIGNATURE_BYTES = 65
FIELD_COUNT = 8
MAX_SEQ = 2**63  # exclusive; fits a signed 64-bit integer in every language a peer might use
MAX_POOL = 2**64  # exclusive; msgpack integers stop at 64 bits
# secp256k1 group order: signatures with s above half of it are the malleable twin of a low-s one.
_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
# Envelopes are an array of 8 scalars; a little head-room lets a future version add fields and still be
# reported as VERSION (not MALFORMED) by this decoder.
_MAX_ARRAY = 32


@lru_cache(maxsize=8192)
def checksum_address(addr: str) -> str:
    """`to_checksum_address`, memoised: it costs a keccak and ~20 us, and the per-message checks call it
    several times with the few addresses of a pool. Bounded; raises like the original for non-addresses."""
    return to_checksum_address(addr)


class RejectReason(StrEnum):
    """Why a message was dropped; also the key of per-peer rejection counters and score weights."""

    MALFORMED = "malformed"
    VERSION = "version"
    KIND = "kind"
    POOL = "pool"
    OVERSIZE = "oversize"
    BAD_SIGNATURE = "bad_signature"
    SENDER_MISMATCH = "sender_mismatch"
    NOT_MEMBER = "not_member"
    NOT_ALLOWED = "not_allowed"
    REPLAY = "replay"
    SKEW = "skew"
    RATE = "rate"
    BANNED = "banned"


class EnvelopeError(PeerError, ValueError):
    """The single exception type of this package: a rejected message, with a machine-readable reason."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason


@dataclass(frozen=True)
class Envelope:
    """One gossip message. `body` is opaque (callers msgpack their own bodies); `signature` is the
    65-byte r||s||v signature by `sender` over `signing_payload(...)`."""

    version: int
    kind: str
    pool: int
    sender: str
    seq: int
    time: float
    body: bytes
    signature: bytes


def _is_int(value: object) -> bool:
    # bool is a subclass of int; a msgpack `true` must never pass as version 1 or seq 1.
    return type(value) is int


def _validate_fields(version: Any, kind: Any, pool: Any, sender: Any, seq: Any, time: Any, body: Any) -> None:
    """Raise EnvelopeError unless the unsigned fields have the exact types and ranges of version 1.

    VERSION is decided first because a future version may change the layout of everything else."""
    if not _is_int(version):
        raise EnvelopeError(RejectReason.MALFORMED, f"version must be an integer, got {type(version).__name__}")
    if version != VERSION:
        raise EnvelopeError(
            RejectReason.VERSION, f"unsupported envelope version {version} (this node speaks {VERSION})"
        )
    if type(kind) is not str:
        raise EnvelopeError(RejectReason.MALFORMED, f"kind must be a string, got {type(kind).__name__}")
    if kind not in KINDS:
        raise EnvelopeError(RejectReason.KIND, f"unknown kind {kind[:32]!r} (expected one of {', '.join(KINDS)})")
    if not _is_int(pool) or not 0 <= pool < MAX_POOL:
        raise EnvelopeError(RejectReason.MALFORMED, "pool must be an integer in [0, 2**64)")
    if type(sender) is not str or len(sender) != 42 or not sender.startswith("0x"):
        raise EnvelopeError(RejectReason.MALFORMED, "sender must be a 0x-prefixed 40-hex-digit address")
    try:
        checksummed = checksum_address(sender)
    except Exception:
        raise EnvelopeError(RejectReason.MALFORMED, "sender is not a hex address") from None
    if checksummed != sender:
        # One canonical spelling per address: the same signed content cannot travel as several byte strings.
        raise EnvelopeError(RejectReason.MALFORMED, "sender must be EIP-55 checksummed")
    if not _is_int(seq) or not 0 <= seq < MAX_SEQ:
        raise EnvelopeError(RejectReason.MALFORMED, "seq must be an integer in [0, 2**63)")
    if type(time) is not float or not math.isfinite(time):
        raise EnvelopeError(RejectReason.MALFORMED, "time must be a finite float (unix seconds)")
    if type(body) is not bytes:
        raise EnvelopeError(RejectReason.MALFORMED, f"body must be bytes, got {type(body).__name__}")


def _pack(fields: list[Any]) -> bytes:
    # msgpack-python writes every int and str in its shortest form and floats as float64, so the same
    # values always give the same bytes: that is what makes the encoding canonical.
    return msgpack.packb(fields, use_bin_type=True)


def signing_payload(version: int, kind: str, pool: int, sender: str, seq: int, time: float, body: bytes) -> bytes:
    """The exact bytes that are signed: a domain prefix (so an envelope signature can never be replayed as
    a signature of anything else the node key signs) followed by the canonical msgpack of the fields."""
    _validate_fields(version, kind, pool, sender, seq, time, body)
    return DOMAIN + _pack([version, kind, pool, sender, seq, time, body])


def _signable(payload: bytes) -> Any:
    return encode_defunct(primitive=keccak(payload))


# EIP-191 "personal message" prefix of a 32-byte message: what `encode_defunct(primitive=...)` signs.
_EIP191_PREFIX_32 = b"\x19Ethereum Signed Message:\n32"
# Per account: its checksummed address and its key as a libsecp256k1 object. `LocalAccount.sign_message`
# re-parses the key and derives its public key (an elliptic-curve multiplication) on every call: 0.56 ms a
# message against 0.06 ms for the signature itself. Weak: an account that is dropped takes its entry along.
_SIGNERS: weakref.WeakKeyDictionary[LocalAccount, tuple[str, coincurve.PrivateKey]] = weakref.WeakKeyDictionary()


def _signer(account: LocalAccount) -> tuple[str, coincurve.PrivateKey]:
    entry = _SIGNERS.get(account)
    if entry is None:
        entry = _SIGNERS[account] = (to_checksum_address(account.address), coincurve.PrivateKey(bytes(account.key)))
    return entry


def sign_payload(account: LocalAccount, payload: bytes) -> bytes:
    """The 65-byte signature (r, s, v = 27 + recovery id) that `account.sign_message(_signable(payload))`
    gives: the same deterministic (RFC 6979) low-s ECDSA over the same EIP-191 hash, a tenth of the cost."""
    digest = keccak(_EIP191_PREFIX_32 + keccak(payload))
    rsv = _signer(account)[1].sign_recoverable(digest, hasher=None)
    return rsv[:64] + bytes([rsv[64] + 27])


def seal(account: LocalAccount, *, kind: str, pool: int, seq: int, time: float, body: bytes) -> Envelope:
    """Build and sign an envelope from `account`; `time` is a parameter because this module has no clock."""
    sender = _signer(account)[0]
    time = float(time)
    payload = signing_payload(VERSION, kind, pool, sender, seq, time, body)
    return Envelope(VERSION, kind, pool, sender, seq, time, body, sign_payload(account, payload))


def encode(env: Envelope) -> bytes:
    """Canonical wire form: the msgpack array [version, kind, pool, sender, seq, time, body, signature]."""
    _validate_fields(env.version, env.kind, env.pool, env.sender, env.seq, env.time, env.body)
    if type(env.signature) is not bytes or len(env.signature) != SIGNATURE_BYTES:
        raise EnvelopeError(RejectReason.MALFORMED, f"signature must be exactly {SIGNATURE_BYTES} bytes")
    return _pack([env.version, env.kind, env.pool, env.sender, env.seq, env.time, env.body, env.signature])


def decode(data: bytes, *, max_bytes: int = MAX_ENVELOPE_BYTES) -> Envelope:
    """Parse wire bytes strictly. Raises EnvelopeError (OVERSIZE, MALFORMED, VERSION or KIND) and nothing else.

    The size is checked before unpacking and the unpacker's length limits are set so that a small input
    cannot make it allocate much. The signature is NOT checked here (see `recover_sender`)."""
    try:
        size = len(data)
        raw = bytes(data)
    except Exception:
        raise EnvelopeError(RejectReason.MALFORMED, f"expected bytes, got {type(data).__name__}") from None
    if size > max_bytes:
        raise EnvelopeError(RejectReason.OVERSIZE, f"envelope is {size} bytes, limit {max_bytes}")
    try:
        obj = msgpack.unpackb(
            raw,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_array_len=_MAX_ARRAY,
            max_map_len=_MAX_ARRAY,
            max_ext_len=0,
        )
    except Exception as exc:  # ExtraData, FormatError, StackError, UnicodeDecodeError, OutOfData, ...
        raise EnvelopeError(RejectReason.MALFORMED, f"not a msgpack value ({type(exc).__name__})") from None
    if type(obj) is not list or not obj:
        raise EnvelopeError(RejectReason.MALFORMED, "envelope must be a non-empty msgpack array")
    if _is_int(obj[0]) and obj[0] != VERSION:
        raise EnvelopeError(RejectReason.VERSION, f"unsupported envelope version {obj[0]} (this node speaks {VERSION})")
    if len(obj) != FIELD_COUNT:
        raise EnvelopeError(RejectReason.MALFORMED, f"envelope must have {FIELD_COUNT} fields, got {len(obj)}")
    version, kind, pool, sender, seq, time, body, signature = obj
    _validate_fields(version, kind, pool, sender, seq, time, body)
    if type(signature) is not bytes or len(signature) != SIGNATURE_BYTES:
        raise EnvelopeError(RejectReason.MALFORMED, f"signature must be exactly {SIGNATURE_BYTES} bytes")
    env = Envelope(version, kind, pool, sender, seq, time, body, signature)
    if encode(env) != raw:
        # e.g. an integer in a wider format than needed, a str8 where fixstr fits, a float32 time.
        raise EnvelopeError(RejectReason.MALFORMED, "non-canonical msgpack encoding")
    return env


def check_signature_form(sig: bytes) -> None:
    """Raise EnvelopeError(BAD_SIGNATURE) unless `sig` is 65 bytes r||s||v with v in {27, 28}, 0 < r < n and
    0 < s <= n/2 (what eth-account produces). Cheap (no curve arithmetic): it keeps the wire form of a
    signed envelope unique even where the recovery itself is skipped."""
    if type(sig) is not bytes or len(sig) != SIGNATURE_BYTES:
        raise EnvelopeError(RejectReason.BAD_SIGNATURE, f"signature must be exactly {SIGNATURE_BYTES} bytes")
    r = int.from_bytes(sig[0:32], "big")
    s = int.from_bytes(sig[32:64], "big")
    v = sig[64]
    if v not in (27, 28) or not 0 < r < _SECP256K1_N or not 0 < s <= _SECP256K1_N // 2:
        raise EnvelopeError(RejectReason.BAD_SIGNATURE, "signature is not a canonical (low-s, v=27/28) signature")


def recover_sender(env: Envelope) -> str:
    """Checksummed address that signed `env`; raises EnvelopeError(BAD_SIGNATURE) if none can be recovered.

    Only low-s signatures with v in {27, 28} (what eth-account produces) are accepted, so each signed
    envelope has exactly one valid byte string."""
    sig = env.signature
    check_signature_form(sig)
    payload = signing_payload(env.version, env.kind, env.pool, env.sender, env.seq, env.time, env.body)
    try:
        return to_checksum_address(Account.recover_message(_signable(payload), signature=sig))
    except Exception:
        raise EnvelopeError(RejectReason.BAD_SIGNATURE, "no public key recovers from this signature") from None


def verify_envelope(env: Envelope) -> Envelope:
    """Check `env`'s own Ethereum signature: returns `env` if `env.sender` signed it, else raises
    EnvelopeError(BAD_SIGNATURE). For envelopes that arrive outside gossip (request-response, files,
    evidence handed to a contract): gossip validation may skip this recovery when the libp2p author,
    whose transport signature covers the same bytes, is the sender (see `MessageValidator.check`)."""
    signer = recover_sender(env)
    if signer != env.sender:
        raise EnvelopeError(RejectReason.BAD_SIGNATURE, f"signed by {signer}, claims sender {env.sender}")
    return env
