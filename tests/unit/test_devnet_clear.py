"""A devnet run in a folder an earlier one used starts clean: every run starts a new chain, and the
roles' old databases (event cursors past the new chain's head, records of another deployment) made the
second `make devnet` in one folder fail. Only what a devnet writes is removed, and only from a folder
that holds a devnet's deployment."""

from __future__ import annotations

from pathlib import Path

from pool.devnet.setup import clear_previous_run


def _old_run(d: Path) -> None:
    for name in ("coordinator", "validator", "juror1", "juror2", "worker1", "worker2", "cheater", "liar"):
        (d / name).mkdir(parents=True)
        (d / name / "state.db").write_bytes(b"cursor past the new chain's head")
        (d / f"{name}.log").write_text("old log\n")
    for name in ("deployment.json", "task-spec.json", "summary.json", "report.json", "anvil.log", "eval.json"):
        (d / name).write_text("{}")


def test_an_earlier_runs_files_are_removed_and_nothing_else(tmp_path: Path) -> None:
    _old_run(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "models").mkdir()
    gone = clear_previous_run(tmp_path)
    assert "worker1" in gone and "deployment.json" in gone and "coordinator.log" in gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "notes.txt"]


def test_a_folder_without_a_devnet_deployment_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "worker1").mkdir()
    (tmp_path / "run.log").write_text("someone else's")
    assert clear_previous_run(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.log", "worker1"]
