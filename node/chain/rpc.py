"""A small JSON-RPC client for Ethereum nodes that runs natively under trio (httpx + anyio), over one
or several endpoints with failover.

Reads are retried a bounded number of times on transport failures; writes (`eth_sendRawTransaction`)
are idempotent by construction (a signed transaction has one hash), so re-sending the same bytes can
never create a second transaction. With several URLs (`--rpc-url a,b` or `INTELLECT_RPC_URL=a,b`) a
failing endpoint is rested for a while (longer after each failure in a row) and the next one answers;
an endpoint is used only after it has shown the chain id the client was bound to.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from ..decoding import DecodeError, loads_json
from .errors import RpcError, RpcUnavailable, WrongChain

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: Seconds a failed endpoint rests before it is tried again: doubled per failure in a row, capped.
REST_FIRST, REST_MAX = 2.0, 60.0
MAX_ENDPOINTS = 16
#: Values in one answer (an eth_getLogs page of many logs); its depth is bounded at the default.
RPC_MAX_VALUES = 8_000_000


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """The endpoint list of `--rpc-url` / `INTELLECT_RPC_URL` (comma-separated) or a list. Pure."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out: list[str] = []
    for u in (x.strip() for x in items):
        if not u:
            continue
        if not u.startswith(("http://", "https://")):
            raise RpcUnavailable(f"RPC URL {u!r} is not an http(s) URL", "pass --rpc-url http://host:port[,http://...]")
        if u not in out:
            out.append(u)
    if not out:
        raise RpcUnavailable("no RPC URL given", "pass --rpc-url http://host:port or set INTELLECT_RPC_URL")
    if len(out) > MAX_ENDPOINTS:
        raise RpcUnavailable(f"{len(out)} RPC URLs given; at most {MAX_ENDPOINTS}")
    return out


# ---------------------------------------------------------------- answers, checked before anyone uses them
# A malformed answer is the endpoint's failure (it rests, the next one answers), never a crash deeper in.

_HEX = frozenset("0123456789abcdefABCDEF")


def quantity(v: Any) -> int:
    """A JSON-RPC quantity ("0x1a")."""
    if isinstance(v, str) and v[:2] in ("0x", "0X") and 2 < len(v) <= 66 and _HEX.issuperset(v[2:]):
        return int(v, 16)
    raise ValueError(f"not a hex quantity: {str(v)[:60]!r}")


def hex_data(v: Any, size: int | None = None) -> str:
    """0x-prefixed hex bytes (of `size` bytes when given)."""
    ok = isinstance(v, str) and v[:2] == "0x" and len(v) % 2 == 0 and _HEX.issuperset(v[2:])
    if ok and (size is None or len(v) == 2 + 2 * size):
        return str(v)
    raise ValueError(f"not hex data{f' of {size} bytes' if size else ''}: {str(v)[:60]!r}")


def block_or_none(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError("a block is not an object")
    hex_data(v.get("hash"), 32)
    quantity(v.get("number"))
    quantity(v.get("timestamp"))
    if v.get("baseFeePerGas") is not None:
        quantity(v["baseFeePerGas"])
    return v


def log_entries(v: Any) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise ValueError("the logs are not a list")
    for entry in v:
        if not isinstance(entry, dict) or not isinstance(entry.get("topics"), list) or len(entry["topics"]) > 4:
            raise ValueError("a log entry is malformed")
        hex_data(entry.get("address"), 20)
        for t in entry["topics"]:
            hex_data(t, 32)
        hex_data(entry.get("data"))
        hex_data(entry.get("transactionHash"), 32)
        quantity(entry.get("blockNumber"))
        quantity(entry.get("logIndex"))
    return v


def receipt_or_none(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError("a receipt is not an object")
    hex_data(v.get("transactionHash"), 32)
    hex_data(v.get("blockHash"), 32)
    for k in ("blockNumber", "gasUsed", "status"):
        quantity(v.get(k))
    log_entries(v.get("logs", []))
    return v


#: Words of providers' errors that say "not now, not here" (rate limits, a lagging backend): the
#: endpoint rests and the next one answers. For `eth_getLogs`, "limit" words may also mean the range
#: was too large: those are left to the caller (`ChainClient.events` halves the range).
_TROUBLE = ("rate limit", "too many requests", "capacity", "header not found", "unknown block", "try again",
            "daily", "credits", "throttl", "overloaded", "timeout", "timed out")  # fmt: skip
RANGE_REFUSAL = ("range", "results", "too large", "too many logs", "response size", "limit", "exceed", "10000")


def endpoint_trouble(method: str, err: RpcError) -> bool:
    """Whether a JSON-RPC error is the endpoint's trouble (retry elsewhere) rather than an answer. Pure."""
    text = str(err).lower()
    if "revert" in text or (isinstance(err.data, str) and err.data.startswith("0x")):
        return False  # the contract's answer, whatever words its reason uses
    if method == "eth_getLogs" and any(w in text for w in RANGE_REFUSAL) and "rate" not in text:
        return False
    return err.code in (-32005, -32090) or any(w in text for w in _TROUBLE)


@dataclass
class Endpoint:
    url: str
    calls: int = 0
    failures: int = 0  # in a row
    total_failures: int = 0
    rest_until: float = 0.0  # monotonic
    last_error: str = ""
    chain_ok: bool = False  # has answered eth_chainId with the bound chain id
    wrong_chain: bool = False  # answered with another chain id: never used again

    def usable(self, now: float) -> bool:
        return not self.wrong_chain and self.rest_until <= now


class RpcClient:
    """JSON-RPC over HTTP to one or several endpoints. Use as an async context manager, or call
    `aclose()`."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        timeout: float = 15.0,
        retries: int = 3,
        backoff: float = 0.25,
    ) -> None:
        self.endpoints = [Endpoint(u) for u in parse_urls(url)]
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.chain_id_bound: int | None = None
        self._ids = itertools.count(1)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=httpx.Limits(max_connections=64))

    @property
    def url(self) -> str:
        """The endpoint answering now (the first usable one)."""
        return self._order()[0].url

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def bind_chain(self, chain_id: int) -> None:
        """From now on an endpoint is used only after it answers `eth_chainId` with `chain_id`."""
        self.chain_id_bound = chain_id

    def health(self) -> list[dict[str, Any]]:
        """Each endpoint's state, for status pages and logs."""
        now = time.monotonic()
        return [
            {
                "url": e.url,
                "ok": e.usable(now) and e.failures == 0,
                "calls": e.calls,
                "failures": e.total_failures,
                "resting_s": round(max(0.0, e.rest_until - now), 1),
                "wrong_chain": e.wrong_chain,
                "last_error": e.last_error,
            }
            for e in self.endpoints
        ]

    def _order(self) -> list[Endpoint]:
        """Usable endpoints in configured order, then resting ones (soonest back first), never the
        ones on another chain; all of them resting is still an order to try."""
        now = time.monotonic()
        live = [e for e in self.endpoints if e.usable(now)]
        resting = sorted(
            (e for e in self.endpoints if not e.wrong_chain and not e.usable(now)), key=lambda e: e.rest_until
        )
        return live + resting or self.endpoints[:1]

    def _failed(self, e: Endpoint, why: str) -> None:
        e.failures += 1
        e.total_failures += 1
        e.last_error = why
        e.rest_until = time.monotonic() + min(REST_MAX, REST_FIRST * 2 ** (e.failures - 1))
        if len(self.endpoints) > 1:
            log.warning("RPC endpoint %s failed (%s); resting it %.0f s", e.url, why, e.rest_until - time.monotonic())

    async def _post(self, e: Endpoint, method: str, params: list[Any]) -> Any:
        """One call to one endpoint, whole within `timeout`, its answer at most MAX_RESPONSE_BYTES (read
        in pieces, never whole first). Raises RpcUnavailable for the endpoint's failures (transport,
        HTTP errors, a non-JSON or oversized answer) or RpcError for a JSON-RPC error."""
        payload = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}
        e.calls += 1
        try:
            with trio.fail_after(self.timeout):
                async with self._http.stream("POST", e.url, json=payload) as resp:
                    if resp.status_code >= 500 or resp.status_code in (401, 403, 404, 408, 429):
                        raise RpcUnavailable(f"RPC endpoint {e.url} answered HTTP {resp.status_code}")
                    parts, size = [], 0
                    async with contextlib.aclosing(resp.aiter_bytes()) as chunks:
                        async for chunk in chunks:
                            size += len(chunk)
                            if size > MAX_RESPONSE_BYTES:
                                raise RpcUnavailable(
                                    f"RPC endpoint {e.url} answered {method} with over {MAX_RESPONSE_BYTES} bytes"
                                )
                            parts.append(chunk)
        except trio.TooSlowError:
            raise RpcUnavailable(f"RPC endpoint {e.url} did not answer {method} within {self.timeout:.0f} s") from None
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            raise RpcUnavailable(f"cannot reach the RPC endpoint {e.url} ({exc!r})") from None
        try:
            body = loads_json(
                b"".join(parts), what="the answer", max_bytes=MAX_RESPONSE_BYTES, max_items=RPC_MAX_VALUES
            )
        except DecodeError as exc:
            raise RpcUnavailable(
                f"RPC endpoint {e.url} sent an answer to {method} that is refused: {exc} (HTTP {resp.status_code})"
            ) from None
        if not isinstance(body, dict):
            raise RpcUnavailable(f"RPC endpoint {e.url} sent a malformed answer to {method}")
        if "error" in body and body["error"] is not None:
            err = body["error"]
            if not isinstance(err, dict):
                raise RpcUnavailable(f"RPC endpoint {e.url} sent a malformed error for {method}")
            code = err.get("code") if isinstance(err.get("code"), int) else None
            raise RpcError(str(err.get("message", err))[:2000], code=code, data=err.get("data"))
        return body.get("result")

    async def _check_chain(self, e: Endpoint) -> None:
        """Before a failover endpoint answers anything, it must serve the chain the client is bound to."""
        if self.chain_id_bound is None or e.chain_ok:
            return
        try:
            got = quantity(await self._post(e, "eth_chainId", []))
        except (RpcError, ValueError) as exc:
            raise RpcUnavailable(f"RPC endpoint {e.url} did not say its chain id ({exc})") from None
        if got != self.chain_id_bound:
            e.wrong_chain = True
            log.error("RPC endpoint %s serves chain %d, not %d: it is not used", e.url, got, self.chain_id_bound)
            raise WrongChain(f"RPC endpoint {e.url} serves chain id {got}, not {self.chain_id_bound}")
        e.chain_ok = True

    async def request(
        self, method: str, params: list[Any] | None = None, *, retry: bool = True, expect: Any = None
    ) -> Any:
        """One JSON-RPC call, answered by the first endpoint that can; `expect(result)` checks and
        converts the answer. An endpoint's failure (transport, HTTP error, a malformed answer, a rate
        limit or a lagging backend's error) moves on to the next endpoint at once, and after a round in
        which every endpoint failed the call waits (back-off) and tries again, `retries` times; other
        JSON-RPC errors are raised at once as `RpcError` (with the node's `data`, e.g. revert bytes)."""
        rounds = 1 + (self.retries if retry else 0)
        last: Exception | None = None
        for attempt in range(rounds):
            if attempt:
                await trio.sleep(self.backoff * 2 ** (attempt - 1))
            for e in self._order():
                try:
                    await self._check_chain(e)
                    result = await self._post(e, method, params or [])
                    if expect is not None:
                        result = expect(result)
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    last = RpcUnavailable(f"RPC endpoint {e.url} sent a malformed answer to {method}: {exc}")
                    self._failed(e, str(last))
                    continue
                except (RpcUnavailable, WrongChain) as exc:
                    last = exc
                    if isinstance(exc, RpcUnavailable):
                        self._failed(e, str(exc))
                    log.debug("rpc %s on %s failed: %s", method, e.url, exc)
                    continue
                except RpcError as err:
                    if endpoint_trouble(method, err):
                        last = err
                        self._failed(e, str(err))
                        continue
                    e.failures = 0
                    raise
                e.failures = 0
                return result
        urls = ", ".join(e.url for e in self.endpoints)
        raise RpcUnavailable(
            f"cannot reach the RPC endpoint{'s' if len(self.endpoints) > 1 else ''} {urls} ({last})",
            "check that the node is running and --rpc-url / INTELLECT_RPC_URL points at it",
        )

    async def chain_id(self) -> int:
        return int(await self.request("eth_chainId", expect=quantity))

    async def block_number(self) -> int:
        return int(await self.request("eth_blockNumber", expect=quantity))

    async def get_block(self, tag: str | int = "latest") -> dict[str, Any]:
        t = hex(tag) if isinstance(tag, int) else tag
        block = await self.request("eth_getBlockByNumber", [t, False], expect=block_or_none)
        if block is None:
            raise RpcError(f"block {tag} not found")
        return dict(block)

    async def block_hash(self, number: int) -> str | None:
        """The hash of block `number` in the node's chain now; None if it has no such block."""
        block = await self.request("eth_getBlockByNumber", [hex(number), False], expect=block_or_none)
        return str(block["hash"]) if block is not None else None

    async def balance(self, address: str, tag: str = "latest") -> int:
        return int(await self.request("eth_getBalance", [address, tag], expect=quantity))

    async def nonce(self, address: str, tag: str = "latest") -> int:
        """The account's transaction count at `tag` (a block number or "latest" / "pending")."""
        t = hex(tag) if isinstance(tag, int) else tag
        return int(await self.request("eth_getTransactionCount", [address, t], expect=quantity))

    async def receipt(self, tx_hash: str) -> dict[str, Any] | None:
        """The receipt of `tx_hash`, checked to be that transaction's; None while it is not mined."""

        def mine(v: Any) -> dict[str, Any] | None:
            rc = receipt_or_none(v)
            if rc is not None and str(rc["transactionHash"]).lower() != tx_hash.lower():
                raise ValueError(f"the receipt asked for {tx_hash} is another transaction's")
            return rc

        return await self.request("eth_getTransactionReceipt", [tx_hash], expect=mine)  # type: ignore[no-any-return]

    async def code(self, address: str) -> str:
        return str(await self.request("eth_getCode", [address, "latest"], expect=hex_data))

    async def call(self, to: str, data: str, *, sender: str | None = None, block: str = "latest") -> str:
        tx: dict[str, Any] = {"to": to, "data": data}
        if sender:
            tx["from"] = sender
        return str(await self.request("eth_call", [tx, block], expect=hex_data))

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
        return list(await self.request("eth_getLogs", [flt], expect=log_entries))
