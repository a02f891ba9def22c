"""The trainer verifies what it trains on: in its old-log-prob pass (the generating version's weights
over every sample) it captures the final-norm hidden states and runs the TOPLOC, sampling and reward
checks, so a file that would pass the coordinator's intake but was not generated honestly by the pool's
model is never trained on. Real vLLM files on the tiny model, the real `Trainer`, the shipped thresholds."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from node.inference.tools import model_tools
from node.rollout.build import build_rollout_file
from node.rollout.checks import Reason
from node.rollout.file import RolloutFile, RolloutHeader, chunks_for
from node.tasks import get_env
from node.taskspec import TaskSpec
from node.verify import Calibrated, pool_checks

SEED = 31
PROMPTS = 6
GROUP = 8
MAX_TOKENS = 96
ENV = "thinking-budget"  # rewards depend on the length: groups have a signal, so samples are trained on
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="module")
def checks() -> Any:
    return pool_checks(TaskSpec("tiny", ENV, SAMPLING), model_tools("tiny"), Calibrated.load("tiny"))


def _generate(engine: Any, checks: Any, *, temperature: float = 1.0, seed: int = SEED, version: int = 0) -> RolloutFile:
    from node.inference.engine import SamplingSpec

    env = get_env(ENV)
    problems = env.problems(SEED, PROMPTS)
    spec = SamplingSpec(temperature, 1.0, MAX_TOKENS, seed=seed, stop_token_ids=tuple(sorted(checks.stop_ids)))
    groups = engine.generate([checks.encode_prompt(p.prompt) for p in problems], spec, n=GROUP)
    header = RolloutHeader(1, "0x" + "ab" * 20, version, ENV, SEED, dict(SAMPLING), "tiny")
    f = build_rollout_file(header, problems, groups, env=env, decode=checks.decode)
    return RolloutFile.from_bytes(f.to_bytes())


def _handwritten(honest: RolloutFile, checks: Any) -> RolloutFile:
    """Completions written by hand (the worker's proofs and logprobs kept): each group's samples get
    different lengths, so rewards differ and the group is trained on, and every reward is the one the
    task gives for that text, so the coordinator's intake has nothing to object to."""
    env = get_env(ENV)
    out = []
    for s in honest.samples:
        problem = env.problem(SEED, s.group)
        text = " ".join(["so"] * (2 + 3 * s.sample)) + f" the answer is {problem.answer}"
        ids = [t for t in checks.encode_prompt(text) if t not in checks.stop_ids][-(MAX_TOKENS - 1) :]
        ids.append(min(checks.stop_ids))  # ends like a real completion: a stop token, finish "stop"
        lp = (list(s.logprobs) + [-1.0] * MAX_TOKENS)[: len(ids)]
        proofs = (list(s.proofs) * MAX_TOKENS)[: chunks_for(len(ids))]
        reward = env.reward(problem, checks.decode(ids), len(ids))
        out.append(dataclasses.replace(s, completion_tokens=ids, logprobs=lp, proofs=proofs, finish_reason="stop",
                                       reward=reward))  # fmt: skip
    return RolloutFile(honest.header, out)


def _weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_trainer_trains_only_on_verified_rollouts(vllm_engine: Any, tiny_model: Path, checks: Any) -> None:
    from pool.grpo import Trainer

    honest = _generate(vllm_engine, checks)
    hot = _generate(vllm_engine, checks, temperature=2.0, seed=SEED + 1)  # hotter than the task's 1.0
    forged = _handwritten(_generate(vllm_engine, checks, seed=SEED + 2), checks)
    files = [honest, hot, forged]

    guarded = Trainer(tiny_model, lr=1e-3, async_level=0, checks=checks, micro_batch_size=4)
    stats = guarded.step(files, 0)
    reasons = {i: v["verdict"]["reason"] for i, v in stats.rejected}
    assert set(reasons) == {1, 2}, reasons
    assert reasons[1] == str(Reason.TEMPERATURE_MISMATCH)
    assert reasons[2].startswith("toploc"), reasons
    assert stats.samples_trained > 0 and stats.verified == stats.samples_trained, stats
    assert stats.rejected_samples > 0 and stats.unverified_dropped == 0

    # exactly what a trainer that saw only the honest file learns: nothing of the cheats reached a gradient
    plain = Trainer(tiny_model, lr=1e-3, async_level=0, micro_batch_size=4)
    alone = plain.step([honest], 0)
    assert alone.samples_trained == stats.samples_trained
    a, b = _weights(guarded), _weights(plain)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    before = _weights(Trainer(tiny_model, lr=1e-3))
    assert any(not torch.equal(a[k], before[k]) for k in a)  # and it did learn from the honest file

    # without checks (the old trainer) the forgery is trained on
    blind = Trainer(tiny_model, lr=1e-3, async_level=0, micro_batch_size=4).step(files, 0)
    assert blind.samples_trained > stats.samples_trained


def test_rollouts_of_an_older_version_are_checked_with_that_version(
    vllm_engine: Any, tiny_model: Path, checks: Any
) -> None:
    """An honest file of version 0 trained at version 1 is verified with version 0's kept weights (the
    weights of the version that generated it); when those weights are gone it is not trained on at all."""
    from pool.grpo import Trainer

    t = Trainer(tiny_model, lr=5e-2, async_level=3, checks=checks, micro_batch_size=8)
    first = t.step([_generate(vllm_engine, checks)], 0)
    assert first.verified == first.samples_trained > 0
    late = _generate(vllm_engine, checks, seed=SEED + 3)  # version 0, arriving after the step to 1
    st = t.step([late], 1)
    assert st.rejected == [] and st.verified == st.samples_trained > 0, st
    # the same file claiming the current version (a worker that skipped the weight update): refused
    relabeled = RolloutFile(dataclasses.replace(late.header, policy_version=2), late.samples)
    lie = t.step([relabeled], 2)
    assert [i for i, _ in lie.rejected] == [0] and lie.samples_trained == 0, lie
    assert t.steps == 3
    t._history.clear()  # a trainer that lost version 0's weights cannot check the file: it skips it
    st = t.step([late], 3)
    assert st.samples_trained == 0 and st.unverified_dropped > 0, st
    assert st.unchecked == [0] and st.rejected == []  # reported as unchecked (the coordinator asks validators)


async def test_the_coordinator_marks_and_reports_what_its_trainer_refused(
    vllm_engine: Any, tiny_model: Path, checks: Any, tmp_path: Path
) -> None:
    """`Coordinator.train_step` with the pool's checks: the forged rollout is marked (never trained on),
    its verdict kept as evidence, the honest one trained; the step counts every trained sample as
    verified. A validator hears the refusal only from the coordinator, and only as a reason to look."""
    import json

    from eth_account import Account

    from node import protocol
    from node.chain.deployment import Deployment
    from node.validator import Validator, ValidatorConfig
    from pool.coordinator import Coordinator, CoordinatorConfig

    cfg = CoordinatorConfig(1, tmp_path / "c", "http://127.0.0.1:1", Deployment(31337, {}, 0), train_files=2)
    coord = Coordinator(cfg, Account.create())
    coord.load_spec(TaskSpec("tiny", ENV, SAMPLING, group_size=GROUP, async_level=1))
    coord.tools = model_tools("tiny")
    coord.checks = coord.training_checks()
    coord.trainer = coord._load_trainer()
    honest = _generate(vllm_engine, checks)
    forged = _handwritten(_generate(vllm_engine, checks, seed=SEED + 2), checks)
    keys = []
    junk = b"PAR1 not really a rollout file"  # an accepted blob that no longer parses (disk corruption)
    for i, data in enumerate((junk, honest.to_bytes(), forged.to_bytes())):
        key = coord.blobs.put(data)
        coord.store.execute(
            "INSERT INTO rollouts(work_key, task_id, node, units, policy_version, proof_commitment, mean_reward, "
            "accepted_at, status) VALUES(?, ?, ?, 1, 0, '0x', 0, ?, 'recorded')",
            (key, f"t{i}", "0x" + "ab" * 20, time.time() + i),
        )
        keys.append(key)
    assert not await coord.train_step()  # the unreadable one is dropped from training, once: one file short
    assert await coord.train_step()
    rows = {r["work_key"]: r for r in coord.store.query("SELECT work_key, trained, note FROM rollouts")}
    assert rows[keys[0]]["trained"] == -1 and "parquet" in rows[keys[0]]["note"]
    keys = keys[1:]
    rows = {r["work_key"]: r for r in coord.store.query("SELECT work_key, trained, note FROM rollouts")}
    assert rows[keys[0]]["trained"] == 1
    assert rows[keys[1]]["trained"] == -2 and "toploc" in rows[keys[1]]["note"]
    status = coord.status()
    assert status["trainer_refused"] == {"0x" + "ab" * 20: 1}
    assert status["samples_verified"] == status["samples_trained"] > 0
    evidence = [json.loads(p.read_text()) for p in (cfg.data_dir / "evidence").glob("*.json")]
    assert [(e["work_key"], e["by"], e["ok"]) for e in evidence] == [(keys[1], "trainer", False)]

    v = Validator(ValidatorConfig(1, tmp_path / "v", "http://127.0.0.1:1", Deployment(31337, {}, 0)), Account.create())
    v.store.execute(
        "INSERT INTO checks(work_key, node, provider, units, policy_version, block, status) "
        "VALUES(?, ?, ?, 1, 0, 1, 'skipped')",
        (keys[1], "0x" + "ab" * 20, "0x" + "cd" * 20),
    )
    hint = protocol.pack({"work_key": keys[1], "ok": False, "reason": "toploc_exponent_mismatch", "by": "trainer"})
    other = Account.create().address
    assert not v.take_hint(other, hint, coord.key.address)  # only the coordinator is heard
    assert not v.take_hint(coord.key.address, b"\xc1garbage", coord.key.address)
    ok = protocol.pack({"work_key": keys[1], "ok": True})
    assert not v.take_hint(coord.key.address, ok, coord.key.address)
    assert v.store.scalar("SELECT status FROM checks WHERE work_key = ?", (keys[1],)) == "skipped"
    assert v.take_hint(coord.key.address, hint, coord.key.address)
    assert v.store.scalar("SELECT status FROM checks WHERE work_key = ?", (keys[1],)) == "pending"
    assert v.store.get(f"suspect:{keys[1]}") == "toploc_exponent_mismatch"


def _fabricated(honest: RolloutFile, checks: Any, seed: int = 7) -> RolloutFile:
    """Random tokens and all-zero proofs, every sample the same length with the reward the task gives
    its text: nothing was generated, and every group's rewards are equal (so no sample has an advantage)."""
    gen = torch.Generator().manual_seed(seed)
    env = get_env(ENV)
    stop = min(checks.stop_ids)
    out = []
    for s in honest.samples:
        ids = [
            int(t)
            for t in torch.randint(0, int(checks.vocab_size), (40,), generator=gen)
            if int(t) not in checks.stop_ids
        ]
        ids = [*ids[:32], stop]
        problem = env.problem(SEED, s.group)
        reward = env.reward(problem, checks.decode(ids), len(ids))
        proofs = [bytes(len(s.proofs[0]))] * chunks_for(len(ids))
        out.append(dataclasses.replace(s, completion_tokens=ids, logprobs=[-1.0] * len(ids), proofs=proofs,
                                       finish_reason="stop", reward=reward))  # fmt: skip
    return RolloutFile(honest.header, out)


def test_a_file_whose_groups_all_score_the_same_is_still_checked(
    vllm_engine: Any, tiny_model: Path, checks: Any
) -> None:
    """Issue 37 (1): a fabricated file (random tokens, zero proofs) whose groups' rewards are all equal has
    no sample with an advantage. The trainer used to drop such samples before the pass that runs the
    checks, so the file was never checked, never reported, and paid. Every sample of every file is now
    checked whatever the step then trains on, and the file is refused and reported."""
    from pool.grpo import Trainer

    honest = _generate(vllm_engine, checks)
    fake = _fabricated(_generate(vllm_engine, checks, seed=SEED + 4), checks)
    by_group: dict[int, set[float]] = {}
    for s in fake.samples:
        by_group.setdefault(s.group, set()).add(s.reward)
    assert all(len(r) == 1 for r in by_group.values()), by_group  # no advantage anywhere in the fake
    t = Trainer(tiny_model, lr=1e-3, async_level=0, checks=checks, micro_batch_size=8)
    stats = t.step([honest, fake], 0)
    reasons = {i: v["verdict"]["reason"] for i, v in stats.rejected}
    assert set(reasons) == {1}, reasons
    assert reasons[1].startswith("toploc") or reasons[1] == str(Reason.PROOF_MALFORMED), reasons
    assert stats.samples_trained == stats.verified > 0 and stats.unchecked == [], stats
    # the honest file is trained on as before: the fake changed nothing but its own verdict
    alone = Trainer(tiny_model, lr=1e-3, async_level=0, checks=checks, micro_batch_size=8).step([honest], 0)
    assert alone.samples_trained == stats.samples_trained and alone.rejected == []
