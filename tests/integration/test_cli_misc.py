"""Keystores through the CLI, and the devnet as a user runs it (a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cli.main import entry


def test_keystore_through_the_cli(chain, tmp_path, monkeypatch, capsys):
    ks = tmp_path / "me.json"
    monkeypatch.setenv("INTELLECT_PASSWORD", "correct horse")
    monkeypatch.delenv("INTELLECT_PRIVATE_KEY", raising=False)
    assert entry(["keys", "new", "--out", str(ks), "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert entry(["keys", "show", "--keystore", str(ks), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["address"] == created["address"]
    monkeypatch.setenv("INTELLECT_PASSWORD", "wrong")
    assert entry(["keys", "show", "--keystore", str(ks)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot decrypt keystore") and err.count("\n") == 1
    # A keystore key signs a real transaction (it has no ETH: the error says so, nothing is sent).
    monkeypatch.setenv("INTELLECT_PASSWORD", "correct horse")
    code = entry(
        [
            "pool",
            "create",
            "--keystore",
            str(ks),
            "--coordinator",
            created["address"],
            "--spec-uri",
            "x",
            "--spec-hash",
            "0x" + "00" * 32,
            "--reward-rate",
            "1",
            "--rpc-url",
            chain.url,
            "--deployment",
            str(chain.deployment_path),
        ]
    )
    assert code == 1 and "has 0.000000 ETH" in capsys.readouterr().err


def test_devnet_command_brings_up_the_chain_side(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    p = subprocess.run(
        [sys.executable, "-m", "cli.main", "devnet", "--chain-only", "--dir", str(tmp_path / "dn"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["pool_status"] == "active" and summary["members"] == 1
    assert set(summary["roles"]) == {"owner", "coordinator", "validator", "provider", "node"}
    saved = json.loads((tmp_path / "dn" / "deployment.json").read_text())
    assert saved["contracts"] == summary["contracts"]
