"""Bad input through the real CLI: each case prints one line naming the problem, exits non-zero, and
changes nothing on chain (no block mined, the sender's nonce unchanged)."""

from __future__ import annotations

import errno
import json
import os

import pytest
import trio
from eth_account import Account

from cli.main import entry
from node import ops
from node.chain.anvil import Anvil
from pool.deploy import TOKEN
from tests.conftest import World, advance_time_sync, rpc_sync


@pytest.fixture
def pool(chain: World) -> int:
    """A started, funded pool (min stake 50, slash 5) with a registered provider (stake 60) and node."""

    async def setup() -> int:
        async with await chain.client(chain.admin) as admin, await chain.client(chain.provider) as prov:
            pid, _ = await ops.create_pool(
                admin,
                ops.PoolSpec(
                    chain.coordinator.address, "file:///s", "0x" + "11" * 32, 10**15, 3600, 5 * TOKEN, 50 * TOKEN
                ),
            )
            await admin.transact("PoolManager", "startPool", pid)
            await ops.fund_pool(admin, pid, 100 * TOKEN)
            await ops.register_provider(prov, 60 * TOKEN)
            await ops.add_node(
                prov, chain.node.address, 1, await ops.node_signature(prov, chain.node, chain.provider.address)
            )
            return pid

    return trio.run(setup)


def run_cli(
    chain: World, key: str | None, args: list[str], monkeypatch, capsys, deployment: str | None = None
) -> tuple[int, str]:
    monkeypatch.setenv("INTELLECT_RPC_URL", chain.url)
    monkeypatch.setenv("INTELLECT_DEPLOYMENT", deployment or str(chain.deployment_path))
    if key:
        monkeypatch.setenv("INTELLECT_PRIVATE_KEY", key)
    else:
        monkeypatch.delenv("INTELLECT_PRIVATE_KEY", raising=False)
    capsys.readouterr()
    code = entry(args)
    _, err = capsys.readouterr()
    return code, err


def snapshot(chain: World, *addrs: str) -> tuple[int, ...]:
    block = int(str(rpc_sync(chain.url, "eth_blockNumber")), 16)
    return (block, *(int(str(rpc_sync(chain.url, "eth_getTransactionCount", [a, "latest"])), 16) for a in addrs))


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


def key(acct) -> str:
    return "0x" + bytes(acct.key).hex()


def test_wrong_chain_id(chain, monkeypatch, capsys):
    with Anvil(chain_id=84532) as other:
        monkeypatch.setenv("INTELLECT_PRIVATE_KEY", key(chain.provider))
        monkeypatch.setenv("INTELLECT_DEPLOYMENT", str(chain.deployment_path))
        capsys.readouterr()
        code = entry(["provider", "register", "--stake", "20", "--rpc-url", other.url])
        _, err = capsys.readouterr()
        assert_one_line_error(code, err, "chain id 84532", "deployment is for chain id 31337")
        assert int(str(rpc_sync(other.url, "eth_blockNumber")), 16) == 0


def test_missing_deployment_file(chain, monkeypatch, capsys, tmp_path):
    code, err = run_cli(
        chain, key(chain.provider), ["provider", "info"], monkeypatch, capsys, str(tmp_path / "nope.json")
    )
    assert_one_line_error(code, err, "deployment file", "not found", "contracts deploy")


def test_corrupt_deployment_file(chain, monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, err = run_cli(chain, key(chain.provider), ["provider", "info"], monkeypatch, capsys, str(bad))
    assert_one_line_error(code, err, "not valid JSON")


def test_unfunded_key(chain, monkeypatch, capsys):
    poor = Account.create()
    before = snapshot(chain, poor.address)
    code, err = run_cli(chain, key(poor), ["token", "mint", "--to", poor.address, "1"], monkeypatch, capsys)
    assert_one_line_error(code, err, poor.address)
    # minting is owner-only, so this is rejected before gas matters; now a call that would succeed:
    code, err = run_cli(
        chain,
        key(poor),
        [
            "pool",
            "create",
            "--coordinator",
            poor.address,
            "--spec-uri",
            "x",
            "--spec-hash",
            "0x" + "00" * 32,
            "--reward-rate",
            "1",
        ],
        monkeypatch,
        capsys,
    )
    assert_one_line_error(code, err, "has 0.000000 ETH", "fund it")
    assert snapshot(chain, poor.address) == before


def test_stake_below_registration_minimum(chain, monkeypatch, capsys):
    before = snapshot(chain, chain.outsider.address)
    code, err = run_cli(chain, key(chain.outsider), ["provider", "register", "--stake", "1"], monkeypatch, capsys)
    assert_one_line_error(code, err, "stake too low", "1 INTL staked", "10 INTL needed")
    info = trio.run(_provider, chain, chain.outsider.address)
    assert info["registered"] is False and info["staked"] == 0
    assert snapshot(chain, chain.outsider.address) == before


def test_stake_more_than_balance(chain, monkeypatch, capsys):
    before = snapshot(chain, chain.coordinator.address)
    code, err = run_cli(chain, key(chain.coordinator), ["provider", "register", "--stake", "20"], monkeypatch, capsys)
    assert_one_line_error(code, err, "holds 0 INTL, needs 20 INTL", "token mint")
    assert snapshot(chain, chain.coordinator.address) == before


async def _provider(chain: World, who: str) -> dict:
    async with await chain.client(None) as c:
        return await c.call("ProviderRegistry", "getProvider", who)


def _invite(chain: World, pid: int, ttl: int, nonce: int | None = None) -> dict:
    async def go():
        async with await chain.client(None) as c:
            return (await ops.make_invite(c, chain.coordinator, pid, chain.node.address, ttl, nonce)).to_dict()

    return trio.run(go)


def test_insufficient_stake_to_join(chain, pool, monkeypatch, capsys, tmp_path):
    # Raise the bar: the provider unstakes to 40 < min stake 50 (node needs 10 per unit).
    async def lower():
        async with await chain.client(chain.provider) as c:
            await ops.unstake(c, 20 * TOKEN)

    trio.run(lower)
    f = tmp_path / "inv.json"
    f.write_text(json.dumps(_invite(chain, pool, 600)))
    before = snapshot(chain, chain.provider.address)
    code, err = run_cli(
        chain, key(chain.provider), ["pool", "join", "--pool", str(pool), "--invite", str(f)], monkeypatch, capsys
    )
    assert_one_line_error(code, err, "stake too low", "40 INTL staked", "50 INTL needed", "provider stake")
    assert snapshot(chain, chain.provider.address) == before


def test_expired_invite(chain, pool, monkeypatch, capsys, tmp_path):
    f = tmp_path / "inv.json"
    f.write_text(json.dumps(_invite(chain, pool, 5)))
    advance_time_sync(chain.url, 10)
    before = snapshot(chain, chain.provider.address)
    code, err = run_cli(
        chain, key(chain.provider), ["pool", "join", "--pool", str(pool), "--invite", str(f)], monkeypatch, capsys
    )
    assert_one_line_error(code, err, "invite expired")
    assert snapshot(chain, chain.provider.address) == before


def test_reused_invite(chain, pool, monkeypatch, capsys, tmp_path):
    f = tmp_path / "inv.json"
    f.write_text(json.dumps(_invite(chain, pool, 600, nonce=7)))
    args = ["pool", "join", "--pool", str(pool), "--invite", str(f)]
    assert run_cli(chain, key(chain.provider), args, monkeypatch, capsys)[0] == 0
    leave = ["pool", "leave", "--pool", str(pool), "--node", chain.node.address]
    assert run_cli(chain, key(chain.provider), leave, monkeypatch, capsys)[0] == 0
    before = snapshot(chain, chain.provider.address)
    code, err = run_cli(chain, key(chain.provider), args, monkeypatch, capsys)
    assert_one_line_error(code, err, "invite nonce 7 of pool", "already used")
    assert snapshot(chain, chain.provider.address) == before


def test_tampered_invite_file(chain, pool, monkeypatch, capsys, tmp_path):
    inv = _invite(chain, pool, 600)
    inv["node"] = chain.node2.address  # re-targeted to another node: the signature no longer matches
    f = tmp_path / "inv.json"
    f.write_text(json.dumps(inv))
    code, err = run_cli(
        chain, key(chain.provider), ["pool", "join", "--pool", str(pool), "--invite", str(f)], monkeypatch, capsys
    )
    assert_one_line_error(code, err, "not by the pool's coordinator")
    f.write_text("{}")
    code, err = run_cli(
        chain, key(chain.provider), ["pool", "join", "--pool", str(pool), "--invite", str(f)], monkeypatch, capsys
    )
    assert_one_line_error(code, err, "not a valid invite")


def _joined(chain: World, pid: int) -> None:
    async def go():
        async with await chain.client(chain.provider) as p, await chain.client(None) as c:
            inv = await ops.make_invite(c, chain.coordinator, pid, chain.node.address, 600)
            await ops.join_pool(p, inv)

    trio.run(go)


def test_non_coordinator_cannot_record_work(chain, pool, monkeypatch, capsys):
    _joined(chain, pool)
    before = snapshot(chain, chain.outsider.address)
    args = [
        "work",
        "submit",
        "--pool",
        str(pool),
        "--node",
        chain.node.address,
        "--key",
        "0x" + "01" * 32,
        "--units",
        "5",
    ]
    code, err = run_cli(chain, key(chain.outsider), args, monkeypatch, capsys)
    assert_one_line_error(code, err, f"{chain.outsider.address} is not the coordinator of pool {pool}")
    assert snapshot(chain, chain.outsider.address) == before


def test_non_validator_cannot_invalidate(chain, pool, monkeypatch, capsys):
    _joined(chain, pool)
    wk = "0x" + "02" * 32
    args = ["work", "submit", "--pool", str(pool), "--node", chain.node.address, "--key", wk, "--units", "5"]
    assert run_cli(chain, key(chain.coordinator), args, monkeypatch, capsys)[0] == 0
    before = snapshot(chain, chain.outsider.address)
    code, err = run_cli(
        chain, key(chain.outsider), ["work", "invalidate", "--pool", str(pool), "--key", wk], monkeypatch, capsys
    )
    assert_one_line_error(code, err, f"is not a validator of pool {pool}")
    assert snapshot(chain, chain.outsider.address) == before
    record = trio.run(_record, chain, pool, wk)
    assert record["statusName"] == "pending"


async def _record(chain: World, pid: int, wk: str) -> dict:
    async with await chain.client(None) as c:
        return await ops.record(c, pid, wk)


def test_rpc_down_is_one_line(chain, monkeypatch, capsys):
    code, err = run_cli(chain, None, ["chain", "info", "--rpc-url", "http://127.0.0.1:9"], monkeypatch, capsys)
    assert_one_line_error(code, err, "cannot reach the RPC endpoint", "--rpc-url")


def test_no_key_is_one_line(chain, monkeypatch, capsys):
    code, err = run_cli(chain, None, ["provider", "stake", "1"], monkeypatch, capsys)
    assert_one_line_error(code, err, "no signing key", "--keystore")


def test_bad_amount_is_a_usage_error(chain, monkeypatch, capsys):
    code, err = run_cli(chain, key(chain.provider), ["provider", "stake", "lots"], monkeypatch, capsys)
    assert code == 2 and "is not an amount" in err


def test_advance_time_with_rpc_down(chain, monkeypatch, capsys):
    code, err = run_cli(
        chain, None, ["chain", "advance-time", "10", "--rpc-url", "http://127.0.0.1:9"], monkeypatch, capsys
    )
    assert_one_line_error(code, err, "cannot reach the RPC endpoint")


def test_a_daemon_out_of_disk_space_ends_with_one_line() -> None:
    """A full disk that a daemon cannot wait out ends it with a one-line error naming the file (trio
    wraps it in exception groups); any other OSError is a bug and keeps its traceback."""
    from node.runtime import fatal_errors as _daemon_errors
    from node.store import StoreError

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/worker.db-wal")
    want = r"^out of disk space \(/data/worker\.db-wal\): No space left on device; free space"
    with pytest.raises(StoreError, match=want), _daemon_errors():
        raise BaseExceptionGroup("daemon", [BaseExceptionGroup("nursery", [full])])
    with pytest.raises(ConnectionRefusedError), _daemon_errors():
        raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
