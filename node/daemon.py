"""Plumbing shared by the three daemons (worker, validator, coordinator) inside their `run()`: the one
prologue (`open_pool_chain`: connect with retries, settle the journal, read the pool), ledger event
cursors, the pool's bootstrap peers and network, evidence documents, policy prefills.
The process around them (logging, signals, the trio root, metrics, fatal errors) is `node.runtime`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from . import ops
from .chain import ChainClient, ChainError, Deployment
from .chain.abi import topic
from .chain.errors import RpcUnavailable
from .chain.tx import TxJournal
from .evidence import MAX_EVIDENCE_PER_KEY, MAX_SERVED_EVIDENCE_BYTES, EvidenceError, failed_verdict, parse_evidence
from .inference.tools import ModelTools
from .p2p.blobs import EVIDENCE_PROTOCOL, BlobStore, fetch_blob, serve_blobs
from .p2p.discovery import parse_bootstrap
from .p2p.host import P2PError, eth_address_from_peer_id
from .p2p.membership import ChainMembership
from .p2p.network import PoolNetwork
from .store import Store, settle_journal

log = logging.getLogger(__name__)


async def connect_chain(
    rpc_url: str,
    deployment: Deployment,
    account: LocalAccount | None,
    *,
    journal: TxJournal | None = None,
    wait: float = 60.0,
    what: str = "daemon",
) -> ChainClient:
    """Connect, retrying with back-off for up to `wait` seconds while the RPC endpoint is down.
    Any other failure (wrong chain, no contracts) is raised at once: retrying cannot fix it."""
    delay = 1.0
    deadline = trio.current_time() + wait
    while True:
        try:
            return await ChainClient.connect(rpc_url, deployment, account, journal=journal)
        except RpcUnavailable as exc:
            if trio.current_time() + delay > deadline:
                raise ChainError(
                    f"{what}: the RPC endpoint {rpc_url} is unreachable (gave up after {wait:.0f} s): {exc.message}",
                    "start the chain node or pass the right --rpc-url",
                ) from None
            log.warning("%s: RPC %s unreachable, retrying in %.0f s", what, rpc_url, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, 10.0)


async def open_pool_chain(cfg: Any, account: LocalAccount, store: Any, what: str) -> tuple[ChainClient, dict[str, Any]]:
    """Every role's prologue: connect to the chain (retrying while the RPC endpoint is down), settle the
    transactions a crash left unconfirmed (`store.journal`), and read the pool `cfg.pool_id`. Returns the
    client and the pool's record; if the prologue fails, the client and the role's `store` are closed
    here (the role's own `finally` covers what comes after)."""
    chain: ChainClient | None = None
    try:
        chain = await connect_chain(
            cfg.rpc_url, cfg.deployment, account, journal=store.journal, wait=cfg.rpc_wait, what=what
        )
        settled = await settle_journal(store.journal, chain.sender)  # type: ignore[arg-type]
        if settled:
            log.info("%s: settled %d transaction(s) sent before a restart", what, len(settled))
        info = await ops.pool_info(chain, cfg.pool_id)
    except BaseException:
        with trio.CancelScope(shield=True):
            if chain is not None:
                await chain.aclose()
            store.close()
        raise
    return chain, info


async def retry(
    fn: Callable[[], Awaitable[Any]],
    what: str,
    *,
    errors: tuple[type[Exception], ...],
    wait: float,
    delay: float = 0.5,
    max_delay: float = 10.0,
    on_retry: Callable[[str], None] | None = None,
) -> Any:
    """Run `fn`, retrying with exponential back-off while it raises one of `errors`; the last error
    is re-raised once the next attempt would start more than `wait` seconds after the first (never,
    with `wait=math.inf`). `on_retry` hears why each retry waits (a daemon's status line)."""
    deadline = trio.current_time() + wait
    while True:
        try:
            return await fn()
        except errors as exc:
            if trio.current_time() + delay > deadline:
                raise
            why = f"{what} failed ({exc}); retrying in {delay:.1f} s"
            log.warning("%s", why)
            if on_retry is not None:
                on_retry(why)
            await trio.sleep(delay)
            delay = min(delay * 2, max_delay)


async def retry_rpc(fn: Callable[[], Awaitable[Any]], what: str, *, wait: float = 120.0) -> Any:
    """Run `fn`, retrying while the RPC endpoint is unreachable (mid-run outages), up to `wait` s."""
    return await retry(fn, what, errors=(RpcUnavailable,), wait=wait)


Statement = tuple[str, tuple[Any, ...]]


#: Blocks a follower reads again when the block at its cursor is no longer the one it read (a
#: reorganisation deeper than the confirmation depth): the events there come again, and what a
#: reorganisation removed does not; consumers are idempotent and check records on chain before acting.
REORG_REWIND = 64


async def new_ledger_events(
    c: ChainClient,
    store: Any,
    cursor_key: str,
    pool_id: int,
    name: str | tuple[str, ...],
    *,
    max_blocks: int | None = None,
    on_reorg: Callable[[int], list[Statement]] | None = None,
) -> tuple[list[Any], list[Statement]] | None:
    """The pool's `WorkLedger` events called `name` (or any of the names) after the durable block cursor
    `cursor_key`, up to `c.confirmations` blocks under the head (or `max_blocks` past the cursor), and the
    statements that move the cursor past them: the caller commits them in the same transaction as what
    it makes of the events. None: nothing new.

    The cursor keeps the hash of its block. If that block is no longer in the chain, a reorganisation
    went deeper than the confirmation depth: the cursor goes back `REORG_REWIND` blocks, and
    `on_reorg(block)` gives the statements that undo what the caller derived from events after `block`
    (committed with the rewind)."""
    cursor = int(store.get(cursor_key, str(c.deployment.block - 1)) or 0)
    seen = store.get(cursor_key + ":hash") or ""
    head = await retry_rpc(c.rpc.block_number, "block number") - c.confirmations
    if head <= cursor:
        return None  # nothing new (a reorganisation comes with new blocks: it is seen then)
    now_hash = await retry_rpc(lambda: c.rpc.block_hash(cursor), "cursor block") if seen else seen
    if now_hash is None:
        return None  # the endpoint does not serve that block (lagging, or the chain got shorter): next round
    if now_hash != seen:
        back = max(c.deployment.block - 1, cursor - REORG_REWIND)
        log.warning(
            "%s: block %d is not the one read before (a reorganisation deeper than %d blocks); reading again from %d",
            cursor_key, cursor, c.confirmations, back + 1,
        )  # fmt: skip
        undo = on_reorg(back) if on_reorg is not None else []
        store.execute_many(
            [*undo, Store.put_statement(cursor_key, str(back)), Store.put_statement(cursor_key + ":hash", "")]
        )
        cursor = back
    to = head if max_blocks is None else min(head, cursor + max_blocks)
    to_hash = await retry_rpc(lambda: c.rpc.block_hash(to), "block") or ""  # "": not one the node serves
    events = await retry_rpc(
        lambda: c.events(["WorkLedger"], from_block=cursor + 1, to_block=to, topics=[None, topic(pool_id)]),
        f"{name} events",
    )
    move = [Store.put_statement(cursor_key, str(to)), Store.put_statement(cursor_key + ":hash", to_hash)]
    names = (name,) if isinstance(name, str) else name
    return [ev for ev in events if ev.name in names], move


def coordinator_addr(bootstrap: list[str], coordinator: str) -> str:
    """The bootstrap multiaddr whose peer id is the pool coordinator's key."""
    for addr in bootstrap:
        peer = addr.rsplit("/p2p/", 1)[-1]
        try:
            if eth_address_from_peer_id(peer).lower() == coordinator.lower():
                return addr
        except Exception:
            continue
    raise ChainError(
        f"none of the bootstrap addresses belongs to the pool's coordinator {coordinator}",
        "pass --coordinator-addr with the coordinator's /ip4/.../p2p/... address, or ask the pool owner to set "
        "the pool's bootstrap",
    )


def pool_peers(configured: list[str] | None, info: dict[str, Any]) -> tuple[list[str], str]:
    """Bootstrap multiaddrs (the configured ones, else the pool's on-chain record) and the coordinator's."""
    try:
        bootstrap = list(configured or []) or parse_bootstrap(str(info.get("bootstrap", "")))
    except ValueError as exc:
        raise ChainError(f"pool {info.get('poolId')}: bad bootstrap record: {exc}", "pass --bootstrap") from None
    return bootstrap, coordinator_addr(bootstrap, str(info["coordinator"]))


async def open_pool_network(
    nursery: trio.Nursery,
    chain: ChainClient,
    pool_id: int,
    private_key: bytes,
    listen: str,
    bootstrap: list[str] = [],  # noqa: B006 - never mutated
    interval: float = 2.0,
) -> tuple[ChainMembership, PoolNetwork]:
    """Start chain-backed membership in `nursery` (returns once loaded) and build the pool's network
    on it; the caller enters the network (`async with net`)."""
    membership = ChainMembership(chain, pool_id, interval=interval)
    await nursery.start(membership.run)
    net = PoolNetwork(
        private_key=private_key, pool=pool_id, membership=membership.snapshot, listen=listen, bootstrap=bootstrap
    )
    return membership, net


# Seconds one source has to hand over an evidence document (1 MiB at most): a source that dribbles it
# out chunk by chunk is dropped then, so an accuser cannot hold the accused worker's appeals back.
EVIDENCE_FETCH_TIMEOUT = 30.0


async def fetch_evidence(
    net: PoolNetwork,
    coordinator_peer: str | None,
    author: str,
    digest: str,
    work_key: str,
    timeout: float = EVIDENCE_FETCH_TIMEOUT,
) -> tuple[dict[str, Any], bytes] | None:
    """The evidence document of hash `digest` (the one on chain) about `work_key`, asked by its hash of
    its `author` (the accusing validator, when connected to us) and of the pool's coordinator (which
    keeps what the pool's validators published), each for at most `timeout` seconds: (the parsed
    document, its bytes), or None when nobody serves it. Whatever a peer sends is checked against the
    hash before it is read."""
    sources: list[Any] = [p for p in net.node.peers if _address_of(p) == author.lower()]
    if coordinator_peer:
        sources.append(coordinator_peer)
    for peer in sources:
        try:
            with trio.fail_after(timeout):
                doc = await fetch_blob(
                    net.node, peer, digest, max_bytes=MAX_SERVED_EVIDENCE_BYTES, protocol=EVIDENCE_PROTOCOL
                )
            claims = parse_evidence(doc, expected_hash=digest, work_key=work_key, max_bytes=MAX_SERVED_EVIDENCE_BYTES)
            return claims, doc
        except trio.TooSlowError:
            log.info("evidence %s not had from %s within %.0f s", digest[:14], str(peer)[-16:], timeout)
        except (P2PError, EvidenceError) as exc:
            log.info("evidence %s not had from %s: %s", digest[:14], str(peer)[-16:], exc)
    return None


def new_evidence(store: Any, sender: str, body: bytes) -> tuple[str, str, bytes, dict[str, Any]] | None:
    """The evidence document a failed verdict message (`body`, from `sender`) carries, when it is about
    one of the rollouts in `store` (a daemon's state with `rollouts` and `evidence` tables), not yet
    held, the first of its sender on that rollout (one flooding validator cannot crowd out the others),
    under `MAX_EVIDENCE_PER_KEY` for the rollout, and hashes to the hash the verdict names: (work key,
    evidence hash, document, the document parsed). None for anything else."""
    got = failed_verdict(body)
    if got is None:
        return None
    key, digest, doc = got
    if doc is None:  # a verdict without its document (the coordinator's trainer's hint): nothing to keep
        return None
    if not store.evidence_wanted(key, digest, sender, MAX_EVIDENCE_PER_KEY):
        return None
    try:
        claims = parse_evidence(doc, expected_hash=digest, work_key=key)
    except EvidenceError as exc:
        log.info("verdict on %s from %s carries no usable evidence document: %s", key[:12], sender, exc)
        return None
    return key, digest, bytes(doc), claims


def serve_evidence(net: PoolNetwork, docs: BlobStore) -> None:
    """Serve the evidence documents in `docs` by their hash (`EVIDENCE_PROTOCOL`) to the pool's members,
    validators and coordinator (the accused worker, a committee member); outsiders are refused before
    anything is read."""

    def allowed(sender: str) -> bool:
        return net.membership().role(sender) is not None

    serve_blobs(net.node, docs, allow=allowed, accept_uploads=False, protocol=EVIDENCE_PROTOCOL)


def _address_of(peer: Any) -> str:
    try:
        return eth_address_from_peer_id(peer).lower()
    except Exception:
        return ""


class PolicyPrefills:
    """HF prefill models of a pool's policy versions, for checking files: version 0 is the base model;
    a later one is downloaded from the announced sources (checked against its announced hash) unless
    `have` already names its checkpoint file, and built on first use. A few stay in memory."""

    def __init__(self, tools: ModelTools, book: Any, data_dir: Path, keep: int = 2) -> None:
        self.tools, self.book, self.data_dir, self.keep = tools, book, data_dir, keep
        self.held: dict[Any, Any] = {}  # 0 (the base model) or (version, manifest hash) -> prefill

    async def get(self, version: int, have: Path | None = None, weights: str | None = None) -> Any | None:
        """The prefill of `version` with the weights of manifest hash `weights` (a file is judged against
        the weights its worker signed for; without it, the first hash announced for the version), or None
        while that checkpoint is not available (not announced, or no source serves that hash any more).
        `have`: the checkpoint file of those weights, already downloaded."""
        from .inference.engine import HfPrefill
        from .inference.models import checkpoint_folder
        from .weights.client import DownloadError, download

        h = None if version == 0 else weights or self.book.hashes.get(version)
        key: Any = 0 if version == 0 else (version, h)
        if key in self.held:
            return self.held[key]
        if version == 0:
            folder = self.tools.path
        else:
            path = have
            if path is None:
                if h is None or not self.book.sources:
                    log.info("policy version %d not announced yet; checking its work later", version)
                    return None
                try:
                    path = await download(version, h, list(self.book.sources), self.data_dir / "weights", keep=4)
                except DownloadError as exc:
                    log.warning("cannot fetch policy version %d (weights %s) yet: %s", version, str(h)[:12], exc)
                    return None
            folder = await trio.to_thread.run_sync(
                # named by the whole manifest hash: a folder is reused for exactly the weights it was built
                # from (a prefix would let a coordinator grind two manifests into one folder)
                checkpoint_folder,
                self.tools.path,
                path,
                self.data_dir / "models" / f"v{version}-{h}",
            )
        model = await trio.to_thread.run_sync(HfPrefill, folder)
        others = [k for k in self.held if k != 0]
        for old in others[: max(0, len(others) - self.keep + 1)]:
            del self.held[old]
        self.held[key] = model
        return model


def count(metrics: Any, name: str, value: float = 1.0, **labels: str) -> None:
    """Increment the `node.metrics.Metrics` attribute `name` (no-op without metrics or for unknown names)."""
    if metrics is None:
        return
    m = getattr(metrics, name, None)
    if m is None:
        return
    (m.labels(**labels) if labels else m).inc(value)
