"""The devnet as a newcomer runs it: `intellect-node devnet --model tiny --adversary --steps 3 --report r.json`
(training on: the coordinator runs GRPO and broadcasts each new policy version).

Everything is real and separate: anvil with the compiled contracts, a coordinator, a validator, two
honest workers and a cheating worker (another model's weights), each its own process with its own
libp2p host and vLLM engine (workers) or transformers prefill (validator)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_devnet_with_adversary_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    report_path = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "cli.main", "devnet", "--model", "tiny", "--adversary", "--steps", "3",
         "--report", str(report_path), "--dir", str(tmp_path / "dn"), "--timeout", "420"],
        capture_output=True, text=True, timeout=480, env=env, cwd=str(ROOT),
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["problems"] == []
    nodes = report["nodes"]
    assert set(nodes) == {"worker1", "worker2", "cheater"}
    # the coordinator served the pool's explorer, and it showed what the audit found
    assert report["explorer"]["matches_audit"] and report["explorer"]["block"] >= report["audit"]["block"]
    for name in ("worker1", "worker2"):
        n = nodes[name]
        # honest: every accepted rollout recorded, verified, final and claimed at the pool's rate
        assert n["rollouts_accepted"] == 3 and n["rollouts_invalidated"] == 0
        assert n["units_recorded"] > 0 and n["units_claimed"] == n["units_recorded"]
        assert n["tokens_claimed"] == n["units_claimed"] * 10**15
        assert n["slashes"] == []
    cheat = nodes["cheater"]
    assert cheat["rollouts_accepted"] == 3  # the coordinator's cheap checks cannot see another model
    assert cheat["rollouts_invalidated"] == 3 and cheat["units_claimed"] == 0
    assert cheat["slashed_tokens"] == 3 * 5 * 10**18
    assert all(s["tx"].startswith("0x") and len(s["tx"]) == 66 for s in cheat["slashes"])
    # the cheater's provider lost exactly the slashes on chain, as the event-only audit rebuilds it
    audit = report["audit"]
    assert audit["consistent"], audit["mismatches"]
    assert audit["providers"][cheat["provider"]]["slashed"] == cheat["slashed_tokens"]
    assert report["validator"].get("ok", 0) >= 6
    # a true invalidation stands through an appeal: the cheater appealed each accusation (its own check
    # of its file passes), a committee of the other validators re-checked the file and upheld every one.
    # (The accuser is the checking validator, or a juror the coordinator's trainer hinted at the file.)
    disputes = report["disputes"]["records"]
    assert len(disputes) == 3, disputes
    assert all(d["by"] in ("validator", "juror1", "juror2") and d["appealed"] for d in disputes.values()), disputes
    assert all(d["verdict"] == "upheld" for d in disputes.values()), disputes
    logs = ("validator", "juror1", "juror2")
    votes = sum((tmp_path / "dn" / f"{n}.log").read_text().count("voted to uphold") for n in logs)
    assert votes >= 2 * 3  # each committee: the two validators that did not accuse
    # the pool trained while it ran: versions advanced, workers hot-reloaded them (honest rollouts of
    # versions > 0 were verified against the downloaded checkpoints), and no step trained on a rollout
    # more than async_level (2) versions older than the policy it updated
    t = report["training"]
    assert t["enabled"] and t["policy_version"] >= 2 and len(t["reward_curve"]) == t["policy_version"]
    assert all(v >= base - 2 for base, versions in enumerate(t["trained_versions"]) for v in versions)
    honest_versions = [v for n in ("worker1", "worker2") for v in t["rollout_versions"][nodes[n]["node"]]]
    assert max(honest_versions) >= 1
    assert Path(t["reward_plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "devnet summary" in p.stdout and "outcome as expected" in p.stdout
    # every daemon stopped cleanly on SIGTERM (state closed), none had to be killed
    for name in ("coordinator", "validator", "worker1", "worker2", "cheater"):
        log = (tmp_path / "dn" / f"{name}.log").read_text()
        assert "SIGTERM received" in log and ": shut down" in log, name
    print(f"devnet with adversary took {elapsed:.0f} s")


@pytest.mark.slow
def test_devnet_lying_validator_is_appealed_and_overturned(tmp_path: Path) -> None:
    """`intellect-node devnet --adversary --adversary-kind lying-validator`: a validator of the pool
    accuses every honest record. Each honest worker appeals (its own check passes), a committee drawn
    from the other validators re-checks the file and overturns: the workers keep their stake and are
    paid in full, and the liar loses every bond it put up."""
    pytest.importorskip("vllm")
    report_path = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    p = subprocess.run(
        [sys.executable, "-m", "cli.main", "devnet", "--model", "tiny", "--adversary", "--adversary-kind",
         "lying-validator", "--steps", "2", "--report", str(report_path), "--dir", str(tmp_path / "dn"),
         "--timeout", "420"],
        capture_output=True, text=True, timeout=480, env=env, cwd=str(ROOT),
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["problems"] == [] and report["adversary"] == "lying-validator"
    assert set(report["nodes"]) == {"worker1", "worker2"}
    for n in report["nodes"].values():
        assert n["rollouts_invalidated"] == 0 and n["slashed_tokens"] == 0 and n["slashes"] == []
        assert n["units_claimed"] == n["units_recorded"] > 0
    liar = report["disputes"]["by_accuser"]["liar"]
    assert liar["accused"] == 4 and liar["overturned"] == 4 and liar["upheld"] == 0
    assert liar["bonds_lost"] == 4 * 5 * 10**18
    assert all(d["appealed"] for d in report["disputes"]["records"].values())
    assert report["audit"]["consistent"], report["audit"]["mismatches"]
    assert "lost 20 INTL in bonds" in p.stdout


@pytest.mark.slow
def test_devnet_with_each_cheat_kind(tmp_path: Path) -> None:
    """`intellect-node devnet --env code --adversary --adversary-kind duplicate --adversary-kind poison
    --workers 1`: code tasks (HumanEval, every reward computed in the sandbox by worker, coordinator and
    validators alike); one cheater copies one completion to fill each group (its logprobs inflated so the
    coordinator's own repeat bound lets them in), the other sends files with zeroed proofs, in the same
    run. Each cheater's every rollout is invalidated for its own reason and slashed, the honest worker is
    paid (the same rewards on every node), and nothing was trained on that the trainer had not verified."""
    pytest.importorskip("vllm")
    report_path = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    p = subprocess.run(
        [sys.executable, "-m", "cli.main", "devnet", "--model", "tiny", "--env", "code", "--adversary",
         "--adversary-kind", "duplicate", "--adversary-kind", "poison", "--workers", "1", "--steps", "3",
         "--report", str(report_path),
         "--dir", str(tmp_path / "dn"), "--timeout", "420"],
        capture_output=True, text=True, timeout=480, env=env, cwd=str(ROOT),
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["problems"] == [] and report["adversary"] == "duplicate+poison"
    assert set(report["nodes"]) == {"worker1", "cheater-duplicate", "cheater-poison"}
    # the trainer refuses such files and hints the pool's validators, jurors too: whichever checks a record
    # first accuses it, so the findings are read from every validator's evidence
    found = {
        d["work_key"]: d["verdict"]["reason"]
        for v in ("validator", "juror1", "juror2")
        for d in (json.loads(f.read_text()) for f in (tmp_path / "dn" / v / "evidence").glob("*.json"))
        if d["verdict"]["reason"] != "ok"
    }
    for kind, reason in (("duplicate", "duplicate_samples"), ("poison", "proof_malformed")):
        cheat = report["nodes"][f"cheater-{kind}"]
        assert cheat["rollouts_accepted"] == 3 and cheat["rollouts_invalidated"] == 3 and cheat["units_claimed"] == 0
        assert cheat["slashed_tokens"] == 3 * 5 * 10**18
        # the cheater keeps its invalidated files; each was found out for its own cheat
        keys = {"0x" + f.stem for f in (tmp_path / "dn" / f"cheater-{kind}" / "rollouts").glob("*.parquet")}
        assert len(keys) == 3 and {found.get(k) for k in keys} == {reason}, (kind, found)
    assert len(found) == 6, found
    honest = report["nodes"]["worker1"]
    assert honest["rollouts_invalidated"] == 0 and honest["units_claimed"] == honest["units_recorded"] > 0
    assert honest["trainer_refused"] == 0
    # the trainer took honest files into its steps (the tiny model's groups often score alike, leaving no
    # advantage, so whether any sample trained is luck) and trained on no sample it had not verified
    assert honest["trainer_took"] > 0
    t = report["training"]
    assert t["samples_verified"] == t["samples_trained"]
    # the honest worker deleted the files of its claimed (final) work
    assert list((tmp_path / "dn" / "worker1" / "rollouts").glob("*.parquet")) == []
