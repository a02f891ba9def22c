"""`join --self-check RATE`: the worker runs the validators' own checks on its rollouts before it submits
them, so a machine whose output validators would reject (a broken GPU or driver; here: a sampler that
runs hotter than the task says) stops before the rollout costs its stake. Real vLLM files on the tiny
model, the real transformers prefill and the pool's real checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio
from eth_account import Account

from node.chain.deployment import Deployment
from node.rollout.build import build_rollout_file
from node.rollout.file import RolloutHeader
from node.tasks.math import MathEnv
from node.worker import Worker, WorkerConfig
from node.worker.generation import SelfCheckFailed
from tests.adversarial.test_hostile_rollouts import _validator

SEED = 77
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 24, "exact": True}


def _file(engine: Any, v: Any, node: str, temperature: float) -> bytes:
    from node.inference.engine import SamplingSpec

    env = MathEnv()
    problems = env.problems(SEED, 2)
    spec = SamplingSpec(temperature, 1.0, 24, seed=SEED, stop_token_ids=tuple(sorted(v.tools.stop_ids)), exact=True)
    groups = engine.generate([v.tools.encode(p.prompt) for p in problems], spec, n=4)
    header = RolloutHeader(1, node, 0, "math", SEED, dict(SAMPLING), "tiny")
    return build_rollout_file(header, problems, groups, env=env, decode=v.tools.decode).to_bytes()


def test_a_worker_whose_output_the_validators_would_reject_stops_before_submitting(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any
) -> None:
    v = _validator(tmp_path, tiny_model, sampling=SAMPLING)
    cfg = WorkerConfig(1, tmp_path / "w", "http://127.0.0.1:1", Deployment(31337, {}, 0), self_check=0.0)
    w = Worker(cfg, Account.create(), Account.create())
    w._checker = v.checker  # the pool's spec and thresholds, as `_model_check` reads them on first use
    honest = _file(vllm_engine, v, w.node.address, 1.0)
    hot = _file(vllm_engine, v, w.node.address, 1.5)

    trio.run(w.guard, hot)  # without --self-check nothing is checked: the validators would find it later
    assert w.self_checked == 0

    w.cfg = dataclasses.replace(cfg, self_check=0.25)
    trio.run(w.guard, honest)  # the first rollout is always checked
    assert w.self_checked == 1
    w.self_checked = 0  # as if it were the first again
    with pytest.raises(SelfCheckFailed) as info:
        trio.run(w.guard, hot)
    message = str(info.value)
    assert "replay_mismatch" in message and "group 0 sample" in message and "not submitted" in message, message
    assert "GPU" in (info.value.hint or "")
