"""Starting and stopping a local anvil chain (devnet and tests), and finding the Foundry binaries."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx

from .errors import ChainError, RpcError
from .rpc import RpcClient

REPO = Path(__file__).resolve().parents[2]

# The keys anvil prefunds from its default mnemonic ("test test ... junk"); public knowledge, for
# local chains only.
ANVIL_KEYS = (
    "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80",
    "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d",
    "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a",
    "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6",
    "0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a",
    "0x8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba",
    "0x92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e",
    "0x4bbbf85ce3377467afe5d46f804f221813b2bb87f24d81f60f1fcdbf7cbf4356",
    "0xdbda1821b80551c9d65939329250298aa3472ba22feea921c0cf5d620ea67b97",
    "0x2a871d0798f97d79848a013d4936a73bf4cc922c825d33c1cf7073dff6d409c6",
)


def find_tool(tool: str) -> str:
    """Path of a Foundry binary: $INTELLECT_FOUNDRY_BIN, the project's npm install, then PATH."""
    env_dir = os.environ.get("INTELLECT_FOUNDRY_BIN")
    candidates = []
    if env_dir:
        candidates.append(Path(env_dir) / tool)
    candidates.append(REPO / "node_modules" / "@foundry-rs" / f"{tool}-linux-amd64" / "bin" / tool)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which(tool)
    if found:
        return found
    raise ChainError(f"cannot find the Foundry binary `{tool}`", "run `make test` or `npm ci` in the project root once")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Anvil:
    """A local anvil process on 127.0.0.1. Use as a context manager; `stop()` is idempotent."""

    def __init__(
        self,
        *,
        port: int | None = None,
        chain_id: int = 31337,
        block_time: float | None = None,
        state_file: str | None = None,
        log_file: str | None = None,
        genesis_number: int = 0,
    ) -> None:
        self.port = port or free_port()
        self.chain_id = chain_id
        self.block_time = block_time
        self.state_file = state_file
        self.log_file = log_file
        self.genesis_number = genesis_number  # the first block's number (a chain with a long past, cheaply)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> Anvil:
        cmd = [find_tool("anvil"), "--host", "127.0.0.1", "--port", str(self.port), "--chain-id", str(self.chain_id)]
        if self.block_time:
            cmd += ["--block-time", str(self.block_time)]
        if self.state_file:
            cmd += ["--state", self.state_file]
        if self.genesis_number:
            cmd += ["--number", str(self.genesis_number)]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            return self._wait_ready(timeout)
        except BaseException:  # Ctrl-C or SIGTERM while it starts: `with Anvil()` never reaches its exit
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> Anvil:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ChainError(f"anvil exited with code {self.proc.returncode} at start (port {self.port})")
            try:
                r = httpx.post(
                    self.url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}, timeout=1
                )
                if r.status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.03)
        raise ChainError(f"anvil did not answer on {self.url} within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            except KeyboardInterrupt:  # a second Ctrl-C while it stops: never leave it running
                self.proc.kill()
                self.proc.wait(5)
                raise
        self.proc = None

    def __enter__(self) -> Anvil:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def is_local(rpc: RpcClient) -> bool:
    """Whether `rpc` is a local development chain (anvil, hardhat, ganache) whose clock may be moved."""
    try:
        version = str(await rpc.request("web3_clientVersion")).lower()
    except RpcError:
        return False
    return version.startswith(("anvil", "hardhat", "ganache"))


async def advance_time(rpc: RpcClient, seconds: int) -> int:
    """Move a local chain's clock forward by `seconds` (0 mines a block only) and mine a block; returns
    the new block's timestamp. The one time-travel helper of the CLI and the tests."""
    if not await is_local(rpc):
        raise ChainError("moving time works on local chains (anvil) only", "on a real network, wait")
    if seconds > 0:
        await rpc.request("evm_increaseTime", [int(seconds)])
    await rpc.request("evm_mine", [])
    return int((await rpc.get_block("latest"))["timestamp"], 16)
