"""The RPC client's pure parts: URL lists, answer checks, and which JSON-RPC errors are an endpoint's
trouble (fail over) rather than an answer (raise)."""

from __future__ import annotations

import pytest

from node.chain.errors import RpcError, RpcUnavailable
from node.chain.fees import bumped_fees, env_number
from node.chain.rpc import endpoint_trouble, hex_data, log_entries, parse_urls, quantity, receipt_or_none


def test_url_lists():
    assert parse_urls("http://a:1, https://b ,http://a:1") == ["http://a:1", "https://b"]
    for bad in ("", "ftp://x", "http://a," + ",".join(f"http://h{i}" for i in range(20))):
        with pytest.raises(RpcUnavailable):
            parse_urls(bad)


@pytest.mark.parametrize("v", [None, 5, "", "0x", "12", "0xzz", "0x" + "1" * 65, ["0x1"]])
def test_quantity_refuses_what_is_not_one(v):
    with pytest.raises(ValueError):
        quantity(v)


def test_answers_that_hold():
    assert quantity("0x1f") == 31 and hex_data("0x") == "0x" and hex_data("0x" + "ab" * 32, 32)
    with pytest.raises(ValueError):
        hex_data("0xabc")
    with pytest.raises(ValueError):
        hex_data("0x" + "ab" * 31, 32)
    assert receipt_or_none(None) is None
    with pytest.raises(ValueError):
        receipt_or_none({"transactionHash": "0x" + "00" * 32})
    with pytest.raises(ValueError):
        log_entries([{"topics": ["0x" + "00" * 32] * 5}])


def test_which_errors_are_the_endpoints_trouble():
    assert endpoint_trouble("eth_call", RpcError("rate limit exceeded", code=-32005))
    assert endpoint_trouble("eth_blockNumber", RpcError("header not found"))
    assert endpoint_trouble("eth_getLogs", RpcError("Too Many Requests, rate limit"))
    assert not endpoint_trouble("eth_getLogs", RpcError("query exceeds max block range 1000", code=-32005))
    assert not endpoint_trouble("eth_call", RpcError("execution reverted: over capacity", data="0x08c379a0"))
    assert not endpoint_trouble("eth_sendRawTransaction", RpcError("nonce too low"))


def test_fee_settings(monkeypatch):
    monkeypatch.setenv("INTELLECT_MAX_FEE_GWEI", "inf")
    with pytest.raises(Exception, match="finite"):
        env_number("INTELLECT_MAX_FEE_GWEI", 1.0)
    monkeypatch.setenv("INTELLECT_MAX_FEE_GWEI", "7")
    assert env_number("INTELLECT_MAX_FEE_GWEI", 1.0) == 7.0
    assert bumped_fees(10, 10, (0, 0), cap=10) is None
