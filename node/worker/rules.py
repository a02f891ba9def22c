"""The worker's rules, pure: which policy version to generate with or fetch for a task, and how to answer
an accusation of its work."""

from __future__ import annotations

from collections.abc import Collection, Iterable


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
