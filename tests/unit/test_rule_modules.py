"""The protocol's rules are pure functions: the modules that hold them do no I/O (no trio, no network, no
database, no files), so they are tested without any, and a daemon shell cannot hide a rule in a loop.
Also: no module of the project passes 450 lines (one concern per file)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RULE_MODULES = [
    "node/protocol.py",
    "node/policy.py",
    "node/evidence.py",
    "node/p2p/envelope.py",
    "node/p2p/rules.py",
    "node/rollout/checks.py",
    "node/rollout/intake.py",
    "node/rollout/exact.py",
    "node/rollout/file.py",
    "node/rollout/footer.py",
    "node/toploc/proofs.py",
    "node/chain/messages.py",
    "node/chain/signing.py",
    "node/chain/fees.py",
    "node/tasks/math.py",
    "node/sandbox/policy.py",
    "node/audit.py",
    "node/status.py",
    "node/validator/rules.py",
    "node/worker/rules.py",
    "pool/coordinator/rules.py",
    "pool/grpo/loss.py",
    "pool/explorer/view.py",
    "pool/explorer/render.py",
    "pool/explorer/live.py",
    "node/decoding.py",
]

# Modules that do I/O, or a concurrency runtime (which exists for I/O).
IO_MODULES = {"trio", "anyio", "asyncio", "httpx", "requests", "socket", "sqlite3", "subprocess", "shutil", "libp2p"}
IO_PROJECT = {
    "node.fsio",
    "node.store",
    "node.httpd",
    "node.ops",
    "node.daemon",
    "node.chain.client",
    "node.chain.rpc",
    "node.chain.tx",
    "node.chain.anvil",
    "node.sandbox.runner",
    "node.sandbox.cgroup",
}
# Calls that touch files.
IO_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "iterdir", "rename"}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _io_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path).split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names = [".".join([*base, *([node.module] if node.module else [])])]
            if not node.module:  # from . import x
                names = [f"{names[0]}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] in IO_MODULES or name in IO_PROJECT:
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Call):
            f = node.func
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if called in IO_CALLS:
                found.append(f"line {node.lineno}: calls {called}()")
    return found


@pytest.mark.parametrize("module", RULE_MODULES)
def test_a_rule_module_does_no_io(module: str) -> None:
    assert _io_uses(REPO / module) == [], f"{module} is a rule module: move the I/O to its shell"


def test_the_check_sees_io() -> None:
    """The checker itself finds what it forbids (else the test above could not fail)."""
    shell = REPO / "node" / "store.py"
    found = _io_uses(shell)
    assert any("sqlite3" in f for f in found) and any("trio" in f for f in found)
    # relative imports are resolved: the status shell's `from .ops import checksum` is I/O
    assert any("node.ops" in f for f in _io_uses(REPO / "node" / "status_read.py"))


def test_no_module_passes_450_lines() -> None:
    long = []
    for top in ("node", "pool", "cli"):
        for p in sorted((REPO / top).rglob("*.py")):
            n, name = len(p.read_text().splitlines()), str(p.relative_to(REPO))
            if n > 450:
                long.append(f"{name}: {n} lines")
    assert long == [], "split these by concern: " + ", ".join(long)


SQL_HEADS = ("SELECT ", "UPDATE ", "DELETE FROM ", "INSERT INTO ", "INSERT OR ", "CREATE TABLE ")
STATE_MODULES = {"node/store.py", "node/worker/state.py", "node/validator/state.py", "pool/coordinator/state.py"}


def _sql_strings(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lstrip().startswith(SQL_HEADS):
            found.append(f"line {node.lineno}: {node.value[:40]!r}")
    return found


def test_no_sql_outside_the_state_modules() -> None:
    """Each daemon's durable state is behind named methods (`state.py`); shells and rules hold no SQL."""
    leaks = {}
    for top in ("node", "pool", "cli"):
        for p in sorted((REPO / top).rglob("*.py")):
            name = str(p.relative_to(REPO))
            if name not in STATE_MODULES and (found := _sql_strings(p)):
                leaks[name] = found
    assert leaks == {}
    assert _sql_strings(REPO / "pool" / "coordinator" / "state.py")  # the check sees SQL where it is
