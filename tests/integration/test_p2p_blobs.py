"""Hash-checked blob transfer between real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
from contextlib import AsyncExitStack
from pathlib import Path

import msgpack
import pytest
import trio
from eth_account import Account

from node.p2p.blobs import UPLOAD_PROTOCOL, BlobStore, blob_key, fetch_blob, serve_blobs, upload_blob
from node.p2p.host import P2PError, P2PNode


def new_key() -> bytes:
    return bytes(Account.create().key)


async def start(stack: AsyncExitStack, n: int) -> list[P2PNode]:
    return [await stack.enter_async_context(P2PNode(private_key=new_key())) for _ in range(n)]


class TamperingStore(BlobStore):
    def read(self, key: str, offset: int, size: int) -> tuple[int, bytes] | None:
        got = super().read(key, offset, size)
        if got is None or offset > 10 or len(got[1]) <= 10 - offset:
            return got
        data = got[1]
        i = 10 - offset
        return got[0], data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]


class CountingStore(BlobStore):
    gets = 0  # chunk reads; each reads only its own bytes

    def read(self, key: str, offset: int, size: int) -> tuple[int, bytes] | None:
        self.gets += 1
        return super().read(key, offset, size)


def test_store_put_get_has(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=1000)
    data = b"hello"
    key = store.put(data)
    assert key == "0x" + hashlib.sha256(data).hexdigest()
    assert (tmp_path / key[2:]).is_file()
    assert store.has(key) and store.get(key) == data
    assert store.get("0x" + "00" * 32) is None and not store.has("nonsense")
    with pytest.raises(ValueError, match="exceeds"):
        store.put(b"x" * 1001)


async def test_fetch_and_errors(tmp_path: Path) -> None:
    blob = os.urandom(1 << 20)
    async with AsyncExitStack() as stack:
        a, b, c = await start(stack, 3)
        store = CountingStore(tmp_path / "a", max_bytes=4 << 20)
        key = store.put(blob)
        serve_blobs(a, store)
        bad = TamperingStore(tmp_path / "c", max_bytes=4 << 20)
        bad.put(blob)
        serve_blobs(c, bad)
        await b.connect(a.listen_addrs[0])
        await b.connect(c.listen_addrs[0])

        with trio.fail_after(10):
            got = await fetch_blob(b, a.peer_id, key, max_bytes=2 << 20)
        assert got == blob

        with pytest.raises(P2PError, match="refused"):
            await fetch_blob(b, a.peer_id, blob_key(b"missing"), max_bytes=2 << 20)

        result = None
        with pytest.raises(P2PError, match="hash mismatch"):
            result = await fetch_blob(b, c.peer_id, key, max_bytes=2 << 20)
        assert result is None

        store.gets = 0
        with pytest.raises(P2PError, match="over the limit"):
            await fetch_blob(b, a.peer_id, key, max_bytes=100_000)
        assert store.gets == 1  # refused after the first chunk, not the whole blob


async def test_upload(tmp_path: Path) -> None:
    data = os.urandom(700 * 1024)
    async with AsyncExitStack() as stack:
        a, b = await start(stack, 2)
        store_b = BlobStore(tmp_path / "b", max_bytes=2 << 20)
        serve_blobs(b, store_b)
        await a.connect(b.listen_addrs[0])

        with trio.fail_after(10):
            key = await upload_blob(a, b.peer_id, data)
        assert key == blob_key(data)
        assert store_b.get(key) == data

        # Declared key does not match the bytes: refused on the last chunk, nothing stored.
        forged = os.urandom(1000)
        wrong = blob_key(b"something else")
        with pytest.raises(P2PError, match="refused"):
            await a.request(b.peer_id, UPLOAD_PROTOCOL, msgpack.packb([wrong, 0, len(forged), forged]))
        assert not store_b.has(wrong) and not store_b.has(blob_key(forged))
        assert list((tmp_path / "b" / ".uploads").iterdir()) == []

        # Malformed request and out-of-order chunk go through the error path too.
        with pytest.raises(P2PError, match="refused"):
            await a.request(b.peer_id, UPLOAD_PROTOCOL, msgpack.packb(["zz", 0]))
        with pytest.raises(P2PError, match="refused"):
            await a.request(b.peer_id, UPLOAD_PROTOCOL, msgpack.packb([wrong, 5, 10, b"abc"]))
