"""Issue 37 (2): a coordinator that swaps the weights of a policy version after work was done with them.

It announces version 1 with one checkpoint, a worker generates with it, then it announces version 1 again
with other weights (and serves only those). Before, the nodes' policy book took the new hash, validators
judged the honest file against the new weights, it failed on every sample (hard) and a committee upheld.
Now a file names the weights its worker generated with (`extra.weights`, signed with the file), the book
keeps the first hash of a version and every hash announced for it, and a file is judged only against
the weights it names: with them it passes, without a source for them there is no verdict (never a
slash), and the two announcements show on the validator's status page as the coordinator's lie.
Real pieces: the tiny model's real checkpoints behind a real weight server on 127.0.0.1, a real vLLM file,
the validator's real prefill and checks."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import trio

from node.policy import PolicyAnnouncement, PolicyBook, weights_of
from node.rollout.checks import invalidation_is_hard, stored_reason
from node.rollout.file import RolloutFile
from node.weights.store import WeightStore
from tests.adversarial.test_hostile_rollouts import _honest, _row, _validator
from tests.integration.test_weights_broadcast import _serve


def _as_version(f: RolloutFile, version: int, weights: str | None) -> RolloutFile:
    extra = {**f.header.extra, **({"weights": weights} if weights is not None else {})}
    return RolloutFile(dataclasses.replace(f.header, policy_version=version, extra=extra), f.samples)


def test_the_book_keeps_the_first_hash_of_a_version_and_every_later_one_as_a_conflict() -> None:
    book = PolicyBook()
    h1, h2, h3 = "11" * 32, "22" * 32, "33" * 32
    book.update(PolicyAnnouncement(1, "tiny", h1, [], {1: h1}))
    book.update(PolicyAnnouncement(1, "tiny", h2, [], {1: h2}))
    book.update(PolicyAnnouncement(2, "tiny", h3, [], {1: h2, 2: h3}))
    assert book.hashes == {1: h1, 2: h3}  # what a worker downloads: the first story, for good
    assert book.signed_for(1, h1) and book.signed_for(1, h2) and not book.signed_for(1, h3)
    assert book.conflicts() == {1: [h1, h2]}
    for i in range(10):  # a coordinator cannot grow the book without bound by announcing more hashes
        book.update(PolicyAnnouncement(1, "tiny", f"{i:064x}", [], {}))
    assert len(book.announced[1]) <= 4


def test_a_swapped_version_is_never_held_against_the_work_done_with_the_first_weights(
    tmp_path: Path, tiny_model: Path, tiny_model_other: Path, vllm_engine: Any
) -> None:
    v = _validator(tmp_path, tiny_model)
    honest = _honest(vllm_engine, v)  # generated with the tiny model's weights...
    first = tmp_path / "first" / "model.safetensors"
    first.parent.mkdir()
    shutil.copy(tiny_model / "model.safetensors", first)  # ...which the coordinator announced as version 1

    async def main() -> None:
        origin = WeightStore(tmp_path / "origin", keep=4)
        relay = WeightStore(tmp_path / "relay", keep=4)  # a node that still serves the first weights
        async with trio.open_nursery() as nursery:
            url, _ = await _serve(nursery, origin)
            relay_url, relay_scope = await _serve(nursery, relay)
            h1 = origin.publish(first, 1).manifest_hash()
            relay.publish(first, 1)
            v.book.update(PolicyAnnouncement(1, "tiny", h1, [url], {1: h1}))
            f = _as_version(honest, 1, h1)
            assert weights_of(f.header) == h1
            # the coordinator swaps version 1's weights and announces them; its origin serves only those
            origin.remove(1)
            h2 = origin.publish(tiny_model_other / "model.safetensors", 1).manifest_hash()
            assert h2 != h1
            v.book.update(PolicyAnnouncement(1, "tiny", h2, [url, relay_url], {1: h2}))
            assert v.book.hashes[1] == h1, "the book took the swapped hash"
            assert v.status()["policy_conflicts"] == {"1": [h1, h2]}

            # judged against the weights its worker signed for (fetched from the relay): it passes
            verdict = await v.judge_file(f, _row(v) | {"policy_version": 1, "units": f.units}, last_chance=True)
            assert verdict is not None and verdict["ok"], verdict

            # the same file under the swapped weights would fail hard: what the lie was for
            lie = await v.judge_file(_as_version(honest, 1, h2), _row(v) | {"policy_version": 1}, last_chance=True)
            assert lie is not None and not lie["ok"] and invalidation_is_hard(stored_reason(lie)), lie

            # with no source of the first weights left: no verdict at all, however late
            relay_scope.cancel()
            v.prefills = None
            shutil.rmtree(v.cfg.data_dir / "weights")
            await trio.sleep(0.1)
            assert await v.judge_file(f, _row(v) | {"policy_version": 1}, last_chance=True) is None

            # a file naming weights nobody announced for its version (or none): revoked softly, never slashed
            for bad in (_as_version(honest, 1, "44" * 32), _as_version(honest, 1, None)):
                assert await v.judge_file(bad, _row(v) | {"policy_version": 1}, last_chance=False) is None
                soft = await v.judge_file(bad, _row(v) | {"policy_version": 1}, last_chance=True)
                assert soft is not None and soft["verdict"]["reason"] == "weights_unknown", soft
                assert not invalidation_is_hard(stored_reason(soft))
            # a version we never heard announced (we joined late, or were down past the history): no
            # verdict, however late: honest work never pays for the gap in our book
            late = _as_version(honest, 2, "55" * 32)
            assert await v.judge_file(late, _row(v) | {"policy_version": 2}, last_chance=True) is None
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_announcements_carry_only_hashes_and_history_up_to_their_version() -> None:
    import pytest

    from node import protocol

    h = "ab" * 32
    ok = PolicyAnnouncement(3, "tiny", h, ["http://127.0.0.1:1"], {1: h, 2: h, 3: h})
    assert PolicyAnnouncement.from_body(ok.to_body()) == ok
    for bad in (
        PolicyAnnouncement(3, "tiny", "a b", [], {}),  # not a hash (stored space-joined: would split)
        PolicyAnnouncement(3, "tiny", h, [], {2: "x" * 64}),
        PolicyAnnouncement(3, "tiny", h, [], {9: h}),  # a version the announcement has not reached
        PolicyAnnouncement(3, "tiny", h, [], {-1: h}),
    ):
        with pytest.raises(protocol.ProtocolError):
            PolicyAnnouncement.from_body(bad.to_body())
