"""Transaction sending against a real anvil: retries never duplicate a transaction, failures are
explained, timeouts carry the hash."""

from __future__ import annotations

import pytest

from node.chain import ChainClient, ContractRevert, RpcUnavailable, TxTimeout, abi
from node.chain.rpc import RpcClient
from node.chain.tx import TxSender
from pool.deploy import TOKEN
from tests.conftest import World


class LosesFirstBroadcastAnswer(RpcClient):
    """Delivers the first eth_sendRawTransaction to the node but reports the answer as lost."""

    lost = 0

    async def request(self, method, params=None, *, retry=True, expect=None):
        result = await super().request(method, params, retry=retry, expect=expect)
        if method == "eth_sendRawTransaction" and self.lost == 0:
            self.lost += 1
            raise RpcUnavailable("connection reset (simulated)")
        return result


class Journal:
    def __init__(self):
        self.events = []

    def signed(self, tx_hash, nonce, raw, label):
        self.events.append(("signed", tx_hash, nonce))

    def mined(self, tx_hash, block_number, status):
        self.events.append(("mined", tx_hash, status))


async def nonce(rpc: RpcClient, addr: str) -> int:
    return int(await rpc.request("eth_getTransactionCount", [addr, "latest"]), 16)


def mint_data(to: str, amount: int) -> str:
    return abi.load("IntellectToken").fn("mint").encode([to, amount])


async def test_lost_broadcast_answer_does_not_duplicate(chain: World):
    token = chain.deployment.address("IntellectToken")
    async with LosesFirstBroadcastAnswer(chain.url) as rpc, await chain.client(None) as reader:
        journal = Journal()
        sender = TxSender(rpc, chain.admin, chain.deployment.chain_id, journal=journal, rebroadcast_every=0.05)
        n0 = await nonce(rpc, chain.admin.address)
        b0 = await reader.token_balance(chain.outsider.address)
        r = await sender.send(token, mint_data(chain.outsider.address, 3 * TOKEN))
        assert r.status == 1 and rpc.lost == 1
        assert await nonce(rpc, chain.admin.address) == n0 + 1
        assert await reader.token_balance(chain.outsider.address) == b0 + 3 * TOKEN
        assert journal.events == [("signed", r.tx_hash, n0), ("mined", r.tx_hash, 1)]


async def test_nonce_taken_elsewhere_is_resigned_once(chain: World):
    token = chain.deployment.address("IntellectToken")
    async with RpcClient(chain.url) as rpc, await chain.client(None) as reader:
        a = TxSender(rpc, chain.admin, chain.deployment.chain_id)
        b = TxSender(rpc, chain.admin, chain.deployment.chain_id)  # another process with the same key
        await a.send(token, mint_data(chain.outsider.address, 1))
        await b.send(token, mint_data(chain.outsider.address, 1))  # takes the nonce `a` has cached
        b0 = await reader.token_balance(chain.outsider.address)
        n0 = await nonce(rpc, chain.admin.address)
        await a.send(token, mint_data(chain.outsider.address, 5))
        assert await nonce(rpc, chain.admin.address) == n0 + 1
        assert await reader.token_balance(chain.outsider.address) == b0 + 5


async def test_on_chain_revert_is_explained(chain: World):
    async with await chain.client(chain.outsider) as c:
        data = abi.load("WorkLedger").fn("invalidateWork").encode([1, "0x" + "01" * 32, "0x" + "00" * 32, True, b""])
        with pytest.raises(ContractRevert) as e:
            await c.sender.send(c.contract("WorkLedger"), data, gas=200_000, what="invalidation")
        assert e.value.name == "UnknownWork" and "reverted on chain" in str(e.value)


async def test_receipt_timeout_carries_the_hash(chain: World):
    token = chain.deployment.address("IntellectToken")
    async with RpcClient(chain.url) as rpc:
        await rpc.request("evm_setAutomine", [False])
        try:
            sender = TxSender(rpc, chain.admin, chain.deployment.chain_id, receipt_timeout=0.3, rebroadcast_every=0.1)
            with pytest.raises(TxTimeout) as e:
                await sender.send(token, mint_data(chain.outsider.address, 1))
            await rpc.request("evm_mine", [])
            r = await sender.wait(e.value.tx_hash)
            assert r.status == 1
        finally:
            await rpc.request("evm_setAutomine", [True])


async def test_preflight_revert_sends_nothing(chain: World):
    async with await chain.client(chain.outsider) as c:
        n0 = await nonce(c.rpc, chain.outsider.address)
        with pytest.raises(ContractRevert) as e:
            await c.transact("PoolManager", "startPool", 999)
        assert e.value.name == "UnknownPool" and "pool 999 does not exist" in str(e.value)
        assert await nonce(c.rpc, chain.outsider.address) == n0


async def test_wrong_chain_detected_on_connect(chain: World):
    from dataclasses import replace

    from node.chain import WrongChain

    with pytest.raises(WrongChain):
        await ChainClient.connect(chain.url, replace(chain.deployment, chain_id=1))
