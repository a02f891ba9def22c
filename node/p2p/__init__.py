"""Peer-to-peer layer. `envelope` and `rules` are the pure protocol core (no I/O, no clock: time is a
parameter); the libp2p/trio host only moves bytes and calls `MessageValidator.check` and `PeerScore`."""

from .envelope import (
    KINDS,
    MAX_ENVELOPE_BYTES,
    VERSION,
    Envelope,
    EnvelopeError,
    RejectReason,
    decode,
    encode,
    recover_sender,
    seal,
    signing_payload,
    verify_envelope,
)
from .rules import (
    DEFAULT_BUDGETS,
    Membership,
    MessageValidator,
    PeerScore,
    ReplayWindow,
    SenderBudget,
    normalize_address,
)

# The trio/libp2p layers (`host.P2PNode`, `network.PoolNetwork`) are imported from their modules, so
# that the pure core stays importable without libp2p.

__all__ = [
    "DEFAULT_BUDGETS",
    "KINDS",
    "MAX_ENVELOPE_BYTES",
    "VERSION",
    "Envelope",
    "EnvelopeError",
    "Membership",
    "MessageValidator",
    "PeerScore",
    "RejectReason",
    "ReplayWindow",
    "SenderBudget",
    "decode",
    "encode",
    "normalize_address",
    "recover_sender",
    "seal",
    "signing_payload",
    "verify_envelope",
]
