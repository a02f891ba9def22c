"""Copy ABI + bytecode of the deployable contracts from forge's build output into node/chain/artifacts.

The Python package reads these JSON files, so a user who installs it never needs Foundry.
`make contracts` runs this after `forge build`; tests/test_artifacts.py checks they are in sync.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ("IntellectToken", "ProviderRegistry", "PoolManager", "WorkLedger")


def artifact(name: str, out: Path) -> dict[str, object]:
    data = json.loads((out / f"{name}.sol" / f"{name}.json").read_text())
    return {"contractName": name, "abi": data["abi"], "bytecode": data["bytecode"]["object"]}


def main(argv: list[str]) -> int:
    out = ROOT / "contracts" / "out"
    dest = ROOT / "node" / "chain" / "artifacts"
    check = "--check" in argv
    stale = []
    for name in CONTRACTS:
        text = json.dumps(artifact(name, out), indent=1, sort_keys=True) + "\n"
        path = dest / f"{name}.json"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale artifacts: {', '.join(stale)}; run `make contracts`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
