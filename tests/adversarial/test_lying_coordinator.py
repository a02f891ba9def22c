"""A coordinator that lies to get honest work slashed (or to have it made on terms validators refuse).

The coordinator hands out the tasks and writes the work records; validators judge a file by the pool's
on-chain spec and by its record. So a lying coordinator could (1) hand out a task off the spec (exact
sampling off, another temperature, another pool's id) and let the validators invalidate the honest
file made for it, or (2) record an honest file under another policy version than the one it says, so
that the validators' check of the record fails. Tried here with the real chain (anvil, the real
contracts, a spec document behind its on-chain hash), a real vLLM file on the tiny model and the
validators' real checks: the worker refuses every task off the spec before generating anything, and a
record that does not match an honest file costs the node its units (soft) but never its stake, while a
cheater's file fails as itself whatever its record says."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from eth_account import Account

from node import ops, protocol
from node.rollout.file import RolloutFile
from node.validator import rules as validator_rules
from node.worker import Worker, WorkerConfig
from pool.deploy import TOKEN
from tests.adversarial.test_hostile_rollouts import _honest, _row, _validator
from tests.conftest import World, write_spec

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 32, "exact": True}


async def _pool(chain: World, folder: Path) -> int:
    uri, digest = write_spec(folder, sampling=SAMPLING, group_size=8)
    async with await chain.client(chain.admin) as admin:
        spec = ops.PoolSpec(chain.coordinator.address, uri, digest, 10**15, 3600, TOKEN, TOKEN)
        pid, _ = await ops.create_pool(admin, spec)
        await admin.transact("PoolManager", "startPool", pid)
        return pid


def _task(pid: int, node: str, **over: Any) -> protocol.Task:
    now = time.time()
    fields: dict[str, Any] = {
        "task_id": "t1", "pool_id": pid, "node": node, "env": "math", "seed": 5, "prompts": 2, "group_size": 8,
        "sampling": dict(SAMPLING), "policy_version": 0, "model": "tiny", "issued_at": now, "expires_at": now + 600,
    } | over  # fmt: skip
    return protocol.Task.from_wire(fields)


async def test_a_worker_refuses_every_task_off_the_on_chain_spec(chain: World, tmp_path: Path) -> None:
    pid = await _pool(chain, tmp_path / "spec")
    w = Worker(WorkerConfig(pid, tmp_path / "w", chain.url, chain.deployment), Account.create(), Account.create())
    w.chain = await chain.client(None)
    try:
        assert await w.off_spec(_task(pid, w.node.address)) is None  # the spec's own terms
        lies = {
            "exact sampling off": {"sampling": {**SAMPLING, "exact": False}},
            "exact sampling left out": {"sampling": {k: v for k, v in SAMPLING.items() if k != "exact"}},
            "hotter": {"sampling": {**SAMPLING, "temperature": 1.5}},
            "narrower top_p": {"sampling": {**SAMPLING, "top_p": 0.5}},
            "longer": {"sampling": {**SAMPLING, "max_tokens": 64}},
            "smaller groups": {"group_size": 4},
            "another environment": {"env": "thinking-budget"},
            "another model": {"model": "smollm2"},
            "another pool's header": {"pool_id": pid + 1},
        }
        for what, over in lies.items():
            why = await w.off_spec(_task(pid, w.node.address, **over))
            assert why is not None, what
        # a coordinator that serves this worker another document than the spec's hash: the spec cannot be
        # read, tasks are taken unchecked (validators could not check either), but never another pool's
        (tmp_path / "spec" / "task-spec.json").write_text('{"model": "tiny"}')
        w.spec = None
        assert await w.off_spec(_task(pid, w.node.address)) is None
        assert "pool" in (await w.off_spec(_task(pid, w.node.address, pool_id=pid + 1)) or "")
    finally:
        await w.chain.aclose()
        w.store.close()


def test_a_record_under_another_policy_version_revokes_units_but_never_slashes(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any, hf_prefill: Any
) -> None:
    v = _validator(tmp_path, tiny_model)
    f = RolloutFile.from_bytes(_honest(vllm_engine, v).to_bytes())
    honest = v.judge(f, _row(v), hf_prefill)
    assert honest["ok"], honest["verdict"]
    # the coordinator recorded the version-0 file as version 3
    lied = v.judge(f, _row(v) | {"policy_version": 3}, hf_prefill)
    assert not lied["ok"] and lied["verdict"]["reason"] == "record_mismatch", lied["verdict"]
    reason = validator_rules.stored_reason(lied)
    assert not validator_rules.invalidation_is_hard(reason)  # the validator revokes the units softly
    assert not validator_rules.vote_upholds(lied)  # and no committee member upholds a slash for it
    # a coordinator that lies for a cheater gains it nothing: the file is judged at its own version first,
    # and a file that fails there fails for what it is (hard), whatever its record says
    import dataclasses

    bad = RolloutFile(f.header, [dataclasses.replace(f.samples[0], reward=f.samples[0].reward + 1.0), *f.samples[1:]])
    shielded = v.judge(bad, _row(v) | {"policy_version": 3}, hf_prefill)
    assert shielded["verdict"]["reason"] == "reward_mismatch", shielded["verdict"]
    assert validator_rules.invalidation_is_hard(validator_rules.stored_reason(shielded))


def test_a_record_with_other_units_than_its_file_is_revoked_softly(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any, hf_prefill: Any
) -> None:
    """Issue 37 (3): the pool pays by a record's units, and the coordinator writes them. A record with
    1000 times its file's generated tokens (a coordinator paying a colluding worker a share of the
    pool's budget) used to be judged like the true one. The validator compares the record's units with
    the file's and revokes a mismatch softly: the worker signed only the file, so nobody is slashed,
    and nobody is paid for units no file holds (nor fewer than its file's: same rule, both ways)."""
    v = _validator(tmp_path, tiny_model)
    f = RolloutFile.from_bytes(_honest(vllm_engine, v).to_bytes())
    honest = v.judge(f, _row(v) | {"units": f.units}, hf_prefill)
    assert honest["ok"], honest["verdict"]
    for units in (f.units * 1000, f.units + 1, f.units - 1):
        lied = v.judge(f, _row(v) | {"units": units}, hf_prefill)
        assert not lied["ok"] and lied["verdict"]["reason"] == "record_mismatch", (units, lied["verdict"])
        assert str(units) in lied["verdict"]["detail"]
        reason = validator_rules.stored_reason(lied)
        assert not validator_rules.invalidation_is_hard(reason) and not validator_rules.vote_upholds(lied)
