"""Chain access shared by every role: JSON-RPC, ABI codec, transactions, deployments."""

from .client import ChainClient
from .deployment import NETWORKS, Deployment, Network
from .errors import (
    ChainError,
    ContractRevert,
    DeploymentError,
    InsufficientFunds,
    KeyLoadError,
    NonceTaken,
    RpcError,
    RpcUnavailable,
    TxTimeout,
    WrongChain,
)
from .rpc import RpcClient
from .tx import Receipt, TxSender

__all__ = [
    "NETWORKS",
    "ChainClient",
    "ChainError",
    "ContractRevert",
    "Deployment",
    "DeploymentError",
    "InsufficientFunds",
    "KeyLoadError",
    "Network",
    "NonceTaken",
    "Receipt",
    "RpcClient",
    "RpcError",
    "RpcUnavailable",
    "TxSender",
    "TxTimeout",
    "WrongChain",
]
