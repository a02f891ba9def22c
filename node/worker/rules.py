"""The worker's rules, pure: whether a task keeps to the pool's spec, which policy version to generate
with or fetch for it, and how to answer an accusation of its work."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ..rollout.intake import same_value


def task_against_spec(
    env: str, model: str, sampling: Mapping[str, Any], group_size: int, spec: Any, pool_id: int, own_pool: int
) -> str | None:
    """Why a task's terms are not the pool's spec (`node.taskspec.TaskSpec`), or None. Validators judge a
    file by the spec alone, so a coordinator that hands out other terms (another temperature, exact
    sampling off or on, another pool's id in the header) would have the worker's honest files
    invalidated; the worker refuses the task."""
    if pool_id != own_pool:
        return f"the task is for pool {pool_id}, this worker works for pool {own_pool}"
    if spec is None:  # the spec could not be read: only the pool is known
        return None
    if env != spec.env or model != spec.model:
        return f"the task asks for {model!r} on {env!r}, the pool's spec for {spec.model!r} on {spec.env!r}"
    if group_size != spec.group_size:
        return f"the task asks for groups of {group_size}, the pool's spec for {spec.group_size}"
    if set(sampling) != set(spec.sampling) or not all(same_value(sampling[k], spec.sampling[k]) for k in sampling):
        return f"the task's sampling {dict(sampling)} is not the pool's spec {dict(spec.sampling)}"
    return None


def follows_current(download_took: float | None, fresh_wait: float) -> bool:
    """Whether a worker asks for tasks bound to the pool's current version (rather than naming the
    newest it holds): while its policy downloads are quick (within `fresh_wait` seconds; none yet
    counts as quick), following the policy gives the trainer the freshest rollouts at a short fetch;
    once one was slow or failed (`inf`), a task bound to weights it cannot get in time would lapse."""
    return download_took is None or download_took <= fresh_wait


def best_downloaded(downloaded: Iterable[int], min_version: int, max_version: int) -> int | None:
    """The newest downloaded version a task allows (`min_version`..`max_version`), if any."""
    return max((v for v in downloaded if min_version <= v <= max_version), default=None)


def newer_coming(loaded: int, downloading: Collection[int], latest_announced: int, max_version: int) -> bool:
    """Whether a version newer than the loaded one, and allowed by the task, is on its way: downloading
    now, or announced by the task but not yet by gossip."""
    return any(loaded < v <= max_version for v in downloading) or max_version > max(latest_announced, loaded)


def version_to_fetch(
    announced: Iterable[int],
    downloaded: Collection[int],
    downloading: Collection[int],
    min_version: int,
    max_version: int,
) -> int | None:
    """The newest announced version a task allows that is neither held nor being fetched (None when one
    of those allowed is already downloading, or none is announced). Version 0 is the base model."""
    wanted = [v for v in announced if min_version <= v <= max_version and v > 0 and v not in downloaded]
    if not wanted or any(v in downloading for v in wanted):
        return None
    return max(wanted)


def answer(why_not: str | None, cheater: bool, yes: bool) -> str:
    """How to answer an accusation of our work: `why_not` is what our own re-check found (None: the file
    stands). An honest worker appeals only work that passes its own check, and only with `--yes`; the
    devnet's cheater appeals anyway, betting on the committee."""
    if why_not is not None and not cheater:
        return "failed-self-check"
    return "appealed" if yes else "declined"


def recorded_for(events: Iterable[Any], provider: str) -> list[tuple[str, int, int]]:
    """(work key, deadline, block) of `provider`'s work recorded in `events` (a ledger page, oldest
    first): a `WorkRecorded` names the provider and the key, the `WorkBatchRecorded` of the same
    transaction the deadline. A batch is one transaction, so a page of whole blocks holds all of it."""
    who = provider.lower()
    keys_by_tx: dict[str, list[tuple[str, int]]] = {}
    out: list[tuple[str, int, int]] = []
    for ev in events:
        if ev.name == "WorkRecorded" and str(ev.args.get("provider", "")).lower() == who:
            keys_by_tx.setdefault(ev.tx_hash, []).append((str(ev.args["workKey"]), ev.block_number))
        elif ev.name == "WorkBatchRecorded":
            deadline = int(ev.args["deadline"])
            out.extend((key, deadline, block) for key, block in keys_by_tx.pop(ev.tx_hash, []))
    return out


def claim_step(status: str, provider_is_ours: bool, deadline: int, now: int) -> str:
    """What the claim scan does with a tracked record whose chain state is `status` at chain time
    `now`: "claim" it, "keep" it for later (its window is open, or a dispute runs) or "forget" it
    (claimed, invalidated, never recorded on this chain: a reorganisation removed it). Pure."""
    if status in ("none", "claimed", "invalidated") or not provider_is_ours:
        return "forget"
    if status == "pending" and now >= deadline:
        return "claim"
    return "keep"
