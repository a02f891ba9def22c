"""SIGTERM to `intellect-node devnet` while one of its trio runs is live (the roles' orchestration, or
the explorer `--keep-running` leaves up; a harness's timeout sends it). Its handler used to raise
`KeyboardInterrupt` at whatever bytecode the signal arrived, also inside trio's own loop: the run was
abandoned half-way, and the garbage collector then closed its coroutines outside trio. Their cleanup
ran with no async library (httpcore's cancellation shield: sniffio's `AsyncLibraryNotFoundError`;
trio's cancel scopes: "must be called from async context"), the intermittent failure the devnet was
seen to end with (issue 19, point 6). A real process with the devnet's handler and trio root
(`stop_on_sigterm`, `run_trio`), a trio run with an HTTP client holding a live connection to a real
server and a nursery of tasks, stopped by a real SIGTERM: it must unwind through trio and leave as one
`KeyboardInterrupt`, with nothing closed outside trio. Started with SIGINT ignored too (a script's
background job), where passing SIGTERM on as SIGINT must still stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import functools, sys, httpx, trio
from node.runtime import run_trio, stop_on_sigterm

stop_on_sigterm()

async def serve(stream):
    await stream.receive_some(65536)
    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok")
    await trio.sleep_forever()

async def main():
    async with trio.open_nursery() as n:
        listeners = await n.start(functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "ok"  # a pooled connection
            for _ in range(20):
                n.start_soon(trio.sleep_forever)
            print("ready", flush=True)
            while True:  # busy in trio's loop and in our code, as a daemon is
                await trio.sleep(0)

try:
    run_trio(main)
except KeyboardInterrupt:
    print("stopped", flush=True)
finally:
    import gc
    gc.collect()  # what the run left unclosed would be closed here, outside trio
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_stops_a_trio_run_without_abandoning_it(sigint: str) -> None:
    for attempt in range(3 if sigint == "default" else 2):  # the signal lands at a random bytecode
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" else None
        p = subprocess.Popen([sys.executable, "-X", "dev", "-c", CHILD], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=ignore)  # fmt: skip
        try:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
            time.sleep(0.05 * attempt)
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
        finally:
            p.kill()
        assert "stopped" in out, (out, err)
        for sign in ("Exception ignored", "AsyncLibraryNotFoundError", "abandoned", "async context"):
            assert sign not in err, err


def processes_naming(text: str) -> list[str]:
    """Command lines of this machine's live processes that contain `text` (a test's own folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and text in cmd:
            found.append(cmd)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_to_a_running_devnet_stops_every_role_cleanly(tmp_path: Path, signals: int) -> None:
    """The reported case itself: a real `intellect-node devnet` stopped by SIGTERM while its
    orchestration polls the roles over HTTP (as a harness's timeout does). It stops its daemons and anvil,
    says so in one line, exits 130, and nothing is closed outside trio. A second SIGTERM (an impatient
    Ctrl-C) while it stops them kills the rest: the roles run in sessions of their own, and were left
    running when it landed in the wait for them."""
    pytest.importorskip("vllm")
    folder = tmp_path / "dn"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-X", "dev", "-m", "cli.main", "devnet", "--model", "tiny", "--honest", "--steps", "1",
             "--dir", str(folder), "--timeout", "300"],
            stdout=sink, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(REPO_ROOT),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        # every role started and polled over HTTP: the orchestration's first round of its roles' status
        # (a worker's own phase, "connecting to the coordinator", can pass between two rounds), and a few
        # seconds more, so that the roles are busy (loading their engines, joining) and take a while to stop:
        # the second SIGTERM must land while they stop, not after the devnet has exited
        while "workers generating" not in out.read_text():
            assert proc.poll() is None, out.read_text()[-4000:]
            assert time.monotonic() < deadline, out.read_text()[-4000:]
            time.sleep(0.5)
        time.sleep(4.0)
        assert proc.poll() is None, out.read_text()[-4000:]
        proc.send_signal(signal.SIGTERM)
        if signals == 2:
            time.sleep(0.3)  # while the roles stop: vLLM engines and libp2p hosts take a moment
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = out.read_text()
    assert code == 130 and text.rstrip().endswith(("aborted", "interrupted")), (code, text[-4000:])
    for sign in ("Traceback", "Exception ignored", "AsyncLibraryNotFoundError", "abandoned", "async context"):
        assert sign not in text, text[-6000:]
    assert processes_naming(str(folder)) == []  # every role and anvil stopped with it


def test_ctrl_c_while_anvil_starts_leaves_no_anvil_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or SIGTERM, passed on as SIGINT) landing while `with Anvil()` waits for it to answer:
    `__exit__` never runs, since `__enter__` did not return, and anvil was left running."""
    from node.chain import anvil

    started: list[int] = []

    def interrupted(self: anvil.Anvil, timeout: float) -> anvil.Anvil:
        assert self.proc is not None
        started.append(self.proc.pid)
        raise KeyboardInterrupt  # where a signal lands while anvil is not answering yet

    monkeypatch.setattr(anvil.Anvil, "_wait_ready", interrupted)
    chain = anvil.Anvil()
    with pytest.raises(KeyboardInterrupt), chain:
        pass
    assert started and chain.proc is None
    assert not Path(f"/proc/{started[0]}").exists()  # stopped and reaped


def test_a_signal_after_the_commands_cleanup_does_not_replace_its_exit_status() -> None:
    """The second SIGTERM of an impatient user can land after the first one's cleanup is done, while
    the process exits: Python's finalization had put the default handler back, so it killed the process
    (status -15) instead of letting it return 130. Once a command is done, late signals are ignored."""
    code = (
        "import os, signal, sys\n"
        "from node.runtime import command_done, stop_on_sigterm\n"
        "stop_on_sigterm()\n"
        "command_done()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.exit(130)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), timeout=60)
    assert done.returncode == 130
