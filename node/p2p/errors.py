"""The p2p layer's errors."""

from __future__ import annotations

from node.errors import PeerError


class P2PError(PeerError):
    """Any failure of the p2p layer that a caller should handle: dial, timeout, size, remote error."""


class Refused(PeerError):
    """Raised by a request handler to turn a sender away (not a member, say): answered with a refusal,
    logged at debug level only, so outsiders cannot fill the log."""
