"""The one error hierarchy of intellect-node.

Every error this project raises on purpose is an `IntellectError`: a one-line `message` that names the
problem and, where there is one, a `hint` with the fix. The CLI catches the root once and prints
`error: <message>; <hint>` with a non-zero exit; daemons log it and go on or stop. Nothing here prints.

The families below the root say whose problem it is:

- `ConfigError`: a file, flag or key the user gave is missing, unreadable or wrong;
- `PeerError`: another party (the coordinator, a peer, a weight source) did not answer, or answered
  something the protocol does not allow;
- `node.chain.errors.ChainError`: a failure talking to the chain, or a rule the chain enforces;
- `node.store.StoreError`: the daemon's own state file cannot be opened or written.

Errors about hostile bytes (`RolloutFormatError`, `ProtocolError`, `EnvelopeError`, ...) are also
`ValueError`s, so that code which parses untrusted input can refuse anything it cannot read with one
`except ValueError`.
"""

from __future__ import annotations


class IntellectError(Exception):
    """Root of the project's errors: a one-line message and an optional hint (what to do about it)."""

    def __init__(self, message: str = "", hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class ConfigError(IntellectError):
    """A file, flag, environment variable or key the user gave is missing, unreadable or malformed."""


class PeerError(IntellectError):
    """Another party did not answer in time or answered something the protocol does not allow."""


def one_line(exc: BaseException) -> str:
    """The user-facing line of any exception: its message (and hint) with newlines folded."""
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())
