"""The devnet as a newcomer runs it: `intellect-node devnet` with no arguments (what `make devnet` runs:
the tiny model, an adversary, three tasks per worker, training on), from a folder of its own, with
`--keep-running` so the explorer it leaves can be opened in a browser.

Everything is real and separate: anvil with the compiled contracts, a coordinator, a validator, two
honest workers and a cheating worker (another model's weights), each its own process with its own
libp2p host and vLLM engine (workers) or transformers prefill (validator).

Found on main before issue 36: the default (SmolLM2, a validator checking every file one after
another) did not finish in 900 s on a 2-core machine, and run from any folder but the repository the
roles could not find the devnet's folder (`devnet/deployment.json not found`)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Devnet:
    """A devnet run with `--keep-running`: its report, folder and stdout, and the process that still
    serves the pool's explorer on the chain it leaves."""

    proc: subprocess.Popen[str]
    report: dict[str, Any]
    folder: Path
    out: Path
    elapsed: float

    @property
    def stdout(self) -> str:
        return self.out.read_text()


@pytest.fixture(scope="module")
def adversary_devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Devnet]:
    """`intellect-node devnet --keep-running` from a folder of its own, until its summary is written and
    the explorer that outlives the roles is up (stopped with SIGTERM at the end)."""
    pytest.importorskip("vllm")
    tmp_path = tmp_path_factory.mktemp("devnet")
    out = tmp_path / "stdout.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    env["PYTHONPATH"] = str(ROOT)
    started = time.monotonic()
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "devnet", "--keep-running"],
            stdout=sink, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp_path),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 900  # the devnet's own default timeout with the tiny model
        while "explorer keeps running" not in out.read_text():
            assert proc.poll() is None, out.read_text()[-6000:]
            assert time.monotonic() < deadline, "the devnet did not finish in 900 s: " + out.read_text()[-3000:]
            time.sleep(1.0)
        elapsed = time.monotonic() - started
        # its folder is the caller's `devnet/`, where its summary is
        summary = json.loads((tmp_path / "devnet" / "summary.json").read_text())
        yield Devnet(proc, summary, tmp_path / "devnet", out, elapsed)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.mark.slow
def test_devnet_with_adversary_end_to_end(adversary_devnet: Devnet) -> None:
    dn = adversary_devnet
    report = dn.report
    assert report["ok"] and report["problems"] == [] and report["model"] == "tiny"
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
    # the coordinator's cheap checks cannot see another model: its files are accepted, and every recorded
    # one is caught and slashed (a file the trainer's checks refused is not recorded, and the run ends
    # when the honest workers are done, so the cheater may have recorded fewer than 3)
    caught = cheat["rollouts_invalidated"]
    assert cheat["rollouts_accepted"] == caught >= 1 and cheat["units_claimed"] == 0
    assert cheat["slashed_tokens"] == caught * 5 * 10**18
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
    assert len(disputes) == caught, disputes
    assert all(d["by"] in ("validator", "juror1", "juror2") and d["appealed"] for d in disputes.values()), disputes
    assert all(d["verdict"] == "upheld" for d in disputes.values()), disputes
    logs = ("validator", "juror1", "juror2")
    votes = sum((dn.folder / f"{n}.log").read_text().count("voted to uphold") for n in logs)
    assert votes >= 2 * caught  # each committee: the two validators that did not accuse
    # the pool trained while it ran: versions advanced, workers hot-reloaded them (honest rollouts of
    # versions > 0 were verified against the downloaded checkpoints), and no step trained on a rollout
    # more than async_level (2) versions older than the policy it updated
    t = report["training"]
    assert t["enabled"] and t["policy_version"] >= 2 and len(t["reward_curve"]) == t["policy_version"]
    assert all(v >= base - 2 for base, versions in enumerate(t["trained_versions"]) for v in versions)
    for node, versions in t["rollout_versions"].items():  # each worker follows ever newer policies
        assert versions == sorted(versions), (node, versions)
    honest_versions = [v for n in ("worker1", "worker2") for v in t["rollout_versions"][nodes[n]["node"]]]
    assert max(honest_versions) >= 1
    assert Path(t["reward_plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "devnet summary" in dn.stdout and "outcome as expected" in dn.stdout
    # every daemon stopped cleanly on SIGTERM (state closed), none had to be killed
    for name in ("coordinator", "validator", "worker1", "worker2", "cheater"):
        log = (dn.folder / f"{name}.log").read_text()
        assert "SIGTERM received" in log and ": shut down" in log, name
    # and it says how long it took (the newcomer's 5 minutes are measured by `time make devnet`, not here)
    took = re.search(r"finished in (\d+) min (\d\d) s", dn.stdout)
    assert took is not None, dn.stdout[-2000:]
    assert int(took[1]) * 60 + int(took[2]) <= dn.elapsed + 1
    print(f"devnet with adversary took {dn.elapsed:.0f} s")


@pytest.mark.slow
def test_the_explorer_of_a_devnet_run_in_chromium(adversary_devnet: Devnet, tmp_path: Path) -> None:
    """The explorer the devnet leaves running (`--keep-running`), in headless Chromium: its numbers are
    the audit's, the cheater's invalidations show with their transactions and evidence, the reward chart
    renders; then Ctrl-C (SIGTERM) stops it cleanly."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    from tests.integration.test_explorer_browser import CHROMIUM, DRIVER, browser, cards

    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    dn = adversary_devnet
    report, audit = dn.report, dn.report["audit"]
    url = report["explorer"]["after"]
    driver = browser(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:  # the explorer reads the chain after it starts
            driver.get(url)
            seen = cards(driver)
            if "recorded units" in seen or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        t = audit["totals"]
        assert seen["recorded units"] == f"{t['recorded_units']:,}", seen
        assert seen["invalidated units"] == f"{t['invalidated_units']:,}" != "0"
        assert seen["claimed units"] == f"{t['claimed_units']:,}"
        assert driver.find_element(By.ID, "audit").text == "audit consistent"
        cheat = report["nodes"]["cheater"]
        html = driver.page_source
        for slash in cheat["slashes"]:  # each of the cheater's slashes: its transaction on the page
            assert slash["tx"] in html, slash
        rows = driver.find_elements(By.CSS_SELECTOR, "table.disputes tbody tr")
        assert len(rows) == len(report["disputes"]["records"]) >= 1
        for row in rows:
            cells = [c.get_attribute("innerHTML") for c in row.find_elements(By.TAG_NAME, "td")]
            assert "slash" in cells[2] and "0x" in cells[5], cells  # the verdict, and the evidence's hash
        chart = driver.find_element(By.CSS_SELECTOR, "svg.chart")
        img = Image.open(io.BytesIO(chart.screenshot_as_png)).convert("RGB")
        line = sum(1 for px in img.getdata() if abs(px[0] - 0x24) < 40 and abs(px[2] - 0xEB) < 40 and px[1] < 0x90)
        assert img.size[0] > 300 and line > 100, (img.size, line)  # the reward per policy version is drawn
    finally:
        driver.quit()
    dn.proc.send_signal(signal.SIGTERM)
    assert dn.proc.wait(60) == 0, dn.stdout[-3000:]
    assert "stopping" in dn.stdout


@pytest.mark.slow
def test_devnet_lying_validator_is_appealed_and_overturned(tmp_path: Path) -> None:
    """`intellect-node devnet --adversary --adversary-kind lying-validator --workers 1`: a validator of the
    pool accuses every honest record, every other one softly. The honest worker appeals each (its own
    check passes), hard or soft, a committee drawn
    from the other validators re-checks the file and overturns: the worker keeps its stake and is
    paid in full, and the liar loses every bond it put up.

    Run twice in one folder: the second run starts from the first one's leftovers (each run has a new
    chain; before, the roles read their old databases and the second run failed)."""
    pytest.importorskip("vllm")
    report_path = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    for run in (1, 2):
        p = subprocess.run(
            [sys.executable, "-m", "cli.main", "devnet", "--model", "tiny", "--adversary", "--adversary-kind",
             "lying-validator", "--workers", "1", "--steps", "2", "--report", str(report_path), "--dir",
             str(tmp_path / "dn"), "--timeout", "420"],
            capture_output=True, text=True, timeout=480, env=env, cwd=str(ROOT),
        )  # fmt: skip
        assert p.returncode == 0, f"run {run}: " + p.stdout[-3000:] + p.stderr[-3000:]
        assert ("cleared the previous devnet run" in p.stdout) == (run == 2), p.stdout[:2000]
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["problems"] == [] and report["adversary"] == "lying-validator"
    assert set(report["nodes"]) == {"worker1"}
    for n in report["nodes"].values():
        assert n["rollouts_invalidated"] == 0 and n["slashed_tokens"] == 0 and n["slashes"] == []
        assert n["units_claimed"] == n["units_recorded"] > 0
    liar = report["disputes"]["by_accuser"]["liar"]
    assert liar["accused"] == 2 and liar["overturned"] == 2 and liar["upheld"] == 0
    # the liar accuses every other record softly (no bond): the worker appeals soft accusations too
    assert liar["bonds_lost"] == 1 * 5 * 10**18
    assert all(d["appealed"] for d in report["disputes"]["records"].values())
    assert sorted(d["soft"] for d in report["disputes"]["records"].values()) == [False, True]
    assert report["audit"]["consistent"], report["audit"]["mismatches"]
    assert "lost 5 INTL in bonds" in p.stdout


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
         "--adversary-kind", "duplicate", "--adversary-kind", "poison", "--workers", "1", "--steps", "2",
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
        assert cheat["rollouts_accepted"] == 2 and cheat["rollouts_invalidated"] == 2 and cheat["units_claimed"] == 0
        assert cheat["slashed_tokens"] == 2 * 5 * 10**18
        # the cheater keeps its invalidated files; each was found out for its own cheat
        keys = {"0x" + f.stem for f in (tmp_path / "dn" / f"cheater-{kind}" / "rollouts").glob("*.parquet")}
        assert len(keys) == 2 and {found.get(k) for k in keys} == {reason}, (kind, found)
    assert len(found) == 4, found
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
