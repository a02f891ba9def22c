"""One error hierarchy: every error class the project defines reaches the user as one line and a
non-zero exit, whether a command raises it directly or a daemon raises it inside trio's nurseries."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any

import click
import pytest
import trio

import cli
import node
import pool
from cli.main import cli as root
from cli.main import entry
from node.errors import ConfigError, IntellectError
from node.runtime import fatal_errors

MESSAGE = "something specific went wrong"
HINT = "do the obvious thing"


def _all_modules() -> None:
    for pkg in (node, pool, cli):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(info.name)


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


_all_modules()
ERRORS = sorted({c for c in [IntellectError, *_subclasses(IntellectError)]}, key=lambda c: (c.__module__, c.__name__))


def _make(cls: type) -> BaseException:
    """An instance of `cls` carrying MESSAGE (the classes with their own constructors get theirs)."""
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    if cls.__name__ == "CalibrationFailed":
        from node.calibrate import Calibrated
        from node.rollout.checks import SamplingTolerances
        from node.toploc.proofs import Thresholds

        cal = Calibrated("tiny", Thresholds.from_dict({}), SamplingTolerances.from_dict({}), {})
        return cls(cal, [MESSAGE])
    if params[:2] == ["reason", "message"]:  # EnvelopeError
        from node.p2p.envelope import RejectReason

        return cls(next(iter(RejectReason)), MESSAGE)
    extra: dict[str, Any] = {
        "tx_hash": "0x" + "ab" * 32,
        "name": "Boom",
        "args": {},
        "data": "0x",
        "code": -32000,
        "nonce": 7,
    }
    return cls(
        MESSAGE, **{p: extra[p] for p in params[1:] if p in extra}, **({"hint": HINT} if "hint" in params else {})
    )


def test_every_error_class_is_found() -> None:
    names = {c.__name__ for c in ERRORS}
    # the families and the errors that used to have roots of their own
    for want in (
        "ConfigError",
        "PeerError",
        "ChainError",
        "StoreError",
        "ProtocolError",
        "RolloutFormatError",
        "EnvelopeError",
        "TaskSpecError",
        "CalibrationFailed",
        "DevnetFailed",
        "P2PError",
    ):
        assert want in names, want
    assert len(ERRORS) >= 25
    # and no exception class of the project has another root
    import sys

    for name, mod in list(sys.modules.items()):
        if name.split(".")[0] in ("node", "pool", "cli"):
            for obj in vars(mod).values():
                if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == name:
                    assert issubclass(obj, IntellectError), f"{name}.{obj.__name__} is not an IntellectError"


def _one_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_error_reaches_the_user_as_one_line(cls: type, monkeypatch, capsys) -> None:
    exc = _make(cls)
    assert isinstance(exc, IntellectError) and "\n" not in str(exc)

    def raise_it() -> None:
        raise exc

    def raise_in_daemon() -> None:
        async def daemon() -> None:
            async with trio.open_nursery() as n:
                n.start_soon(trio.sleep_forever)
                async with trio.open_nursery() as inner:
                    inner.start_soon(trio.sleep, 0)
                    raise exc

        with fatal_errors():
            trio.run(daemon)

    monkeypatch.setitem(root.commands, "boom", click.Command("boom", callback=raise_it))
    monkeypatch.setitem(root.commands, "boom-daemon", click.Command("boom-daemon", callback=raise_in_daemon))
    for command in ("boom", "boom-daemon"):
        capsys.readouterr()
        code = entry([command])
        line = _one_line(code, capsys.readouterr().err)
        assert MESSAGE in line, line
        if getattr(exc, "hint", ""):
            assert exc.hint in line, line


@pytest.mark.parametrize("daemon", ["validate", "coordinator"])
def test_a_missing_thresholds_file_is_a_config_error_before_anything_starts(
    daemon: str, tmp_path: Path, capsys
) -> None:
    """`validate --thresholds nope` printed a traceback once; it now fails at once, before the chain."""

    def start(thresholds: str) -> str:
        flags = ["--pool", "1", "--thresholds", thresholds, "--data-dir", str(tmp_path / "d")]
        code = entry([daemon, *flags, "--rpc-url", "http://127.0.0.1:9", "--rpc-wait", "0"])
        return _one_line(code, capsys.readouterr().err)

    line = start("nope")
    assert "no thresholds file 'nope'" in line and "toploc calibrate" in line
    bad = tmp_path / "t.json"
    bad.write_text('{"model": "tiny"}')
    assert f"thresholds file {bad} is malformed" in start(str(bad))
    with pytest.raises(ConfigError):
        from node.verify import Calibrated

        Calibrated.load(tmp_path / "missing.json")


DAEMON_STATE = {
    "join": "node.worker.daemon.WorkerState",
    "validate": "node.validator.daemon.ValidatorState",
    "coordinator": "pool.coordinator.daemon.CoordinatorState",
}


@pytest.mark.parametrize("daemon", sorted(DAEMON_STATE))
def test_a_daemon_that_cannot_start_on_its_data_dir_says_so_in_one_line(
    daemon: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A --data-dir with a file in the way, and a disk that fills while the daemon opens its state, fail
    before the chain is touched: one line each, no traceback."""
    from node.chain.deployment import CONTRACT_NAMES, Deployment

    dep = tmp_path / "deployment.json"
    Deployment(chain_id=31337, contracts={n: "0x" + "11" * 20 for n in CONTRACT_NAMES}, block=0).save(dep)
    monkeypatch.setenv("INTELLECT_DEPLOYMENT", str(dep))
    monkeypatch.setenv("INTELLECT_PRIVATE_KEY", "0x" + "ab" * 32)
    monkeypatch.setenv("INTELLECT_NODE_KEY", "0x" + "cd" * 32)

    def start(data_dir: Path) -> str:
        flags = ["--pool", "1", "--data-dir", str(data_dir), "--metrics", ""]
        code = entry([daemon, *flags, "--rpc-url", "http://127.0.0.1:9", "--rpc-wait", "0"])
        return _one_line(code, capsys.readouterr().err)

    (tmp_path / "a-file").write_text("")
    assert f"cannot use --data-dir {tmp_path / 'a-file' / 'd'}: Not a directory" in start(tmp_path / "a-file" / "d")

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device", str(tmp_path / "d" / "state.db"))

    monkeypatch.setattr(DAEMON_STATE[daemon], full)
    assert "out of disk space" in start(tmp_path / "d")


def test_ctrl_c_inside_a_trio_run_leaves_as_one_keyboard_interrupt() -> None:
    """trio delivers Ctrl-C inside the main task, so it leaves a nursery in an exception group; the CLI
    (`entry`: "interrupted", 130) and the devnet's `finally` blocks expect one `KeyboardInterrupt`."""
    import trio

    from node.runtime import run_trio

    async def interrupted() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            raise KeyboardInterrupt

    async def failed() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            raise ValueError("boom")

    with pytest.raises(KeyboardInterrupt):
        run_trio(interrupted)
    with pytest.raises(BaseExceptionGroup) as group:  # anything else is left as it was raised
        run_trio(failed)
    assert isinstance(group.value.exceptions[0], ValueError)

    async def failed_as_interrupted() -> None:
        async def fail() -> None:
            raise RuntimeError("a role failed")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)
            raise KeyboardInterrupt

    with pytest.raises(BaseExceptionGroup) as group:  # a failure beside the interrupt is shown, not hidden
        run_trio(failed_as_interrupted)
    assert {type(e) for e in group.value.exceptions} == {RuntimeError, KeyboardInterrupt}

    async def answer() -> int:
        return 42

    assert run_trio(answer) == 42
