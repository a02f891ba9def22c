"""The deployment file: which chain, which contract addresses, from which block.

Written by `intellect-node contracts deploy`; read by every other command. Pure data + file I/O.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eth_utils import is_address, to_checksum_address

from node.fsio import write_file

from .abi import CONTRACT_NAMES
from .errors import DeploymentError


@dataclass(frozen=True)
class Network:
    name: str
    chain_id: int
    default_rpc_url: str | None
    local: bool


NETWORKS: dict[str, Network] = {
    "local": Network("local", 31337, "http://127.0.0.1:8545", True),
    "base-sepolia": Network("base-sepolia", 84532, None, False),
}

DEFAULT_DEPLOYMENT = "deployment.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Deployment:
    chain_id: int
    contracts: dict[str, str]
    block: int
    network: str = "local"
    deployer: str = ""
    rpc_url: str = ""
    version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def address(self, name: str) -> str:
        try:
            return self.contracts[name]
        except KeyError:
            raise DeploymentError(
                f"the deployment file lists no {name} contract", "redeploy with `contracts deploy`"
            ) from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "deployment file") -> Deployment:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise DeploymentError(f"{source} is not valid JSON ({exc})", "redeploy or restore the file") from None
        if not isinstance(data, dict):
            raise DeploymentError(f"{source} is not a JSON object", "redeploy or restore the file")
        if data.get("version") != FORMAT_VERSION:
            raise DeploymentError(f"{source} has format version {data.get('version')!r}, expected {FORMAT_VERSION}")
        try:
            chain_id = int(data["chain_id"])
            block = int(data["block"])
            contracts = dict(data["contracts"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DeploymentError(f"{source} lacks a valid field ({exc})", "redeploy or restore the file") from None
        missing = [n for n in CONTRACT_NAMES if n not in contracts]
        if missing:
            raise DeploymentError(f"{source} lacks addresses for {', '.join(missing)}")
        for name, addr in contracts.items():
            if not is_address(addr):
                raise DeploymentError(f"{source}: {name} address {addr!r} is not an address")
        return cls(
            chain_id=chain_id,
            contracts={k: to_checksum_address(v) for k, v in contracts.items()},
            block=block,
            network=str(data.get("network", "local")),
            deployer=str(data.get("deployer", "")),
            rpc_url=str(data.get("rpc_url", "")),
            extra=dict(data.get("extra", {})),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Deployment:
        p = Path(path)
        try:
            text = p.read_text()
        except FileNotFoundError:
            raise DeploymentError(
                f"deployment file {p} not found",
                "run `intellect-node contracts deploy` or pass --deployment FILE / set INTELLECT_DEPLOYMENT",
            ) from None
        except OSError as exc:
            raise DeploymentError(f"cannot read deployment file {p}: {exc.strerror}") from None
        return cls.from_json(text, str(p))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Atomic write: a crash leaves the old file or the new one, never half of one."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_file(p, self.to_json().encode())
