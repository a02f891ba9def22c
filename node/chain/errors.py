"""Errors of the chain layer.

Like every `node.errors.IntellectError`, each carries a one-line message that names the problem and,
where there is one, the fix (`hint`). The CLI prints `str(error)` and exits non-zero; nothing here prints.
"""

from __future__ import annotations

from typing import Any

from node.errors import ConfigError, IntellectError


class ChainError(IntellectError):
    """Base class: a failure talking to the chain or a rule the chain enforces."""


class RpcUnavailable(ChainError):
    """The JSON-RPC endpoint could not be reached (after bounded retries)."""


class RpcError(ChainError):
    """The node answered with a JSON-RPC error that is not a contract revert."""

    def __init__(self, message: str, code: int | None = None, data: Any = None, hint: str = "") -> None:
        super().__init__(message, hint)
        self.code = code
        self.data = data


class WrongChain(ChainError):
    """The RPC endpoint serves another chain than the deployment file names."""


class DeploymentError(ChainError, ConfigError):
    """The deployment file is missing, unreadable or does not match the chain."""


class KeyLoadError(ChainError, ConfigError):
    """A key could not be loaded (missing keystore, wrong password, malformed hex)."""


class InsufficientFunds(ChainError):
    """The sending account cannot pay for gas (or value)."""


class TxTimeout(ChainError):
    """A sent transaction was not mined within the time allowed. It may still be mined later."""

    def __init__(self, message: str, tx_hash: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.tx_hash = tx_hash


class ContractRevert(ChainError):
    """A contract call reverted; `name` and `args` hold the decoded custom error when known."""

    def __init__(self, message: str, name: str | None, args: dict[str, Any], data: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.name = name
        self.args = args
        self.data = data


class NonceTaken(ChainError):
    """Another transaction of the same account was mined with this transaction's nonce: these bytes can
    never be mined (whoever holds the key sent something else)."""

    def __init__(self, message: str, tx_hash: str, nonce: int, hint: str = "") -> None:
        super().__init__(message, hint)
        self.tx_hash = tx_hash
        self.nonce = nonce
