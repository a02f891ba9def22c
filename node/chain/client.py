"""The chain client every role shares: typed calls, transactions and event history for the protocol
contracts of one deployment."""

from __future__ import annotations

import logging
import os
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from . import abi
from .deployment import Deployment
from .errors import ChainError, DeploymentError, RpcError, WrongChain
from .rpc import RANGE_REFUSAL, RpcClient
from .tx import Receipt, TxJournal, TxSender, revert_from_rpc

log = logging.getLogger(__name__)

#: Blocks per `eth_getLogs` call at first (`INTELLECT_LOG_RANGE` sets another). A provider that refuses
#: a range (many cap it at 1,000 to 10,000 blocks or so many results) gets half of it, down to one block;
#: the client keeps the smaller range for its later reads.
LOG_CHUNK_BLOCKS = 2_000
MAX_LOGS = 1_000_000
#: Pages read without a refusal after which a halved range is doubled again (up to the configured one).
LOG_RANGE_REGROW = 64


#: Blocks an event or a transaction must be buried under before any role acts on it, per network
#: (`INTELLECT_CONFIRMATIONS` sets another): anvil never reorganises; an L2's sequencer rarely does, and
#: only by a block or two. A reorganisation deeper than this is detected (`node.daemon.new_ledger_events`,
#: membership) and what it removed is read again.
CONFIRMATIONS = {"local": 0}
DEFAULT_CONFIRMATIONS = 5


def confirmations_default(network: str) -> int:
    text = os.environ.get("INTELLECT_CONFIRMATIONS", "").strip()
    if not text:
        return CONFIRMATIONS.get(network, DEFAULT_CONFIRMATIONS)
    if not text.isdigit():
        raise ChainError(f"INTELLECT_CONFIRMATIONS={text!r} is not a number of blocks")
    return int(text)


def log_range_default() -> int:
    text = os.environ.get("INTELLECT_LOG_RANGE", "").strip()
    if not text:
        return LOG_CHUNK_BLOCKS
    if not text.isdigit() or int(text) < 1:
        raise ChainError(f"INTELLECT_LOG_RANGE={text!r} is not a positive number of blocks")
    return int(text)


class ChainClient:
    """Bound to one RPC endpoint and one deployment; optionally to a signing account."""

    def __init__(self, rpc: RpcClient, deployment: Deployment, sender: TxSender | None = None) -> None:
        self.rpc = rpc
        self.deployment = deployment
        self.sender = sender
        self.log_range = self._log_range_max = log_range_default()
        self._log_range_ok = 0  # pages read since the range last changed
        self.confirmations = confirmations_default(deployment.network)
        self.log_range_refusals = 0  # how often a provider refused a range (each halves `log_range`)
        self._by_address = {addr.lower(): name for name, addr in deployment.contracts.items()}

    @classmethod
    async def connect(
        cls,
        rpc_url: str,
        deployment: Deployment,
        account: LocalAccount | None = None,
        *,
        journal: TxJournal | None = None,
        receipt_timeout: float = 120.0,
        check_code: bool = True,
        rpc_retries: int = 3,
    ) -> ChainClient:
        """Connect and check that the endpoint serves the deployment's chain and contracts."""
        rpc = RpcClient(rpc_url, retries=rpc_retries)
        try:
            chain_id = await rpc.chain_id()
            if chain_id != deployment.chain_id:
                raise WrongChain(
                    f"the RPC endpoint serves chain id {chain_id}, the deployment is for chain id {deployment.chain_id}",
                    "point --rpc-url at the right chain or pass the matching --deployment",
                )
            rpc.bind_chain(chain_id)  # a failover endpoint must show the same chain before it is used
            if check_code:
                addr = deployment.address("WorkLedger")
                if (await rpc.code(addr)) in ("0x", "", None):
                    raise DeploymentError(
                        f"no contract at {addr} on chain {chain_id}: the chain was reset or the deployment file is stale",
                        "redeploy with `intellect-node contracts deploy`",
                    )
        except BaseException:
            await rpc.aclose()
            raise
        client = cls(rpc, deployment)
        if account is not None:
            client.sender = TxSender(
                rpc, account, chain_id, journal=journal, receipt_timeout=receipt_timeout, decode_logs=client.decode_logs,
                confirmations=client.confirmations,
            )  # fmt: skip
        return client

    async def aclose(self) -> None:
        await self.rpc.aclose()

    async def __aenter__(self) -> ChainClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ basics

    @property
    def address(self) -> str:
        """The signing account's address."""
        return self._require_sender().address

    def _require_sender(self) -> TxSender:
        if self.sender is None:
            raise ChainError("this command needs a signing key", "pass --keystore FILE or set INTELLECT_PRIVATE_KEY")
        return self.sender

    def contract(self, name: str) -> str:
        return self.deployment.address(name)

    async def call(self, contract: str, fn: str, *args: Any, block: str = "latest", sender: str | None = None) -> Any:
        f = abi.load(contract).fn(fn)
        try:
            out = await self.rpc.call(self.contract(contract), f.encode(args), sender=sender, block=block)
        except RpcError as err:
            raise revert_from_rpc(err, f"{contract}.{fn}") from None
        try:
            return f.decode(out)
        except Exception as exc:  # eth_abi's decoding errors: an answer that is no return value of `fn`
            raise RpcError(
                f"{contract}.{fn}: the RPC endpoint's answer {out[:74]!r} is not its return value ({exc})",
                hint="no contract at the deployment's address on this chain, or a broken endpoint",
            ) from None

    async def transact(
        self,
        contract: str,
        fn: str,
        *args: Any,
        what: str | None = None,
        gas: int | None = None,
        min_gas: int = 0,
    ) -> Receipt:
        f = abi.load(contract).fn(fn)
        return await self._require_sender().send(
            self.contract(contract), f.encode(args), what=what or f"{contract}.{fn}", gas=gas, min_gas=min_gas
        )

    def decode_logs(self, logs: list[dict[str, Any]]) -> list[abi.DecodedEvent]:
        out = []
        for log in logs:
            name = self._by_address.get(str(log.get("address", "")).lower())
            if name is None:
                continue
            ev = abi.load(name).decode_log(log)
            if ev is not None:
                out.append(ev)
        return out

    async def events(
        self,
        contracts: list[str] | None = None,
        *,
        from_block: int | None = None,
        to_block: int | None = None,
        topics: list[Any] | None = None,
        chunk: int | None = None,
    ) -> list[abi.DecodedEvent]:
        """Decoded events of the deployment's contracts, oldest first, fetched in bounded block ranges
        (`chunk`, default `log_range`; halved while the provider refuses a range)."""
        names = contracts or list(self.deployment.contracts)
        addresses = [self.contract(n) for n in names]
        start = self.deployment.block if from_block is None else from_block
        end = await self.rpc.block_number() if to_block is None else to_block
        step = chunk or self.log_range
        logs: list[dict[str, Any]] = []
        lo = start
        while lo <= end:
            hi = min(end, lo + step - 1)
            try:
                page = await self.rpc.get_logs(addresses, lo, hi, topics)
            except RpcError as err:
                if hi == lo or not any(w in str(err).lower() for w in RANGE_REFUSAL):
                    raise
                step = max(1, (hi - lo + 1) // 2)  # the provider caps the range (or the results): half of it
                self.log_range = min(self.log_range, step)
                self.log_range_refusals += 1
                self._log_range_ok = 0
                log.warning(
                    "eth_getLogs over %d blocks refused (%s); reading %d blocks at a time", hi - lo + 1, err, step
                )
                continue
            logs.extend(page)
            if len(logs) > MAX_LOGS:
                raise ChainError(f"more than {MAX_LOGS} logs between blocks {start} and {end}", "narrow the range")
            lo = hi + 1
            self._log_range_ok += 1
            if self._log_range_ok >= LOG_RANGE_REGROW and self.log_range < self._log_range_max:
                self.log_range = min(self._log_range_max, self.log_range * 2)  # a refusal may have been a bad moment
                self._log_range_ok = 0
        events = self.decode_logs(logs)
        events.sort(key=lambda e: (e.block_number, e.log_index))
        return events

    async def timestamp(self, block: int | str = "latest") -> int:
        return int((await self.rpc.get_block(block))["timestamp"], 16)

    # ------------------------------------------------------------------ token helpers

    async def token_balance(self, who: str) -> int:
        return int(await self.call("IntellectToken", "balanceOf", to_checksum_address(who)))

    async def ensure_allowance(self, spender_contract: str, amount: int) -> Receipt | None:
        """Approve `spender_contract` for `amount` if the current allowance is lower."""
        spender = self.contract(spender_contract)
        have = int(await self.call("IntellectToken", "allowance", self.address, spender))
        if have >= amount:
            return None
        return await self.transact("IntellectToken", "approve", spender, amount, what="token approval")
