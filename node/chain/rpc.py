"""A small JSON-RPC client for Ethereum nodes that runs natively under trio (httpx + anyio).

Reads are retried a bounded number of times on transport failures; writes (`eth_sendRawTransaction`)
are idempotent by construction (a signed transaction has one hash), so re-sending the same bytes can
never create a second transaction.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import httpx
import trio

from .errors import RpcError, RpcUnavailable

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class RpcClient:
    """JSON-RPC over HTTP. Use as an async context manager, or call `aclose()`."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 15.0,
        retries: int = 3,
        backoff: float = 0.25,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise RpcUnavailable(f"RPC URL {url!r} is not an http(s) URL", "pass --rpc-url http://host:port")
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._ids = itertools.count(1)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=httpx.Limits(max_connections=64))

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, params: list[Any] | None = None, *, retry: bool = True) -> Any:
        """One JSON-RPC call. Transport failures are retried `retries` times with back-off;
        JSON-RPC errors are raised at once as `RpcError` (with the node's `data`, e.g. revert bytes)."""
        payload = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or []}
        attempts = 1 + (self.retries if retry else 0)
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                await trio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                resp = await self._http.post(self.url, json=payload)
            except (httpx.TransportError, OSError) as exc:
                last = exc
                log.debug("rpc %s attempt %d failed: %s", method, attempt + 1, exc)
                continue
            if resp.status_code >= 500 or resp.status_code == 429:
                last = RpcUnavailable(f"RPC endpoint {self.url} answered HTTP {resp.status_code}")
                continue
            if len(resp.content) > MAX_RESPONSE_BYTES:
                raise RpcError(f"RPC response to {method} is larger than {MAX_RESPONSE_BYTES} bytes")
            try:
                body = resp.json()
            except ValueError:
                raise RpcError(f"RPC endpoint {self.url} sent a non-JSON answer (HTTP {resp.status_code})") from None
            if not isinstance(body, dict):
                raise RpcError(f"RPC endpoint {self.url} sent a malformed answer to {method}")
            if "error" in body and body["error"] is not None:
                err = body["error"]
                raise RpcError(str(err.get("message", err)), code=err.get("code"), data=err.get("data"))
            return body.get("result")
        raise RpcUnavailable(
            f"cannot reach the RPC endpoint {self.url} ({last})",
            "check that the node is running and --rpc-url / INTELLECT_RPC_URL points at it",
        )

    async def chain_id(self) -> int:
        return int(await self.request("eth_chainId"), 16)

    async def block_number(self) -> int:
        return int(await self.request("eth_blockNumber"), 16)

    async def get_block(self, tag: str | int = "latest") -> dict[str, Any]:
        t = hex(tag) if isinstance(tag, int) else tag
        block = await self.request("eth_getBlockByNumber", [t, False])
        if block is None:
            raise RpcError(f"block {tag} not found")
        return dict(block)

    async def balance(self, address: str, tag: str = "latest") -> int:
        return int(await self.request("eth_getBalance", [address, tag]), 16)

    async def code(self, address: str) -> str:
        return str(await self.request("eth_getCode", [address, "latest"]))

    async def call(self, to: str, data: str, *, sender: str | None = None, block: str = "latest") -> str:
        tx: dict[str, Any] = {"to": to, "data": data}
        if sender:
            tx["from"] = sender
        return str(await self.request("eth_call", [tx, block]))

    async def get_logs(
        self,
        addresses: list[str],
        from_block: int,
        to_block: int,
        topics: list[Any] | None = None,
    ) -> list[dict[str, Any]]:
        flt: dict[str, Any] = {"address": addresses, "fromBlock": hex(from_block), "toBlock": hex(to_block)}
        if topics:
            flt["topics"] = topics
        return list(await self.request("eth_getLogs", [flt]))
