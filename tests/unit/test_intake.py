"""Pure rules for untrusted input: the pool's task spec, the repeat bound, the node's rollout signature."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from eth_account import Account

from node.chain.signing import RolloutClaim
from node.rollout.intake import repeat_log_bound
from node.taskspec import TaskSpecError, parse_spec

SPEC = {"model": "tiny", "environment": "math", "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}}


def _bytes(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()


def test_spec_is_checked_against_its_hash_and_parsed() -> None:
    data = _bytes(SPEC)
    spec = parse_spec(data, "0x" + hashlib.sha256(data).hexdigest())
    assert (spec.model, spec.env, spec.max_tokens, spec.group_size) == ("tiny", "math", 64, 4)
    assert spec.sampling_params().temperature == 1.0
    with pytest.raises(TaskSpecError, match="does not match the pool's on-chain hash"):
        parse_spec(data, "0x" + "00" * 32)


@pytest.mark.parametrize(
    "bad",
    [
        {**SPEC, "sampling": {**SPEC["sampling"], "seed": 1}},  # a key nobody checks
        {**SPEC, "sampling": {"temperature": float("inf"), "max_tokens": 64}},
        {**SPEC, "sampling": {"temperature": 1.0, "max_tokens": 0}},
        {**SPEC, "sampling": {"temperature": True, "max_tokens": 8}},
        {**SPEC, "environment": "chess"},
        {**SPEC, "model": ""},
        {**SPEC, "group_size": 1000},
        [1, 2],
    ],
)
def test_malformed_specs_are_refused(bad: object) -> None:
    with pytest.raises(TaskSpecError):
        parse_spec(json.dumps(bad).replace("Infinity", "1e999").encode())


def test_garbage_and_oversize_specs_are_refused() -> None:
    for data in (b"\xff\xfe", b"{", b"x" * 70_000):
        with pytest.raises(TaskSpecError):
            parse_spec(data)


def test_repeat_bound() -> None:
    # 8 copies of an answer the model gives half the time: about 0.004, plausible
    assert math.exp(repeat_log_bound(8, 8, math.log(0.5))) == pytest.approx(0.5**8)
    # one copy is no repeat; a zero-probability claim does not make the bound positive
    assert repeat_log_bound(8, 1, -100.0) == 0.0
    assert repeat_log_bound(4, 2, 5.0) == pytest.approx(math.log(6))
    # two copies of an e^-40 completion among 4 draws: far below 1e-9
    assert repeat_log_bound(4, 2, -40.0) < math.log(1e-9)


def test_rollout_claim_names_its_signer_and_nothing_else() -> None:
    node, other = Account.create(), Account.create()
    key = "0x" + "ab" * 32
    claim = RolloutClaim(key, 3, 31337, "0x" + "11" * 20)
    sig = claim.sign(node)
    assert claim.signed_by(sig, node.address) and claim.signed_by(sig, node.address.lower())
    assert not claim.signed_by(sig, other.address)
    # the same signature does not carry to another pool, chain, ledger or file
    for changed in (
        RolloutClaim(key, 4, 31337, "0x" + "11" * 20),
        RolloutClaim(key, 3, 84532, "0x" + "11" * 20),
        RolloutClaim(key, 3, 31337, "0x" + "22" * 20),
        RolloutClaim("0x" + "cd" * 32, 3, 31337, "0x" + "11" * 20),
    ):
        assert not changed.signed_by(sig, node.address)
    for junk in (None, "", "0x", 12, "0x" + "00" * 65, "0x" + "zz" * 65, sig[:-2]):
        assert claim.signer(junk) is None
        assert not claim.signed_by(junk, node.address)
