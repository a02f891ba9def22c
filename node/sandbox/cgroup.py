"""Each sandboxed run in its own cgroup, with a pids and a memory limit (`policy.cgroup_settings`), where
the host delegates one to the node; elsewhere runs are bounded by their rlimits alone, and `doctor` says
so (`locate` tells why, changing nothing).

Where: cgroup v2 (the node's own cgroup, with the pids and memory controllers available and writable by
the node: root's, or one delegated, e.g. systemd's `Delegate=yes`), else cgroup v1's pids and memory
hierarchies (writable: root's, typically). The node makes one folder of its own, `intellect-sandbox-<pid>`,
and a `run-<n>` in it per run (in v1, one in each hierarchy); the runner starts bubblewrap through a shell
that moves itself in first (`policy.cgroup_wrapper`). In v2 a cgroup that holds processes cannot pass
controllers to its children, so where the node's cgroup has none enabled yet the node moves itself into a
leaf, `intellect-node-<pid>`, first (what a delegated service is expected to do). Folders that an earlier
node left (its pid gone) are removed on the way.

The parsing of /proc/self/cgroup and /proc/self/mountinfo is pure; the rest reads and writes cgroupfs.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .policy import Limits, cgroup_settings

__all__ = ["HINT", "Cgroups", "Located", "locate", "parse_mountinfo", "parse_proc_cgroup", "setup"]

_NODE, _LEAF, _RUN = "intellect-sandbox-", "intellect-node-", "run-"
_CONTROLLERS = ("pids", "memory")
#: what to do where `locate` finds nothing
HINT = "run the node as root, or in a delegated cgroup v2 with pids and memory (systemd: Delegate=yes)"


@dataclass(frozen=True)
class Mount:
    point: str
    root: str  # the folder of the hierarchy mounted there
    fstype: str
    options: frozenset[str]  # the superblock's (v1: the controllers)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts in /proc/self/mountinfo's text."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            point = fields[4].replace("\\040", " ")
            out.append(Mount(point, fields[3], tail[0], frozenset(tail[2].split(","))))
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup's text as controller -> path; cgroup v2's path under ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                out[name.removeprefix("name=")] = parts[2]
    return out


def _under(mount: Mount, path: str) -> str | None:
    """The folder of cgroup `path` under `mount` (None where the mount does not show it)."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return (mount.point.rstrip("/") + path[len(root) :]).rstrip("/") or "/"


@dataclass(frozen=True)
class Located:
    """Where the runs' cgroups can go: `version` 2 (`dirs`: the node's cgroup) or 1 (`dirs`: its pids
    and its memory cgroup)."""

    version: int
    dirs: tuple[str, ...]


def locate(proc_cgroup: str | None = None, mountinfo: str | None = None) -> Located | str:
    """Where this process can make its runs' cgroups, or why it cannot. Reads, changes nothing."""
    if os.environ.get("INTELLECT_SANDBOX_CGROUP", "").lower() in ("0", "off", "no"):
        return "turned off (INTELLECT_SANDBOX_CGROUP)"
    try:
        own = parse_proc_cgroup(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
        mounts = parse_mountinfo(mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror})"
    if not mounts:
        return "no cgroup filesystem mounted"
    why = []
    for m in (m for m in mounts if m.fstype == "cgroup2" and "" in own):
        d = _under(m, own[""])
        if d is None:
            continue
        try:
            available = set(Path(d, "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if not available.issuperset(_CONTROLLERS):
            why.append(f"cgroup v2 at {d} has no {' and '.join(c for c in _CONTROLLERS if c not in available)}")
        elif not os.access(d, os.W_OK):
            why.append(f"cgroup v2 at {d} is not writable by this user")
        elif _shared_v2(d):
            why.append(f"cgroup v2 at {d} holds other processes, so it cannot have children with controllers")
        else:
            return Located(2, (d,))
    v1 = []
    for ctrl in _CONTROLLERS:
        found = [d for m in mounts if m.fstype == "cgroup" and ctrl in m.options and ctrl in own
                 for d in [_under(m, own[ctrl])] if d is not None and os.path.isdir(d)]  # fmt: skip
        if not found:
            why.append(f"no cgroup v1 {ctrl} hierarchy")
        elif not os.access(found[0], os.W_OK):
            why.append(f"cgroup v1 {ctrl} at {found[0]} is not writable by this user")
        else:
            v1.append(found[0])
    if len(v1) == len(_CONTROLLERS):
        return Located(1, tuple(v1))
    return "; ".join(why)


def _shared_v2(d: str) -> bool:
    """Whether v2 cgroup `d` cannot pass its controllers on: it has none enabled for its children yet,
    is not the root (which has no cgroup.events) and holds other processes than this one."""
    try:
        if set(Path(d, "cgroup.subtree_control").read_text().split()).issuperset(_CONTROLLERS):
            return False
        procs = set(Path(d, "cgroup.procs").read_text().split())
    except OSError:
        return True
    return os.path.exists(f"{d}/cgroup.events") and bool(procs - {str(os.getpid())})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parent: str) -> None:
    """The folders a node that is gone left under `parent` (its runs' first)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            name = entry.name
            for prefix in (_NODE, _LEAF):
                pid = name.removeprefix(prefix)
                if name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)) and entry.is_dir():
                    with contextlib.suppress(OSError):
                        for run in os.scandir(entry.path):
                            if run.is_dir():
                                os.rmdir(run.path)
                        os.rmdir(entry.path)


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _enable_v2(d: str) -> None:
    """Pass the pids and memory controllers to `d`'s children; where `d` holds this process (and so
    cannot), move it into a leaf of its own first."""
    want = " ".join(f"+{c}" for c in _CONTROLLERS)
    if set(Path(d, "cgroup.subtree_control").read_text().split()).issuperset(_CONTROLLERS):
        return
    try:
        _write(f"{d}/cgroup.subtree_control", want)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    leaf = f"{d}/{_LEAF}{os.getpid()}"
    os.makedirs(leaf, exist_ok=True)
    _write(f"{leaf}/cgroup.procs", str(os.getpid()))
    try:
        _write(f"{d}/cgroup.subtree_control", want)
    except OSError:  # other processes share the node's cgroup: back where it was
        with contextlib.suppress(OSError):
            _write(f"{d}/cgroup.procs", str(os.getpid()))
            os.rmdir(leaf)
        raise


_shared: dict[int, tuple[Cgroups | None, str]] = {}
_lock = threading.Lock()


def setup() -> tuple[Cgroups | None, str]:
    """The node's cgroups for its runs, or None and why not: made on first use, one folder per node
    process whatever number of sandboxes it holds, removed when the interpreter exits."""
    with _lock:
        if os.getpid() not in _shared:
            _shared[os.getpid()] = made = _setup()
            if made[0] is not None:
                atexit.register(made[0].close)
        return _shared[os.getpid()]


def _setup() -> tuple[Cgroups | None, str]:
    where = locate()
    if isinstance(where, str):
        return None, where
    try:
        for d in where.dirs:
            _remove_stale(d)
        if where.version == 2:
            _enable_v2(where.dirs[0])
        dirs = tuple(f"{d}/{_NODE}{os.getpid()}" for d in where.dirs)
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        if where.version == 2:
            _write(f"{dirs[0]}/cgroup.subtree_control", " ".join(f"+{c}" for c in _CONTROLLERS))
    except OSError as exc:
        return None, f"cgroup v{where.version} at {', '.join(where.dirs)}: {exc.strerror or exc}"
    return Cgroups(where.version, dirs), ""


@dataclass
class Cgroups:
    """The node's folder(s) for its runs' cgroups (`dirs`: v2 one; v1 its pids and its memory folder)."""

    version: int
    dirs: tuple[str, ...]
    _count: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _stale: list[str] = field(default_factory=list)

    def create(self, limits: Limits) -> list[str]:
        """A new run's cgroup, its limits set: the folders to pass to `procs`, `kill` and `remove`."""
        self._sweep()
        n = next(self._count)
        made = [f"{d}/{_RUN}{n}" for d in self.dirs]
        try:
            for d in made:
                os.mkdir(d)
            for name, value, required in cgroup_settings(limits, self.version):
                where = made[0] if self.version == 2 or name.startswith("pids.") else made[-1]
                try:
                    _write(f"{where}/{name}", value)
                except OSError:
                    if required:
                        raise
        except OSError:
            self.remove(made)
            raise
        return made

    @staticmethod
    def procs(run: list[str]) -> list[str]:
        return [f"{d}/cgroup.procs" for d in run]

    def kill(self, run: list[str]) -> None:
        """SIGKILL to every process in the run's cgroup."""
        with contextlib.suppress(OSError):
            if self.version == 2 and os.path.exists(f"{run[0]}/cgroup.kill"):
                _write(f"{run[0]}/cgroup.kill", "1")
                return
            for _ in range(3):  # v1 (or v2 before Linux 5.14): one by one; none of them can fork
                pids = [int(p) for p in Path(run[0], "cgroup.procs").read_text().split()]
                if not pids:
                    return
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def remove(self, run: list[str], wait_s: float = 1.0) -> None:
        """Remove the run's cgroup once its processes are gone (killed first); where they take longer
        than `wait_s`, at a later run."""
        deadline = time.monotonic() + wait_s
        for d in run:
            while os.path.isdir(d):
                try:
                    os.rmdir(d)
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                        self._stale.append(d)
                        break
                    self.kill(run)
                    time.sleep(0.005)

    def _sweep(self) -> None:
        stale, self._stale = self._stale, []
        for d in stale:
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def close(self) -> None:
        """Remove what is left: the runs' cgroups and the node's folder(s)."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                for run in os.scandir(d):
                    if run.is_dir() and run.name.startswith(_RUN):
                        self.remove([run.path], wait_s=0.5)
            with contextlib.suppress(OSError):
                os.rmdir(d)
