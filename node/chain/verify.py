"""What a block explorer (Etherscan/Basescan, Blockscout) needs to verify the deployed contracts.

`contracts deploy` writes, beside the deployment file `NAME.json`, a folder `NAME.verify/`:

- `<Contract>.input.json`: the contract's Solidity standard-JSON compiler input, with only the sources it
  was compiled from (the OpenZeppelin imports included) and the settings it was built with;
- `manifest.json`: the chain, the compiler's long version and, per contract, its address, its name as
  `path:Contract`, its licence, its ABI-encoded constructor arguments and its input file.

`contracts verify-info` reads the folder back. Everything comes from `artifacts/verify.json`, which
`tools/export_artifacts.py` builds from the forge build's solc metadata, so nothing here needs Foundry.
Pure data and file I/O; no chain access.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from node.fsio import atomic_dir

from .abi import ARTIFACTS, CONTRACT_NAMES
from .deployment import Deployment
from .errors import DeploymentError

BUNDLE = ARTIFACTS / "verify.json"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
#: What a compile of a written input reports: enough to compare with the chain (bytecode, immutables).
OUTPUTS = [
    "abi",
    "evm.bytecode.object",
    "evm.deployedBytecode.object",
    "evm.deployedBytecode.immutableReferences",
    "metadata",
]


KINDS = ("etherscan", "blockscout")


@dataclass(frozen=True)
class Explorer:
    name: str
    url: str
    kind: str  # "etherscan" or "blockscout": the API it speaks, and so forge's --verifier

    def verify_page(self, address: str) -> str:
        if self.kind == "etherscan":
            return f"{self.url}/verifyContract?a={address}"
        return f"{self.url}/address/{address}/contract-verification"


#: The public explorers of the network presets in node/chain/deployment.py (none for a local chain).
EXPLORERS: dict[str, tuple[Explorer, ...]] = {
    "base-sepolia": (
        Explorer("Basescan", "https://sepolia.basescan.org", "etherscan"),
        Explorer("Blockscout", "https://base-sepolia.blockscout.com", "blockscout"),
    ),
}


@dataclass(frozen=True)
class Contract:
    """One deployed contract, as an explorer's verification asks for it."""

    name: str
    address: str
    target: str  # `path:Contract`, the name explorers and forge want
    constructor_args: str  # 0x-hex, ABI-encoded
    license: str
    input_path: Path  # the standard-JSON input file


@dataclass(frozen=True)
class VerifyInfo:
    folder: Path
    chain_id: int
    network: str
    compiler: str  # the long version, e.g. v0.8.30+commit.73712a01
    optimizer: bool
    optimizer_runs: int
    evm_version: str
    contracts: tuple[Contract, ...]


@cache
def _bundle() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(BUNDLE.read_text())
    return data


def compiler_version() -> str:
    return str(_bundle()["compiler"])


def standard_input(name: str) -> dict[str, Any]:
    """The standard-JSON compiler input of one contract: its sources and the settings it was built with."""
    bundle = _bundle()
    entry = bundle["contracts"][name]
    return {
        "language": "Solidity",
        "sources": {path: {"content": bundle["sources"][path]["content"]} for path in entry["sources"]},
        "settings": {**bundle["settings"], "outputSelection": {entry["path"]: {name: OUTPUTS}}},
    }


def folder_for(deployment_path: str | os.PathLike[str]) -> Path:
    """`deployment.json` -> `deployment.verify` (beside it)."""
    return Path(deployment_path).with_suffix(".verify")


def _dump(data: object) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def write(dep: Deployment, deployment_path: str | os.PathLike[str]) -> Path:
    """Write the verification folder of `dep` beside its deployment file (replacing an older one whole);
    returns the folder."""
    args = dep.extra.get("constructor_args")
    if not isinstance(args, dict) or set(args) != set(CONTRACT_NAMES):
        raise DeploymentError("the deployment lacks its constructor arguments", "deploy with `contracts deploy`")
    bundle = _bundle()
    folder = folder_for(deployment_path)
    contracts = {}
    with atomic_dir(folder) as tmp:
        for name in CONTRACT_NAMES:
            entry = bundle["contracts"][name]
            (tmp / f"{name}.input.json").write_bytes(_dump(standard_input(name)))
            contracts[name] = {
                "address": dep.address(name),
                "contract": f"{entry['path']}:{name}",
                "constructor_args": args[name],
                "license": entry["license"],
                "input": f"{name}.input.json",
            }
        manifest = {
            "version": FORMAT_VERSION,
            "chain_id": dep.chain_id,
            "network": dep.network,
            "compiler": bundle["compiler"],
            "contracts": contracts,
        }
        (tmp / MANIFEST).write_bytes(_dump(manifest))
    return folder


def load(deployment_path: str | os.PathLike[str], dep: Deployment) -> VerifyInfo:
    """Read the verification folder of the deployment file at `deployment_path` (already loaded as `dep`)."""
    folder = folder_for(deployment_path)
    redeploy = "it is written by `contracts deploy` (redeploy, or pass the --deployment it was written for)"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("version") != FORMAT_VERSION:
            raise DeploymentError(f"{folder}: manifest format {manifest.get('version')!r}, not {FORMAT_VERSION}")
        contracts = []
        settings: dict[str, Any] = {}
        for name in CONTRACT_NAMES:
            c = manifest["contracts"][name]
            path = folder / str(c["input"])
            these = json.loads(path.read_text())["settings"]
            settings = settings or these
            if (these["optimizer"], these["evmVersion"]) != (settings["optimizer"], settings["evmVersion"]):
                raise DeploymentError(f"{folder}: the contracts' inputs disagree on the compiler settings", redeploy)
            contracts.append(
                Contract(
                    name, str(c["address"]), str(c["contract"]), str(c["constructor_args"]), str(c["license"]), path
                )
            )
        info = VerifyInfo(
            folder=folder,
            chain_id=int(manifest["chain_id"]),
            network=str(manifest["network"]),
            compiler=str(manifest["compiler"]),
            optimizer=bool(settings["optimizer"].get("enabled", False)),
            optimizer_runs=int(settings["optimizer"].get("runs", 200)),
            evm_version=str(settings["evmVersion"]),
            contracts=tuple(contracts),
        )
    except FileNotFoundError as exc:
        raise DeploymentError(f"no verification file {exc.filename}", redeploy) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DeploymentError(f"{folder} is not a readable verification folder ({exc!r})", redeploy) from None
    stale = [c.name for c in info.contracts if c.address.lower() != dep.address(c.name).lower()]
    if stale or info.chain_id != dep.chain_id:
        raise DeploymentError(f"{folder} describes another deployment than {deployment_path}", redeploy)
    return info


def forge_command(info: VerifyInfo, c: Contract, kind: str = "etherscan") -> str:
    """The `forge verify-contract` line for `c`, run from the root of this repository at the deployed
    version (forge rebuilds the sources itself). `kind` "etherscan": forge finds the explorer (Basescan)
    by chain id and reads ETHERSCAN_API_KEY from the environment; "blockscout": the network's Blockscout."""
    argv = ["forge", "verify-contract", c.address, c.target, "--chain", str(info.chain_id)]
    argv += ["--compiler-version", info.compiler, "--evm-version", info.evm_version]
    if info.optimizer:
        argv += ["--num-of-optimizations", str(info.optimizer_runs)]
    if c.constructor_args not in ("", "0x"):
        argv += ["--constructor-args", c.constructor_args]
    argv += ["--verifier", kind]
    if kind == "blockscout":
        blockscout = next((e for e in EXPLORERS.get(info.network, ()) if e.kind == kind), None)
        if blockscout is None:
            raise DeploymentError(f"no Blockscout is known for network {info.network}")
        argv += ["--verifier-url", f"{blockscout.url}/api/"]
    return shlex.join([*argv, "--watch"])


def forge_commands(info: VerifyInfo, c: Contract) -> dict[str, str]:
    """`forge verify-contract` per explorer API: Etherscan always, Blockscout where the network has one."""
    kinds = {"etherscan"} | {e.kind for e in EXPLORERS.get(info.network, ())}
    return {kind: forge_command(info, c, kind) for kind in KINDS if kind in kinds}


def form_fields(info: VerifyInfo, c: Contract, kind: str) -> dict[str, str]:
    """The fields of an explorer's standard-JSON verification form, labelled as the explorer labels them
    (`kind`: "etherscan" for Etherscan and Basescan, "blockscout")."""
    args = c.constructor_args.removeprefix("0x")
    if kind == "etherscan":
        return {
            "Contract Address": c.address,
            "Compiler Type": "Solidity (Standard-Json-Input)",
            "Compiler Version": info.compiler,
            "Open Source License Type": c.license,
            "Standard-Input-Json file": str(c.input_path),
            "Constructor Arguments ABI-encoded": args,
        }
    return {
        "Contract address": c.address,
        "Verification method": "Solidity (Standard JSON input)",
        "Compiler": info.compiler,
        "Standard input JSON": str(c.input_path),
        "Contract name": c.target,
        "Constructor arguments": args,
    }


def to_dict(info: VerifyInfo) -> dict[str, Any]:
    """`contracts verify-info --json`."""
    explorers = EXPLORERS.get(info.network, ())
    return {
        "folder": str(info.folder),
        "chain_id": info.chain_id,
        "network": info.network,
        "explorers": {e.name: e.url for e in explorers},
        "contracts": [
            {
                "name": c.name,
                "address": c.address,
                "contract": c.target,
                "compiler_version": info.compiler,
                "optimizer": {"enabled": info.optimizer, "runs": info.optimizer_runs},
                "evm_version": info.evm_version,
                "license": c.license,
                "constructor_args": c.constructor_args,
                "standard_json": str(c.input_path),
                "forge_commands": forge_commands(info, c),
                "verify_pages": {e.name: e.verify_page(c.address) for e in explorers},
                "forms": {kind: form_fields(info, c, kind) for kind in KINDS},
            }
            for c in info.contracts
        ],
    }
