"""`cast` (Foundry) can call every view function and decode every event of the protocol contracts,
with signatures taken from the forge artifacts: a block-explorer user needs nothing of ours."""

from __future__ import annotations

import subprocess

import pytest
import trio
from eth_utils import keccak

from node import ops
from node.chain import abi
from node.chain.anvil import advance_time, find_tool
from pool.deploy import TOKEN
from tests.conftest import World, rpc_sync, signed

CAST = find_tool("cast")
# Emitted only by OpenZeppelin code paths the protocol never takes (role admin changes, EIP-5267
# domain changes); decoded from a synthesized log instead of a real one.
NEVER_EMITTED = {"RoleAdminChanged", "EIP712DomainChanged"}


def cast(*args: str) -> str:
    p = subprocess.run([CAST, *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, f"cast {' '.join(args)} failed: {p.stderr}"
    return p.stdout.strip()


def sig(entry: dict, with_names: bool = False) -> str:
    parts = []
    for p in entry.get("inputs", []):
        t = abi._type(p)
        if with_names:
            t += (" indexed" if p.get("indexed") else "") + (f" {p['name']}" if p.get("name") else "")
        parts.append(t)
    return f"{entry['name']}({','.join(parts)})"


def out_sig(entry: dict) -> str:
    return "(" + ",".join(abi._type(p) for p in entry.get("outputs", [])) + ")"


def arg_for(t: str, addr: str) -> str:
    if t.endswith("]"):
        return "[]"
    if t == "address":
        return addr
    if t.startswith(("uint", "int")):
        return "1"
    if t == "bool":
        return "false"
    if t == "bytes32":
        return "0x" + "00" * 31 + "01"
    if t == "bytes":
        return "0x"
    if t.startswith("bytes"):
        return "0x" + "00" * int(t[5:])
    if t == "string":
        return "x"
    raise AssertionError(f"no sample argument for {t}")


def _busy_pool(chain: World) -> int:
    """Drive the contracts through every kind of state change so every event is emitted for real."""

    async def go() -> int:
        async with (
            await chain.client(chain.outsider) as outsider,
            await chain.client(chain.admin) as admin,
            await chain.client(chain.provider) as prov,
            await chain.client(chain.coordinator) as coord,
            await chain.client(chain.validator) as val,
        ):
            pid, _ = await ops.create_pool(
                admin,
                ops.PoolSpec(
                    chain.coordinator.address,
                    "ipfs://spec",
                    "0x" + "12" * 32,
                    10**15,
                    100,
                    TOKEN,
                    0,
                    "/ip4/127.0.0.1/tcp/1",
                    validators=(chain.validator.address, chain.outsider.address, chain.admin.address),
                    disputes=ops.DisputeTerms(appeal_period=50, vote_period=50, committee_size=1),
                ),
            )
            await admin.transact("PoolManager", "startPool", pid)
            await admin.transact("PoolManager", "setBootstrap", pid, "/ip4/127.0.0.1/tcp/2")
            await ops.fund_pool(admin, pid, 100 * TOKEN)
            await ops.register_provider(prov, 50 * TOKEN)
            await ops.stake(prov, 5 * TOKEN)
            for n in (chain.node, chain.node2):
                await ops.add_node(prov, n.address, 1, await ops.node_signature(prov, n, chain.provider.address))
                await ops.join_pool(prov, await ops.make_invite(coord, chain.coordinator, pid, n.address, 600))
            await ops.record_work(
                coord,
                pid,
                [ops.WorkItem(chain.node.address, "0x" + f"{i:064x}", 10, 1, "0x" + "aa" * 32) for i in range(1, 6)],
            )
            k = ["0x" + f"{i:064x}" for i in range(6)]
            s = [signed(val, pid, key, chain.node) for key in k]
            await ops.invalidate(val, pid, k[1], "0x" + "bb" * 32, signature=s[1])  # accused; final after appeal period
            await ops.invalidate(val, pid, k[3], "0x" + "bb" * 32, hard=False)  # revoked, no slash
            await ops.invalidate(val, pid, k[4], "0x" + "bb" * 32, signature=s[4])  # accused, appealed, overturned
            await ops.appeal(prov, pid, k[4])
            await prov.rpc.request("evm_mine", [])
            await ops.draw_committee(prov, pid, k[4])
            juror = (
                outsider if await admin.call("WorkLedger", "jurorState", pid, k[4], chain.outsider.address) else admin
            )
            await ops.vote(juror, pid, k[4], False)
            await ops.register_provider(outsider, 10 * TOKEN)  # staked: may challenge
            await ops.challenge(outsider, pid, k[5], "0x" + "cc" * 32, s[5])  # challenged, then lapses
            await ops.add_validator(admin, pid, chain.node.address)
            await prov.rpc.request("anvil_mine", [hex(300)])  # the seed block's hash is gone: every one sits
            await ops.draw_committee(prov, pid, k[5])  # the set as the challenge opened
            await ops.remove_validator(admin, pid, chain.node.address)
            await advance_time(prov.rpc, 200)
            await ops.finalize_invalidation(val, pid, k[1])
            await ops.finalize_invalidation(val, pid, k[3])
            await ops.resolve_lapsed(val, pid, k[5])  # reopened: final once the time it had left is over
            await advance_time(prov.rpc, 200)
            await ops.claim(prov, pid)
            await admin.transact("WorkLedger", "withdrawSurplus", pid, TOKEN, chain.admin.address)
            await prov.transact("PoolManager", "leavePool", pid, chain.node2.address)
            await prov.transact("ProviderRegistry", "removeNode", chain.node2.address)
            await coord.transact("PoolManager", "ejectNode", pid, chain.node.address)
            await coord.transact("PoolManager", "blacklistNode", pid, chain.node.address)
            await ops.unstake(prov, TOKEN)
            await advance_time(prov.rpc, 8 * 86400)
            await ops.withdraw(prov)
            await admin.transact("ProviderRegistry", "setTreasury", chain.admin.address)
            await admin.transact("ProviderRegistry", "setParameters", 7 * 86400, 10 * TOKEN, 10 * TOKEN, 1000, 10**30)
            role = "0x" + keccak(text="SLASHER_ROLE").hex()
            await admin.transact("ProviderRegistry", "grantRole", role, chain.outsider.address)
            await admin.transact("ProviderRegistry", "revokeRole", role, chain.outsider.address)
            await admin.transact("PoolManager", "rotateCoordinator", pid, chain.node2.address)
            await admin.transact("PoolManager", "endPool", pid)
            return pid

    return trio.run(go)


def test_cast_calls_every_view_function(chain):
    pid = _busy_pool(chain)
    called = 0
    for name in abi.CONTRACT_NAMES:
        address = chain.deployment.contracts[name]
        for entry in abi.load(name).abi:
            if entry["type"] != "function" or entry["stateMutability"] not in ("view", "pure"):
                continue
            args = [arg_for(abi._type(p), chain.provider.address) for p in entry["inputs"]]
            out = cast("call", address, sig(entry) + out_sig(entry), *args, "--rpc-url", chain.url)
            assert out != "", f"{name}.{entry['name']} returned nothing"
            called += 1
    assert called >= 40
    # A few values, checked against what we know.
    assert cast(
        "call", chain.deployment.contracts["PoolManager"], "poolCount()(uint256)", "--rpc-url", chain.url
    ) == str(pid)
    got = cast(
        "call",
        chain.deployment.contracts["ProviderRegistry"],
        "stakeOf(address)(uint256)",
        chain.provider.address,
        "--rpc-url",
        chain.url,
    )
    assert got.split()[0] == str(53 * TOKEN)  # 50 + 5 staked, 1 slashed, 1 unstaked
    pool = cast(
        "call",
        chain.deployment.contracts["PoolManager"],
        "getPool(uint256)((address,uint8,uint64,address,uint32,uint64,uint128,uint128,uint256,bytes32,string,string))",
        str(pid),
        "--rpc-url",
        chain.url,
    )
    assert chain.admin.address in pool and "ipfs://spec" in pool and "/ip4/127.0.0.1/tcp/2" in pool


def _decode_with_cast(entry: dict, topics: list[str], data: str) -> list[str]:
    indexed = [p for p in entry["inputs"] if p.get("indexed")]
    plain = [p for p in entry["inputs"] if not p.get("indexed")]
    assert cast("sig-event", sig(entry, with_names=True)) == topics[0]
    values = [cast("abi-decode", f"f()({abi._type(p)})", t) for p, t in zip(indexed, topics[1:], strict=True)]
    if plain:
        values.append(cast("decode-event", "--sig", f"{entry['name']}({','.join(abi._type(p) for p in plain)})", data))
    return values


def test_cast_decodes_every_event(chain):
    _busy_pool(chain)
    head = int(str(rpc_sync(chain.url, "eth_blockNumber")), 16)
    logs = rpc_sync(
        chain.url,
        "eth_getLogs",
        [{"fromBlock": "0x0", "toBlock": hex(head), "address": list(chain.deployment.contracts.values())}],
    )
    by_address = {a.lower(): n for n, a in chain.deployment.contracts.items()}
    seen: set[str] = set()
    for log in logs:  # type: ignore[union-attr]
        name = by_address[log["address"].lower()]
        ev = abi.load(name).decode_log(log)
        assert ev is not None, f"python could not decode a {name} log"
        entry = abi.load(name).events[bytes.fromhex(log["topics"][0][2:])]
        values = _decode_with_cast(entry, log["topics"], log["data"])
        # cast and our decoder agree on every indexed address/number
        for p, v in zip([p for p in entry["inputs"] if p.get("indexed")], values, strict=False):
            if abi._type(p) == "address":
                assert v.lower() == ev.args[p["name"]].lower()
            elif abi._type(p).startswith("uint"):
                assert v.split()[0] == str(ev.args[p["name"]])
        seen.add(ev.name)
    declared = {e["name"] for n in abi.CONTRACT_NAMES for e in abi.load(n).abi if e["type"] == "event"}
    missing = declared - seen - NEVER_EMITTED
    assert not missing, f"events never emitted by the flow: {sorted(missing)}"
    # The two OpenZeppelin-only events: decode synthesized logs.
    import eth_abi

    for n in abi.CONTRACT_NAMES:
        for entry in abi.load(n).abi:
            if entry["type"] == "event" and entry["name"] in NEVER_EMITTED:
                topic0 = "0x" + keccak(text=sig(entry)).hex()
                indexed = [p for p in entry["inputs"] if p.get("indexed")]
                plain = [p for p in entry["inputs"] if not p.get("indexed")]
                topics = [topic0] + ["0x" + "00" * 31 + "07" for _ in indexed]
                data = "0x" + eth_abi.encode([abi._type(p) for p in plain], [7 for _ in plain]).hex()
                values = _decode_with_cast(entry, topics, data)
                assert len(values) == len(indexed) + (1 if plain else 0)


@pytest.fixture(autouse=True)
def _needs_cast():
    assert CAST
