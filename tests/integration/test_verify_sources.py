"""What `contracts deploy` writes for block explorers verifies: the standard-JSON inputs that
`contracts verify-info` names, compiled by the project's own solc (solcjs through tools/solc-shim.js) in
an empty folder (so nothing but the input is read), give exactly the creation code that was sent (with the
constructor arguments it reports appended) and the runtime code on chain (modulo immutables).

This is what Etherscan and Blockscout do with the same files: compile, compare, decode the arguments."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cli.main import entry
from node.chain import abi
from node.chain.anvil import ANVIL_KEYS, REPO
from tests.conftest import rpc_sync

SHIM = REPO / "tools" / "solc-shim.js"
NODE = shutil.which("node")


def _compile_all(inputs: dict[str, Path], workdir: Path) -> dict[str, dict]:
    """solcjs on each input at once (two cores: about 20 s for the four), in an empty folder."""
    procs = {}
    for name, path in inputs.items():
        with path.open("rb") as stdin:
            procs[name] = subprocess.Popen(
                [str(NODE), str(SHIM)], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir
            )
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, f"solcjs on {name}: {stderr.decode()[-2000:]}"
        result = json.loads(stdout)
        errors = [e for e in result.get("errors", []) if e["severity"] == "error"]
        assert not errors, f"{name}: {errors}"
        out[name] = result
    return out


def _creation_inputs(url: str, first_block: int, addresses: set[str]) -> dict[str, str]:
    """The creation transactions' input by created address, found by scanning the blocks since `first_block`."""
    head = int(str(rpc_sync(url, "eth_blockNumber")), 16)
    found: dict[str, str] = {}
    for n in range(first_block, head + 1):
        block = rpc_sync(url, "eth_getBlockByNumber", [hex(n), True])
        for tx in block["transactions"]:  # type: ignore[index]
            if tx["to"] is None:
                created = rpc_sync(url, "eth_getTransactionReceipt", [tx["hash"]])["contractAddress"]  # type: ignore[index]
                if created and created.lower() in addresses:
                    found[created.lower()] = tx["input"]
    return found


def _blank_immutables(code: bytes, refs: dict[str, list[dict[str, int]]]) -> bytes:
    out = bytearray(code)
    for ranges in refs.values():
        for r in ranges:
            out[r["start"] : r["start"] + r["length"]] = bytes(r["length"])
    return bytes(out)


@pytest.mark.slow
def test_the_written_inputs_compile_to_the_code_on_chain(anvil, tmp_path, monkeypatch, capsys):
    snap = rpc_sync(anvil.url, "evm_snapshot")
    try:
        _check(anvil.url, tmp_path, monkeypatch, capsys)
    finally:
        rpc_sync(anvil.url, "evm_revert", [snap])


def _check(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert NODE, "node is not on PATH (make installs the npm toolchain)"
    monkeypatch.setenv("INTELLECT_RPC_URL", url)
    monkeypatch.setenv("INTELLECT_PRIVATE_KEY", ANVIL_KEYS[0])
    deployment = tmp_path / "deployment.json"
    assert entry(["contracts", "deploy", "--deployment", str(deployment), "--json"]) == 0
    dep = json.loads(capsys.readouterr().out)
    assert entry(["contracts", "verify-info", "--deployment", str(deployment), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    contracts = {c["name"]: c for c in info["contracts"]}
    assert set(contracts) == set(abi.CONTRACT_NAMES)
    assert {n: c["address"] for n, c in contracts.items()} == dep["contracts"]

    empty = tmp_path / "empty"
    empty.mkdir()
    compiled = _compile_all({n: Path(c["standard_json"]) for n, c in contracts.items()}, empty)
    creations = _creation_inputs(url, dep["block"], {c["address"].lower() for c in contracts.values()})
    for name, c in contracts.items():
        path, _, contract = c["contract"].partition(":")
        out = compiled[name]["contracts"][path][contract]
        settings = json.loads(Path(c["standard_json"]).read_text())["settings"]
        assert settings["optimizer"] == {"enabled": True, "runs": c["optimizer"]["runs"]}
        assert settings["evmVersion"] == c["evm_version"]
        assert json.loads(out["metadata"])["compiler"]["version"] == c["compiler_version"].removeprefix("v")

        # the creation code sent is the compiled creation code followed by the reported arguments
        sent = creations[c["address"].lower()]
        assert sent == "0x" + out["evm"]["bytecode"]["object"] + c["constructor_args"].removeprefix("0x"), name

        # the runtime code on chain is the compiled runtime code, its immutables filled in by the constructor
        on_chain = bytes.fromhex(str(rpc_sync(url, "eth_getCode", [c["address"], "latest"]))[2:])
        runtime = out["evm"]["deployedBytecode"]
        built = bytes.fromhex(runtime["object"])
        refs = runtime["immutableReferences"]
        assert len(on_chain) == len(built) > 1000, name
        assert _blank_immutables(on_chain, refs) == _blank_immutables(built, refs), name
        assert on_chain != built and refs, f"{name} has immutables the constructor sets"
