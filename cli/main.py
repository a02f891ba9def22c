"""`intellect-node`: the command-line front end. Thin: it parses, calls node/ and pool/, prints.

Every failure a user can cause prints one line, `error: <problem>; <fix>`, and exits 1
(usage errors exit 2).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from node import keys, ops
from node.audit import audit as run_audit
from node.chain import ChainError, Deployment, RpcClient, WrongChain
from node.chain.anvil import advance_time
from node.chain.deployment import NETWORKS
from node.chain.messages import tokens
from node.chain.signing import Invite
from node.errors import ConfigError, IntellectError, one_line
from node.fsio import write_file
from pool.deploy import DeployParams, deploy

from ._common import AMOUNT, Settings, common, output, run

ZERO32 = "0x" + "00" * 32


def _receipt(r: Any) -> dict[str, Any]:
    return {"tx": r.tx_hash, "block": r.block_number, "gas_used": r.gas_used}


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="intellect-node")
def cli() -> None:
    """intellect-node: decentralized reinforcement learning with verified inference.

    Keys: --keystore FILE (password from INTELLECT_PASSWORD or a prompt), or a hex key in
    INTELLECT_PRIVATE_KEY for development. Chain: --rpc-url / INTELLECT_RPC_URL and
    --deployment / INTELLECT_DEPLOYMENT. Amounts are in tokens (`12.5`) or base units (`100wei`).
    """


# ---------------------------------------------------------------------------------------- keys


@cli.group("keys")
def keys_group() -> None:
    """Create and inspect keys."""


@keys_group.command("new")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Keystore file to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def keys_new(out: str, overwrite: bool, as_json: bool) -> None:
    """Create a new key and save it as an encrypted V3 keystore."""
    password = os.environ.get(keys.PASSWORD_ENV)
    if password is None:
        password = click.prompt("New keystore password", hide_input=True, confirmation_prompt=True)
    acct = keys.new_keystore(out, password, overwrite=overwrite)
    s = Settings(None, "", None, as_json)
    output(s, {"address": acct.address, "keystore": str(Path(out).resolve())}, f"created {acct.address} in {out}")


@keys_group.command("show")
@common
def keys_show(s: Settings) -> None:
    """Print the address of the signing key."""
    acct = s.account()
    assert acct is not None
    output(s, {"address": acct.address}, acct.address)


# ---------------------------------------------------------------------------------------- contracts


@cli.group("contracts")
def contracts_group() -> None:
    """Deploy the protocol contracts."""


@contracts_group.command("deploy")
@click.option(
    "--network",
    type=click.Choice(sorted(NETWORKS)),
    default="local",
    show_default=True,
    help="Network preset: checks the chain id (local 31337, base-sepolia 84532).",
)
@click.option("--treasury", help="Receives slashed stake (required off the local chain; never the admin by default).")
@click.option("--unbonding-period", type=click.IntRange(min=0), default=7 * 86400, show_default=True, help="Seconds.")
@click.option("--stake-per-unit", type=AMOUNT, default="10", show_default=True, help="Stake per compute unit.")
@click.option(
    "--min-provider-stake", type=AMOUNT, default="10", show_default=True, help="Minimum stake at registration."
)
@click.option("--force", is_flag=True, help="Overwrite an existing deployment file.")
@common
def contracts_deploy(
    s: Settings,
    network: str,
    treasury: str | None,
    unbonding_period: int,
    stake_per_unit: int,
    min_provider_stake: int,
    force: bool,
) -> None:
    """Deploy token, registry, pool manager and work ledger; write the deployment file."""
    preset = NETWORKS[network]
    url = s.rpc_url or preset.default_rpc_url
    if not url:
        raise ConfigError(f"network {network} has no default RPC URL", "pass --rpc-url or set INTELLECT_RPC_URL")
    if Path(s.deployment_path).exists() and not force:
        raise ConfigError(f"{s.deployment_path} already exists", "pass --force to replace it or --deployment FILE")
    acct = s.account()
    assert acct is not None
    params = DeployParams(
        treasury=ops.checksum(treasury, "treasury") if treasury else None,
        unbonding_period=unbonding_period,
        stake_per_compute_unit=stake_per_unit,
        min_provider_stake=min_provider_stake,
    )
    if treasury is None and network != "local":
        raise click.UsageError(f"a deployment on {network} needs --treasury (slashed stake goes there)")
    lines: list[str] = []

    async def go() -> Deployment:
        async with RpcClient(url) as rpc:
            chain_id = await rpc.chain_id()
            if chain_id != preset.chain_id:
                raise WrongChain(
                    f"network {network} expects chain id {preset.chain_id}, the RPC endpoint serves {chain_id}",
                    "pass the matching --network or --rpc-url",
                )
            say = (lambda m: None) if s.as_json else (lambda m: click.echo(m, err=True))
            return await deploy(rpc, acct, params, network=network, rpc_url=s.rpc_url or "", progress=say)

    dep = run(go)
    dep.save(s.deployment_path)
    lines.append(f"deployment for chain {dep.chain_id} written to {s.deployment_path} (from block {dep.block})")
    output(s, json.loads(dep.to_json()), lines)


# ---------------------------------------------------------------------------------------- token


@cli.group("token")
def token_group() -> None:
    """The stake and reward token."""


@token_group.command("mint")
@click.option("--to", "to", required=True, help="Recipient address.")
@click.argument("amount", type=AMOUNT)
@common
def token_mint(s: Settings, to: str, amount: int) -> None:
    """Mint tokens (token owner only; test networks)."""

    async def go() -> Any:
        async with await s.client() as c:
            return await c.transact("IntellectToken", "mint", ops.checksum(to, "recipient"), amount, what="mint")

    r = run(go)
    output(s, _receipt(r) | {"to": to, "amount": amount}, f"minted {tokens(amount)} to {to} (tx {r.tx_hash})")


@token_group.command("balance")
@click.argument("address", required=False)
@common
def token_balance(s: Settings, address: str | None) -> None:
    """Token balance of ADDRESS (default: the signing key)."""

    async def go() -> tuple[str, int]:
        async with await s.client(signer=False) as c:
            who = ops.checksum(address) if address else s.account().address  # type: ignore[union-attr]
            return who, await c.token_balance(who)

    who, bal = run(go)
    output(s, {"address": who, "balance": bal}, f"{who}: {tokens(bal)}")


# ---------------------------------------------------------------------------------------- provider


@cli.group("provider")
def provider_group() -> None:
    """Register as a compute provider, manage stake, claim rewards."""


@provider_group.command("register")
@click.option("--stake", "amount", type=AMOUNT, required=True, help="Initial stake.")
@common
def provider_register(s: Settings, amount: int) -> None:
    """Register the signing key as a provider with an initial stake."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.register_provider(c, amount)

    r = run(go)
    output(s, _receipt(r) | {"stake": amount}, f"registered with {tokens(amount)} staked (tx {r.tx_hash})")


@provider_group.command("stake")
@click.argument("amount", type=AMOUNT)
@common
def provider_stake(s: Settings, amount: int) -> None:
    """Add AMOUNT to the provider's stake."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.stake(c, amount)

    r = run(go)
    staked = r.event("Staked").args["staked"]
    output(s, _receipt(r) | {"staked": staked}, f"staked {tokens(amount)}; now {tokens(staked)} (tx {r.tx_hash})")


@provider_group.command("unstake")
@click.argument("amount", type=AMOUNT)
@common
def provider_unstake(s: Settings, amount: int) -> None:
    """Move AMOUNT of stake into unbonding."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.unstake(c, amount)

    r = run(go)
    end = r.event("UnstakeRequested").args["unbondingEnd"]
    output(
        s, _receipt(r) | {"unbonding_end": end}, f"unbonding {tokens(amount)} until unix time {end} (tx {r.tx_hash})"
    )


@provider_group.command("withdraw")
@common
def provider_withdraw(s: Settings) -> None:
    """Withdraw all stake whose unbonding period is over."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.withdraw(c)

    r = run(go)
    amount = r.event("Withdrawn").args["amount"]
    output(s, _receipt(r) | {"amount": amount}, f"withdrew {tokens(amount)} (tx {r.tx_hash})")


@provider_group.command("claim")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_keys", multiple=True, help="Work key to claim (repeatable; default: all claimable).")
@common
def provider_claim(s: Settings, pool_id: int, work_keys: tuple[str, ...]) -> None:
    """Claim rewards of final work (validation window over, not invalidated)."""

    async def go() -> tuple[int, list[Any]]:
        async with await s.client() as c:
            return await ops.claim(c, pool_id, list(work_keys) or None)

    total, receipts = run(go)
    output(
        s,
        {"pool": pool_id, "reward": total, "txs": [_receipt(r) for r in receipts]},
        f"claimed {tokens(total)} from pool {pool_id} in {len(receipts)} transaction(s)",
    )


@provider_group.command("info")
@click.argument("address", required=False)
@common
def provider_info(s: Settings, address: str | None) -> None:
    """Stake, unbonding and nodes of a provider (default: the signing key)."""

    async def go() -> dict[str, Any]:
        async with await s.client(signer=False) as c:
            who = ops.checksum(address) if address else s.account().address  # type: ignore[union-attr]
            return {"address": who} | await ops.provider_info(c, who)

    info = run(go)
    output(
        s,
        info,
        [
            f"provider {info['address']} ({'registered' if info['registered'] else 'not registered'})",
            f"  staked {tokens(info['staked'])} (required {tokens(info['required'])}), unbonding {tokens(info['unbonding'])}",
            f"  nodes {info['nodeCount']} with {info['computeUnits']} compute units; slashed {tokens(info['slashed'])}",
        ],
    )


# ---------------------------------------------------------------------------------------- node


@cli.group("node")
def node_group() -> None:
    """Bind nodes (machines) to a provider."""


def _node_account(node_keystore: str | None) -> Any:
    if node_keystore:
        return keys.load_keystore(node_keystore, password=os.environ.get("INTELLECT_NODE_PASSWORD"))
    if os.environ.get("INTELLECT_NODE_PRIVATE_KEY"):
        return keys.from_hex(os.environ["INTELLECT_NODE_PRIVATE_KEY"], "INTELLECT_NODE_PRIVATE_KEY")
    return None


@node_group.command("add")
@click.option("--units", type=click.IntRange(min=1), default=1, show_default=True, help="Compute units of the node.")
@click.option(
    "--node-keystore",
    type=click.Path(dir_okay=False),
    help="The node's keystore (password INTELLECT_NODE_PASSWORD); or INTELLECT_NODE_PRIVATE_KEY.",
)
@click.option("--node", "node_addr", help="Node address, with --signature made by `node sign` on the node.")
@click.option("--signature", help="The node's binding signature (from `intellect-node node sign`).")
@common
def node_add(s: Settings, units: int, node_keystore: str | None, node_addr: str | None, signature: str | None) -> None:
    """Bind a node to the signing provider. The node key signs (provider, node, binding nonce, chain id, registry)."""

    async def go() -> tuple[str, Any]:
        async with await s.client() as c:
            nk = _node_account(node_keystore)
            if nk is not None:
                node, sig = nk.address, await ops.node_signature(c, nk, c.address)
            elif node_addr and signature:
                node, sig = ops.checksum(node_addr, "node"), signature
            else:
                raise ConfigError(
                    "no node key",
                    "pass --node-keystore, set INTELLECT_NODE_PRIVATE_KEY, or pass --node and --signature",
                )
            return node, await ops.add_node(c, node, units, sig)

    node, r = run(go)
    output(
        s,
        _receipt(r) | {"node": node, "units": units},
        f"node {node} bound with {units} compute units (tx {r.tx_hash})",
    )


@node_group.command("sign")
@click.option("--provider", required=True, help="The provider the node binds to.")
@click.option(
    "--node-keystore", type=click.Path(dir_okay=False), help="The node's keystore; or INTELLECT_NODE_PRIVATE_KEY."
)
@common
def node_sign(s: Settings, provider: str, node_keystore: str | None) -> None:
    """Sign a node binding with the node key (for a provider key kept elsewhere)."""
    nk = _node_account(node_keystore)
    if nk is None:
        raise ConfigError("no node key", "pass --node-keystore or set INTELLECT_NODE_PRIVATE_KEY")

    async def go() -> str:
        async with await s.client(signer=False) as c:
            return await ops.node_signature(c, nk, provider)

    sig = run(go)
    output(s, {"node": nk.address, "provider": provider, "signature": sig}, sig)


@node_group.command("remove")
@click.argument("node")
@common
def node_remove(s: Settings, node: str) -> None:
    """Unbind a node that is in no pool."""

    async def go() -> Any:
        async with await s.client() as c:
            return await c.transact("ProviderRegistry", "removeNode", ops.checksum(node, "node"), what="node removal")

    r = run(go)
    output(s, _receipt(r), f"node {node} removed (tx {r.tx_hash})")


# ---------------------------------------------------------------------------------------- pool


@cli.group("pool")
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
        _receipt(r) | {"pool": pool_id},
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
        output(s, _receipt(r) | {"pool": pool_id}, f"{what} of pool {pool_id} done (tx {r.tx_hash})")

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
        _receipt(r) | {"pool": pool_id, "coordinator": coordinator},
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
        _receipt(r) | {"pool": pool_id, "amount": amount},
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
        s, _receipt(r) | {"pool": pool_id, "bootstrap": peers}, f"pool {pool_id} bootstrap peers set (tx {r.tx_hash})"
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
        _receipt(r) | {"pool": pool_id, "amount": amount},
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
        write_file(Path(out), (text + "\n").encode())
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
        s, _receipt(r) | {"pool": pool_id, "node": inv.node}, f"node {inv.node} joined pool {pool_id} (tx {r.tx_hash})"
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
        output(
            s, _receipt(r) | {"pool": pool_id, "node": node}, f"{what}: node {node}, pool {pool_id} (tx {r.tx_hash})"
        )

    return command


pool_group.command("leave", help="Take a node out of a pool (its provider).")(_membership_tx("leavePool", "leave"))
pool_group.command("eject", help="Remove a node from a pool (owner or coordinator).")(
    _membership_tx("ejectNode", "eject")
)
pool_group.command("blacklist", help="Bar a node from a pool for good (owner or coordinator).")(
    _membership_tx("blacklistNode", "blacklist")
)


# ---------------------------------------------------------------------------------------- work


@cli.group("work")
def work_group() -> None:
    """Record and invalidate work."""


@work_group.command("submit")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option(
    "--file",
    "batch_file",
    type=click.Path(dir_okay=False),
    help="JSON list of {node, work_key, units, policy_version, proof_commitment}.",
)
@click.option("--node", help="Node address (single record).")
@click.option("--key", "work_key", help="Work key: sha256 of the rollout file (single record).")
@click.option("--units", type=click.IntRange(min=1), help="Units (tokens generated).")
@click.option("--policy-version", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--proof", default=ZERO32, help="Proof commitment hash.")
@common
def work_submit(
    s: Settings,
    pool_id: int,
    batch_file: str | None,
    node: str | None,
    work_key: str | None,
    units: int | None,
    policy_version: int,
    proof: str,
) -> None:
    """Record work on chain (the pool's coordinator key)."""
    if batch_file:
        try:
            data = json.loads(Path(batch_file).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read work batch {batch_file}: {exc}") from None
        if not isinstance(data, list):
            raise ConfigError(f"work batch {batch_file} must be a JSON list of records")
        items = [ops.WorkItem.from_dict(d) for d in data]
    elif node and work_key and units:
        items = [ops.WorkItem(node, work_key, units, policy_version, proof)]
    else:
        raise click.UsageError("pass --file, or --node, --key and --units")

    async def go() -> list[Any]:
        async with await s.client() as c:
            return await ops.record_work(c, pool_id, items)

    rs = run(go)
    gas = sum(r.gas_used for r in rs)
    output(
        s,
        {"pool": pool_id, "records": len(items), "txs": [_receipt(r) for r in rs], "gas_per_record": gas / len(items)},
        f"recorded {len(items)} work record(s) in pool {pool_id} ({gas // len(items)} gas each)",
    )


EVIDENCE_HELP = (
    "The evidence: its hash (0x + sha256), or the evidence document itself (`rollout verify FILE "
    "--evidence-out DOC`), which must be about this work; its sha256 goes on chain."
)


def _evidence_hash(value: str, work_key: str) -> str:
    """An --evidence value as the hash that goes on chain: a hash as given, or the sha256 of an evidence
    document file, once the document is checked to be evidence about `work_key`."""
    from node.evidence import MAX_SERVED_EVIDENCE_BYTES, EvidenceError, parse_evidence

    if value.startswith("0x") and len(value) == 66:
        return value
    path = Path(value)
    if not path.is_file():
        raise ConfigError(
            f"--evidence {value}: neither a 0x-prefixed sha256 nor a file",
            "pass the evidence hash, or the document `rollout verify FILE --evidence-out DOC` wrote",
        )
    doc = path.read_bytes()
    try:
        parse_evidence(doc, work_key=work_key, max_bytes=MAX_SERVED_EVIDENCE_BYTES)
    except EvidenceError as exc:
        raise ConfigError(f"{value}: {exc}", "is it the evidence of this work?") from None
    return "0x" + hashlib.sha256(doc).hexdigest()


@work_group.command("invalidate")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_key", required=True, help="Work key.")
@click.option("--evidence", default=ZERO32, help=EVIDENCE_HELP)
@click.option("--soft", is_flag=True, help="Revoke the units without a slash (e.g. data never served).")
@common
def work_invalidate(s: Settings, pool_id: int, work_key: str, evidence: str, soft: bool) -> None:
    """Invalidate recorded work before its deadline (one of the pool's validators). Hard by default:
    an accusation with the pool's bond, final (slash) once its appeal period ends unappealed."""
    evidence = _evidence_hash(evidence, work_key)

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.invalidate(c, pool_id, work_key, evidence, hard=not soft)

    r = run(go)
    if soft:
        ev = r.event("WorkSoftInvalidated").args
        output(s, _receipt(r) | {"units": ev["units"], "soft": True}, f"revoked {ev['units']} units (tx {r.tx_hash})")
        return
    ev = r.event("WorkAccused").args
    output(
        s,
        _receipt(r) | {"appeal_end": ev["appealEnd"], "bond": ev["bond"], "provider": ev["provider"]},
        f"accused provider {ev['provider']} (bond {tokens(ev['bond'])}); final unless appealed by "
        f"{ev['appealEnd']} (tx {r.tx_hash})",
    )


def _dispute_tx(fn: Any, what: str, done: str) -> Any:
    @click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
    @click.option("--key", "work_key", required=True, help="Work key.")
    @common
    def command(s: Settings, pool_id: int, work_key: str) -> None:
        async def go() -> Any:
            async with await s.client() as c:
                return await fn(c, pool_id, work_key)

        r = run(go)
        output(s, _receipt(r) | {"pool": pool_id, "work_key": work_key}, f"{done} {work_key} (tx {r.tx_hash})")

    command.__doc__ = what
    return command


work_group.command("appeal", help="Appeal a hard invalidation of your work with the pool's bond (provider).")(
    _dispute_tx(ops.appeal, "appeal", "appealed")
)
work_group.command("finalize", help="Make an unappealed invalidation final after its appeal period (anyone).")(
    _dispute_tx(ops.finalize_invalidation, "finalize", "finalized the invalidation of")
)
work_group.command("close-lapsed", help="Close a dispute whose vote ended without a majority (anyone).")(
    _dispute_tx(ops.resolve_lapsed, "close", "closed the lapsed dispute of")
)


@work_group.command("challenge")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_key", required=True, help="Work key.")
@click.option("--evidence", required=True, help=EVIDENCE_HELP)
@common
def work_challenge(s: Settings, pool_id: int, work_key: str, evidence: str) -> None:
    """Challenge another provider's record before its deadline, with the pool's bond (any staked provider).
    Keep the evidence document: the committee re-checks the file itself, and anyone given the document
    can check it against the hash on chain with `rollout verify FILE --evidence DOC`."""
    evidence = _evidence_hash(evidence, work_key)

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.challenge(c, pool_id, work_key, evidence)

    r = run(go)
    ev = r.event("WorkChallenged").args
    output(
        s,
        _receipt(r) | {"vote_end": ev["voteEnd"]},
        f"challenged {work_key}; the vote ends {ev['voteEnd']} (tx {r.tx_hash})",
    )


@work_group.command("vote")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_key", required=True, help="Work key.")
@click.option("--uphold/--overturn", required=True, help="Keep the invalidation (slash) or overturn it.")
@common
def work_vote(s: Settings, pool_id: int, work_key: str, uphold: bool) -> None:
    """Vote on an appeal or a challenge (a drawn committee member, or the pool's arbiter)."""

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.vote(c, pool_id, work_key, uphold)

    r = run(go)
    output(s, _receipt(r) | {"uphold": uphold}, f"voted to {'uphold' if uphold else 'overturn'} (tx {r.tx_hash})")


@work_group.command("show")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_key", required=True, help="Work key.")
@common
def work_show(s: Settings, pool_id: int, work_key: str) -> None:
    """Show a work record."""

    async def go() -> dict[str, Any]:
        async with await s.client(signer=False) as c:
            r = await ops.record(c, pool_id, work_key)
            d = await ops.dispute(c, pool_id, work_key)
            return r | {"dispute": d if d["kindName"] != "none" else None}

    r = run(go)
    line = f"{work_key}: {r['statusName']}, {r['units']} units, provider {r['provider']}, deadline {r['deadline']}"
    d = r["dispute"]
    if d is not None:
        line += f"; {d['kindName']} by {d['accuser']}, {d['verdictName']}"
        if d["kindName"] == "accusation" and d["verdictName"] == "open":
            line += f" (appealable until {d['appealEnd']})"
        elif d["verdictName"] == "open":
            line += f" (vote until {d['voteEnd']}: {d['upheld']} uphold, {d['overturned']} overturn of {d['size']})"
    output(s, r, line)


# ---------------------------------------------------------------------------------------- validator


@cli.group("validator")
def validator_group() -> None:
    """Name or remove a pool's validators (the pool owner's key)."""


def _validator_tx(add: bool) -> Any:
    @click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
    @click.argument("address")
    @common
    def command(s: Settings, pool_id: int, address: str) -> None:
        async def go() -> Any:
            async with await s.client() as c:
                fn = ops.add_validator if add else ops.remove_validator
                return await fn(c, pool_id, address)

        r = run(go)
        what = "named validator" if add else "removed validator"
        output(
            s,
            _receipt(r) | {"pool": pool_id, "address": address},
            f"{what} {address} of pool {pool_id} (tx {r.tx_hash})",
        )

    return command


validator_group.command("add", help="Name ADDRESS a validator of the pool (owner).")(_validator_tx(True))
validator_group.command("remove", help="Remove ADDRESS from the pool's validators (owner).")(_validator_tx(False))


# ---------------------------------------------------------------------------------------- chain


@cli.group("chain")
def chain_group() -> None:
    """Inspect the chain; move time on local chains."""


@chain_group.command("advance-time")
@click.argument("seconds", type=click.IntRange(min=1))
@common
def chain_advance(s: Settings, seconds: int) -> None:
    """Move a local chain's clock forward by SECONDS and mine a block."""

    async def go() -> int:
        dep = Deployment.load(s.deployment_path) if Path(s.deployment_path).exists() else None
        async with RpcClient(s.url_for(dep)) as rpc:
            return await advance_time(rpc, seconds)

    ts = run(go)
    output(s, {"timestamp": ts}, f"chain time is now {ts}")


@chain_group.command("info")
@common
def chain_info(s: Settings) -> None:
    """Chain id, head block and the deployment's addresses."""

    async def go() -> dict[str, Any]:
        async with await s.client(signer=False) as c:
            head = await c.rpc.block_number()
            return {
                "chain_id": c.deployment.chain_id,
                "block": head,
                "timestamp": await c.timestamp(),
                "contracts": c.deployment.contracts,
            }

    info = run(go)
    output(
        s,
        info,
        [f"chain {info['chain_id']} at block {info['block']}"]
        + [f"  {k}: {v}" for k, v in sorted(info["contracts"].items())],
    )


# ---------------------------------------------------------------------------------------- audit


@cli.command("audit")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--node", help="Only this node's ledger (all checks still run).")
@common
def audit_cmd(s: Settings, pool_id: int, node: str | None) -> None:
    """Rebuild every node's ledger from events alone and check it against contract state.

    Exits 1 if anything disagrees."""

    async def go() -> Any:
        async with await s.client(signer=False) as c:
            return await run_audit(c, pool_id, ops.checksum(node, "node") if node else None)

    rep = run(go)
    lines = [f"pool {pool_id} at block {rep.block}: {'consistent' if rep.consistent else 'INCONSISTENT'}"]
    for addr, n in sorted(rep.nodes.items()):
        lines.append(
            f"  node {addr}: {n['records']} records, units recorded {n['recorded_units']}, pending {n['pending_units']}"
            f" (final {n['finalized_units']}), invalidated {n['invalidated_units']}, claimed {n['claimed_units']}"
            f" = {tokens(n['claimed_tokens'])}, slashed {tokens(n['slashed_tokens'])}"
        )
        for sl in n["slashes"]:
            lines.append(f"    slash {tokens(sl['amount'])} for {sl['work_key']} by {sl['validator']} (tx {sl['tx']})")
        for d in n.get("disputes", []):
            lines.append(f"    {d['kind']} of {d['work_key']} by {d['by']}: {d['verdict']} (txs {', '.join(d['txs'])})")
    lines += [f"  MISMATCH: {m}" for m in rep.mismatches]
    output(s, rep.to_dict(), lines)
    if not rep.consistent:
        sys.exit(1)


# ---------------------------------------------------------------------------------------- toploc


@cli.group("toploc")
def toploc_group() -> None:
    """TOPLOC proof thresholds."""


@toploc_group.command("calibrate")
@click.option("--model", default="tiny", show_default=True, help="tiny, smollm2, or a local model folder.")
@click.option("--out", type=click.Path(dir_okay=False), help="Thresholds file to write (default: print).")
@click.option("--prompts", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--samples", type=click.IntRange(min=1), default=2, show_default=True, help="Completions per prompt.")
@click.option("--max-tokens", type=click.IntRange(min=8), default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--cache", type=click.Path(file_okay=False), help="Keep generated rollouts here and reuse them on a rerun."
)
@click.option(
    "--precision",
    type=click.Choice(["any", "fp32", "bf16"]),
    default="any",
    show_default=True,
    help="Honest precision the pool allows: any (fp32 and bf16), or one mandated precision.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def toploc_calibrate(
    model: str,
    out: str | None,
    prompts: int,
    samples: int,
    max_tokens: int,
    seed: int,
    cache: str | None,
    precision: str,
    as_json: bool,
) -> None:
    """Measure honest and tampered rollouts on MODEL and write thresholds that separate them.

    Honest: fp32 and bf16 generation, batch sizes 1 and 8, checked by fp32 and bf16 prefills.
    Tampered: other weights, 1 % weight noise, fp8 weights, another system prompt, a changed prompt
    token, another model's tokens spliced in. Exits 1 if no thresholds separate them."""
    from node.calibrate import CalibrationConfig, CalibrationFailed, calibrate

    say = (lambda m: None) if as_json else (lambda m: click.echo(m, err=True))
    try:
        result = calibrate(
            CalibrationConfig(model, prompts, samples, max_tokens, 1.0, seed, precision),
            progress=say,
            cache=Path(cache) if cache else None,
        )
    except CalibrationFailed as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    text = json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n"
    if out:
        write_file(Path(out), text.encode())
    t = result.toploc
    summary = [
        f"{model}: exponent mismatches <= {t.exp_mismatch_max}, mantissa error mean <= {t.mant_err_mean_max}, "
        f"median <= {t.mant_err_median_max}, sign mismatches <= {t.sign_mismatch_max}; "
        f"logprob error <= {result.sampling.logprob_max_abs}",
    ]
    if out:
        summary.append(f"written to {out}")
    if as_json or not out:
        click.echo(text, nl=False)
    else:
        for line in summary:
            click.echo(line)


@cli.group("rollout")
def rollout_group() -> None:
    """Inspect and verify rollout files."""


@rollout_group.command("verify")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", default=None, help="Model to prefill with (default: the file's model).")
@click.option("--thresholds", help="Thresholds file or model name (default: the model's shipped thresholds).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(exists=True, dir_okay=False),
    help="The pool's task spec: check against its terms (default: the terms the file's header declares).",
)
@click.option(
    "--evidence",
    "evidence_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A validator's evidence document on this file: each of its claims is compared with this check.",
)
@click.option(
    "--evidence-out",
    "evidence_out",
    type=click.Path(dir_okay=False, writable=True),
    help="Write this check's verdict as an evidence document (canonical JSON; its sha256 is the evidence "
    "hash `work invalidate` and `work challenge` put on chain).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def rollout_verify(
    file: str,
    model: str | None,
    thresholds: str | None,
    dtype: str,
    spec_file: str | None,
    evidence_file: str | None,
    evidence_out: str | None,
    as_json: bool,
) -> None:
    """Run the validator's checks on a rollout file; exits 1 if it fails. Without --spec the header's own
    sampling parameters are used (an inspection aid: a validator takes them from the pool's spec).
    With --evidence (a validator's evidence document, e.g. from its `evidence/` folder or a worker's
    appeal), each failure it claims is set against this check: "agree" or "DISPUTE" per claim."""
    from node.evidence import MAX_SERVED_EVIDENCE_BYTES, EvidenceError, compare, encode_evidence, parse_evidence
    from node.inference.engine import HfPrefill
    from node.inference.tools import model_tools
    from node.rollout.checks import SamplingParams
    from node.rollout.file import RolloutFile, RolloutFormatError, work_key
    from node.rollout.intake import check_terms
    from node.tasks import get_env
    from node.taskspec import TaskSpec, parse_spec
    from node.verify import Calibrated, FileChecks, verify_file

    data = Path(file).read_bytes()
    try:
        f = RolloutFile.from_bytes(data)
        h = f.header
        spec = (
            parse_spec(Path(spec_file).read_bytes())
            if spec_file
            else TaskSpec(h.model, h.env, dict(h.sampling))  # the header's own claims
        )
        wrong = check_terms(h, pool_id=h.pool_id, env=spec.env, model=spec.model, sampling=spec.sampling)
        if wrong is not None:
            raise ValueError(f"{wrong.reason}: {wrong.detail}")
        claims = None
        if evidence_file is not None:
            doc = Path(evidence_file).read_bytes()
            claims = parse_evidence(doc, work_key=work_key(data), max_bytes=MAX_SERVED_EVIDENCE_BYTES)
        params: SamplingParams = spec.sampling_params()
        name = model or spec.model
        cal = Calibrated.load(thresholds or name)
        env = get_env(spec.env)
    except EvidenceError as exc:
        raise ConfigError(f"{evidence_file}: {exc}", "is it the evidence of this file?") from None
    except ConfigError:
        raise
    except (RolloutFormatError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{file}: {exc}") from None
    tools = model_tools(name)
    prefill = HfPrefill(tools.path, dtype=dtype)  # type: ignore[arg-type]

    def run_prefill(prompt: list[int], completion: list[int]) -> Any:
        p = prefill.prefill(prompt, completion)
        return p.hidden, p.logprobs

    checks = FileChecks(params, env, tools.encode, tools.decode, tools.stop_ids, cal, prefill.vocab_size)
    v = verify_file(f, run_prefill, checks)
    d = v.to_dict() | {"work_key": work_key(data), "units": f.units}
    line = f"{file}: {'valid' if v.ok else 'INVALID: ' + str(v.verdict.reason) + ' (' + v.verdict.detail + ')'}"
    if claims is not None:
        d["evidence"] = compare(claims, v.to_dict())
        line += "".join(f"\n  {c}" for c in d["evidence"])
    if evidence_out is not None:
        doc, d["evidence_hash"] = encode_evidence({"work_key": d["work_key"], "pool": h.pool_id, **v.to_dict()})
        write_file(Path(evidence_out), doc)
        line += f"\n  evidence document {evidence_out}: hash {d['evidence_hash']}"
    output(Settings(None, "", None, as_json), d, line)
    if not v.ok:
        sys.exit(1)


# ---------------------------------------------------------------------------------------- eval


@cli.command("eval")
@click.option("--model", default="tiny", show_default=True, help="The pool's base model (tiny, smollm2 or a folder).")
@click.option(
    "--checkpoint",
    "checkpoints",
    multiple=True,
    metavar="LABEL=FOLDER",
    help="A policy checkpoint folder (the coordinator's checkpoints/v<N>); repeatable. `base` is always first.",
)
@click.option(
    "--env", "env_name", type=click.Choice(["math", "thinking-budget"]), default="thinking-budget", show_default=True
)
@click.option("--problems", type=click.IntRange(min=2), default=32, show_default=True, help="Held-out problems.")
@click.option("--samples", type=click.IntRange(min=1), default=8, show_default=True, help="Completions per problem.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Use the budget the policy was trained with.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Which held-out set (and sampling seed).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def eval_cmd(
    model: str,
    checkpoints: tuple[str, ...],
    env_name: str,
    problems: int,
    samples: int,
    max_tokens: int,
    seed: int,
    as_json: bool,
) -> None:
    """Score the base model and policy checkpoints on the same held-out problems with the same sampling
    seeds (a paired comparison), and print each one's mean reward and its gain over the base model."""
    from pool.evaluate import evaluate

    cps: dict[str, Path | None] = {"base": None}
    for item in checkpoints:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            raise click.BadParameter(f"{item!r} is not LABEL=FOLDER", param_hint="--checkpoint")
        if label in cps:
            raise click.BadParameter(f"label {label!r} given twice", param_hint="--checkpoint")
        cps[label] = Path(folder).expanduser()
    try:
        ev = evaluate(
            model, cps, env_name=env_name, problems=problems, samples=samples, max_tokens=max_tokens, seed=seed,
            progress=None if as_json else click.echo,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise ConfigError(str(exc), "pass the folder the coordinator saved (it holds model.safetensors)") from None
    data = ev.to_dict("base")
    lines = [f"{problems} held-out {env_name} problems x {samples} samples, {ev.seconds:.0f} s"]
    for label in cps:
        line = f"  {label:>10}: mean reward {ev.mean(label):+.3f}"
        if label in data["gain_over_base"]:
            g = data["gain_over_base"][label]
            line += f"  ({g['gain']:+.3f} +- {g['se']:.3f} over base)"
        lines.append(line)
    output(Settings(None, "", None, as_json), data, lines)


# ---------------------------------------------------------------------------------------- devnet


@cli.command("devnet")
@click.option(
    "--dir",
    "workdir",
    default="devnet",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the devnet writes its deployment, state and logs.",
)
@click.option("--port", type=int, default=0, help="anvil port (default: a free one).")
@click.option("--chain-id", type=int, default=31337, show_default=True, help="84532 mimics Base Sepolia.")
@click.option("--model", default="smollm2", show_default=True, help="smollm2 (SmolLM2-135M-Instruct) or tiny.")
@click.option(
    "--env", "env_name", type=click.Choice(["math", "thinking-budget"]), default="thinking-budget", show_default=True
)
@click.option("--steps", type=int, default=3, show_default=True, help="Tasks each worker completes.")
@click.option(
    "--train/--no-train",
    default=None,
    help="Train the policy (GRPO) while it runs (default: on for --model tiny or with a GPU).",
)
@click.option("--train-files", type=int, default=2, show_default=True, help="Rollout files per policy step.")
@click.option("--seed", type=int, help="Fixed task seeds: the same problems in the same order on every run.")
@click.option("--workers", type=click.IntRange(1, 2), default=2, show_default=True, help="Honest workers.")
@click.option("--adversary", is_flag=True, help="Add an adversary (a cheating worker by default) and two jurors.")
@click.option(
    "--adversary-kind",
    type=click.Choice(["model", "temperature", "duplicate", "poison", "lying-validator"]),
    default="model",
    show_default=True,
    help="How the adversary cheats: another model's weights, a hotter temperature than claimed, one completion "
    "copied to fill each group (duplicate), proofs that crash the reference verifier (poison), or a validator "
    "that accuses honest work (lying-validator: its accusations are appealed and overturned).",
)
@click.option("--window", type=int, default=24 * 3600, show_default=True, help="Validation window (seconds).")
@click.option("--report", type=click.Path(dir_okay=False), help="Write the outcome (with the audit) as JSON here.")
@click.option("--timeout", type=float, default=900, show_default=True, help="Give up after this many seconds.")
@click.option("--chain-only", is_flag=True, help="Only the chain side: a pool with one joined node, no daemons.")
@click.option("--keep-running", is_flag=True, help="Keep anvil running until Ctrl-C.")
@click.option(
    "--eval",
    "eval_problems",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="After training, score the base and final policies on this many held-out problems (0: off).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def devnet_cmd(
    workdir: str,
    port: int,
    chain_id: int,
    model: str,
    env_name: str,
    steps: int,
    train: bool | None,
    train_files: int,
    seed: int | None,
    workers: int,
    adversary: bool,
    adversary_kind: str,
    window: int,
    report: str | None,
    timeout: float,
    chain_only: bool,
    keep_running: bool,
    eval_problems: int,
    as_json: bool,
) -> None:
    """Run the local devnet: anvil, contracts, a pool, a coordinator, workers, a validator (and with
    --adversary a cheater) as separate processes on 127.0.0.1; ends with a summary and the audit."""
    from pool.devnet import DevnetOptions, run_devnet

    run_devnet(
        DevnetOptions(
            workdir=Path(workdir),
            port=port,
            chain_id=chain_id,
            keep_running=keep_running,
            as_json=as_json,
            window=window,
            chain_only=chain_only,
            model=model,
            env=env_name,
            steps=steps,
            train=train,
            train_files=train_files,
            seed=seed,
            workers=workers,
            adversary=adversary,
            adversary_kind=adversary_kind,
            report=Path(report) if report else None,
            timeout=timeout,
            eval_problems=eval_problems,
        )
    )


# ---------------------------------------------------------------------------------------- entry


def entry(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status (tests call this in-process)."""
    try:
        cli.main(args=argv, prog_name="intellect-node", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except IntellectError as exc:
        click.echo(f"error: {one_line(exc)}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


from .daemons import COMMANDS as _DAEMON_COMMANDS  # noqa: E402
from .status_cmd import status_command  # noqa: E402

cli.add_command(status_command)
for _command in _DAEMON_COMMANDS:
    cli.add_command(_command)


def main() -> None:
    sys.exit(entry())


if __name__ == "__main__":
    main()
