"""Bootstrap peers from the pool's on-chain record, against a real anvil with the real contracts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio

from node import ops
from node.chain.errors import ChainError
from node.p2p.discovery import pool_bootstrap
from node.p2p.host import P2PNode
from tests.conftest import World


def test_pool_bootstrap_reads_and_validates_the_record(chain: World) -> None:
    async def main() -> None:
        # A real host's address is what a pool owner would publish.
        async with P2PNode(private_key=b"\x05" * 32) as boot:
            addr = boot.listen_addrs[0]
            async with await chain.client(chain.admin) as admin, await chain.client(None) as reader:
                spec = ops.PoolSpec(chain.coordinator.address, "file:///s", "0x" + "11" * 32, 10**15, 3600)
                good, _ = await ops.create_pool(admin, replace(spec, bootstrap=f" {addr} ,"))
                empty, _ = await ops.create_pool(admin, spec)
                bad, _ = await ops.create_pool(admin, replace(spec, bootstrap=f"{addr}, /ip4/127.0.0.1/tcp/1"))
                assert await pool_bootstrap(reader, good) == [addr]
                assert await pool_bootstrap(reader, empty) == []
                with pytest.raises(ValueError, match=rf"pool {bad}: bootstrap entry 2 '/ip4/127.0.0.1/tcp/1'"):
                    await pool_bootstrap(reader, bad)
                with pytest.raises(ChainError):
                    await pool_bootstrap(reader, 10_000)

                # The parsed list is directly usable as a node's bootstrap.
                with trio.fail_after(10):
                    async with P2PNode(private_key=b"\x06" * 32, bootstrap=await pool_bootstrap(reader, good)) as n:
                        while boot.peer_id not in n.peers:
                            await trio.sleep(0.02)

    trio.run(main)
