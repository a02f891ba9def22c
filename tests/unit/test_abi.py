"""The offline ABI codec and the readable error messages."""

from __future__ import annotations

import eth_abi
from eth_utils import keccak
from hypothesis import given
from hypothesis import strategies as st

from node.chain import abi
from node.chain.messages import explain, tokens

SAMPLE = {"address": "0x" + "11" * 20, "bool": True, "string": "s", "bytes": b"\x01"}


def sample(t: str):
    if t in SAMPLE:
        return SAMPLE[t]
    if t.startswith(("uint", "int")):
        return 3
    if t.startswith("bytes"):
        return b"\x02" * int(t[5:])
    raise AssertionError(t)


def all_errors():
    for name in abi.CONTRACT_NAMES:
        yield from abi.load(name).errors.values()


def test_every_custom_error_decodes_to_its_name_and_args():
    n = 0
    for entry in all_errors():
        types = [abi._type(p) for p in entry["inputs"]]
        data = keccak(text=abi.signature(entry))[:4] + eth_abi.encode(types, [sample(t) for t in types])
        got = abi.decode_error("0x" + data.hex())
        assert got is not None and got.name == entry["name"]
        assert list(got.args) == [p["name"] for p in entry["inputs"]]
        n += 1
    assert n > 40


def test_every_protocol_error_has_a_readable_message():
    """No custom error of ours falls through to the generic `Name(args)` rendering."""
    for entry in all_errors():
        types = [abi._type(p) for p in entry["inputs"]]
        data = keccak(text=abi.signature(entry))[:4] + eth_abi.encode(types, [sample(t) for t in types])
        decoded = abi.decode_error(data)
        message, _hint = explain(decoded)
        generic = f"{entry['name']}(" in message
        openzeppelin_internal = entry["name"].startswith(
            (
                "SafeERC20",
                "ERC20Invalid",
                "ERC2612",
                "InvalidAccountNonce",
                "InvalidShortString",
                "StringTooLong",
                "AccessControlBadConfirmation",
                "OwnableInvalidOwner",
                "ECDSA",
            )
        )
        assert not generic or openzeppelin_internal, f"{entry['name']} has no readable message: {message}"


def test_revert_strings_and_panics():
    data = keccak(text="Error(string)")[:4] + eth_abi.encode(["string"], ["boom"])
    assert abi.decode_error(data).args == {"message": "boom"}
    data = keccak(text="Panic(uint256)")[:4] + eth_abi.encode(["uint256"], [0x11])
    assert "overflow" in explain(abi.decode_error(data))[0]


@given(st.binary(max_size=200))
def test_decode_error_never_crashes(data):
    abi.decode_error(data)
    abi.decode_error(keccak(text="DuplicateWork(uint256,bytes32)")[:4] + data)


@given(st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=4), st.binary(max_size=300))
def test_decode_log_never_crashes_on_garbage(topics, data):
    ledger = abi.load("WorkLedger")
    log = {
        "topics": ["0x" + t.hex() for t in topics],
        "data": "0x" + data.hex(),
        "address": "0x" + "00" * 20,
        "blockNumber": "0x1",
        "transactionHash": "0x" + "00" * 32,
        "logIndex": "0x0",
    }
    ev = ledger.decode_log(log)
    assert ev is None or ev.name in {e["name"] for e in ledger.events.values()}


def test_function_roundtrip_with_struct_argument():
    f = abi.load("WorkLedger").fn("recordWork")
    data = f.encode(
        [
            7,
            [
                {
                    "node": "0x" + "22" * 20,
                    "workKey": "0x" + "33" * 32,
                    "units": 5,
                    "policyVersion": 2,
                    "proofCommitment": "0x" + "44" * 32,
                }
            ],
        ]
    )
    assert data.startswith("0x" + f.selector.hex())
    decoded = eth_abi.decode(["uint256", "(address,bytes32,uint48,uint32,bytes32)[]"], bytes.fromhex(data[10:]))
    assert decoded[0] == 7 and decoded[1][0][2] == 5


def test_struct_output_comes_back_as_named_dict():
    f = abi.load("WorkLedger").fn("getRecord")
    raw = eth_abi.encode(["(address,uint40,uint8,uint48)"], [("0x" + "55" * 20, 99, 1, 12)])
    rec = f.decode(raw)
    assert rec == {"provider": "0x" + "55" * 20, "deadline": 99, "status": 1, "units": 12}


def test_tokens_formatting():
    assert tokens(0) == "0 INTL"
    assert tokens(10**18) == "1 INTL"
    assert tokens(15 * 10**17) == "1.5 INTL"
    assert tokens(1) == "0.000000000000000001 INTL"
