"""Where the sandbox's runs get their cgroups (`node.sandbox.cgroup`): /proc/self/cgroup and mountinfo
read right for cgroup v1, v2 and the hybrid of both, and `locate` picks v2 where it has the controllers,
else v1, else says why not. The cgroup filesystems here are folders of plain files laid out as the
kernel's; the real ones are used in tests/adversarial/test_sandbox_privileges.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node.doctor import check_sandbox_cgroup
from node.sandbox.cgroup import Located, locate, parse_mountinfo, parse_proc_cgroup

HYBRID_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/api/abc\n3:cpu,cpuacct:/\n0::/\n"


def _mountinfo(rows: list[tuple[str, str, str, str]]) -> str:
    """(mount point, root, fstype, super options) as /proc/self/mountinfo lines."""
    return "".join(
        f"{30 + i} 25 0:{40 + i} {root} {point} rw,nosuid shared:{i} - {fstype} {fstype} {opts}\n"
        for i, (point, root, fstype, opts) in enumerate(rows)
    )


def test_proc_cgroup_and_mountinfo_are_parsed() -> None:
    own = parse_proc_cgroup(HYBRID_CGROUP)
    assert own == {"systemd": "/", "pids": "/", "memory": "/api/abc", "cpu": "/", "cpuacct": "/", "": "/"}
    text = _mountinfo([("/sys/fs/cgroup/memory", "/", "cgroup", "rw,memory"), ("/sys/fs/cgroup/unified", "/",
                       "cgroup2", "rw,nsdelegate")]) + "22 1 8:1 / / rw - ext4 /dev/sda rw\n"  # fmt: skip
    mounts = parse_mountinfo(text)
    assert [(m.point, m.fstype) for m in mounts] == [("/sys/fs/cgroup/memory", "cgroup"),
                                                      ("/sys/fs/cgroup/unified", "cgroup2")]  # fmt: skip
    assert "memory" in mounts[0].options


def _v2(root: Path, own: str, controllers: str, subtree: str = "", procs: str = "") -> None:
    d = root / own.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.controllers").write_text(controllers + "\n")
    (d / "cgroup.subtree_control").write_text(subtree + "\n")
    (d / "cgroup.procs").write_text(procs)
    (d / "cgroup.events").write_text("populated 1\n")


def test_locate_prefers_a_v2_cgroup_with_the_controllers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INTELLECT_SANDBOX_CGROUP", raising=False)
    v2 = tmp_path / "unified"
    _v2(v2, "/system.slice/node.service", "cpu memory pids", procs=f"{os.getpid()}\n")
    mounts = _mountinfo([(str(v2), "/", "cgroup2", "rw")])
    assert locate("0::/system.slice/node.service\n", mounts) == Located(2, (str(v2 / "system.slice/node.service"),))
    # a container's view: the mount's root is the container's cgroup, /proc/self/cgroup names it in full
    _v2(v2, "/node.service", "memory pids", procs=f"{os.getpid()}\n")
    mounts = _mountinfo([(str(v2), "/system.slice", "cgroup2", "rw")])
    assert locate("0::/system.slice/node.service\n", mounts) == Located(2, (str(v2 / "node.service"),))
    # another process shares the node's cgroup and no controllers are passed on yet: not usable
    _v2(v2, "/system.slice/node.service", "cpu memory pids", procs=f"{os.getpid()}\n1\n")
    why = locate("0::/system.slice/node.service\n", _mountinfo([(str(v2), "/", "cgroup2", "rw")]))
    assert isinstance(why, str) and "holds other processes" in why
    # without the pids controller (not delegated)
    _v2(v2, "/", "cpu memory")
    why = locate("0::/\n", _mountinfo([(str(v2), "/", "cgroup2", "rw")]))
    assert isinstance(why, str) and "has no pids" in why and "no cgroup v1 pids hierarchy" in why


def test_locate_falls_back_to_v1_in_a_hybrid_and_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INTELLECT_SANDBOX_CGROUP", raising=False)
    unified, pids, memory = tmp_path / "unified", tmp_path / "pids", tmp_path / "memory"
    _v2(unified, "/", "hugetlb")
    pids.mkdir()
    (memory / "api" / "abc").mkdir(parents=True)
    mounts = _mountinfo([(str(pids), "/", "cgroup", "rw,pids"), (str(memory), "/", "cgroup", "rw,memory"),
                         (str(unified), "/", "cgroup2", "rw")])  # fmt: skip
    assert locate(HYBRID_CGROUP, mounts) == Located(1, (str(pids), str(memory / "api" / "abc")))
    why = locate(
        HYBRID_CGROUP, _mountinfo([(str(pids), "/", "cgroup", "rw,pids"), (str(unified), "/", "cgroup2", "rw")])
    )
    assert why == f"cgroup v2 at {unified} has no pids and memory; no cgroup v1 memory hierarchy"
    assert locate("", "") == "no cgroup filesystem mounted"
    monkeypatch.setenv("INTELLECT_SANDBOX_CGROUP", "off")
    assert locate(HYBRID_CGROUP, mounts) == "turned off (INTELLECT_SANDBOX_CGROUP)"
    note = check_sandbox_cgroup()  # doctor: a note with the way to get one, not a failure
    assert note.ok is None and "rlimits only" in note.detail and "Delegate=yes" in note.detail
