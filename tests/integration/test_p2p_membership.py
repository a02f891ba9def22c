"""ChainMembership against a real anvil with the real contracts: joins, leaves and validator grants
appear in the cached snapshot after a refresh, and RPC failures keep the last snapshot."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import trio

from node import ops
from node.p2p.membership import ChainMembership
from pool.deploy import TOKEN
from tests.conftest import World


async def _pool_with_node(chain: World) -> int:
    """A started, funded pool whose provider is registered with `chain.node` added (not yet joined)."""
    async with await chain.client(chain.admin) as admin, await chain.client(chain.provider) as prov:
        pid, _ = await ops.create_pool(
            admin,
            ops.PoolSpec(
                chain.coordinator.address,
                "file:///s",
                "0x" + "11" * 32,
                10**15,
                3600,
                5 * TOKEN,
                50 * TOKEN,
                validators=(chain.validator.address,),
            ),
        )
        await admin.transact("PoolManager", "startPool", pid)
        await ops.fund_pool(admin, pid, 100 * TOKEN)
        await ops.register_provider(prov, 60 * TOKEN)
        await ops.add_node(
            prov, chain.node.address, 1, await ops.node_signature(prov, chain.node, chain.provider.address)
        )
        return pid


async def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.02)


def test_snapshot_follows_joins_leaves_and_the_pools_validators(chain: World) -> None:
    async def main() -> None:
        t0 = time.monotonic()
        pid = await _pool_with_node(chain)
        async with (
            await chain.client(chain.admin) as admin,
            await chain.client(chain.provider) as prov,
            await chain.client(chain.coordinator) as coord,
            await chain.client(None) as reader,
        ):
            cm = ChainMembership(reader, pid, interval=0.1, max_backoff=0.4)
            with pytest.raises(RuntimeError):
                cm.snapshot()
            snap = await cm.refresh()
            assert snap.pool == pid
            assert snap.coordinator == chain.coordinator.address
            assert snap.validators == {chain.validator.address}  # named at the pool's creation
            assert snap.members == frozenset()

            await ops.join_pool(prov, await ops.make_invite(coord, chain.coordinator, pid, chain.node.address, 600))
            assert chain.node.address not in cm.snapshot().members  # snapshot() does no I/O
            assert chain.node.address in (await cm.refresh()).members
            assert cm.snapshot().role(chain.node.address) == "member"

            await ops.add_validator(admin, pid, chain.outsider.address)
            await prov.transact("PoolManager", "leavePool", pid, chain.node.address)
            snap = await cm.refresh()
            assert snap.validators == {chain.validator.address, chain.outsider.address}
            assert snap.members == frozenset()
            assert await cm.refresh() == snap  # nothing new: same snapshot

            # The background loop: it starts once loaded, keeps up with new events, and survives RPC errors.
            async with trio.open_nursery() as nursery:
                started = await nursery.start(cm.run)
                assert started == snap
                real = reader.rpc.block_number
                broken = {"left": 3}

                async def flaky() -> int:
                    if broken["left"] > 0:
                        broken["left"] -= 1
                        raise OSError("rpc down")
                    return await real()

                reader.rpc.block_number = flaky  # type: ignore[method-assign]
                await _until(lambda: cm.failures >= 2)
                assert cm.snapshot() == snap  # the last good snapshot stays in force
                await ops.remove_validator(admin, pid, chain.outsider.address)
                await ops.join_pool(prov, await ops.make_invite(coord, chain.coordinator, pid, chain.node.address, 600))
                await _until(
                    lambda: (
                        chain.node.address in cm.snapshot().members
                        and chain.outsider.address not in cm.snapshot().validators
                    )
                )
                assert cm.failures == 0
                seen: list[frozenset[str]] = []

                async def watch() -> None:
                    seen.append((await cm.wait_for_change()).members)

                nursery.start_soon(watch)
                await trio.sleep(0)  # the watcher waits before the change can happen
                await coord.transact("PoolManager", "ejectNode", pid, chain.node.address)
                await _until(lambda: bool(seen))
                assert seen == [frozenset()]
                nursery.cancel_scope.cancel()
        print(f"\n[membership] chain-backed snapshot test in {time.monotonic() - t0:.1f} s")

    trio.run(main)
