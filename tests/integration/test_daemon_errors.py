"""The daemons (`join`, `validate`, `coordinator`) refuse to start with one readable line and exit 1
when they cannot do their job; and an RPC outage mid-run is ridden out by the retry wrapper.

Real anvil and contracts (the session `chain` fixture), the CLI run in-process through `entry`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from eth_account.signers.local import LocalAccount
from libp2p.peer.id import ID

from cli.main import entry
from node import ops
from node.chain import ChainClient
from node.chain.anvil import Anvil, free_port
from node.chain.errors import RpcUnavailable
from node.chain.rpc import RpcClient
from node.daemon import retry_rpc
from node.p2p.host import identity_from_eth_key
from pool.deploy import TOKEN
from tests.conftest import World, rpc_sync, write_spec

REPO = Path(__file__).resolve().parents[2]
COORDINATOR_CMD = [sys.executable, "-m", "cli.main", "coordinator", "--metrics", ""]


def key(acct: LocalAccount) -> str:
    return "0x" + bytes(acct.key).hex()


def peer_id(acct: LocalAccount) -> str:
    return str(ID.from_pubkey(identity_from_eth_key(bytes(acct.key)).public_key))


def make_pool(
    chain: World,
    *,
    start: bool = True,
    bootstrap: str = "",
    min_stake: int = 50 * TOKEN,
    spec_dir: Path | None = None,
) -> int:
    uri, digest = write_spec(spec_dir) if spec_dir is not None else ("file:///s", "0x" + "11" * 32)

    async def go() -> int:
        async with await chain.client(chain.admin) as admin:
            spec = ops.PoolSpec(chain.coordinator.address, uri, digest, 10**15, 3600, 5 * TOKEN, min_stake, bootstrap)
            pid, _ = await ops.create_pool(admin, spec)
            if start:
                await admin.transact("PoolManager", "startPool", pid)
            return pid

    return trio.run(go)


def nonce(chain: World, addr: str) -> int:
    return int(str(rpc_sync(chain.url, "eth_getTransactionCount", [addr, "latest"])), 16)


def run_daemon(
    chain: World,
    who: LocalAccount,
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    node: LocalAccount | None = None,
) -> tuple[int, str, float]:
    monkeypatch.setenv("INTELLECT_RPC_URL", chain.url)
    monkeypatch.setenv("INTELLECT_DEPLOYMENT", str(chain.deployment_path))
    monkeypatch.setenv("INTELLECT_PRIVATE_KEY", key(who))
    monkeypatch.delenv("INTELLECT_KEYSTORE", raising=False)
    if node is not None:
        monkeypatch.setenv("INTELLECT_NODE_KEY", key(node))
    capsys.readouterr()
    t0 = time.monotonic()
    code = entry([*args, "--metrics", ""])
    elapsed = time.monotonic() - t0
    _, err = capsys.readouterr()
    return code, err, elapsed


def assert_error_line(code: int, err: str, *needles: str) -> str:
    """Exit 1, and exactly one `error: ...` line on stderr, the last one, naming every needle."""
    assert code == 1, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err, err
    for n in needles:
        assert n in errors[0], f"{n!r} not in {errors[0]!r}"
    return errors[0]


def test_join_unknown_pool(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    before = nonce(chain, chain.provider.address)
    code, err, _ = run_daemon(
        chain,
        chain.provider,
        ["join", "--pool", "999", "--yes", "--data-dir", str(tmp_path / "w")],
        monkeypatch,
        capsys,
        chain.node,
    )
    assert_error_line(code, err, "pool 999 does not exist", "pool id")
    assert nonce(chain, chain.provider.address) == before


def test_join_pool_not_started(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    pid = make_pool(chain, start=False)
    before = nonce(chain, chain.provider.address)
    code, err, _ = run_daemon(
        chain,
        chain.provider,
        ["join", "--pool", str(pid), "--yes", "--data-dir", str(tmp_path / "w")],
        monkeypatch,
        capsys,
        chain.node,
    )
    assert_error_line(code, err, f"pool {pid} is created, not active")
    assert nonce(chain, chain.provider.address) == before


def test_join_without_tokens_to_stake(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    pid = make_pool(chain)
    poor = chain.coordinator  # holds ETH (anvil prefunds it) but no INTL
    before = nonce(chain, poor.address)
    code, err, _ = run_daemon(
        chain,
        poor,
        ["join", "--pool", str(pid), "--yes", "--data-dir", str(tmp_path / "w")],
        monkeypatch,
        capsys,
        chain.node,
    )
    assert_error_line(code, err, poor.address, "holds 0 INTL, needs 50 INTL", "token mint")
    assert nonce(chain, poor.address) == before


def test_join_with_unreachable_coordinator(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    dead = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer_id(chain.coordinator)}"
    pid = make_pool(chain, bootstrap=dead)
    code, err, elapsed = run_daemon(
        chain,
        chain.provider,
        ["join", "--pool", str(pid), "--yes", "--connect-wait", "3", "--data-dir", str(tmp_path / "w")],
        monkeypatch,
        capsys,
        chain.node,
    )
    assert_error_line(code, err, "coordinator", dead, "unreachable", "gave up after 3 s")
    assert elapsed < 60, elapsed


def test_join_with_an_unusable_data_dir(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, err, _ = run_daemon(
        chain,
        chain.provider,
        ["join", "--pool", "1", "--yes", "--data-dir", str(blocker / "w")],
        monkeypatch,
        capsys,
        chain.node,
    )
    assert_error_line(code, err, f"cannot use --data-dir {blocker / 'w'}: Not a directory", "writable folder")


def test_join_with_rpc_down(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, err, elapsed = run_daemon(
        chain,
        chain.provider,
        ["join", "--pool", "1", "--yes", "--rpc-url", url, "--rpc-wait", "2", "--data-dir", str(tmp_path / "w")],
        monkeypatch,
        capsys,
        chain.node,
    )
    assert_error_line(code, err, f"the RPC endpoint {url} is unreachable", "gave up after 2 s", "--rpc-url")
    assert 1.0 <= elapsed < 60, elapsed  # it retried before giving up


def test_validate_with_rpc_down(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, err, elapsed = run_daemon(
        chain,
        chain.validator,
        ["validate", "--pool", "1", "--rpc-url", url, "--rpc-wait", "2", "--data-dir", str(tmp_path / "v")],
        monkeypatch,
        capsys,
    )
    assert_error_line(code, err, "validator", f"the RPC endpoint {url} is unreachable")
    assert elapsed < 60, elapsed


def test_coordinator_with_the_wrong_key(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    pid = make_pool(chain)
    code, err, _ = run_daemon(
        chain,
        chain.outsider,
        ["coordinator", "--pool", str(pid), "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp_path / "c")],
        monkeypatch,
        capsys,
    )
    assert_error_line(
        code, err, f"{chain.outsider.address} is not the coordinator of pool {pid}", chain.coordinator.address
    )


def test_validate_by_a_key_the_pool_does_not_name(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    pid = make_pool(chain)
    code, err, _ = run_daemon(
        chain,
        chain.outsider,
        ["validate", "--pool", str(pid), "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp_path / "v")],
        monkeypatch,
        capsys,
    )
    assert_error_line(code, err, f"{chain.outsider.address} is not a validator of pool {pid}", "validator add")


def test_join_refused_by_the_coordinator(chain: World, monkeypatch, capsys, tmp_path: Path) -> None:
    """A live coordinator (a real `intellect-node coordinator` process) refuses the invite of a
    blacklisted node: the worker exits with the coordinator's reason on one line."""
    port = free_port()
    addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id(chain.coordinator)}"
    pid = make_pool(chain, bootstrap=addr, spec_dir=tmp_path / "spec")

    async def blacklist() -> None:
        async with await chain.client(chain.admin) as admin:
            await admin.transact("PoolManager", "blacklistNode", pid, chain.node.address)

    trio.run(blacklist)
    env = {
        **os.environ,
        "INTELLECT_PRIVATE_KEY": key(chain.coordinator),
        "INTELLECT_RPC_URL": chain.url,
        "INTELLECT_DEPLOYMENT": str(chain.deployment_path),
        "PYTHONPATH": str(REPO),
    }
    env.pop("INTELLECT_KEYSTORE", None)
    log = tmp_path / "coordinator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                *COORDINATOR_CMD,
                "--pool",
                str(pid),
                "--listen",
                addr.split("/p2p/")[0],
                "--data-dir",
                str(tmp_path / "c"),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "coordinator did not start listening: " + log.read_text()
            time.sleep(0.2)
        code, err, elapsed = run_daemon(
            chain,
            chain.provider,
            ["join", "--pool", str(pid), "--yes", "--connect-wait", "60", "--data-dir", str(tmp_path / "w")],
            monkeypatch,
            capsys,
            chain.node,
        )
        assert_error_line(code, err, "invite request refused", f"{chain.node.address} is blacklisted in pool {pid}")
        assert elapsed < 90, elapsed
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------- RPC outage mid-run


def test_retry_rpc_rides_out_an_anvil_restart() -> None:
    """A real anvil goes away for ~2 s and comes back on the same port: the call retried through
    `retry_rpc` succeeds; with a wait shorter than the outage it gives up with `RpcUnavailable`."""
    port = free_port()
    a = Anvil(port=port).start()
    try:

        async def go() -> tuple[int, float, int]:
            async with RpcClient(a.url, retries=0) as rpc:
                assert await rpc.block_number() == 0
                rpc_sync(a.url, "evm_mine")
                await trio.to_thread.run_sync(a.stop)
                with pytest.raises(RpcUnavailable):
                    await rpc.block_number()
                with pytest.raises(RpcUnavailable):
                    await retry_rpc(rpc.block_number, "short wait", wait=0.5)
                attempts = 0

                async def call() -> int:
                    nonlocal attempts
                    attempts += 1
                    return await rpc.chain_id()

                async def restart() -> None:
                    await trio.sleep(2.0)
                    await trio.to_thread.run_sync(a.start)

                t0 = trio.current_time()
                async with trio.open_nursery() as n:
                    n.start_soon(restart)
                    with trio.fail_after(45):
                        chain_id = await retry_rpc(call, "chain id", wait=40.0)
                return chain_id, trio.current_time() - t0, attempts

        chain_id, took, attempts = trio.run(go)
        assert chain_id == 31337
        assert took >= 1.5 and attempts >= 2, (took, attempts)
    finally:
        a.stop()


def test_worker_claim_scan_survives_an_rpc_outage(chain: World, tmp_path: Path) -> None:
    """The worker's claim path against a chain whose endpoint drops mid-run: a TCP proxy in front of
    the session anvil is closed and reopened on the same port while `claim_final` runs."""
    from node.worker import Worker, WorkerConfig

    pid = make_pool(chain)
    port = free_port()
    proxy = _Proxy(port, int(chain.url.rsplit(":", 1)[1]))

    async def go() -> tuple[int, float]:
        async with trio.open_nursery() as n:
            await n.start(proxy.serve)
            url = f"http://127.0.0.1:{port}"
            cfg = WorkerConfig(pool_id=pid, data_dir=tmp_path / "w", rpc_url=url, deployment=chain.deployment)
            w = Worker(cfg, chain.provider, chain.node)
            w.chain = await ChainClient.connect(url, chain.deployment, chain.provider, rpc_retries=0)
            try:
                assert await w.claim_final() == 0
                await proxy.close()
                t0 = trio.current_time()

                async def reopen() -> None:
                    await trio.sleep(2.0)
                    await n.start(proxy.serve)

                n.start_soon(reopen)
                with trio.fail_after(45):
                    got = await w.claim_final()
                took = trio.current_time() - t0
            finally:
                await w.chain.aclose()
                w.store.close()
            n.cancel_scope.cancel()
            return got, took

    got, took = trio.run(go)
    assert got == 0 and took >= 1.5, (got, took)


class _Proxy:
    """A TCP forwarder on 127.0.0.1:`port` to 127.0.0.1:`target` that can be closed (dropping every
    connection: the endpoint is down) and reopened on the same port."""

    def __init__(self, port: int, target: int) -> None:
        self.port = port
        self.target = target
        self.scope: trio.CancelScope | None = None

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self.scope = scope
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            async with trio.open_nursery() as n:
                task_status.started()
                await trio.serve_listeners(self._handle, listeners, handler_nursery=n)

    async def close(self) -> None:
        assert self.scope is not None
        self.scope.cancel()
        await trio.sleep(0.1)

    async def _handle(self, client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target)
        except OSError:
            await client.aclose()
            return

        async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
            try:
                while data := await src.receive_some(65536):
                    await dst.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                await dst.aclose()

        async with client, upstream, trio.open_nursery() as n:
            n.start_soon(pump, client, upstream)
            n.start_soon(pump, upstream, client)
