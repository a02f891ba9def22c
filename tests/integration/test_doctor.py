"""`intellect-node doctor` against a real anvil with the real contracts: every check passes on a good
set-up, and each failure path fails with its fix (an unreachable RPC, another chain, no such pool, a
pool not started, an unreadable spec, no gas, no stake, the coordinator's address dead, a port taken,
a small disk, no deployment file, and the machine-level checks)."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from cli.main import entry
from node import doctor
from pool.devnet.setup import peer_id_of
from tests.conftest import World
from tests.integration.test_daemon_errors import make_pool


@pytest.fixture
def listening() -> Any:
    """A TCP port something listens on (the coordinator's, in these tests)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def run_doctor(chain: World, monkeypatch, capsys, *args: str, expect: int) -> dict[str, dict[str, Any]]:
    monkeypatch.setenv("INTELLECT_RPC_URL", chain.url)
    monkeypatch.setenv("INTELLECT_DEPLOYMENT", str(chain.deployment_path))
    monkeypatch.delenv("INTELLECT_PRIVATE_KEY", raising=False)
    monkeypatch.delenv("INTELLECT_KEYSTORE", raising=False)
    capsys.readouterr()
    code = entry(["doctor", "--json", "--metrics", "127.0.0.1:0", "--min-free-gb", "0.01", *args])
    out = capsys.readouterr().out
    assert code == expect, out
    return {c["name"]: c for c in json.loads(out)["checks"]}


def good_pool(chain: World, tmp_path: Path, port: int, **kw: Any) -> int:
    boot = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_of(chain.coordinator)}"
    return make_pool(chain, bootstrap=boot, spec_dir=tmp_path / "spec", **kw)


def test_a_good_set_up_passes(chain: World, tmp_path: Path, monkeypatch, capsys, listening):
    pid = good_pool(chain, tmp_path, listening)
    checks = run_doctor(chain, monkeypatch, capsys, "--pool", str(pid), "--provider", chain.provider.address,
                        "--data-dir", str(tmp_path / "w"), expect=0)  # fmt: skip
    assert all(c["ok"] is not False for c in checks.values()), checks
    for name in ("python", "packages", "disk", "p2p port", "metrics port", "rpc", "pool", "task spec", "model",
                 "gas", "stake", "coordinator"):  # fmt: skip
        assert checks[name]["ok"] is True, (name, checks[name])
    assert checks["accelerator"]["ok"] in (True, None)  # no GPU here: a note, not a failure
    monkeypatch.setenv("INTELLECT_RPC_URL", chain.url)
    capsys.readouterr()
    assert entry(["doctor", "--pool", str(pid), "--provider", chain.provider.address, "--metrics", "127.0.0.1:0",
                  "--min-free-gb", "0.01", "--data-dir", str(tmp_path / "w")]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "PASS  rpc:" in text and "all checks passed" in text


def test_chain_failures_each_say_their_fix(chain: World, tmp_path: Path, monkeypatch, capsys, listening):
    pid = good_pool(chain, tmp_path, listening)
    # the RPC endpoint is down
    checks = run_doctor(chain, monkeypatch, capsys, "--pool", str(pid), "--rpc-url", "http://127.0.0.1:1", expect=1)
    assert checks["rpc"]["ok"] is False and "--rpc-url" in checks["rpc"]["fix"]
    # it serves another chain than the deployment's
    other = tmp_path / "other.json"
    replace(chain.deployment, chain_id=1).save(other)
    checks = run_doctor(chain, monkeypatch, capsys, "--pool", str(pid), "--deployment", str(other), expect=1)
    assert checks["rpc"]["ok"] is False and "chain id" in checks["rpc"]["detail"]
    # no deployment file
    checks = run_doctor(chain, monkeypatch, capsys, "--pool", str(pid), "--deployment", str(tmp_path / "none.json"),
                        expect=1)  # fmt: skip
    assert checks["deployment"]["ok"] is False
    # no such pool; a pool never started
    checks = run_doctor(chain, monkeypatch, capsys, "--pool", "999", expect=1)
    assert checks["pool"]["ok"] is False and "does not exist" in checks["pool"]["detail"]
    idle = good_pool(chain, tmp_path, listening, start=False)
    checks = run_doctor(chain, monkeypatch, capsys, "--pool", str(idle), expect=1)
    assert checks["pool"]["ok"] is False and "created" in checks["pool"]["detail"]


def test_spec_funds_and_coordinator_failures(chain: World, tmp_path: Path, monkeypatch, capsys):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    pid = good_pool(chain, tmp_path, port)
    (tmp_path / "spec" / "task-spec.json").write_text("{}")  # the spec no longer matches its hash
    broke = Account.create().address  # no ether, no tokens
    checks = run_doctor(chain, monkeypatch, capsys, "--pool", str(pid), "--provider", broke, expect=1)
    assert checks["task spec"]["ok"] is False
    assert checks["gas"]["ok"] is False and "ETH" in checks["gas"]["fix"]
    assert checks["stake"]["ok"] is False and "more of the pool's token" in checks["stake"]["fix"]
    assert checks["coordinator"]["ok"] is False and "coordinator" in checks["coordinator"]["fix"]


def test_machine_failures(chain: World, tmp_path: Path, monkeypatch, capsys, listening):
    pid = good_pool(chain, tmp_path, listening)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    p = taken.getsockname()[1]
    try:
        checks = run_doctor(chain, monkeypatch, capsys, "--pool", str(pid), "--listen", f"/ip4/127.0.0.1/tcp/{p}",
                            "--min-free-gb", "1e9", expect=1)  # fmt: skip
    finally:
        taken.close()
    assert checks["p2p port"]["ok"] is False and checks["disk"]["ok"] is False
    assert checks["disk"]["fix"].startswith("free space")
    assert not doctor.check_python((3, 10, 4)).ok and doctor.check_python((3, 11, 7)).ok
    missing = doctor.check_packages(("trio", "no_such_package_here"))
    assert missing.ok is False and "no_such_package_here" in missing.detail
    assert doctor.check_model(str(tmp_path / "no-model")).ok is False
    assert doctor.check_port("x", "127.0.0.1", 0).ok
    assert doctor.multiaddr_host_port("/dns4/example.org/tcp/4001/p2p/x") == ("example.org", 4001)
    assert doctor.multiaddr_host_port("/ip4/1.2.3.4/udp/1") is None
