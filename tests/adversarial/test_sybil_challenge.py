"""A sybil provider challenges honest work, betting that the committee will not look.

Anyone staked at the pool's minimum may challenge a record with a bond. Here a fresh provider with
no stake in the outcome challenges an honest file made by the real vLLM engine; the pool's validator
daemon is drawn onto the committee, fetches the file, re-checks it with its own transformers prefill
and votes to overturn. The challenger's bond goes to the honest provider, the record stays payable,
and the provider claims its full reward after the deadline. Real pieces: the compiled contracts on
anvil, the validator daemon, libp2p on 127.0.0.1 (the coordinator's side is a PoolNetwork with its key
that serves the file and the node's signature of it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from node import ops, protocol
from node.chain.anvil import ANVIL_KEYS, advance_time
from node.inference.tools import model_tools
from node.keys import from_hex
from node.p2p.blobs import BlobStore, serve_blobs
from node.p2p.network import PoolNetwork
from node.p2p.rules import Membership
from node.rollout.build import build_rollout_file
from node.rollout.file import RolloutHeader
from node.tasks.math import MathEnv
from node.validator import Validator, ValidatorConfig
from tests.adversarial.test_hostile_rollouts import PROMPTS, SAMPLING, SEED
from tests.conftest import TOKEN, World, write_spec

WINDOW = 3600


async def _pool(chain: World, folder: Path) -> int:
    """A pool on the honest file's spec, with one validator (so a committee of one) and one member node."""
    uri, digest = write_spec(folder, sampling=SAMPLING)
    async with await chain.client(chain.admin) as admin, await chain.client(chain.provider) as prov:
        spec = ops.PoolSpec(
            chain.coordinator.address, uri, digest, 10**15, WINDOW, TOKEN, TOKEN, validators=(chain.validator.address,)
        )
        pid, _ = await ops.create_pool(admin, spec)
        await admin.transact("PoolManager", "startPool", pid)
        await ops.fund_pool(admin, pid, 10 * TOKEN)
        await ops.register_provider(prov, 100 * TOKEN)
        async with await chain.client(chain.coordinator) as coord:
            await ops.add_node(
                prov, chain.node.address, 1, await ops.node_signature(prov, chain.node, chain.provider.address)
            )
            await ops.join_pool(prov, await ops.make_invite(coord, chain.coordinator, pid, chain.node.address, 600))
    return pid


async def test_a_sybil_challenge_of_honest_work_is_overturned_and_costs_its_bond(
    chain: World, tmp_path: Path, tiny_model: Path, vllm_engine: Any
) -> None:
    from node.inference.engine import SamplingSpec

    pid = await _pool(chain, tmp_path / "spec")
    # the honest file, as the worker makes it: the pool's spec, the real engine, the node's address
    assert tiny_model.is_dir()
    tools = model_tools("tiny")
    env = MathEnv()
    problems = env.problems(SEED, PROMPTS)
    sampling = SamplingSpec(1.0, 1.0, SAMPLING["max_tokens"], seed=SEED, stop_token_ids=tuple(sorted(tools.stop_ids)))
    groups = vllm_engine.generate([tools.encode(p.prompt) for p in problems], sampling, n=4)
    header = RolloutHeader(pid, chain.node.address, 0, "math", SEED, dict(SAMPLING), "tiny")
    data = build_rollout_file(header, problems, groups, env=env, decode=tools.decode).to_bytes()
    blobs = BlobStore(tmp_path / "coord-blobs", 1 << 24)
    key = blobs.put(data)

    sybil = from_hex(ANVIL_KEYS[7])
    async with await chain.client(chain.coordinator) as coord_chain, await chain.client(chain.admin) as admin:
        node_sig = ops.rollout_claim(coord_chain, pid, key).sign(chain.node)
        await ops.record_work(coord_chain, pid, [ops.WorkItem(chain.node.address, key, 500, 0, "0x" + "22" * 32)])
        await admin.transact("IntellectToken", "mint", sybil.address, 100 * TOKEN)
    async with await chain.client(sybil) as s:
        await ops.register_provider(s, 10 * TOKEN)  # staked at the pool's minimum: allowed to challenge
        before = int(await s.call("IntellectToken", "balanceOf", sybil.address))
        await ops.challenge(s, pid, key, "0x" + "ee" * 32, node_sig)
        assert int(await s.call("IntellectToken", "balanceOf", sybil.address)) == before - TOKEN  # the bond
    async with await chain.client(None) as reader:
        provider_before = int(await reader.call("IntellectToken", "balanceOf", chain.provider.address))
        stake_before = int(await reader.call("ProviderRegistry", "stakeOf", chain.provider.address))

    def members() -> Membership:
        return Membership(pid, chain.coordinator.address, frozenset({chain.validator.address}), frozenset())

    async def on_signature(request: bytes, sender: str) -> bytes:
        asked = protocol.unpack(request, "signature request").get("work_key")
        return protocol.ok(signature=node_sig) if asked == key else protocol.refuse("no signature")

    async with (
        PoolNetwork(private_key=bytes(chain.coordinator.key), pool=pid, membership=members) as coordinator,
        trio.open_nursery() as nursery,
    ):
        serve_blobs(coordinator.node, blobs, allow=lambda s: True, accept_uploads=False)
        coordinator.node.set_handler(protocol.SIGNATURE_PROTOCOL, on_signature)
        cfg = ValidatorConfig(
            pid, tmp_path / "validator", chain.url, chain.deployment, bootstrap=coordinator.listen_addrs[:1],
            poll_every=0.5, refetch_every=1.0,
        )  # fmt: skip
        v = Validator(cfg, chain.validator)
        await nursery.start(v.run)
        with trio.fail_after(120):
            while v.store.scalar("SELECT status FROM duties WHERE work_key = ?", (key,)) != "voted":
                await trio.sleep(0.5)
        vote = v.store.scalar("SELECT vote FROM duties WHERE work_key = ?", (key,))
        nursery.cancel_scope.cancel()

    assert vote == "overturn"
    async with await chain.client(None) as reader:
        d = await ops.dispute(reader, pid, key)
        assert (d["kindName"], d["verdictName"]) == ("challenge", "overturned")
        assert (await ops.record(reader, pid, key))["statusName"] == "pending"
        assert int(await reader.call("IntellectToken", "balanceOf", chain.provider.address)) == provider_before + TOKEN
        assert int(await reader.call("ProviderRegistry", "stakeOf", chain.provider.address)) == stake_before
        assert int(await reader.call("IntellectToken", "balanceOf", sybil.address)) == before - TOKEN
    # the honest work is paid in full once final
    async with await chain.client(chain.provider) as prov:
        await advance_time(prov.rpc, WINDOW + 1)
        reward, _ = await ops.claim(prov, pid, [key])
    assert reward == 500 * 10**15
