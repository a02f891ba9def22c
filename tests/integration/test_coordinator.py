"""The coordinator daemon against real anvil and real libp2p hosts: a member that heartbeats on gossip
stays, a member that goes silent is ejected on chain."""

from __future__ import annotations

from pathlib import Path

import trio

from node import ops, protocol
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from pool.coordinator import Coordinator, CoordinatorConfig
from pool.deploy import TOKEN
from tests.conftest import World


async def _pool_with_two_members(chain: World) -> int:
    async with await chain.client(chain.admin) as admin, await chain.client(chain.provider) as prov:
        spec = ops.PoolSpec(chain.coordinator.address, "file:///s", "0x" + "22" * 32, 10**15, 3600, TOKEN, TOKEN)
        pid, _ = await ops.create_pool(admin, spec)
        await admin.transact("PoolManager", "startPool", pid)
        await ops.register_provider(prov, 100 * TOKEN)
        async with await chain.client(chain.coordinator) as coord:
            for node in (chain.node, chain.node2):
                await ops.add_node(prov, node.address, 1, ops.node_signature(prov, node, chain.provider.address))
                await ops.join_pool(prov, await ops.make_invite(coord, chain.coordinator, pid, node.address, 600))
        return pid


async def test_silent_member_is_ejected_and_heartbeating_one_stays(chain: World, tmp_path: Path) -> None:
    pid = await _pool_with_two_members(chain)
    cfg = CoordinatorConfig(
        pool_id=pid,
        data_dir=tmp_path / "coord",
        rpc_url=chain.url,
        deployment=chain.deployment,
        listen="/ip4/127.0.0.1/tcp/0",
        model="tiny",
        eject_after=6.0,
        heartbeat_grace=0.0,
    )
    coord = Coordinator(cfg, chain.coordinator)
    async with await chain.client(None) as reader, trio.open_nursery() as nursery:
        addrs = await nursery.start(coord.run)

        def members() -> Membership:
            return Membership(pid, chain.coordinator.address, frozenset(), frozenset({chain.node2.address}))

        async with PoolNetwork(private_key=bytes(chain.node2.key), pool=pid, membership=members) as net:
            await net.connect(addrs[0])

            async def beat() -> None:
                while True:
                    await net.publish("heartbeat", protocol.pack({"accepted": 0}))
                    await trio.sleep(0.5)

            nursery.start_soon(beat)
            with trio.fail_after(60):
                while await reader.call("PoolManager", "isMember", pid, chain.node.address):
                    await trio.sleep(0.5)
            assert await reader.call("PoolManager", "isMember", pid, chain.node2.address)
            assert coord.heartbeats.get(chain.node2.address) is not None
        nursery.cancel_scope.cancel()
    async with await chain.client(None) as reader:
        ejected = [e for e in await reader.events(["PoolManager"]) if e.name == "NodeEjected"]
    assert [(e.args["node"], e.args["by"]) for e in ejected] == [(chain.node.address, chain.coordinator.address)]
