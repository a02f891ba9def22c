"""Copy ABI + bytecode of the deployable contracts from forge's build output into node/chain/artifacts,
and what a block explorer needs to verify them into node/chain/artifacts/verify.json.

The Python package reads these JSON files, so a user who installs it never needs Foundry.
`make contracts` runs this after `forge build`; `make test` runs it with `--check`, which fails when a
file here differs from what the build would give (tests/unit/test_verify.py checks verify.json's sources
against the files on disk).

verify.json is built from each contract's solc metadata (compiler long version, settings, and the
keccak256 of every source the contract was compiled from), not from forge's `--build-info`: with the
solcjs shim that file lacks the commit part of the compiler version that explorers ask for, holds every
source of the project (tests too) and weighs 18 MB. Each source is read from disk and checked against
the metadata's hash, so a source edited after the build is refused here rather than exported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from eth_utils import keccak

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ("IntellectToken", "ProviderRegistry", "PoolManager", "WorkLedger")


def _build(name: str, out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / f"{name}.sol" / f"{name}.json").read_text())
    return data


def artifact(name: str, out: Path) -> dict[str, object]:
    data = _build(name, out)
    return {"contractName": name, "abi": data["abi"], "bytecode": data["bytecode"]["object"]}


def verify_bundle(out: Path, root: Path = ROOT) -> dict[str, Any]:
    """Compiler, settings and sources of every deployable contract, each source stored once.
    `contracts[name].sources` lists the files that contract was compiled from (node/chain/verify.py
    builds its standard-JSON input from them)."""
    compiler = ""
    settings: dict[str, Any] | None = None
    contracts: dict[str, Any] = {}
    sources: dict[str, dict[str, str]] = {}
    for name in CONTRACTS:
        meta = _build(name, out)["metadata"]
        version = "v" + meta["compiler"]["version"]
        these = {k: v for k, v in meta["settings"].items() if k != "compilationTarget"}
        (path, target), *_ = meta["settings"]["compilationTarget"].items()
        if target != name or (compiler and version != compiler) or (settings is not None and these != settings):
            raise SystemExit(f"{name}: built with another compiler, target or settings than the others")
        compiler, settings = version, these
        for src, info in meta["sources"].items():
            text = (root / src).read_text()
            if "0x" + keccak(text=text).hex() != info["keccak256"]:
                raise SystemExit(f"{src} changed since the last `forge build`; run `make contracts`")
            sources[src] = {"content": text, "keccak256": info["keccak256"]}
        contracts[name] = {
            "path": path,
            "license": meta["sources"][path].get("license", ""),
            "sources": sorted(meta["sources"]),
        }
    return {
        "compiler": compiler,
        "settings": settings,
        "contracts": contracts,
        "sources": dict(sorted(sources.items())),
    }


def main(argv: list[str]) -> int:
    out = ROOT / "contracts" / "out"
    dest = ROOT / "node" / "chain" / "artifacts"
    check = "--check" in argv
    files = {f"{name}.json": artifact(name, out) for name in CONTRACTS}
    files["verify.json"] = verify_bundle(out)
    stale = []
    for filename, data in files.items():
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        path = dest / filename
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(filename)
        else:
            path.write_text(text)
    if stale:
        print(f"stale artifacts: {', '.join(stale)}; run `make contracts`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
