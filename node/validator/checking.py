"""How the validator checks one record: its file fetched by hash (from the coordinator, else the node),
the node's signature over it, the prefill of the policy version that made it, every check of
`node.verify`, and the verdict saved as evidence and published. A mixin of `Validator`."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import trio

from .. import ops, protocol
from ..chain import ChainClient
from ..chain.signing import RolloutClaim
from ..daemon import (
    PolicyPrefills,
)
from ..evidence import MAX_EVIDENCE_BYTES
from ..inference.tools import ModelTools
from ..p2p.blobs import fetch_blob
from ..p2p.host import P2PError, eth_address_from_peer_id
from ..p2p.network import PoolNetwork
from ..policy import PolicyBook, weights_of
from ..rollout.budget import ParseBusy
from ..rollout.checks import Reason, Verdict
from ..rollout.file import RolloutFile
from ..store import write_evidence
from ..taskspec import TaskSpec
from ..verify import Calibrated, FileVerdict, PoolFileCheck
from .state import ValidatorState

log = logging.getLogger("intellect.validator")


class CheckingMixin:
    """State set up by `Validator.__init__`."""

    cfg: Any
    state: ValidatorState
    store: Any
    net: PoolNetwork | None
    chain: ChainClient | None
    coordinator_peer: str | None
    last_fetch: dict[str, float]
    tools: ModelTools | None
    prefill: Any
    prefills: PolicyPrefills | None
    book: PolicyBook
    spec: TaskSpec | None
    calibrated: Calibrated | None
    evidence_dir: Path

    async def node_signed(self, key: str, node: str) -> bool:
        """Whether we hold, or can get from the coordinator or the node, the node's signature of `key`."""
        claim = self.claim(key)
        sig = self.store.get(f"sig:{key}")
        if claim.signed_by(sig, node):
            return True
        for peer in self._sources(node):
            try:
                reply = protocol.reply_body(
                    await self.net.node.request(  # type: ignore[union-attr]
                        peer, protocol.SIGNATURE_PROTOCOL, protocol.pack({"work_key": key}), timeout=10.0
                    ),
                    "signature",
                )
            except (P2PError, protocol.ProtocolError) as exc:
                log.info("no signature of %s from %s: %s", key[:12], peer, exc)
                continue
            if claim.signed_by(reply.get("signature"), node):
                self.store.put(f"sig:{key}", str(reply["signature"]))
                return True
            log.warning("%s sent a signature of %s that is not node %s's", peer, key[:12], node)
        return False

    def claim(self, key: str) -> RolloutClaim:
        assert self.chain is not None
        return ops.rollout_claim(self.chain, self.cfg.pool_id, key)

    def _sources(self, node: str) -> list[str]:
        """Where a record's file and signature may be fetched: the coordinator, then the node itself at
        the address it announced (its peer id checked to be the node's key)."""
        out = [self.coordinator_peer] if self.coordinator_peer else []
        raw = self.store.get(f"peer:{node.lower()}")
        if raw:
            out += [a for a in json.loads(raw) if isinstance(a, str)]
        return out

    async def prefill_for(self, version: int, weights: str | None = None) -> Any:
        """The prefill model of policy `version` with the weights of manifest hash `weights` (downloaded
        and checked by hash on first use), or None while that checkpoint is not available."""
        if self.prefills is None:
            assert self.tools is not None
            self.prefills = PolicyPrefills(self.tools, self.book, self.cfg.data_dir, keep=3)
            if self.prefill is not None:
                self.prefills.held[0] = self.prefill
        return await self.prefills.get(version, weights=weights)

    def _save_evidence(self, key: str, verdict: dict[str, Any]) -> str:
        return write_evidence(self.evidence_dir, {"work_key": key, "pool": self.cfg.pool_id, **verdict})

    def evidence_doc(self, evidence: str) -> bytes | None:
        """Our evidence document of hash `evidence` (None if we hold none, or it is too large to publish)."""
        if not re.fullmatch(r"0x[0-9a-f]{64}", evidence):
            return None
        try:
            doc = (self.evidence_dir / f"{evidence[2:]}.json").read_bytes()
        except OSError:
            return None
        return doc if len(doc) <= MAX_EVIDENCE_BYTES else None

    async def _publish_verdict(self, key: str, ok: bool, reason: str, evidence: str) -> None:
        """A verdict on gossip; a failed one carries its evidence document (`node.evidence`), so the
        accused worker and the pool's committee can re-check each of its claims against the file."""
        if self.net is None:
            return
        msg: dict[str, Any] = {"work_key": key, "ok": ok, "reason": reason, "evidence": evidence}
        doc = None if ok else self.evidence_doc(evidence)
        if doc is not None:
            msg["doc"] = doc
        try:
            await self.net.publish("verdict", protocol.pack(msg))
        except Exception as exc:
            log.debug("verdict announcement failed: %r", exc)

    async def fetch(self, r: dict[str, Any]) -> bytes | None:
        """The record's file from the coordinator, else from the node; None if neither serves it now."""
        assert self.net is not None
        key, errors = r["work_key"], []
        for peer in self._sources(str(r["node"])):
            try:
                return await fetch_blob(self.net.node, peer, key, max_bytes=self.cfg.max_rollout_bytes)
            except P2PError as exc:
                errors.append(f"{peer[-12:]}: {exc}")
        attempts = int(r["attempts"]) + 1
        self.state.count_fetch_attempt(key, attempts)
        log.warning("cannot fetch rollout %s yet (attempt %d): %s", key[:12], attempts, "; ".join(errors))
        return None

    async def _verify(self, r: dict[str, Any], last_chance: bool = False) -> dict[str, Any] | None:
        """The verdict dict, or None when the file or the weights could not be fetched this round.
        Unavailable work is asked for again every `refetch_every` seconds; once its deadline is close
        (`last_chance`) and neither the coordinator nor the node serves it, that is the verdict."""
        key = r["work_key"]
        if not last_chance and time.monotonic() - self.last_fetch.get(key, -1e9) < self.cfg.refetch_every:
            return None
        self.last_fetch[key] = time.monotonic()
        data = await self.fetch(r)
        if data is None:
            if not last_chance or not self.sampled(key):
                # A record we check only because the coordinator's trainer hinted at it is never
                # invalidated for want of its file: the coordinator claims to have read that file, so a
                # coordinator that hints and then withholds it could get an honest node slashed.
                return None
            detail = (
                f"neither the coordinator nor node {r['node']} served the file after {int(r['attempts']) + 1} tries"
            )
            return FileVerdict(Verdict(Reason.UNAVAILABLE, detail), []).to_dict()
        self.last_fetch.pop(key, None)
        try:  # parsing a hostile file takes CPU, not the loop
            f = await trio.to_thread.run_sync(self.intake, data, r)
        except ParseBusy:  # other parses hold this process's parse memory: not a verdict, checked again later
            return None
        if isinstance(f, FileVerdict):
            return f.to_dict()
        return await self.judge_file(f, r, last_chance)

    async def judge_file(self, f: RolloutFile, r: dict[str, Any], last_chance: bool = False) -> dict[str, Any] | None:
        """The verdict on a file that passed `intake`, judged with its own policy version (a record that
        names another is `record_mismatch`, in `judge`) and the weights its worker signed for (the header's
        `weights`, `node.policy.weights_of`), never those of a later announcement of that version: a
        coordinator that re-announces a version with other weights cannot make honest work fail. None
        while those weights are not announced yet (before `last_chance`) or cannot be fetched."""
        key = r["work_key"]
        version, weights = f.header.policy_version, weights_of(f.header)
        if version > 0 and (weights is None or not self.book.signed_for(version, weights)):
            # Revoked (softly) only at the deadline and only where we heard what the coordinator announced
            # for that version: a validator that joined late or was down past the announcements' history
            # may simply not know the hash, and honest work must not pay for our gap (no verdict then).
            if not last_chance or not self.book.announced.get(version):
                return None
            said = "names no weights" if weights is None else f"names weights {weights[:16]}"
            detail = f"the file of policy version {version} {said}; none such was announced for that version"
            return FileVerdict(Verdict(Reason.WEIGHTS_UNKNOWN, detail), []).to_dict()
        prefill = await self.prefill_for(version, weights)
        if prefill is None:
            return None
        started = time.monotonic()
        result = await trio.to_thread.run_sync(self.judge, f, r, prefill)
        log.info(
            "checked %s in %.1f s: %s", key[:12], time.monotonic() - started,
            "ok" if result["ok"] else result["verdict"]["reason"],
        )  # fmt: skip
        return result

    @property
    def checker(self) -> PoolFileCheck:
        """The pool's checks of one file (`node.verify.PoolFileCheck`), once the spec and model are loaded."""
        assert self.spec is not None and self.tools is not None and self.calibrated is not None
        return PoolFileCheck(self.spec, self.tools, self.calibrated, self.cfg.pool_id, self.cfg.max_rollout_bytes)

    def intake(self, data: bytes, r: dict[str, Any]) -> RolloutFile | FileVerdict:
        """The checks that need no model (parse, header terms, bounds) of record `r`'s file."""
        return self.checker.intake(data, str(r["node"]))

    def judge(self, f: RolloutFile, r: dict[str, Any], prefill: Any) -> dict[str, Any]:
        """The full check of a file that passed `intake` (blocking: prefill and checks; run in a thread),
        against its record: the policy version and the units the coordinator recorded for it."""
        units = r.get("units")
        return self.checker.judge(f, prefill, int(r["policy_version"]), None if units is None else int(units))


def _peer_is(addr: str, address: str) -> bool:
    """Whether the multiaddr `addr` ends in the peer id of the key of Ethereum `address`."""
    try:
        return eth_address_from_peer_id(addr.rsplit("/p2p/", 1)[1]).lower() == address.lower()
    except Exception:
        return False
