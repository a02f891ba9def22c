"""Model-written code against the real sandbox (bubblewrap + seccomp + rlimits, `node.sandbox`): every
escape attempt ends as a failed run inside its limits, and the process that ran it (this test, standing
for the node) is unharmed: alive, its files unread and unchanged, its listening socket never reached."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from node.sandbox import Limits, Sandbox

LIMITS = Limits(cpu_s=1, wall_s=3.0, memory_bytes=256 << 20, output_bytes=4096, file_bytes=1 << 20, tmpfs_bytes=4 << 20)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    s = Sandbox(LIMITS, parallel=2)
    s.probe()
    return s


def test_an_honest_program_runs_and_its_output_comes_back(sandbox: Sandbox) -> None:
    r = sandbox.run("import math\nprint(math.factorial(10))\nopen('scratch.txt', 'w').write('ok')\n")
    assert r.status == "ok" and r.stdout == b"3628800\n", r
    assert sandbox.run("raise SystemExit(3)").status == "error"


def test_no_network_not_even_the_hosts_loopback(sandbox: Sandbox) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        r = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('IN')\n")
        assert r.status == "error" and b"IN" not in r.stdout, r
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody came
    r = sandbox.run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nprint('OUT')\n")
    assert r.status == "error" and b"OUT" not in r.stdout, r


def test_nothing_outside_the_temp_dir_is_read_or_written(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("node key material")
    here = Path(__file__).resolve()
    for path in (secret, here, Path("/etc/passwd"), Path.home() / ".bashrc", Path("/proc/1/environ")):
        r = sandbox.run(f"print(open({str(path)!r}).read())")
        assert r.status == "error" and b"key material" not in r.stdout and not r.stdout, (path, r)
    for target in (secret, tmp_path / "new.txt", Path("/usr/evil"), Path("/evil"), Path("/dev/shm/evil")):
        r = sandbox.run(f"open({str(target)!r}, 'w').write('pwned')")
        assert r.status == "error", (target, r)
    assert secret.read_text() == "node key material" and not (tmp_path / "new.txt").exists()
    assert not Path("/usr/evil").exists() and not Path("/evil").exists()


def test_a_fork_bomb_and_any_new_process_are_refused(sandbox: Sandbox) -> None:
    r = sandbox.run("import os\nwhile True:\n    os.fork()\n")
    assert r.status == "error" and b"PermissionError" in r.stderr, r
    r = sandbox.run("import subprocess\nsubprocess.run(['/bin/sh', '-c', 'echo escaped'])\n")
    assert r.status == "error" and b"escaped" not in r.stdout, r
    r = sandbox.run("import multiprocessing as mp\np = mp.Process(target=print)\np.start()\n")
    assert r.status == "error", r
    # threads remain (libraries use them), bounded by the memory limit and the deadline
    r = sandbox.run("import threading\nt = threading.Thread(target=print, args=('thread',))\nt.start(); t.join()\n")
    assert r.status == "ok" and r.stdout == b"thread\n", r


def test_an_infinite_loop_is_stopped_by_its_cpu_limit() -> None:
    # a wall limit far above the CPU one: on a loaded machine CPU seconds come slower than wall seconds
    box = Sandbox(Limits(cpu_s=1, wall_s=15.0))
    r = box.run("while True:\n    pass\n")
    assert r.status == "cpu_limit", r
    r = box.run("import signal\nsignal.signal(signal.SIGXCPU, lambda *a: None)\nwhile True:\n    pass\n")
    assert r.status in ("killed", "cpu_limit"), r  # SIGKILL a second of CPU later


def test_sleeping_past_the_wall_limit_is_killed(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    r = sandbox.run("import time\ntime.sleep(60)\n")
    assert r.status == "timeout" and time.monotonic() - t0 < LIMITS.wall_s + 2, r


def test_huge_output_is_cut_and_the_run_killed(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert r.status == "output_limit" and len(r.stdout) <= LIMITS.output_bytes, r
    r = sandbox.run("import sys\nwhile True:\n    sys.stderr.write('y' * 65536)\n")
    assert r.status == "output_limit" and len(r.stderr) <= LIMITS.output_bytes, r


def test_memory_and_disk_blow_ups_hit_their_limits(sandbox: Sandbox) -> None:
    r = sandbox.run("x = bytearray(1 << 30)\nprint('allocated')\n")
    assert r.status == "error" and b"MemoryError" in r.stderr and not r.stdout, r
    r = sandbox.run("f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))\n")
    assert r.status != "ok" and b"File too large" in r.stderr, r
    many = "i = 0\nwhile True:\n    with open(f'f{i}', 'wb') as f:\n        f.write(b'x' * 500000)\n    i += 1\n"
    r = sandbox.run(many)
    assert r.status == "error" and b"No space left" in r.stderr, r  # the tmpfs is full at its size


def test_killing_the_parent_or_everything_reaches_nothing_outside(sandbox: Sandbox) -> None:
    me = os.getpid()
    for program in (
        f"import os, signal\nos.kill({me}, signal.SIGKILL)\n",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('parent survived')\n",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
        f"import os, signal\nos.killpg({os.getpgid(0)}, signal.SIGKILL)\n",
    ):
        r = sandbox.run(program)
        assert r.status in ("ok", "error", "killed"), r
    assert os.getpid() == me  # still here to assert it
    assert sandbox.run("print('next')").stdout == b"next\n"


def test_runs_go_in_parallel_and_each_keeps_its_own_verdict(sandbox: Sandbox) -> None:
    programs = ["import time\ntime.sleep(1)\nprint('slow')\n"] * 4 + ["raise SystemExit(2)\n", "print('quick')\n"]
    t0 = time.monotonic()
    results = sandbox.run_many(programs)
    took = time.monotonic() - t0
    assert [r.status for r in results] == ["ok"] * 4 + ["error", "ok"]
    assert [r.stdout for r in results[:4]] == [b"slow\n"] * 4 and results[5].stdout == b"quick\n"
    # two at a time: the runs' own durations add up to about twice the time they all took (one after
    # another they would add up to it); sleeps keep this ratio whatever else the machine is doing
    assert sum(r.wall_s for r in results) / took > 1.5


def test_the_limits_themselves_are_checked() -> None:
    with pytest.raises(ValueError, match="cpu_s"):
        Limits(cpu_s=0)
    with pytest.raises(ValueError, match="parallel"):
        Sandbox(LIMITS, parallel=0)


def test_where_no_sandbox_can_be_set_up_code_is_refused_not_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bubblewrap that cannot make a sandbox (here: one that always fails) stops the node with the reason
    before any model code runs; nothing falls back to running it unsandboxed."""
    from node.sandbox import SandboxUnavailable
    from node.tasks.code import CodeEnv

    monkeypatch.setenv("INTELLECT_BWRAP", "/bin/false")
    with pytest.raises(SandboxUnavailable, match="cannot be set up"):
        Sandbox(LIMITS).probe()
    env = CodeEnv()
    canary = tmp_path / "ran"
    with pytest.raises(SandboxUnavailable):
        env.prepare()
    with pytest.raises(SandboxUnavailable):
        env.rewards([(env.problem(1, 0), f"    open({str(canary)!r}, 'w').write('ran')\n", 5)])
    assert not canary.exists()
    monkeypatch.setenv("INTELLECT_BWRAP", str(tmp_path / "missing"))
    with pytest.raises(SandboxUnavailable, match="not an executable"):
        Sandbox(LIMITS)


def test_runs_are_deterministic_and_the_sandbox_cannot_reach_its_own_init(sandbox: Sandbox) -> None:
    """Found in review: `-I` made the interpreter ignore PYTHONHASHSEED, so set order (and rewards) changed
    from run to run; and ptrace let the code take over the sandbox's init (no rlimits) and outlive the run."""
    import sys

    runs = sandbox.run_many(["print(hash('a'), list({'b', 'c', 'd', 'e', 'f'}))"] * 3)
    assert all(r.status == "ok" for r in runs) and len({r.stdout for r in runs}) == 1, runs
    attach = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH to pid 1
    )
    assert sandbox.run(attach).stdout == b"-1 1\n"  # EPERM
    site = f"{sys.base_prefix}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    r = sandbox.run(f"import sys\nsys.path.insert(0, {site!r})\nimport pip\n")  # what each node installed
    assert r.status == "error" and b"No module named 'pip'" in r.stderr, r
    r = sandbox.run("import sys\nprint(sorted(vars(sys.modules['__main__'])))\n")
    assert b"src" not in r.stdout and b"code" not in r.stdout, r  # the bootstrap keeps no program text
