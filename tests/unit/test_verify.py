"""Explorer verification data without a chain: constructor-argument encoding, the packaged sources
(complete, in sync with the files they came from), the folder `contracts deploy` writes and how
`contracts verify-info` prints it. tests/integration/test_verify_sources.py compiles the files."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath

import eth_abi
import pytest
from eth_utils import keccak

from cli.main import entry
from node.chain import abi, verify
from node.chain.anvil import REPO
from node.chain.deployment import Deployment
from node.chain.errors import DeploymentError

A = {name: "0x" + f"{i + 1:02x}" * 20 for i, name in enumerate(abi.CONTRACT_NAMES)}
ARGS = {name: "0x" + f"{i + 10:02x}" * 32 for i, name in enumerate(abi.CONTRACT_NAMES)}
IMPORT = re.compile(r'^\s*import\s+(?:[^"\']*\s+from\s+)?["\']([^"\']+)["\']', re.MULTILINE)


def deployment(network: str = "base-sepolia", chain_id: int = 84532, **extra: object) -> Deployment:
    return Deployment(chain_id, dict(A), 7, network=network, extra={"constructor_args": dict(ARGS), **extra})


def test_constructor_args_are_the_abi_encoding_that_follows_the_bytecode():
    registry = abi.load("ProviderRegistry")
    values = [A["IntellectToken"], A["PoolManager"], "0x" + "00" * 19 + "de", 3600, 10**19, 5 * 10**18]
    encoded = registry.constructor_args(values)
    types = [abi._type(p) for p in registry.constructor["inputs"]]
    assert [str(v).lower() for v in eth_abi.decode(types, bytes.fromhex(encoded[2:]))] == [
        str(v).lower() for v in values
    ]
    assert registry.deploy_data(values) == registry.bytecode + encoded[2:]
    assert abi.load("PoolManager").constructor_args([A["ProviderRegistry"]]) == "0x" + "00" * 12 + A[
        "ProviderRegistry"
    ].removeprefix("0x")
    with pytest.raises(ValueError):
        abi.load("PoolManager").constructor_args([])


def test_every_standard_input_holds_every_source_it_imports():
    remappings = [r.split("=", 1) for r in verify.standard_input("WorkLedger")["settings"]["remappings"]]
    seen = 0
    for name in abi.CONTRACT_NAMES:
        data = verify.standard_input(name)
        sources = data["sources"]
        assert f"contracts/src/{name}.sol" in sources
        assert data["settings"]["outputSelection"] == {f"contracts/src/{name}.sol": {name: verify.OUTPUTS}}
        for path, src in sources.items():
            for imp in IMPORT.findall(src["content"]):
                if imp.startswith("."):
                    target = str(PurePosixPath(path).parent / imp)
                    parts: list[str] = []
                    for part in target.split("/"):
                        if part == "..":
                            parts.pop()
                        elif part != ".":
                            parts.append(part)
                    target = "/".join(parts)
                else:
                    prefix, repl = next((p, r) for p, r in remappings if imp.startswith(p))
                    target = repl + imp[len(prefix) :]
                assert target in sources, f"{name}: {path} imports {imp}, not in the input"
                seen += 1
    assert seen > 100


def test_the_packaged_sources_are_the_files_they_were_built_from():
    bundle = json.loads(verify.BUNDLE.read_text())
    assert re.fullmatch(r"v\d+\.\d+\.\d+\+commit\.[0-9a-f]{8}", bundle["compiler"])
    assert bundle["settings"]["metadata"] == {"bytecodeHash": "none"}
    assert bundle["settings"]["optimizer"] == {"enabled": True, "runs": 200}
    assert bundle["settings"]["evmVersion"] == "cancun"
    for path, src in bundle["sources"].items():
        assert "0x" + keccak(text=src["content"]).hex() == src["keccak256"], path
        assert (REPO / path).read_text() == src["content"], f"{path} changed: run `make contracts`"
    for name in abi.CONTRACT_NAMES:
        assert bundle["contracts"][name]["license"] == "MIT"
    # only what a contract needs: the token is compiled without the registry and the ledger
    token = verify.standard_input("IntellectToken")["sources"]
    assert not any(p.endswith(("ProviderRegistry.sol", "WorkLedger.sol")) for p in token)


def test_deploy_writes_a_folder_that_verify_info_reads_back(tmp_path):
    dep = deployment()
    path = tmp_path / "deployment.json"
    folder = verify.write(dep, path)
    assert folder == tmp_path / "deployment.verify"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [verify.MANIFEST, *(f"{n}.input.json" for n in abi.CONTRACT_NAMES)]
    )
    info = verify.load(path, dep)
    assert (info.chain_id, info.network, info.evm_version, info.optimizer, info.optimizer_runs) == (
        84532,
        "base-sepolia",
        "cancun",
        True,
        200,
    )
    assert info.compiler == verify.compiler_version()
    for c in info.contracts:
        assert c.address == dep.contracts[c.name] and c.constructor_args == ARGS[c.name]
        assert c.target == f"contracts/src/{c.name}.sol:{c.name}"
        assert json.loads(c.input_path.read_text()) == verify.standard_input(c.name)
    # a second deployment replaces the folder whole
    again = Deployment(84532, {**A, "WorkLedger": "0x" + "99" * 20}, 9, "base-sepolia", extra=dep.extra)
    verify.write(again, path)
    assert verify.load(path, again).contracts[-1].address == again.contracts["WorkLedger"]


def test_forge_commands_and_forms_for_base_sepolia(tmp_path):
    verify.write(deployment(), tmp_path / "d.json")
    info = verify.load(tmp_path / "d.json", deployment())
    ledger = info.contracts[-1]
    cmds = verify.forge_commands(info, ledger)
    assert set(cmds) == {"etherscan", "blockscout"}
    argv = shlex.split(cmds["etherscan"])
    assert argv[:4] == ["forge", "verify-contract", A["WorkLedger"], "contracts/src/WorkLedger.sol:WorkLedger"]
    for flag, value in {
        "--chain": "84532",
        "--compiler-version": info.compiler,
        "--evm-version": "cancun",
        "--num-of-optimizations": "200",
        "--constructor-args": ARGS["WorkLedger"],
        "--verifier": "etherscan",
    }.items():
        assert argv[argv.index(flag) + 1] == value
    blockscout = shlex.split(cmds["blockscout"])
    assert blockscout[blockscout.index("--verifier-url") + 1] == "https://base-sepolia.blockscout.com/api/"
    form = verify.form_fields(info, ledger, "etherscan")
    assert form["Compiler Type"] == "Solidity (Standard-Json-Input)"
    assert form["Constructor Arguments ABI-encoded"] == ARGS["WorkLedger"][2:]
    assert form["Standard-Input-Json file"] == str(tmp_path / "d.verify" / "WorkLedger.input.json")
    assert verify.form_fields(info, ledger, "blockscout")["Contract name"] == ledger.target


def test_a_local_deployment_has_no_explorer(tmp_path):
    dep = deployment("local", 31337)
    verify.write(dep, tmp_path / "d.json")
    info = verify.load(tmp_path / "d.json", dep)
    assert set(verify.forge_commands(info, info.contracts[0])) == {"etherscan"}
    with pytest.raises(DeploymentError):
        verify.forge_command(info, info.contracts[0], "blockscout")
    assert verify.to_dict(info)["explorers"] == {}


def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = entry(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_info_prints_every_field(tmp_path, capsys):
    path = tmp_path / "deployment.json"
    dep = deployment()
    dep.save(path)
    verify.write(dep, path)
    code, out, _ = _cli("contracts", "verify-info", "--deployment", str(path), capsys=capsys)
    assert code == 0
    block = out.split("\nWorkLedger ")[1]
    assert block.startswith(A["WorkLedger"])
    for want in (
        "contracts/src/WorkLedger.sol:WorkLedger",
        verify.compiler_version(),
        "enabled, 200 runs",
        "cancun",
        "MIT",
        ARGS["WorkLedger"],
        str(tmp_path / "deployment.verify" / "WorkLedger.input.json"),
        "forge verify-contract " + A["WorkLedger"],
        f"https://sepolia.basescan.org/verifyContract?a={A['WorkLedger']}",
        f"https://base-sepolia.blockscout.com/address/{A['WorkLedger']}/contract-verification",
        "Compiler Type: Solidity (Standard-Json-Input)",
        "Verification method: Solidity (Standard JSON input)",
    ):
        assert want in block, want
    code, out, _ = _cli("contracts", "verify-info", "--deployment", str(path), "--json", capsys=capsys)
    data = json.loads(out)
    assert code == 0 and [c["name"] for c in data["contracts"]] == list(abi.CONTRACT_NAMES)
    ledger = data["contracts"][-1]
    assert ledger["constructor_args"] == ARGS["WorkLedger"] and ledger["optimizer"] == {"enabled": True, "runs": 200}
    assert set(ledger["forge_commands"]) == {"etherscan", "blockscout"} and set(ledger["forms"]) == set(verify.KINDS)
    assert data["explorers"] == {
        "Basescan": "https://sepolia.basescan.org",
        "Blockscout": "https://base-sepolia.blockscout.com",
    }


def test_verify_info_without_its_folder_or_with_a_stale_one_is_one_line(tmp_path, capsys):
    path = tmp_path / "deployment.json"
    dep = deployment()
    dep.save(path)
    code, _, err = _cli("contracts", "verify-info", "--deployment", str(path), capsys=capsys)
    assert code == 1 and err.count("\n") == 1 and "deployment.verify" in err and "contracts deploy" in err
    verify.write(Deployment(84532, {**A, "PoolManager": "0x" + "77" * 20}, 7, extra=dep.extra), path)
    code, _, err = _cli("contracts", "verify-info", "--deployment", str(path), capsys=capsys)
    assert code == 1 and "another deployment" in err
    (tmp_path / "deployment.verify" / verify.MANIFEST).write_text("{")
    code, _, err = _cli("contracts", "verify-info", "--deployment", str(path), capsys=capsys)
    assert code == 1 and "not a readable verification folder" in err


def test_a_deployment_without_constructor_args_writes_nothing(tmp_path):
    with pytest.raises(DeploymentError, match="constructor arguments"):
        verify.write(Deployment(84532, dict(A), 7), tmp_path / "d.json")
    assert not Path(tmp_path / "d.verify").exists()
