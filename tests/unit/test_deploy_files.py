"""The operator files in deploy/: the Grafana dashboard asks only for metrics the daemons export, and
each systemd unit starts a real command of this CLI with options it has."""

from __future__ import annotations

import configparser
import json
import re
import shlex
from pathlib import Path

import pytest

from cli.main import cli
from node.metrics import Metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def exported() -> set[str]:
    names = set()
    for fam in Metrics("worker").registry.collect():
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.add(fam.name + "_total")  # labelled counters have no samples until first used
    return names


def test_dashboard_queries_exported_metrics():
    dash = json.loads((DEPLOY / "grafana" / "intellect-node.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    used = {m for e in exprs for m in re.findall(r"\bintellect_[a-z_]+", e)}
    assert len(exprs) >= 15 and used
    assert used <= exported(), used - exported()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("role", ["worker", "validator", "coordinator"])
def test_systemd_unit_runs_a_real_command(role: str):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / f"intellect-node-{role}.service")
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    svc = unit["Service"]
    assert svc["Restart"] == "on-failure" and svc["KillSignal"] == "SIGTERM"
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].endswith("/intellect-node")
    command = cli.commands[argv[1]]
    known = {o for p in command.params for o in getattr(p, "opts", [])}
    used = [a for a in argv[2:] if a.startswith("--")]
    assert used and set(used) <= known, set(used) - known
    assert "--pool" in used and "--data-dir" in used


def test_every_counted_name_is_a_metric():
    """`_count("name")` is a no-op for a name `Metrics` lacks: every name the daemons count must exist."""
    root = DEPLOY.parent
    names = {
        m for f in [*root.glob("node/**/*.py"), *root.glob("pool/**/*.py")]
        for m in re.findall(r"_count\(\s*\"([a-z_]+)\"", f.read_text())
    }  # fmt: skip
    m = Metrics("x")
    assert len(names) > 10 and {n for n in names if not hasattr(m, n)} == set()
