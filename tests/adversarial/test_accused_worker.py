"""An accused worker's side of a dispute: the verdicts with evidence documents it is sent (hostile ones
too), and its own re-check of its file before it appeals, with the real vLLM engine, the real
transformers prefill and the real checks on the tiny model.

A lying validator's accusation of an honest file must be appealed, each of its claims disputed; a file
the worker's own re-check fails is not appealed (an appeal it would lose costs its bond); no verdict
message, however malformed, crashes the worker or fills its store."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import trio
from eth_account import Account

from node import protocol
from node.chain.deployment import Deployment
from node.evidence import MAX_EVIDENCE_BYTES, MAX_EVIDENCE_PER_KEY, encode_evidence
from node.rollout.file import RolloutFile, work_key
from node.worker import Worker, WorkerConfig
from tests.adversarial.test_hostile_rollouts import _honest, _validator


def _worker(tmp_path: Path, v: Any) -> Worker:
    cfg = WorkerConfig(1, tmp_path / "w", "http://127.0.0.1:1", Deployment(31337, {}, 0))
    w = Worker(cfg, Account.create(), Account.create())
    w._checker = v.checker  # the pool's spec and thresholds, as `_model_check` reads them on first use
    return w


def _keep(w: Worker, data: bytes) -> str:
    """A rollout of the worker's, on disk and in its table, as the worker writes them."""
    key = work_key(data)
    path = w.cfg.data_dir / "rollouts" / f"{key}.parquet"
    path.write_bytes(data)
    w.store.execute(
        "INSERT INTO rollouts(work_key, task_id, path, units, mean_reward, status, created) VALUES(?, ?, ?, ?, ?, ?, ?)",
        (key, "t", str(path), 1, 0.0, "accepted", time.time()),
    )
    return key


def _verdict_msg(key: str, record: dict[str, Any]) -> tuple[bytes, str]:
    doc, digest = encode_evidence(record)
    return protocol.pack({"work_key": key, "ok": False, "reason": "x", "evidence": digest, "doc": doc}), digest


def _own_file(tmp_path: Path, tiny_model: Path, vllm_engine: Any) -> tuple[Any, Worker, RolloutFile]:
    v = _validator(tmp_path, tiny_model)
    w = _worker(tmp_path, v)
    f = _honest(vllm_engine, v)
    f = dataclasses.replace(f, header=dataclasses.replace(f.header, node=w.node.address))
    return v, w, f


def test_a_lying_validators_accusation_is_appealed_claim_by_claim(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any, hf_prefill: Any
) -> None:
    v, w, f = _own_file(tmp_path, tiny_model, vllm_engine)
    data = f.to_bytes()
    key = _keep(w, data)
    # what the devnet's lying validator signs: the real verdict of the file, with every completion "failing"
    honest = v.checker.check(data, w.node.address, hf_prefill, 0)
    assert honest["ok"], "the honest file must pass the validators' check"
    lie = {
        "work_key": key, "pool": 1, **honest, "ok": False,
        "verdict": {**honest["verdict"], "reason": "made-up"},
        "samples": [{**s, "reason": "toploc-mismatch"} for s in honest["samples"]],
    }  # fmt: skip
    msg, digest = _verdict_msg(key, lie)
    assert w.take_evidence(v.key.address, msg)
    why, notes = trio.run(w.recheck, key, digest)
    assert why is None, why
    assert "our re-check of every completion passes" in notes
    assert "DISPUTE file: evidence says made-up, our check says ok" in notes
    assert "DISPUTE group 0 sample 0: evidence says toploc-mismatch, ours ok" in notes
    # without the document (it never reached us) the re-check still decides, and says so
    why, notes = trio.run(w.recheck, key, "0x" + "11" * 32)
    assert why is None and "no evidence document about this work reached us" in notes


def test_a_file_our_own_recheck_fails_is_not_appealed(
    tmp_path: Path, tiny_model: Path, vllm_engine: Any, hf_prefill: Any
) -> None:
    v, w, f = _own_file(tmp_path, tiny_model, vllm_engine)
    # a cheater's file: rewards the task does not give (the worker wrote them, the file is intact)
    data = dataclasses.replace(
        f, samples=[dataclasses.replace(s, reward=0.1 * i) for i, s in enumerate(f.samples)]
    ).to_bytes()
    key = _keep(w, data)
    found = v.checker.check(data, w.node.address, hf_prefill, 0)
    assert not found["ok"]
    msg, digest = _verdict_msg(key, {"work_key": key, "pool": 1, **found})
    assert w.take_evidence(v.key.address, msg)
    why, _ = trio.run(w.recheck, key, digest)
    assert why is not None and why.startswith("our own re-check fails too: " + found["verdict"]["reason"]), why
    # a file that is not ours, or no longer on disk, is never appealed either
    why, _ = trio.run(w.recheck, "0x" + "22" * 32, digest)
    assert why == "not a rollout of this node"
    Path(str(w.store.one("SELECT path FROM rollouts WHERE work_key = ?", (key,))["path"])).unlink()
    why, _ = trio.run(w.recheck, key, digest)
    assert why is not None and why.startswith("the file is gone")


def test_hostile_verdict_messages_are_dropped_and_bounded(tmp_path: Path, tiny_model: Path) -> None:
    v = _validator(tmp_path, tiny_model)
    w = _worker(tmp_path, v)
    key = _keep(w, b"not a parquet file, but ours")
    sender = "0x" + "cd" * 20
    record = {"work_key": key, "ok": False, "verdict": {"reason": "made-up", "detail": ""}, "samples": []}
    doc, digest = encode_evidence(record)
    other_key = "0x" + "33" * 32
    other_doc, other_digest = encode_evidence({**record, "work_key": other_key})
    big_doc, big_digest = encode_evidence({**record, "pad": "x" * MAX_EVIDENCE_BYTES})
    hostile = {
        "garbage": b"\xc1\xff" * 100,
        "not a map": b"\x93\x01\x02\x03",
        "ok verdict": protocol.pack({"work_key": key, "ok": True, "evidence": digest, "doc": doc}),
        "hash of another document": protocol.pack({"work_key": key, "ok": False, "evidence": other_digest, "doc": doc}),
        "document about another record": protocol.pack(
            {"work_key": key, "ok": False, "evidence": other_digest, "doc": other_doc}
        ),
        "not our record": protocol.pack(
            {"work_key": other_key, "ok": False, "evidence": other_digest, "doc": other_doc}
        ),
        "oversized document": protocol.pack({"work_key": key, "ok": False, "evidence": big_digest, "doc": big_doc}),
        "document as text": protocol.pack({"work_key": key, "ok": False, "evidence": digest, "doc": doc.decode()}),
        "key as a number": protocol.pack({"work_key": 7, "ok": False, "evidence": digest, "doc": doc}),
        "no verdict inside": protocol.pack(
            {
                "work_key": key,
                "ok": False,
                "evidence": encode_evidence({"work_key": key})[1],
                "doc": encode_evidence({"work_key": key})[0],
            }
        ),
    }
    for name, body in hostile.items():
        assert not w.take_evidence(sender, body), name
    assert w.store.scalar("SELECT COUNT(*) FROM evidence") == 0
    # the real one is kept once; a flood of distinct documents from its sender keeps only the first,
    # and the documents of many senders on the same record stop at the cap
    assert w.take_evidence(sender, protocol.pack({"work_key": key, "ok": False, "evidence": digest, "doc": doc}))
    assert not w.take_evidence(sender, protocol.pack({"work_key": key, "ok": False, "evidence": digest, "doc": doc}))
    for i in range(3):
        d, h = encode_evidence({**record, "n": i})
        assert not w.take_evidence(sender, protocol.pack({"work_key": key, "ok": False, "evidence": h, "doc": d}))
    for i in range(3 * MAX_EVIDENCE_PER_KEY):
        d, h = encode_evidence({**record, "n": 100 + i})
        w.take_evidence(f"0x{i:040x}", protocol.pack({"work_key": key, "ok": False, "evidence": h, "doc": d}))
    assert w.store.scalar("SELECT COUNT(*) FROM evidence WHERE work_key = ?", (key,)) == MAX_EVIDENCE_PER_KEY
