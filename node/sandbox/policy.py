"""What a sandboxed run may do, as data: the limits, the seccomp program that forbids new processes, the
bubblewrap command line and the bootstrap the interpreter runs first. Pure functions (no I/O); the runner
(`node.sandbox.runner`) only starts processes and moves bytes.

The sandbox holds model-written code. Inside it the code sees a read-only interpreter and system
libraries, a fresh size-capped tmpfs as its only writable place (and working directory), a /dev of
four device nodes (null, zero, random, urandom), no /proc, /sys, /etc or home, no network (its own empty network namespace), its own PID, IPC and
UTS namespaces, no capabilities, no new user namespaces, and no way to start another process (seccomp:
fork, vfork and clone without CLONE_THREAD fail with EPERM, clone3 with ENOSYS so that libraries fall
back to clone); threads stay allowed. The bootstrap lowers its rlimits (CPU seconds, address space,
open files, file size, core dumps) before it reads the program, hard and soft alike, so the code cannot
raise them. The runner adds a wall-clock deadline and a cap on output, and kills everything at the end.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass

__all__ = ["Limits", "bootstrap", "bwrap_argv", "seccomp_program"]


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

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_bytes", "open_files", "file_bytes", "tmpfs_bytes", "output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")


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

# audit arch, and the syscall numbers of clone, fork, vfork, clone3 (None: the arch has no such call)
_ARCHES = {
    "x86_64": (0xC000003E, 56, 57, 58, 435),
    "aarch64": (0xC00000B7, 220, None, None, 435),
}
# Calls refused with EPERM: reaching other processes (ptrace: the sandbox's own init has no rlimits and
# could be made to outlive the run; process_vm_*, pidfd_*), the kernel's bigger attack surface (bpf,
# perf_event_open, userfaultfd, io_uring, keyrings), and changing mounts or namespaces.
_DENIED = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_open": 434, "pidfd_getfd": 438,
        "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "add_key": 248, "request_key": 249, "keyctl": 250, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "reboot": 169, "acct": 163, "personality": 135,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_open": 434, "pidfd_getfd": 438,
        "perf_event_open": 241, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "add_key": 217, "request_key": 218, "keyctl": 219, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "reboot": 142, "acct": 89, "personality": 92,
    },
}  # fmt: skip


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter (an array of `struct sock_filter`) for this machine's architecture: another
    architecture's calls (or x32's) kill the process; new processes and the `_DENIED` calls fail;
    everything else is allowed."""
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
    ops.append((_JEQ_K, 0, 3, clone))
    ops.append((_LD_W_ABS, 0, 0, 16))  # args[0] (clone flags), low 32 bits (little-endian)
    ops.append((_JSET_K, 1, 0, _CLONE_THREAD))
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


def bwrap_argv(
    bwrap: str, python: str, prefix: str, limits: Limits, seccomp_fd: int, version: str = "3.11"
) -> list[str]:
    """bubblewrap running `python` (whose installation lives under `prefix`, bound read-only) on the
    bootstrap, with the filter read from `seccomp_fd` (an fd the runner passes to bwrap)."""
    argv = [bwrap, "--ro-bind", "/usr", "/usr"]
    for link, target in (("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/bin", "usr/bin"), ("/sbin", "usr/sbin")):
        argv += ["--symlink", target, link]
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    # the interpreter's installed packages differ between nodes: hidden, so no run can depend on them
    site = f"{prefix}/lib/python{version}/site-packages"
    argv += ["--tmpfs", site, "--remount-ro", site]
    argv += [
        # four device nodes, nothing else (no ptmx: no host-wide pseudo-terminals)
        "--tmpfs", "/dev", *(a for d in _DEVICES for a in ("--dev-bind", d, d)),
        "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
        "--remount-ro", "/dev", "--remount-ro", "/",  # nothing writable but /tmp (and the device nodes)
        "--chdir", "/tmp",
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PYTHONHASHSEED", "0", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
        "--seccomp", str(seccomp_fd),
        # not -I: its -E would ignore PYTHONHASHSEED (and --clearenv leaves no other PYTHON* variable);
        # -s -P are the rest of what -I does, -S skips site, -B writes no bytecode
        python, "-s", "-P", "-S", "-B", "-c", bootstrap(limits),
    ]  # fmt: skip
    return argv
