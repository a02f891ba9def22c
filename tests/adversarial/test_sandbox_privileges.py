"""Model-written code against the real sandbox's privileges (issue 37, finding 5): whatever user the node
runs as (root here, in CI), the code holds no capability, cannot put a thread into a new namespace,
cannot park memory in SysV IPC beyond its address-space limit, and, where the host delegates cgroups,
is held to its run's pids and memory limits."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from node.sandbox import Limits, Sandbox

LIMITS = Limits(cpu_s=2, wall_s=6.0, memory_bytes=256 << 20, output_bytes=4096, tmpfs_bytes=4 << 20)

# the capability sets (capget), the bounding set (prctl PR_CAPBSET_READ) and the ambient set
# (prctl PR_CAP_AMBIENT_IS_SET) of the sandboxed process, and what a raw packet socket (CAP_NET_RAW) gets
CAPS = """
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
data = (ctypes.c_uint32 * 6)()  # two of {effective, permitted, inheritable}
assert libc.capget(header, data) == 0, ctypes.get_errno()
sets = {name: data[i] | data[i + 3] << 32 for i, name in enumerate(("effective", "permitted", "inheritable"))}
sets["bounding"] = sum(1 << c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1)
sets["ambient"] = sum(1 << c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1)
print(sorted((k, hex(v)) for k, v in sets.items()))
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    print("raw socket")
except OSError as exc:
    print("no raw socket", exc.errno)
"""


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    s = Sandbox(LIMITS, parallel=2)
    s.probe()
    return s


def test_the_code_holds_no_capability_whatever_user_runs_the_node(sandbox: Sandbox) -> None:
    """Found: run by root, bubblewrap kept every capability the node had (in the sandbox's own user
    namespace: its network, its mounts, its IPC) while the policy said none."""
    r = sandbox.run(CAPS)
    assert r.status == "ok", r
    lines = r.stdout.decode().splitlines()
    assert lines[0] == str(sorted((k, "0x0") for k in ("ambient", "bounding", "effective", "inheritable", "permitted")))
    assert lines[1] == "no raw socket 1", r  # EPERM


NAMESPACES = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


def test_no_clone_reaches_the_kernel_with_a_namespace_flag(sandbox: Sandbox) -> None:
    """Found: a clone with CLONE_THREAD and CLONE_NEWNET passed the filter (a thread in a new network
    namespace brought up `lo` and made an nf_tables table). Each call here lacks CLONE_SIGHAND, so the
    kernel, if it sees it, answers EINVAL before it makes anything: EPERM means the filter refused it."""
    program = (
        "import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "nr = {'x86_64': 56, 'aarch64': 220}[platform.machine()]\n"
        f"for name, flag in {sorted(NAMESPACES.items())!r}:\n"
        "    for extra in (0x00010000, 0x00010000 | 0x11, 0):  # CLONE_THREAD, and with SIGCHLD, and alone\n"
        "        ret = libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(flag | extra), ctypes.c_long(0),\n"
        "                           ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))\n"
        "        print(name, hex(extra), ret, ctypes.get_errno())\n"
        "    print(name, 'unshare', libc.unshare(flag), ctypes.get_errno())\n"
        "print('setns', libc.setns(0, 0), ctypes.get_errno())\n"
        "import threading\nt = threading.Thread(target=print, args=('thread',))\nt.start(); t.join()\n"
    )
    r = sandbox.run(program)
    assert r.status == "ok", r
    lines = r.stdout.decode().splitlines()
    assert lines[-1] == "thread" and len(lines) == 1 + len(NAMESPACES) * 4 + 1, r
    refused = [line for line in lines[:-1] if line.endswith(" -1 1")]
    assert refused == lines[:-1], [line for line in lines[:-1] if line not in refused]


SHM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
size, held = 64 << 20, 0
for _ in range(8):  # 512 MiB, twice the address-space limit, 64 MiB mapped at a time
    seg = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if seg < 0:
        print("shmget refused", ctypes.get_errno())
        break
    at = libc.shmat(seg, None, 0)
    if at in (None, 2**64 - 1):
        print("shmat refused", ctypes.get_errno())
        break
    ctypes.memset(at, 1, size)
    libc.shmdt(ctypes.c_void_p(at))
    held += size
print("held MiB", held >> 20)
print("semget", libc.semget(0, 1, 0o1600), ctypes.get_errno())
print("msgget", libc.msgget(0, 0o1600), ctypes.get_errno())
"""


def test_sysv_ipc_cannot_hold_memory_beyond_the_address_space_limit(sandbox: Sandbox) -> None:
    """Found: detached SysV segments stay allocated (in the run's IPC namespace) but leave the address
    space, so a run held 1.5 GB against its 512 MiB RLIMIT_AS. SysV IPC is refused: no Python program a
    task needs uses it (multiprocessing's locks are POSIX semaphores, and it cannot fork anyway)."""
    r = sandbox.run(SHM)
    assert r.status == "ok", r
    lines = r.stdout.decode().splitlines()
    assert lines == ["shmget refused 1", "held MiB 0", "semget -1 1", "msgget -1 1"], r


def _cgroup_or_skip(box: Sandbox) -> None:
    if box.cgroups is None:
        pytest.skip(f"no cgroup for the sandbox's runs on this host: {box.cgroups_missing}")


THREADS = """
import threading
threading.stack_size(1 << 16)  # small stacks: the address-space limit alone would allow thousands
stop, n = threading.Event(), 0
try:
    while n < 2000:
        threading.Thread(target=stop.wait, daemon=True).start()
        n += 1
except RuntimeError:
    pass
stop.set()
print(n)
"""


def test_a_run_is_held_to_its_pids_limit(sandbox: Sandbox) -> None:
    """Found: no pids cgroup. With small thread stacks RLIMIT_AS does not bound the number of threads;
    the run's cgroup does (the sandbox's init and bubblewrap count too)."""
    _cgroup_or_skip(sandbox)
    box = Sandbox(Limits(cpu_s=2, wall_s=6.0, processes=32), parallel=1)
    r = box.run(THREADS)
    assert r.status == "ok", r
    assert 16 < int(r.stdout) < 32, r


def test_a_run_is_held_to_its_memory_limit_and_its_cgroup_goes_away(sandbox: Sandbox) -> None:
    """Found: no memory cgroup (the run's tmpfs, kernel memory and anything else outside its address
    space went unbounded). A run over its cgroup's memory is killed; its cgroup, seen from outside while
    it runs, holds its processes under the limits, and is removed after."""
    _cgroup_or_skip(sandbox)
    box = Sandbox(Limits(cpu_s=2, wall_s=6.0, memory_bytes=512 << 20, run_memory_bytes=96 << 20), parallel=1)
    r = box.run("x = b'x' * (200 << 20)\nprint('allocated')\n")
    assert r.status == "killed" and b"allocated" not in r.stdout, r
    assert box.run("x = b'x' * (40 << 20)\nprint('allocated')\n").stdout == b"allocated\n"

    assert box.cgroups is not None
    parents = [Path(p) for p in box.cgroups.dirs]
    seen: dict[str, str] = {}

    def look() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not seen:
            for run in parents[0].glob("run-*"):
                procs = (run / "cgroup.procs").read_text().split()
                if len(procs) >= 2:  # bubblewrap, its init and the interpreter
                    seen["procs"] = " ".join(procs)
                    for p in parents:
                        for f in ("pids.max", "memory.max", "memory.limit_in_bytes"):
                            if (p / run.name / f).exists():
                                seen[f] = (p / run.name / f).read_text().strip()
            time.sleep(0.05)

    watcher = threading.Thread(target=look)
    watcher.start()
    assert box.run("import time\ntime.sleep(1.5)\nprint('done')\n").stdout == b"done\n"
    watcher.join()
    assert seen.get("pids.max") == str(box.limits.processes), seen
    assert (seen.get("memory.max") or seen.get("memory.limit_in_bytes")) == str(96 << 20), seen
    assert not [run for p in parents for run in p.glob("run-*")]  # every run's cgroup removed
