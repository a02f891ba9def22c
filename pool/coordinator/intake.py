"""What the coordinator answers workers: invitations (to stakers with a bound node), tasks (throttled to
what the trainer can use, seeded so nobody prepares answers), node signatures over rollouts, and
submitted rollout files (checked against the pool's terms before anything is kept). Every refusal is
one bounded line in the state file. A mixin of `Coordinator`."""

from __future__ import annotations

import logging
import re
import secrets
import time
from typing import Any

import trio

from node import ops, protocol
from node.chain.errors import RpcUnavailable
from node.chain.signing import RolloutClaim
from node.p2p.patches import prefix_of
from node.p2p.reqresp import PEER_IP
from node.p2p.rules import ROLE_MEMBER
from node.policy import weights_of
from node.rollout.budget import ParseBusy
from node.rollout.file import RolloutFile, RolloutFormatError
from node.rollout.intake import completion_hashes
from node.toploc import proof_commitment

from . import rules

log = logging.getLogger("intellect.coordinator")


REJECTION_DETAIL = 300  # characters of a refusal's detail kept (and sent back)
MAX_REJECTIONS = 10_000  # newest refusals kept in the state file
REJECTION_LOG_EVERY = 10.0  # seconds between log lines about one sender's refusals
OUTSIDER_COOLDOWN = 10.0  # seconds between chain reads (and invites) for one sender that is no member
# Chain reads made for senders that are no member (an invite, a membership check), whose addresses are
# free to make: per network (/24, IPv6 /56) and for all of them, (per second, burst). Beyond, "busy":
# a flood of fresh identities cannot spend the coordinator's RPC quota that honest work needs.
OUTSIDER_READS = {"network": (2.0, 20.0), "all": (20.0, 100.0)}
ALIVE_EVERY = 30.0  # seconds between the coordinator's "alive" marks in its state
ALIVE_GRACE = 60.0  # after a restart, seconds in which an expiring task is still the outage's, not its node's


#: (per second, burst) of the requests a member node may make: an honest worker asks for a task and
#: submits its file once per task (retries after "busy" included, far below these).
REQUEST_BUDGETS: dict[str, tuple[float, float]] = {"task": (2.0, 30.0), "submit": (2.0, 30.0)}


def too_many(what: str, kind: str) -> tuple[str, str]:
    rate, burst = REQUEST_BUDGETS[kind]
    return f"too many {what}: at most {rate:g} a second (bursts of {burst:g})", "slow down"


class IntakeMixin:
    """State set up by `Coordinator.__init__`."""

    cfg: Any
    store: Any

    def note_downtime(self, now: float) -> None:
        """At start: the time since this coordinator was last seen alive (`alive_loop`) was an outage, and
        tasks whose life overlapped it (until `ALIVE_GRACE` after the restart, while workers reconnect)
        are no node's lapse."""
        last = self.store.get("alive_at")
        new = (float(last), now + ALIVE_GRACE) if last is not None else None
        spans = rules.recent_downtimes(self.state.downtimes(), now - self.cfg.lapse_window, new)
        self.state.keep_downtimes(spans)
        self.store.put("alive_at", str(now))

    async def alive_loop(self) -> None:
        """Mark this coordinator alive every `ALIVE_EVERY` seconds (what `note_downtime` reads)."""
        while True:
            await trio.sleep(ALIVE_EVERY)
            self.store.put("alive_at", str(time.time()))

    async def _on_invite(self, request: bytes, sender: str) -> bytes:
        """An invite (or the reason there is none). The one request outsiders may make, so its answer is
        cached per sender for `OUTSIDER_COOLDOWN` seconds: asking again costs no chain read."""
        now = time.monotonic()
        cached = self.invite_replies.get(sender)
        if cached is not None and now - cached[0] < OUTSIDER_COOLDOWN:
            return cached[1]
        if len(self.invite_replies) > 10_000:
            self.invite_replies.clear()
        if not self._outsider_read(now):
            return protocol.refuse("busy: too many new nodes are asking right now", "retry in a few seconds")
        reply = await self._invite_reply(sender)
        self.invite_replies[sender] = (now, reply)
        return reply

    async def _invite_reply(self, sender: str) -> bytes:
        assert self.chain is not None
        c, pool = self.chain, self.cfg.pool_id
        try:
            membership = await c.call("PoolManager", "membershipOf", sender)
            if int(membership["poolId"]) == pool:
                return protocol.ok(member=True)
            if int(membership["poolId"]) != 0:
                return protocol.refuse(
                    f"node {sender} is in pool {membership['poolId']}", "leave that pool first (`node leave`)"
                )
            provider = await c.call("ProviderRegistry", "providerOf", sender)
            if int(provider, 16) == 0:
                return protocol.refuse(f"node {sender} is not bound to a provider", "bind it with `node add` first")
            if await c.call("PoolManager", "isBlacklisted", pool, sender):
                return protocol.refuse(f"node {sender} is blacklisted in pool {pool}")
            stake = int(await c.call("ProviderRegistry", "stakeOf", provider))
            need = int((await c.call("PoolManager", "getPool", pool))["minStake"])
            if stake < need:
                return protocol.refuse(
                    f"provider {provider} stakes {stake} base units, pool {pool} needs {need}", "stake more"
                )
            now = await c.timestamp()
            row = self.state.invite(sender)
            if (
                row is not None
                and int(row["expiry"]) > now + 60
                and not await c.call("PoolManager", "isInviteUsed", pool, int(row["nonce"]))
            ):
                inv = {"nonce": int(row["nonce"]), "expiry": int(row["expiry"]), "signature": row["signature"]}
            else:
                invite = await ops.make_invite(c, self.key, pool, sender, self.cfg.invite_ttl)
                self.state.keep_invite(sender, invite.nonce, invite.expiry, invite.signature)
                inv = {"nonce": invite.nonce, "expiry": invite.expiry, "signature": invite.signature}
            log.info("invite for node %s to pool %d", sender, pool)
            return protocol.ok(member=False, invite=inv)
        except RpcUnavailable:
            return protocol.refuse(
                "the coordinator cannot reach its chain node right now", "retry in a minute", retry=True
            )

    async def _is_member(self, node: str) -> bool:
        """From the membership snapshot; a sender not in it (maybe one that joined a second ago) costs
        at most one chain read per `OUTSIDER_COOLDOWN` seconds, whatever it sends."""
        assert self.membership is not None and self.chain is not None
        if node in self.membership.snapshot().members:
            return True
        now = time.monotonic()
        if now - self.outsiders.get(node, -1e9) < OUTSIDER_COOLDOWN:
            return False
        if len(self.outsiders) > 10_000:
            self.outsiders.clear()
        if not self._outsider_read(now):
            return False  # not remembered: asked again once the budget allows
        self.outsiders[node] = now
        member = bool(await self.chain.call("PoolManager", "isMember", self.cfg.pool_id, node))
        if member:
            self.outsiders.pop(node, None)
        return member

    def _outsider_read(self, now: float) -> bool:
        """Whether a chain read for a sender that is no member fits `OUTSIDER_READS` (the request's
        network's budget and everyone's)."""
        net = prefix_of(PEER_IP.get()) or "unknown"
        return self.outsider_reads.take(net, "network", now) and self.outsider_reads.take("*", "all", now)

    def may_use_blobs(self, sender: str) -> bool:
        """Uploads and downloads: members (their own rollouts) and validators (to check them) only."""
        assert self.membership is not None
        return self.membership.snapshot().role(sender) is not None

    def may_upload(self, sender: str) -> str | None:
        """Uploads only from a member node that holds an open task (the file it will submit for it): a
        member cannot hold upload slots, or fill the disk, with files no task asked for."""
        if self.membership is None or self.membership.snapshot().role(sender) != ROLE_MEMBER:
            return f"{protocol.UPLOAD_REFUSED} only the pool's member nodes upload rollout files"
        if self.state.open_task(sender, time.time()) is None:
            return f"{protocol.UPLOAD_REFUSED} node {sender} holds no open task: ask for one, then upload its file"
        return None

    async def _on_task(self, request: bytes, sender: str) -> bytes:
        cfg = self.cfg
        try:
            if not await self._is_member(sender):
                return protocol.refuse(f"node {sender} is not a member of pool {cfg.pool_id}", "join the pool first")
        except RpcUnavailable:
            return protocol.refuse(
                "the coordinator cannot reach its chain node right now", "retry in a minute", retry=True
            )
        if not self.request_budget.take(sender, "task", time.monotonic()):
            return protocol.refuse(*too_many("task requests", "task"), retry=True)
        if 0 < cfg.blacklist_after <= self.invalidations(sender):
            return protocol.refuse(f"node {sender} had {self.invalidations(sender)} record(s) invalidated in this pool")
        try:
            asked = protocol.unpack(request, "task request")
        except protocol.ProtocolError as exc:
            return protocol.refuse(str(exc), "send a msgpack map, e.g. {'version': the policy version you hold}")
        now = time.time()
        row = self.state.open_task(sender, now + cfg.resend_margin)
        if row is not None:
            open_task = protocol.unpack(bytes.fromhex(row["body"]), "task")
            version = int(open_task.get("policy_version", 0))
            if rules.task_to_hand_out(version, cfg.policy_version, cfg.async_level, cfg.train, 0, 1) == "resend":
                return protocol.ok(task=open_task)
            # the policy moved past it (the worker was down, or named an old version): replaced by a task with
            # the same seed, at once (not more work for the trainer, and no new seed: not held back), bound to
            # a version fixed by the old task alone (`rules.replacement`): each version let pass is a lapse
            bound, hops = rules.replacement(version, cfg.policy_version, cfg.async_level)
            task = self._task(sender, int(open_task.get("seed", 0)), bound, now)
            if not self.state.replace_task(
                row["task_id"], hops, task.task_id, sender, protocol.pack(task.to_wire()), task.expires_at, now
            ):
                return protocol.ok(retry_after=1.0, reason="your task was submitted meanwhile")
            log.info("task %s of %s superseded: issued at policy version %s, replaced at %s", row["task_id"],
                     sender, version, bound)  # fmt: skip
            self._count("tasks_issued")
            return protocol.ok(task=task.to_wire())
        lives = self.state.lapsed(sender, now - cfg.lapse_window, now, now + cfg.resend_margin)
        lapsed = rules.counted_lapses(lives, self.state.downtimes())
        wait = rules.lapse_wait(lapsed, now, cfg.lapse_window, cfg.lapse_limit)
        if wait > 0:
            self._count("tasks_held_back")
            return protocol.ok(
                retry_after=round(wait, 1),
                lapsed=len(lapsed),
                reason=f"{len(lapsed)} of your tasks lapsed unsubmitted in the last {cfg.lapse_window / 3600:g} h "
                f"(at most {cfg.lapse_limit}): the next one in {wait:.0f} s",
            )
        if (
            rules.task_to_hand_out(
                None, cfg.policy_version, cfg.async_level, cfg.train, self.backlog(now), cfg.train_files
            )
            == "wait"
        ):
            return protocol.ok(retry_after=2.0, reason="waiting for the trainer")
        version = rules.bound_version(
            asked.get("version"), cfg.policy_version, cfg.async_level, seeded=cfg.seed is not None
        )
        task = self._task(sender, self._task_seed(), version, now)
        self.state.add_task(task.task_id, sender, protocol.pack(task.to_wire()), task.expires_at)
        self._count("tasks_issued")
        return protocol.ok(task=task.to_wire())

    def _task(self, node: str, seed: int, version: int, now: float) -> protocol.Task:
        """A task for `node`: `seed` (its problems), bound to policy `version`."""
        cfg = self.cfg
        return protocol.Task(
            task_id="t-" + secrets.token_hex(8),
            pool_id=cfg.pool_id,
            node=node,
            env=cfg.env,
            seed=seed,
            prompts=cfg.prompts,
            group_size=cfg.group_size,
            sampling=dict(cfg.sampling),
            policy_version=version,
            model=cfg.model,
            issued_at=now,
            expires_at=now + cfg.task_ttl,
            min_policy_version=version,
        )

    def _task_seed(self) -> int:
        """The seed the next task's problems are drawn from. Unpredictable by default, so a worker cannot
        prepare answers ahead; with `seed` set, the n-th task issued gets sha256(seed, n), the same
        sequence of problems on every run (and across restarts: n is counted in the state file)."""
        if self.cfg.seed is None:
            return secrets.randbits(62)
        return rules.seeded_task_seed(self.cfg.seed, self.state.tasks_issued())

    def backlog(self, now: float) -> int:
        """Rollouts the trainer has not consumed yet: accepted-untrained plus tasks still open."""
        return self.state.backlog(now)

    def _reject(self, sender: str, reason: str, detail: str) -> bytes:
        """Count a refused submission and keep a bounded record of it: the sender's text is cut to
        `REJECTION_DETAIL` characters, the table to the newest `MAX_REJECTIONS` rows, and one sender gets
        a log line at most every `REJECTION_LOG_EVERY` seconds (a member that spams refusals costs us
        neither disk nor log)."""
        self.rejected[reason] += 1
        self._count("rollouts_rejected", reason=reason)
        detail = detail[:REJECTION_DETAIL]
        self.state.add_rejection(sender, reason, detail, MAX_REJECTIONS)
        now = time.monotonic()
        if now - self._rejection_logged.get(sender, -1e9) >= REJECTION_LOG_EVERY:
            self._rejection_logged[sender] = now
            if len(self._rejection_logged) > 10_000:
                self._rejection_logged.pop(next(iter(self._rejection_logged)))
            log.info("rejected a rollout from %s: %s (%s)", sender, reason, detail)
        return protocol.refuse(f"rollout rejected: {reason}: {detail}")

    def claim(self, key: str) -> RolloutClaim:
        assert self.chain is not None
        return ops.rollout_claim(self.chain, self.cfg.pool_id, key)

    async def _on_signature(self, request: bytes, sender: str) -> bytes:
        """The node's signature of an accepted file, for validators (and members) only."""
        assert self.membership is not None
        if self.membership.snapshot().role(sender) is None:
            return protocol.refuse("signatures are served to the pool's validators and members")
        key = protocol.unpack(request, "signature request").get("work_key")
        row = self.state.rollout(key) if isinstance(key, str) else None
        if row is None or not row["signature"]:
            return protocol.refuse(f"no signed rollout {key!r} here")
        return protocol.ok(signature=row["signature"])

    def _prior(self, f: RolloutFile) -> tuple[dict[Any, int], dict[Any, int]]:
        """Draws of each of the file's prompts and copies of each of its completions in accepted files."""
        draws: dict[Any, int] = {}
        copies: dict[Any, int] = {}
        for s in f.samples:
            p, c = completion_hashes(s)
            pk, ck = tuple(s.prompt_tokens), (tuple(s.prompt_tokens), tuple(s.completion_tokens))
            if pk not in draws:
                draws[pk] = self.state.prior_draws(p)
            if ck not in copies:
                copies[ck] = self.state.prior_copies(c)
        return draws, copies

    async def _on_submit(self, request: bytes, sender: str) -> bytes:
        assert self.tools is not None and self.membership is not None
        try:
            if not await self._is_member(sender):
                return protocol.refuse(f"node {sender} is not a member of pool {self.cfg.pool_id}")
        except RpcUnavailable:
            return protocol.refuse(
                "the coordinator cannot reach its chain node right now", "retry in a minute", retry=True
            )
        if not self.request_budget.take(sender, "submit", time.monotonic()):
            return protocol.refuse(*too_many("submissions", "submit"), retry=True)
        req = protocol.unpack(request, "submission")
        key, task_id, signature = req.get("work_key"), req.get("task_id"), req.get("signature")
        if not isinstance(key, str) or not isinstance(task_id, str) or not re.fullmatch(r"0x[0-9a-f]{64}", key):
            return protocol.refuse("malformed submission: work_key (0x + 64 lowercase hex) and task_id are required")
        done = self.state.rollout(key)
        if done is not None:
            return protocol.ok(status="duplicate", work_key=key)
        trow = self.state.task(task_id)
        if trow is None or trow["node"] != sender:
            return self._reject(sender, "unknown-task", f"task {task_id} was not issued to {sender}")
        if trow["status"] == "superseded":
            return self._reject(sender, "task-superseded", f"task {task_id} was replaced after the policy moved on")
        if trow["status"] != "issued":
            return self._reject(sender, "task-done", f"task {task_id} already has rollout {trow['work_key']}")
        if not self.claim(key).signed_by(signature, sender):
            # Without it, a validator could never show the file is the node's: the node could deny it, or
            # we could be accused of recording work it never made.
            return self._reject(sender, "unsigned", "the submission carries no valid signature of the node's key")
        data = self.blobs.get(key)
        if data is None:
            return protocol.refuse(f"rollout {key} has not been uploaded", "upload it before submitting")
        task = protocol.Task.from_wire(protocol.unpack(bytes.fromhex(trow["body"]), "task"))
        tools = self.tools

        def parse() -> RolloutFile:
            # what a file for this task may hold, before a value is decoded: its rows, its prompts, max_tokens
            limits = protocol.file_limits(task, self.env, tools.encode)
            return RolloutFile.from_bytes(data, max_bytes=self.cfg.max_rollout_bytes, limits=limits)

        if sender in self._parsing:  # one parse per node at a time: no node holds more of the parse budget
            return protocol.refuse("another file of this node is being checked", "submit again shortly", retry=True)
        self._parsing.add(sender)
        try:  # in a thread (a hostile file costs its decode budget in CPU), a few at a time, within the
            # memory every parse of this process shares
            f = await trio.to_thread.run_sync(parse, limiter=self._parse_limiter)
        except ParseBusy as exc:
            return protocol.refuse(
                str(exc), "the coordinator is busy checking other files: submit again shortly", retry=True
            )
        except RolloutFormatError as exc:
            self.blobs.delete(key)
            return self._reject(sender, "malformed", str(exc))
        finally:
            self._parsing.discard(sender)
        version, named = f.header.policy_version, weights_of(f.header)
        announced = self.state.version_hash(version) if version > 0 else None
        if version > 0 and named != announced:
            self.blobs.delete(key)
            return self._reject(
                sender, "wrong-weights",
                f"the file names weights {str(named)[:16]} for policy version {version}, "
                f"announced as {str(announced)[:16]}",
            )  # fmt: skip
        draws, copies = self._prior(f)
        decision = await trio.to_thread.run_sync(
            lambda: protocol.check_submission(
                f,
                task,
                sender=sender,
                now=time.time(),
                current_policy=self.cfg.policy_version,
                async_level=self.cfg.async_level,
                env=self.env,
                encode_prompt=tools.encode,
                decode=tools.decode,
                vocab_size=tools.vocab_size,
                prior_draws=draws,
                prior_copies=copies,
            )
        )
        if not decision.accepted:
            self.blobs.delete(key)
            return self._reject(sender, decision.reason, decision.detail)
        commitment = "0x" + proof_commitment([p for s in f.samples for p in s.proofs]).hex()
        mean_reward = sum(s.reward for s in f.samples) / len(f.samples)
        if not self.state.accept(key, task_id, sender, f, commitment, mean_reward, signature):
            # another submission for this task was accepted (or the task superseded) while this one was checked
            now_row = self.state.task(task_id) or {}
            if now_row.get("work_key") != key:
                self.blobs.delete(key)
            return self._reject(sender, "task-done", f"task {task_id} was closed while this submission was checked")
        self._count("rollouts_accepted")
        self._count("tokens_generated", f.units)
        log.info("accepted rollout %s from %s: %d units, mean reward %.3f", key[:12], sender, f.units, mean_reward)
        return protocol.ok(status="accepted", work_key=key, units=f.units)
