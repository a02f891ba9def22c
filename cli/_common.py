"""Shared plumbing of the CLI: common options, amounts, output, connecting."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Awaitable, Callable
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import click
from eth_account.signers.local import LocalAccount

from node import keys
from node.chain import ChainClient, ChainError, Deployment
from node.chain.deployment import DEFAULT_DEPLOYMENT, NETWORKS
from node.errors import ConfigError
from node.runtime import run_trio

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

DECIMALS = 18


class Settings:
    """The common options of every command, collected on the click context."""

    def __init__(self, rpc_url: str | None, deployment: str, keystore: str | None, as_json: bool) -> None:
        self.rpc_url = rpc_url
        self.deployment_path = deployment
        self.keystore = keystore
        self.as_json = as_json

    def deployment(self) -> Deployment:
        return Deployment.load(self.deployment_path)

    def url_for(self, dep: Deployment | None) -> str:
        if self.rpc_url:
            return self.rpc_url
        if dep is not None and dep.rpc_url:
            return dep.rpc_url
        if dep is not None and dep.network in NETWORKS and NETWORKS[dep.network].default_rpc_url:
            return str(NETWORKS[dep.network].default_rpc_url)
        if dep is None:
            return str(NETWORKS["local"].default_rpc_url)
        raise ConfigError(f"no RPC URL for network {dep.network}", "pass --rpc-url or set INTELLECT_RPC_URL")

    def account(self, required: bool = True) -> LocalAccount | None:
        try:
            return keys.load_account(self.keystore, prompt=_prompt_password)
        except ChainError:
            if required:
                raise
            return None

    async def client(self, signer: bool = True) -> ChainClient:
        dep = self.deployment()
        account = self.account() if signer else None
        return await ChainClient.connect(self.url_for(dep), dep, account)


def _prompt_password(text: str) -> str:
    return str(click.prompt(text, hide_input=True))


def common(f: F) -> F:
    """Adds --rpc-url, --deployment, --keystore and --json to a command and passes `settings`."""

    @click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
    @click.option(
        "--keystore",
        envvar="INTELLECT_KEYSTORE",
        type=click.Path(dir_okay=False),
        help="eth-account V3 keystore of the signing key (password: INTELLECT_PASSWORD or a prompt). "
        "Without it the hex key in INTELLECT_PRIVATE_KEY is used (development only).",
    )
    @click.option(
        "--deployment",
        envvar="INTELLECT_DEPLOYMENT",
        default=DEFAULT_DEPLOYMENT,
        show_default=True,
        type=click.Path(dir_okay=False),
        help="Deployment file written by `contracts deploy` (env INTELLECT_DEPLOYMENT).",
    )
    @click.option("--rpc-url", envvar="INTELLECT_RPC_URL", help="JSON-RPC endpoint (env INTELLECT_RPC_URL).")
    @functools.wraps(f)
    def wrapper(rpc_url: str | None, deployment: str, keystore: str | None, as_json: bool, **kw: Any) -> Any:
        return f(Settings(rpc_url, deployment, keystore, as_json), **kw)

    return wrapper  # type: ignore[return-value]


ZERO32 = "0x" + "00" * 32


def receipt(r: Any) -> dict[str, Any]:
    """A transaction receipt as the CLI prints it (--json)."""
    return {"tx": r.tx_hash, "block": r.block_number, "gas_used": r.gas_used}


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return run_trio(fn, *args)


def output(settings: Settings, data: dict[str, Any], human: str | list[str]) -> None:
    if settings.as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        for line in [human] if isinstance(human, str) else human:
            click.echo(line)


def parse_amount(text: str) -> int:
    """Token amount: `12.5` means 12.5 tokens (18 decimals); `123wei` means 123 base units."""
    t = text.strip().lower().replace("_", "")
    try:
        if t.endswith("wei"):
            value = int(t[:-3])
        else:
            d = Decimal(t)
            if not d.is_finite():
                raise InvalidOperation
            scaled = d * (Decimal(10) ** DECIMALS)
            if scaled != scaled.to_integral_value():
                raise click.BadParameter(f"{text!r} has more than {DECIMALS} decimals")
            value = int(scaled)
    except (InvalidOperation, ValueError):
        raise click.BadParameter(f"{text!r} is not an amount (e.g. 100, 0.5 or 1000wei)") from None
    if value < 0:
        raise click.BadParameter("amounts cannot be negative")
    return value


class Amount(click.ParamType):
    name = "AMOUNT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_amount(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


AMOUNT = Amount()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
