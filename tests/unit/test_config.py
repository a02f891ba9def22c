"""Deployment files, amounts and keys: pure parsing with clear errors."""

from __future__ import annotations

import json
import stat

import click
import pytest

from cli._common import parse_amount
from node import keys
from node.chain import Deployment, DeploymentError, KeyLoadError

ADDRS = {
    n: "0x" + f"{i:040x}" for i, n in enumerate(["IntellectToken", "ProviderRegistry", "PoolManager", "WorkLedger"], 1)
}


def test_deployment_roundtrip(tmp_path):
    d = Deployment(chain_id=84532, contracts=ADDRS, block=12, network="base-sepolia", deployer="0x" + "ab" * 20)
    p = tmp_path / "sub" / "deployment.json"
    d.save(p)
    back = Deployment.load(p)
    assert back.chain_id == 84532 and back.block == 12 and back.network == "base-sepolia"
    assert back.address("WorkLedger").lower() == ADDRS["WorkLedger"]
    assert not list(p.parent.glob(".deployment.json.*"))  # no temp file left behind


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[]", "not a JSON object"),
        ("{", "not valid JSON"),
        (json.dumps({"version": 2}), "format version"),
        (json.dumps({"version": 1, "chain_id": 1, "block": 0}), "lacks a valid field"),
        (
            json.dumps(
                {"version": 1, "chain_id": 1, "block": 0, "contracts": {"IntellectToken": ADDRS["IntellectToken"]}}
            ),
            "lacks addresses",
        ),
        (
            json.dumps({"version": 1, "chain_id": 1, "block": 0, "contracts": {**ADDRS, "WorkLedger": "0x12"}}),
            "is not an address",
        ),
    ],
)
def test_bad_deployment_files(tmp_path, text, needle):
    p = tmp_path / "d.json"
    p.write_text(text)
    with pytest.raises(DeploymentError, match=needle):
        Deployment.load(p)


def test_missing_deployment_file_names_the_fix(tmp_path):
    with pytest.raises(DeploymentError) as e:
        Deployment.load(tmp_path / "nope.json")
    assert "not found" in str(e.value) and "contracts deploy" in str(e.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 10**18), ("0.5", 5 * 10**17), ("1_000", 1000 * 10**18), ("7wei", 7), ("0", 0), ("1e-18", 1)],
)
def test_amounts(text, value):
    assert parse_amount(text) == value


@pytest.mark.parametrize("text", ["-1", "abc", "1e-19", "nan", "inf", "1.2.3", "xwei"])
def test_bad_amounts(text):
    with pytest.raises(click.BadParameter):
        parse_amount(text)


def test_keystore_roundtrip(tmp_path, monkeypatch):
    p = tmp_path / "k.json"
    acct = keys.new_keystore(p, "pw")
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert keys.load_keystore(p, "pw").address == acct.address
    monkeypatch.setenv(keys.PASSWORD_ENV, "pw")
    assert keys.load_account(p).address == acct.address
    with pytest.raises(KeyLoadError, match="wrong password"):
        keys.load_keystore(p, "nope")
    with pytest.raises(KeyLoadError, match="already exists"):
        keys.new_keystore(p, "pw")


def test_key_sources(monkeypatch, tmp_path):
    monkeypatch.delenv(keys.PRIVATE_KEY_ENV, raising=False)
    with pytest.raises(KeyLoadError, match="no signing key"):
        keys.load_account(None)
    monkeypatch.setenv(keys.PRIVATE_KEY_ENV, "0x" + "11" * 32)
    assert keys.load_account(None).address.startswith("0x")
    monkeypatch.setenv(keys.PRIVATE_KEY_ENV, "0x1234")
    with pytest.raises(KeyLoadError, match="not a 32-byte hex"):
        keys.load_account(None)
    with pytest.raises(KeyLoadError, match="not found"):
        keys.load_keystore(tmp_path / "none.json", "x")
    (tmp_path / "bad.json").write_text("garbage")
    with pytest.raises(KeyLoadError, match="unreadable"):
        keys.load_keystore(tmp_path / "bad.json", "x")
