"""Shared fixtures: a real anvil chain per test session, the real contracts deployed once, and a
chain snapshot reverted after every test so tests do not see each other's state."""

from __future__ import annotations

import contextlib
import hashlib
import json
import resource
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
from eth_account.signers.local import LocalAccount

from node import ops
from node.chain import ChainClient, Deployment
from node.chain.anvil import ANVIL_KEYS, Anvil, advance_time
from node.chain.rpc import RpcClient
from node.chain.tx import Receipt
from node.keys import from_hex
from pool.deploy import TOKEN, DeployParams, deploy


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past `limit` bytes of one file fail with EFBIG (the kernel's RLIMIT_FSIZE), as they would
    with ENOSPC on a full disk; SIGXFSZ is ignored so the write returns the error instead."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


DEFAULT_SPEC = {
    "name": "test",
    "model": "tiny",
    "environment": "math",
    "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64},
    "group_size": 4,
    "async_level": 2,
}


def write_spec(folder: Path, **over: object) -> tuple[str, str]:
    """A pool task spec file in `folder`: its file:// URI and sha256 (what a pool's record holds)."""
    data = json.dumps({**DEFAULT_SPEC, **over}, sort_keys=True).encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "task-spec.json"
    path.write_bytes(data)
    return path.resolve().as_uri(), "0x" + hashlib.sha256(data).hexdigest()


def advance_time_sync(url: str, seconds: int) -> int:
    """`node.chain.anvil.advance_time` for a test outside trio: the chain's clock `seconds` on, a block
    mined; returns the new timestamp."""

    async def go() -> int:
        async with RpcClient(url) as rpc:
            return await advance_time(rpc, seconds)

    return trio.run(go)


def rpc_sync(url: str, method: str, params: list[object] | None = None, timeout: float = 10) -> object:
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}, timeout=timeout)
    body = r.json()
    if "error" in body:
        raise RuntimeError(body["error"])
    return body["result"]


@dataclass(frozen=True)
class World:
    url: str
    deployment: Deployment
    deployment_path: Path
    admin: LocalAccount
    provider: LocalAccount
    coordinator: LocalAccount
    validator: LocalAccount
    outsider: LocalAccount
    node: LocalAccount
    node2: LocalAccount

    async def client(self, who: LocalAccount | None) -> ChainClient:
        return await ChainClient.connect(self.url, self.deployment, who)


@pytest.fixture(scope="session")
def anvil() -> Iterator[Anvil]:
    with Anvil() as a:
        yield a


def make_world(anvil: Anvil, folder: Path) -> World:
    """The real contracts deployed on `anvil`, tokens minted to the test parties."""
    keys = [from_hex(k) for k in ANVIL_KEYS]
    admin, provider, coordinator, validator, outsider, node, node2 = keys[:7]

    async def setup() -> Deployment:
        async with RpcClient(anvil.url) as rpc:
            dep = await deploy(rpc, admin, DeployParams(), rpc_url=anvil.url)
        c = await ChainClient.connect(anvil.url, dep, admin)
        async with c:
            for who in (admin, provider, outsider, validator):
                await c.transact("IntellectToken", "mint", who.address, 10_000 * TOKEN)
        return dep

    dep = trio.run(setup)
    path = folder / "deployment.json"
    dep.save(path)
    return World(anvil.url, dep, path, admin, provider, coordinator, validator, outsider, node, node2)


@pytest.fixture(scope="session")
def world(anvil: Anvil, tmp_path_factory: pytest.TempPathFactory) -> World:
    return make_world(anvil, tmp_path_factory.mktemp("deploy"))


@pytest.fixture
def own_chain(tmp_path: Path) -> Iterator[World]:
    """A world on an anvil of its own, for tests that reorganise the chain (`anvil_reorg` and the session
    chain's snapshot-and-revert do not mix)."""
    with Anvil() as a:
        yield make_world(a, tmp_path)


def signed(c: ChainClient, pool_id: int, work_key: str, node: LocalAccount) -> str:
    """`node`'s signature over its rollout file `work_key` in `pool_id` (what its file carries, and what a
    slash needs: a node bound to the record's provider)."""
    return ops.rollout_claim(c, pool_id, work_key).sign(node)


async def slash_now(w: World, pool_id: int, work_key: str, evidence: str = "0x" + "ee" * 32) -> Receipt:
    """The pool's validator (`w.validator`) invalidates `work_key` hard, nobody appeals, and once the
    chain's clock has passed the appeal period anyone makes it final. Returns the finalizing receipt
    (its `WorkInvalidated` and `Slashed` events)."""
    async with await w.client(w.validator) as v:
        sig = signed(v, pool_id, work_key, w.node)
        accused = (await ops.invalidate(v, pool_id, work_key, evidence, signature=sig)).event("WorkAccused").args
        now = await v.timestamp()
        await advance_time(v.rpc, max(0, int(accused["appealEnd"]) - now))
        return await ops.finalize_invalidation(v, pool_id, work_key)


@pytest.fixture
def chain(world: World) -> Iterator[World]:
    """The deployed world, restored to its post-deployment state after the test."""
    snap = rpc_sync(world.url, "evm_snapshot")
    try:
        yield world
    finally:
        rpc_sync(world.url, "evm_revert", [snap])
