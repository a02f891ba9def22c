"""The whole foundation flow through the real CLI against a real anvil with the real contracts:
deploy, register, add node, create/start pool, invite + join, record work, invalidate inside the
window, fail to invalidate after it, fail to claim before it, claim after it, audit consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import entry
from node.chain.anvil import ANVIL_KEYS
from node.evidence import encode_evidence
from tests.conftest import rpc_sync

KEY = {
    name: ANVIL_KEYS[i] for i, name in enumerate(["admin", "provider", "coordinator", "validator", "outsider", "node"])
}


class Cli:
    def __init__(self, url: str, deployment: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
        self.url = url
        self.deployment = deployment
        self.mp = monkeypatch
        self.capsys = capsys
        monkeypatch.setenv("INTELLECT_RPC_URL", url)
        monkeypatch.setenv("INTELLECT_DEPLOYMENT", str(deployment))
        monkeypatch.delenv("INTELLECT_KEYSTORE", raising=False)

    def __call__(self, who: str, *args: str, expect: int = 0) -> tuple[str, str]:
        self.mp.setenv("INTELLECT_PRIVATE_KEY", KEY[who])
        self.capsys.readouterr()
        code = entry(list(args))
        out, err = self.capsys.readouterr()
        assert code == expect, f"`{' '.join(args)}` exited {code}, expected {expect}\nstdout: {out}\nstderr: {err}"
        return out, err

    def json(self, who: str, *args: str) -> dict:
        out, _ = self(who, *args, "--json")
        return json.loads(out)


def tx_count(url: str, addr: str) -> int:
    return int(str(rpc_sync(url, "eth_getTransactionCount", [addr, "latest"])), 16)


def test_full_flow_through_the_cli(anvil, tmp_path, monkeypatch, capsys):
    # A fresh deployment of our own (not the shared session one): the CLI deploys it.
    snap = rpc_sync(anvil.url, "evm_snapshot")
    try:
        _flow(anvil.url, tmp_path, monkeypatch, capsys)
    finally:
        rpc_sync(anvil.url, "evm_revert", [snap])


def _flow(url, tmp_path, monkeypatch, capsys):
    from node.keys import from_hex

    addr = {k: from_hex(v).address for k, v in KEY.items()}
    cli = Cli(url, tmp_path / "deployment.json", monkeypatch, capsys)

    dep = cli.json("admin", "contracts", "deploy", "--unbonding-period", "3600")
    assert dep["chain_id"] == 31337 and set(dep["contracts"]) == {
        "IntellectToken",
        "ProviderRegistry",
        "PoolManager",
        "WorkLedger",
    }
    # Redeploying over an existing file is refused.
    _, err = cli("admin", "contracts", "deploy", expect=1)
    assert "already exists" in err and "--force" in err

    cli("admin", "token", "mint", "--to", addr["provider"], "1000")
    cli("admin", "token", "mint", "--to", addr["admin"], "5000")
    cli("admin", "token", "mint", "--to", addr["validator"], "50")  # its accusation bonds

    reg = cli.json("provider", "provider", "register", "--stake", "100")
    assert reg["stake"] == 100 * 10**18
    monkeypatch.setenv("INTELLECT_NODE_PRIVATE_KEY", KEY["node"])
    added = cli.json("provider", "node", "add", "--units", "2")
    assert added["node"] == addr["node"]

    pool = cli.json(
        "admin",
        "pool",
        "create",
        "--coordinator",
        addr["coordinator"],
        "--spec-uri",
        "file:///spec.json",
        "--spec-hash",
        "0x" + "ab" * 32,
        "--reward-rate",
        "0.01",
        "--window",
        "86400",
        "--slash",
        "5",
        "--min-stake",
        "50",
        "--validator",
        addr["validator"],
        "--appeal-period",
        "3600",
        "--vote-period",
        "3600",
    )
    pid = str(pool["pool"])
    # Joining before the pool starts fails with a clear reason.
    invite = tmp_path / "invite.json"
    cli("coordinator", "pool", "invite", "--pool", pid, "--node", addr["node"], "--out", str(invite))
    _, err = cli("provider", "pool", "join", "--pool", pid, "--invite", str(invite), expect=1)
    assert "pool 1 is created, needs to be active" in err
    cli("admin", "pool", "start", pid)
    cli("admin", "pool", "fund", pid, "1000")
    joined = cli.json("provider", "pool", "join", "--pool", pid, "--invite", str(invite))
    assert joined["node"] == addr["node"]
    info = cli.json("admin", "pool", "info", pid)
    assert info["statusName"] == "active" and info["members"] == 1

    keys = ["0x" + f"{i:064x}" for i in range(1, 5)]
    batch = tmp_path / "batch.json"
    batch.write_text(
        json.dumps(
            [
                {
                    "node": addr["node"],
                    "work_key": k,
                    "units": 100 * (i + 1),
                    "policy_version": 3,
                    "proof_commitment": "0x" + "cd" * 32,
                }
                for i, k in enumerate(keys)
            ]
        )
    )
    sub = cli.json("coordinator", "work", "submit", "--pool", pid, "--file", str(batch))
    assert sub["records"] == 4

    # the evidence as a document (what `rollout verify --evidence-out` writes): its sha256 goes on chain
    doc, digest = encode_evidence({"work_key": keys[0], "ok": False, "verdict": {"reason": "r"}, "samples": []})
    (tmp_path / "evidence.json").write_bytes(doc)
    _, err = cli("validator", "work", "invalidate", "--pool", pid, "--key", keys[1], "--evidence",
                 str(tmp_path / "evidence.json"), expect=1)  # fmt: skip
    assert f"not work {keys[1]}" in err and "is it the evidence of this work?" in err and err.count("\n") == 1
    # a hard accusation shows the node's signature over the work (what its file carries); without it, refused
    _, err = cli("validator", "work", "invalidate", "--pool", pid, "--key", keys[0], expect=1)
    assert "no signature of the node" in err and err.count("\n") == 1
    sig = {k: cli.json("provider", "work", "sign", "--pool", pid, "--key", k)["signature"] for k in keys[:3]}
    inv = cli.json(
        "validator",
        "work",
        "invalidate",
        "--pool",
        pid,
        "--key",
        keys[0],
        "--evidence",
        str(tmp_path / "evidence.json"),
        "--signature",
        sig[keys[0]],
    )
    assert inv["bond"] == 5 * 10**18 and inv["provider"] == addr["provider"]  # an accusation: no slash yet
    _, err = cli("validator", "work", "finalize", "--pool", pid, "--key", keys[0], expect=1)
    assert "can be appealed until" in err and err.count("\n") == 1

    _, err = cli("provider", "provider", "claim", "--pool", pid, "--key", keys[1], expect=1)
    assert "still in its validation window" in err and err.count("\n") == 1

    cli("admin", "chain", "advance-time", "86400")
    cli("provider", "work", "finalize", "--pool", pid, "--key", keys[0])  # unappealed: anyone makes it final
    _, err = cli("validator", "work", "invalidate", "--pool", pid, "--key", keys[2], "--signature", sig[keys[2]],
                 expect=1)  # fmt: skip
    assert "validation window" in err and "closed" in err and err.count("\n") == 1

    claimed = cli.json("provider", "provider", "claim", "--pool", pid)
    assert claimed["reward"] == (200 + 300 + 400) * 10**16  # 0.01 token per unit

    shown = cli.json("admin", "work", "show", "--pool", pid, "--key", keys[0])
    assert shown["statusName"] == "invalidated"
    assert shown["dispute"]["kindName"] == "accusation" and shown["dispute"]["verdictName"] == "upheld"

    rep = cli.json("admin", "audit", "--pool", pid)
    assert rep["consistent"] is True, rep["mismatches"]
    n = rep["nodes"][addr["node"]]
    assert n["records"] == 4 and n["invalidated_units"] == 100 and n["claimed_units"] == 900
    assert n["claimed_tokens"] == 9 * 10**18 and n["slashed_tokens"] == 5 * 10**18
    assert n["slashes"][0]["work_key"] == keys[0]
    assert n["disputes"][0]["evidence"] == digest  # the document's sha256, as the event has it
    prov = rep["providers"][addr["provider"]]
    assert prov["slashed"] == 5 * 10**18 and prov["staked"] == 95 * 10**18
    out, _ = cli("admin", "audit", "--pool", pid, "--node", addr["node"])
    assert "consistent" in out and "slash 5 INTL" in out

    # Unstake / withdraw after unbonding.
    cli("provider", "provider", "unstake", "10")
    _, err = cli("provider", "provider", "withdraw", expect=1)
    assert "still unbonding" in err
    cli("admin", "chain", "advance-time", "3601")
    w = cli.json("provider", "provider", "withdraw")
    assert w["amount"] == 10 * 10**18
    pinfo = cli.json("provider", "provider", "info")
    assert pinfo["withdrawn"] == 10 * 10**18
    assert pinfo["deposited"] == pinfo["staked"] + pinfo["unbonding"] + pinfo["withdrawn"] + pinfo["slashed"]
    cli("admin", "pool", "bootstrap", pid, "/ip4/127.0.0.1/tcp/4001/p2p/QmX")
    assert cli.json("admin", "pool", "info", pid)["bootstrap"] == "/ip4/127.0.0.1/tcp/4001/p2p/QmX"
    _, err = cli("admin", "pool", "withdraw-surplus", pid, "1000", expect=1)
    assert "not owed to pending work" in err
    cli("admin", "pool", "withdraw-surplus", pid, "1")
    # The owner rotates the coordinator key: the old key can no longer record work.
    cli("admin", "pool", "rotate-coordinator", pid, addr["validator"])
    assert cli.json("admin", "pool", "info", pid)["coordinator"] == addr["validator"]
    _, err = cli("coordinator", "work", "submit", "--pool", pid, "--file", str(batch), expect=1)
    assert "is not the coordinator of pool" in err
    cli("admin", "pool", "end", pid)
    assert cli.json("admin", "pool", "info", pid)["statusName"] == "ended"
    assert cli.json("admin", "audit", "--pool", pid)["consistent"] is True
