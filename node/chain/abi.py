"""Offline ABI codec for the protocol contracts: calldata, return values, events and custom errors.

Pure functions over the forge artifacts; no I/O except reading the artifact files once.
Encoding and decoding use eth-abi (web3.py's codec) with names taken from the ABI, so tuples come
back as dicts keyed by their Solidity field names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import eth_abi
from eth_utils import keccak, to_checksum_address
from eth_utils.abi import collapse_if_tuple

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CONTRACT_NAMES = ("IntellectToken", "ProviderRegistry", "PoolManager", "WorkLedger")

Json = dict[str, Any]


def _type(param: Json) -> str:
    return str(collapse_if_tuple(dict(param)))


def signature(entry: Json) -> str:
    """`name(type1,type2)` with tuples spelled out, as hashed for selectors and topics."""
    return f"{entry['name']}({','.join(_type(p) for p in entry.get('inputs', []))})"


def _to_python(param: Json, value: Any) -> Any:
    """Decoded eth-abi value -> python: tuples to dicts by field name, addresses checksummed,
    bytes32 to 0x-hex."""
    t = param["type"]
    if t.endswith("]"):
        inner = dict(param, type=t[: t.rindex("[")])
        return [_to_python(inner, v) for v in value]
    if t == "tuple":
        return {c["name"]: _to_python(c, v) for c, v in zip(param["components"], value, strict=True)}
    if t == "address":
        return to_checksum_address(value)
    if t.startswith("bytes"):
        return "0x" + bytes(value).hex()
    return value


def _to_abi(param: Json, value: Any) -> Any:
    """python -> eth-abi input: dicts to tuples in field order, hex strings to bytes."""
    t = param["type"]
    if t.endswith("]"):
        inner = dict(param, type=t[: t.rindex("[")])
        return [_to_abi(inner, v) for v in value]
    if t == "tuple":
        comps = param["components"]
        if isinstance(value, dict):
            missing = [c["name"] for c in comps if c["name"] not in value]
            if missing:
                raise ValueError(f"tuple {param.get('name', '')} lacks fields {missing}")
            return tuple(_to_abi(c, value[c["name"]]) for c in comps)
        return tuple(_to_abi(c, v) for c, v in zip(comps, value, strict=True))
    if t.startswith("bytes") and isinstance(value, str):
        return bytes.fromhex(value.removeprefix("0x"))
    if t == "address" and isinstance(value, str):
        return to_checksum_address(value)
    return value


def topic(value: int | str) -> str:
    """An indexed uint or address as the 32-byte topic `eth_getLogs` filters on."""
    if isinstance(value, str):
        return "0x" + bytes.fromhex(value.removeprefix("0x")).rjust(32, b"\0").hex()
    return "0x" + value.to_bytes(32, "big").hex()


@dataclass(frozen=True)
class Function:
    contract: str
    entry: Json

    @property
    def name(self) -> str:
        return str(self.entry["name"])

    @property
    def selector(self) -> bytes:
        return keccak(text=signature(self.entry))[:4]

    @property
    def mutating(self) -> bool:
        return self.entry.get("stateMutability") not in ("view", "pure")

    def encode(self, args: Sequence[Any]) -> str:
        inputs = self.entry.get("inputs", [])
        if len(args) != len(inputs):
            raise TypeError(f"{self.contract}.{self.name} takes {len(inputs)} arguments, got {len(args)}")
        types = [_type(p) for p in inputs]
        values = [_to_abi(p, a) for p, a in zip(inputs, args, strict=True)]
        return "0x" + (self.selector + eth_abi.encode(types, values)).hex()

    def decode(self, data: str | bytes) -> Any:
        """Return value(s): a single output unwrapped, several as a tuple."""
        raw = bytes.fromhex(data.removeprefix("0x")) if isinstance(data, str) else data
        outputs = self.entry.get("outputs", [])
        values = eth_abi.decode([_type(p) for p in outputs], raw)
        py = [_to_python(p, v) for p, v in zip(outputs, values, strict=True)]
        return py[0] if len(py) == 1 else tuple(py)


@dataclass(frozen=True)
class DecodedEvent:
    contract: str
    name: str
    args: dict[str, Any]
    address: str
    block_number: int
    tx_hash: str
    log_index: int


@dataclass(frozen=True)
class DecodedError:
    name: str
    args: dict[str, Any]


class ContractABI:
    """One contract's ABI: functions by name, events by topic, errors by selector."""

    def __init__(self, name: str, abi: list[Json], bytecode: str) -> None:
        self.name = name
        self.abi = abi
        self.bytecode = bytecode
        self.functions: dict[str, Function] = {}
        self.events: dict[bytes, Json] = {}
        self.event_topics: dict[str, str] = {}
        self.errors: dict[bytes, Json] = {}
        for e in abi:
            if e["type"] == "function":
                if e["name"] in self.functions:
                    raise ValueError(f"overloaded function {name}.{e['name']} is not supported")
                self.functions[e["name"]] = Function(name, e)
            elif e["type"] == "event":
                topic = keccak(text=signature(e))
                self.events[topic] = e
                self.event_topics[e["name"]] = "0x" + topic.hex()
            elif e["type"] == "error":
                self.errors[keccak(text=signature(e))[:4]] = e
        self.constructor = next((e for e in abi if e["type"] == "constructor"), {"inputs": []})

    def fn(self, name: str) -> Function:
        try:
            return self.functions[name]
        except KeyError:
            raise AttributeError(f"{self.name} has no function {name}") from None

    def constructor_args(self, args: Sequence[Any]) -> str:
        """The ABI-encoded constructor arguments (0x-hex): what follows the bytecode in the creation
        transaction, and what a block explorer asks for to verify the contract."""
        inputs = self.constructor.get("inputs", [])
        types = [_type(p) for p in inputs]
        values = [_to_abi(p, a) for p, a in zip(inputs, args, strict=True)]
        return "0x" + eth_abi.encode(types, values).hex()

    def deploy_data(self, args: Sequence[Any]) -> str:
        return self.bytecode + self.constructor_args(args).removeprefix("0x")

    def decode_log(self, log: Json) -> DecodedEvent | None:
        """Decode a raw `eth_getLogs` entry; None when the topic is not one of this contract's events."""
        topics = [bytes.fromhex(t.removeprefix("0x")) for t in log["topics"]]
        if not topics or topics[0] not in self.events:
            return None
        entry = self.events[topics[0]]
        indexed = [p for p in entry["inputs"] if p.get("indexed")]
        plain = [p for p in entry["inputs"] if not p.get("indexed")]
        if len(topics) != len(indexed) + 1:
            return None
        args: dict[str, Any] = {}
        for p, topic in zip(indexed, topics[1:], strict=True):
            t = _type(p)
            if t in ("string", "bytes") or t.endswith("]") or t.startswith("("):
                args[p["name"]] = "0x" + topic.hex()  # dynamic indexed values are stored hashed
            else:
                try:
                    args[p["name"]] = _to_python(p, eth_abi.decode([t], topic)[0])
                except eth_abi.exceptions.DecodingError:
                    return None
        data = bytes.fromhex(log["data"].removeprefix("0x"))
        try:
            values = eth_abi.decode([_type(p) for p in plain], data)
        except eth_abi.exceptions.DecodingError:
            return None  # not a log our contracts emit (wrong shape for the topic)
        for p, v in zip(plain, values, strict=True):
            args[p["name"]] = _to_python(p, v)
        return DecodedEvent(
            contract=self.name,
            name=entry["name"],
            args=args,
            address=to_checksum_address(log["address"]),
            block_number=int(log["blockNumber"], 16),
            tx_hash=log["transactionHash"],
            log_index=int(log["logIndex"], 16),
        )


@cache
def load(name: str) -> ContractABI:
    path = ARTIFACTS / f"{name}.json"
    data = json.loads(path.read_text())
    return ContractABI(name, data["abi"], data["bytecode"])


@cache
def _error_table() -> dict[bytes, Json]:
    table: dict[bytes, Json] = {}
    for name in CONTRACT_NAMES:
        table.update(load(name).errors)
    return table


_PANIC_CODES = {
    0x01: "assertion failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division by zero",
    0x21: "invalid enum value",
    0x32: "array index out of bounds",
    0x41: "out of memory",
}


def decode_error(data: str | bytes | None) -> DecodedError | None:
    """Decode revert data: a custom error of any protocol contract, `Error(string)` or `Panic(uint256)`."""
    if data is None:
        return None
    raw = bytes.fromhex(data.removeprefix("0x")) if isinstance(data, str) else data
    if len(raw) < 4:
        return None
    sel, body = raw[:4], raw[4:]
    try:
        if sel == keccak(text="Error(string)")[:4]:
            return DecodedError("Error", {"message": eth_abi.decode(["string"], body)[0]})
        if sel == keccak(text="Panic(uint256)")[:4]:
            code = eth_abi.decode(["uint256"], body)[0]
            return DecodedError("Panic", {"code": code, "message": _PANIC_CODES.get(code, hex(code))})
        entry = _error_table().get(sel)
        if entry is None:
            return None
        inputs = entry["inputs"]
        values = eth_abi.decode([_type(p) for p in inputs], body)
        return DecodedError(entry["name"], {p["name"]: _to_python(p, v) for p, v in zip(inputs, values, strict=True)})
    except (eth_abi.exceptions.DecodingError, ValueError):
        return None
