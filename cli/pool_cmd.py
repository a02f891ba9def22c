"""`pool`: create, fund, configure and join compute pools."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import click

from node import ops
from node.chain import ChainError
from node.chain.messages import tokens
from node.chain.signing import Invite
from node.errors import ConfigError
from node.fsio import write_output

from ._common import AMOUNT, Settings, common, output, receipt, run


@click.group("pool")
def pool_group() -> None:
    """Create and run pools; invite and join nodes."""


@pool_group.command("create")
@click.option("--coordinator", required=True, help="Address of the coordinator key (records work, signs invites).")
@click.option("--spec-uri", required=True, help="Where the task spec lives (model, environment, sampling).")
@click.option("--spec-hash", help="sha256 of the task spec (0x + 64 hex); or --spec-file.")
@click.option("--spec-file", type=click.Path(exists=True, dir_okay=False), help="Task spec file to hash.")
@click.option("--reward-rate", type=AMOUNT, required=True, help="Reward per work unit (token).")
@click.option("--window", type=click.IntRange(min=0), default=0, help="Validation window in seconds (0: 24 h).")
@click.option("--slash", "slash_amount", type=AMOUNT, default="0", help="Slash per invalidated record.")
@click.option("--min-stake", type=AMOUNT, default="0", help="Provider stake needed to join.")
@click.option("--bootstrap", default="", help="Comma-separated p2p bootstrap multiaddrs.")
@click.option("--validator", "validators", multiple=True, help="Name a validator of the pool (repeatable).")
@click.option("--appeal-period", type=click.IntRange(min=1), default=86_400, show_default=True, help="Seconds.")
@click.option("--vote-period", type=click.IntRange(min=1), default=86_400, show_default=True, help="Seconds.")
@click.option("--committee", type=click.IntRange(1, 32), default=3, show_default=True, help="Validators per dispute.")
@click.option("--bond", type=AMOUNT, help="Bond per dispute party (default: the slash amount).")
@click.option("--arbiter", help="An address that decides disputes alone (default: a committee).")
@click.option("--start", "start_now", is_flag=True, help="Also start the pool.")
@common
def pool_create(
    s: Settings,
    coordinator: str,
    spec_uri: str,
    spec_hash: str | None,
    spec_file: str | None,
    reward_rate: int,
    window: int,
    slash_amount: int,
    min_stake: int,
    bootstrap: str,
    validators: tuple[str, ...],
    appeal_period: int,
    vote_period: int,
    committee: int,
    bond: int | None,
    arbiter: str | None,
    start_now: bool,
) -> None:
    """Create a pool owned by the signing key, with its validators and dispute terms (both fixed for
    the terms once the pool starts; validators can be named and removed later)."""
    if spec_file:
        spec_hash = "0x" + hashlib.sha256(Path(spec_file).read_bytes()).hexdigest()
    if not spec_hash:
        raise click.UsageError("pass --spec-hash or --spec-file")
    terms = ops.DisputeTerms(appeal_period, vote_period, committee, bond, arbiter or ops.ZERO_ADDRESS)
    spec = ops.PoolSpec(
        coordinator, spec_uri, spec_hash, reward_rate, window, slash_amount, min_stake, bootstrap,
        tuple(validators), terms,
    )  # fmt: skip

    async def go() -> tuple[int, Any]:
        async with await s.client() as c:
            pool_id, r = await ops.create_pool(c, spec)
            if start_now:
                await c.transact("PoolManager", "startPool", pool_id, what="pool start")
            return pool_id, r

    pool_id, r = run(go)
    output(
        s,
        receipt(r) | {"pool": pool_id},
        f"created pool {pool_id}{' and started it' if start_now else ''} (tx {r.tx_hash})",
    )


def _pool_tx(fn: str, what: str) -> Any:
    @click.argument("pool_id", type=int)
    @common
    def command(s: Settings, pool_id: int) -> None:
        async def go() -> Any:
            async with await s.client() as c:
                return await c.transact("PoolManager", fn, pool_id, what=what)

        r = run(go)
        output(s, receipt(r) | {"pool": pool_id}, f"{what} of pool {pool_id} done (tx {r.tx_hash})")

    return command


@pool_group.command("rotate-coordinator")
@click.argument("pool_id", type=int)
@click.argument("coordinator")
@common
def pool_rotate_coordinator(s: Settings, pool_id: int, coordinator: str) -> None:
    """Replace the pool's coordinator key (owner): invites and records signed by the old one stop working."""

    async def go() -> Any:
        async with await s.client() as c:
            new = ops.checksum(coordinator, "coordinator")
            return await c.transact("PoolManager", "rotateCoordinator", pool_id, new, what="coordinator rotation")

    r = run(go)
    output(
        s,
        receipt(r) | {"pool": pool_id, "coordinator": coordinator},
        f"pool {pool_id} coordinator is now {coordinator}",
    )


pool_group.command("start", help="Open a created pool for joins and work (owner).")(_pool_tx("startPool", "start"))
pool_group.command("end", help="End a pool (owner); recorded work keeps its deadlines.")(_pool_tx("endPool", "end"))


@pool_group.command("info")
@click.argument("pool_id", type=int)
@common
def pool_info(s: Settings, pool_id: int) -> None:
    """Terms, status, members and budget of a pool."""

    async def go() -> dict[str, Any]:
        async with await s.client(signer=False) as c:
            return await ops.pool_info(c, pool_id)

    p = run(go)
    a = p["account"]
    output(
        s,
        p,
        [
            f"pool {pool_id}: {p['statusName']}, owner {p['owner']}, coordinator {p['coordinator']}, {p['members']} members",
            f"  spec {p['specURI']} ({p['specHash']})",
            f"  reward {tokens(p['rewardRate'])}/unit, window {p['validationWindow']} s, slash {tokens(p['slashAmount'])},"
            f" min stake {tokens(p['minStake'])}",
            f"  budget {tokens(a['budget'])}; units recorded {a['recordedUnits']}, pending {a['pendingUnits']},"
            f" invalidated {a['invalidatedUnits']}, claimed {a['claimedUnits']}",
        ],
    )


@pool_group.command("fund")
@click.argument("pool_id", type=int)
@click.argument("amount", type=AMOUNT)
@common
def pool_fund(s: Settings, pool_id: int, amount: int) -> None:
    """Add AMOUNT to a pool's reward budget."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.fund_pool(c, pool_id, amount)

    r = run(go)
    output(
        s,
        receipt(r) | {"pool": pool_id, "amount": amount},
        f"funded pool {pool_id} with {tokens(amount)} (tx {r.tx_hash})",
    )


@pool_group.command("bootstrap")
@click.argument("pool_id", type=int)
@click.argument("peers")
@common
def pool_bootstrap(s: Settings, pool_id: int, peers: str) -> None:
    """Set the pool's p2p bootstrap peers (comma-separated multiaddrs; owner)."""

    async def go() -> Any:
        async with await s.client() as c:
            return await c.transact("PoolManager", "setBootstrap", pool_id, peers, what="bootstrap update")

    r = run(go)
    output(
        s, receipt(r) | {"pool": pool_id, "bootstrap": peers}, f"pool {pool_id} bootstrap peers set (tx {r.tx_hash})"
    )


@pool_group.command("withdraw-surplus")
@click.argument("pool_id", type=int)
@click.argument("amount", type=AMOUNT)
@click.option("--to", "to", help="Recipient (default: the signing key).")
@common
def pool_withdraw_surplus(s: Settings, pool_id: int, amount: int, to: str | None) -> None:
    """Take back budget not owed to pending work (owner)."""

    async def go() -> Any:
        async with await s.client() as c:
            dest = ops.checksum(to, "recipient") if to else c.address
            return await c.transact("WorkLedger", "withdrawSurplus", pool_id, amount, dest, what="surplus withdrawal")

    r = run(go)
    output(
        s,
        receipt(r) | {"pool": pool_id, "amount": amount},
        f"withdrew {tokens(amount)} from pool {pool_id} (tx {r.tx_hash})",
    )


@pool_group.command("invite")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--node", required=True, help="Node address to invite.")
@click.option(
    "--ttl", type=click.IntRange(min=1), default=3600, show_default=True, help="Seconds until the invite expires."
)
@click.option("--nonce", type=click.IntRange(min=0), help="Invite nonce (default: random).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the invite JSON here (default: stdout).")
@common
def pool_invite(s: Settings, pool_id: int, node: str, ttl: int, nonce: int | None, out: str | None) -> None:
    """Sign a single-use invite with the coordinator key (the signing key)."""

    async def go() -> Invite:
        async with await s.client(signer=False) as c:
            acct = s.account()
            assert acct is not None
            info = await ops.pool_info(c, pool_id)
            if info["coordinator"] != acct.address:
                raise ChainError(
                    f"the signing key {acct.address} is not the coordinator {info['coordinator']} of pool {pool_id}",
                    "sign invites with the coordinator's key",
                )
            return await ops.make_invite(c, acct, pool_id, node, ttl, nonce)

    inv = run(go)
    text = json.dumps(inv.to_dict(), indent=2)
    if out:
        write_output(Path(out), (text + "\n").encode())
        output(
            s, inv.to_dict(), f"invite for node {inv.node} to pool {pool_id} written to {out} (expires {inv.expiry})"
        )
    else:
        click.echo(text)


@pool_group.command("join")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--invite", "invite_file", required=True, type=click.Path(dir_okay=False), help="Invite JSON file.")
@common
def pool_join(s: Settings, pool_id: int, invite_file: str) -> None:
    """Join a node to a pool with the coordinator's invite (sent by the node's provider)."""
    try:
        inv = Invite.from_dict(json.loads(Path(invite_file).read_text()))
    except FileNotFoundError:
        raise ConfigError(f"invite file {invite_file} not found", "ask the coordinator for an invite") from None
    except ValueError as exc:
        raise ConfigError(
            f"invite file {invite_file} is not a valid invite ({exc})", "ask the coordinator for a new one"
        ) from None

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.join_pool(c, inv, pool_id)

    r = run(go)
    output(
        s, receipt(r) | {"pool": pool_id, "node": inv.node}, f"node {inv.node} joined pool {pool_id} (tx {r.tx_hash})"
    )


def _membership_tx(fn: str, what: str) -> Any:
    @click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
    @click.option("--node", required=True, help="Node address.")
    @common
    def command(s: Settings, pool_id: int, node: str) -> None:
        async def go() -> Any:
            async with await s.client() as c:
                return await c.transact("PoolManager", fn, pool_id, ops.checksum(node, "node"), what=what)

        r = run(go)
        output(s, receipt(r) | {"pool": pool_id, "node": node}, f"{what}: node {node}, pool {pool_id} (tx {r.tx_hash})")

    return command


pool_group.command("leave", help="Take a node out of a pool (its provider).")(_membership_tx("leavePool", "leave"))
pool_group.command("eject", help="Remove a node from a pool (owner or coordinator).")(
    _membership_tx("ejectNode", "eject")
)
pool_group.command("blacklist", help="Bar a node from a pool for good (owner or coordinator).")(
    _membership_tx("blacklistNode", "blacklist")
)
