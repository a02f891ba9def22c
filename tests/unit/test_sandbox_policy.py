"""The sandbox's rules as data (`node.sandbox.policy`): the seccomp program, the bootstrap and the
bubblewrap command line. The real sandbox is tried in tests/adversarial/test_sandbox.py."""

from __future__ import annotations

import struct

import pytest

from node.sandbox.policy import Limits, bootstrap, bwrap_argv, seccomp_program


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
                 "--clearenv", "--seccomp 7", "--size 1048576 --tmpfs /tmp", "--remount-ro /"):  # fmt: skip
        assert flag in joined, flag
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert binds == ["/usr", "/opt/py"] and "--bind" not in argv  # nothing writable is bound
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--dev-bind"]
    assert devices == ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"] and "--dev" not in argv
    assert "--proc" not in argv and "--share-net" not in argv
    at = argv.index("/opt/py/bin/python3.11")
    assert argv[at + 1 : at + 5] == ["-s", "-P", "-S", "-B"]  # not -I: its -E would drop PYTHONHASHSEED
    assert "PYTHONHASHSEED" in argv and "/opt/py/lib/python3.11/site-packages" in argv  # hidden by a tmpfs
