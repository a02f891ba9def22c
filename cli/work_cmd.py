"""`work` (record, invalidate, challenge, vote, show) and `validator` (name a pool's validators)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import click

from node import ops
from node.chain.messages import tokens
from node.chain.values import bytes32
from node.errors import ConfigError

from ._common import ZERO32, Settings, common, output, receipt, run
from .provider_cmd import node_account


@click.group("work")
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
        {"pool": pool_id, "records": len(items), "txs": [receipt(r) for r in rs], "gas_per_record": gas / len(items)},
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


SIGNATURE_HELP = (
    "The node's signature over the work key (its RolloutClaim, 0x-hex; served by the coordinator and the node "
    "on /intellect/signature/1): no slash without it."
)


@work_group.command("invalidate")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_key", required=True, help="Work key.")
@click.option("--evidence", default=ZERO32, help=EVIDENCE_HELP)
@click.option("--soft", is_flag=True, help="Revoke the units without a slash (e.g. data never served).")
@click.option("--signature", default=None, help=SIGNATURE_HELP)
@common
def work_invalidate(s: Settings, pool_id: int, work_key: str, evidence: str, soft: bool, signature: str | None) -> None:
    """Accuse recorded work before its deadline (one of the pool's validators, named by the time it was
    recorded). Hard by default: with the pool's bond and the node's signature over the work, a slash
    once its appeal period ends unappealed. Soft: no bond, no slash. Either way the record's reward goes
    to the treasury when it becomes final (`work finalize`)."""
    evidence = _evidence_hash(evidence, work_key)

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.invalidate(c, pool_id, work_key, evidence, hard=not soft, signature=signature)

    r = run(go)
    if soft:
        ev = r.event("WorkSoftInvalidated").args
        output(
            s,
            receipt(r) | {"units": ev["units"], "soft": True, "appeal_end": ev["appealEnd"]},
            f"revoking {ev['units']} units; final unless appealed by {ev['appealEnd']} (tx {r.tx_hash})",
        )
        return
    ev = r.event("WorkAccused").args
    output(
        s,
        receipt(r) | {"appeal_end": ev["appealEnd"], "bond": ev["bond"], "provider": ev["provider"]},
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
        output(s, receipt(r) | {"pool": pool_id, "work_key": work_key}, f"{done} {work_key} (tx {r.tx_hash})")

    command.__doc__ = what
    return command


work_group.command(
    "appeal", help="Appeal an invalidation (hard or soft) of your work with the pool's bond (provider)."
)(_dispute_tx(ops.appeal, "appeal", "appealed"))
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
@click.option("--signature", required=True, help=SIGNATURE_HELP)
@common
def work_challenge(s: Settings, pool_id: int, work_key: str, evidence: str, signature: str) -> None:
    """Challenge another provider's record before its deadline, with the pool's bond (any staked provider).
    Keep the evidence document: the committee re-checks the file itself, and anyone given the document
    can check it against the hash on chain with `rollout verify FILE --evidence DOC`."""
    evidence = _evidence_hash(evidence, work_key)

    async def go() -> Any:
        async with await s.client() as c:
            return await ops.challenge(c, pool_id, work_key, evidence, signature)

    r = run(go)
    ev = r.event("WorkChallenged").args
    output(
        s,
        receipt(r) | {"vote_end": ev["voteEnd"]},
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
    output(s, receipt(r) | {"uphold": uphold}, f"voted to {'uphold' if uphold else 'overturn'} (tx {r.tx_hash})")


@work_group.command("sign")
@click.option("--pool", "pool_id", type=int, required=True, help="Pool id.")
@click.option("--key", "work_key", required=True, help="Work key (the rollout file's sha256).")
@click.option(
    "--node-keystore",
    type=click.Path(dir_okay=False),
    help="The node's keystore (password INTELLECT_NODE_PASSWORD); or INTELLECT_NODE_PRIVATE_KEY.",
)
@common
def work_sign(s: Settings, pool_id: int, work_key: str, node_keystore: str | None) -> None:
    """The node's signature over one of its rollout files in a pool (the RolloutClaim its worker puts in
    the file and serves on /intellect/signature/1): what a hard accusation or a challenge of the record
    must show. Node key; no transaction."""
    nk = node_account(node_keystore)
    if nk is None:
        raise ConfigError("no node key", "pass --node-keystore FILE or set INTELLECT_NODE_PRIVATE_KEY")
    key = bytes32(work_key, "work key")

    async def go() -> str:
        async with await s.client(signer=False) as c:
            return ops.rollout_claim(c, pool_id, key).sign(nk)

    sig = run(go)
    output(s, {"pool": pool_id, "work_key": key, "node": nk.address, "signature": sig}, sig)


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


@click.group("validator")
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
            receipt(r) | {"pool": pool_id, "address": address},
            f"{what} {address} of pool {pool_id} (tx {r.tx_hash})",
        )

    return command


validator_group.command("add", help="Name ADDRESS a validator of the pool (owner).")(_validator_tx(True))
validator_group.command("remove", help="Remove ADDRESS from the pool's validators (owner).")(_validator_tx(False))
