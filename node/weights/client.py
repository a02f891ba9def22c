"""Worker side of the weight broadcast: verified, parallel, resumable downloads from several sources.

``await download(version, manifest_hash, sources, dest)`` returns the path of the assembled checkpoint
file (``dest/<version>/<name>``, e.g. ``model.safetensors``), ready for
``VllmEngine.reload_weights(path)``. On the way:

- the manifest is fetched from the first source that has it and refused unless its sha256 equals the
  announced ``manifest_hash`` (nothing from a refused manifest is ever written or loaded);
- shards are fetched by ``parallel`` concurrent workers; each picks the source with the best measured
  throughput per in-flight request (untried sources first), so faster sources get more shards; each
  source prefers its "home" shards (rendezvous hash of source URL and index, identical on every client)
  so relays that fetch on demand hold disjoint parts;
- every shard's sha256 is checked; a corrupt shard is discarded, its source penalised (dropped after
  ``max_strikes`` failures) and the shard retried from another source; ``DownloadError`` when no source
  is left that could supply a shard;
- verified shards are kept under ``dest/<version>/shards/`` until the file is assembled, so a restart
  after an interruption fetches only the missing ones; the assembled file is checked against the
  whole-file sha256 before it is returned; only the newest ``keep`` versions stay under ``dest``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from node.decoding import loads_json
from node.errors import IntellectError, PeerError
from node.store import DISK_FULL
from node.weights.manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    IntegrityError,
    Manifest,
    assemble,
    missing_shards,
    sha256_hex,
    write_manifest,
    write_shard,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 90.0  # longer than a relay's wait for a shard it is still fetching
SHARD_TIMEOUT = 300.0
DOWNLOAD_TIMEOUT = 3600.0


class SourceError(PeerError):
    """One source failed to supply something (HTTP error, timeout, wrong bytes)."""


class DownloadError(IntellectError):
    """The download as a whole failed (no source can supply a shard, refused manifest, deadline, or
    the checkpoint cannot be written locally)."""


def _disk_error(version: int, dest: Path, exc: OSError) -> DownloadError:
    hint = " (is the disk full?)" if exc.errno in DISK_FULL else ""
    return DownloadError(f"cannot write version {version} under {dest}: {exc.strerror or exc}{hint}")


def make_http_client(max_connections: int = 64, local_address: str | None = None) -> httpx.AsyncClient:
    """The weight fetches' HTTP client; ``local_address`` binds its connections to that source address
    (the benchmark gives each of its loopback clients its own, as if each were another host)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
        limits=limits,
        follow_redirects=False,
        trust_env=False,
        transport=httpx.AsyncHTTPTransport(limits=limits, local_address=local_address) if local_address else None,
    )


async def _get(client: httpx.AsyncClient, url: str, max_bytes: int, timeout: float) -> bytes:
    try:
        with trio.fail_after(timeout):
            async with client.stream("GET", url) as r:
                if r.status_code != 200:
                    raise SourceError(f"{url}: HTTP {r.status_code}")
                declared = r.headers.get("content-length")
                if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
                    raise SourceError(f"{url}: body of {declared} bytes, at most {max_bytes} expected")
                buf = bytearray()
                async for chunk in r.aiter_raw():
                    buf += chunk
                    if len(buf) > max_bytes:
                        raise SourceError(f"{url}: body over {max_bytes} bytes")
                return bytes(buf)
    except trio.TooSlowError:
        raise SourceError(f"{url}: no answer within {timeout:.0f} s") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        raise SourceError(f"{url}: {type(exc).__name__}: {exc}") from None


async def fetch_manifest(
    client: httpx.AsyncClient, sources: list[str], version: int, manifest_hash: str, timeout: float = 60.0
) -> Manifest:
    """The manifest of ``version`` from the first source whose copy hashes to ``manifest_hash``.

    Sources are tried in turn, rounds repeated with a short backoff until ``timeout``; a copy with
    another hash is refused (``DownloadError`` when every answer was such a copy), never parsed.
    """
    expected = manifest_hash.lower().removeprefix("0x")
    errors: list[str] = []
    wrong = 0
    with trio.move_on_after(timeout):
        delay = 0.2
        while True:
            for base in sources:
                url = f"{base.rstrip('/')}/v/{version}/manifest.json"
                try:
                    body = await _get(client, url, MAX_MANIFEST_BYTES, min(timeout, READ_TIMEOUT))
                except SourceError as exc:
                    errors.append(str(exc))
                    continue
                if hashlib.sha256(body).hexdigest() != expected:
                    wrong += 1
                    errors.append(f"{url}: manifest hash differs from the announced one")
                    continue
                m = Manifest.from_json(body)
                if m.version != version:
                    raise DownloadError(f"manifest announced for version {version} is for version {m.version}")
                return m
            if wrong and wrong >= len(sources):
                break
            await trio.sleep(delay)
            delay = min(delay * 2, 5.0)
    if wrong:
        raise DownloadError(f"refused the manifest of version {version}: its hash differs from the announced one")
    last = errors[-1] if errors else "timed out"
    raise DownloadError(f"no source supplied the manifest of version {version} ({last})")


PROBE_TIMEOUT = 5.0
MAX_VERSIONS_BYTES = 64 * 1024


async def probe_relay(
    client: httpx.AsyncClient, base: str, history: dict[int, str], timeout: float = PROBE_TIMEOUT
) -> str | None:
    """Check that ``base`` serves one of the pool's checkpoints: None if it does, else why not.

    ``history`` maps the pool's recent versions to their manifest hashes. The relay's ``/versions`` names
    what it holds; the newest version it holds with a hash from ``history`` is fetched as
    ``/v/<version>/manifest.json`` and must hash to it. Both requests are bounded in time and size.
    """
    want = {v: h.lower().removeprefix("0x") for v, h in history.items() if h}
    root = base.rstrip("/")
    try:
        body = await _get(client, f"{root}/versions", MAX_VERSIONS_BYTES, timeout)
        listing = loads_json(body, what="version list", max_bytes=MAX_VERSIONS_BYTES)
        held = {
            int(e["version"]): str(e["manifest_hash"]).lower()
            for e in listing["versions"]
            if isinstance(e, dict) and type(e.get("version")) is int
        }
    except SourceError as exc:
        return str(exc)
    except (ValueError, KeyError, TypeError):
        return f"{base}/versions: not a weight server's version list"
    ours = sorted((v for v, h in held.items() if want.get(v) == h), reverse=True)
    if not ours:
        return "holds none of the pool's recent versions"
    v = ours[0]
    try:
        body = await _get(client, f"{root}/v/{v}/manifest.json", MAX_MANIFEST_BYTES, timeout)
    except SourceError as exc:
        return str(exc)
    if hashlib.sha256(body).hexdigest() != want[v]:
        return f"{base}: the manifest of version {v} differs from the pool's"
    return None


async def fetch_shard(
    client: httpx.AsyncClient, base: str, manifest: Manifest, index: int, timeout: float = SHARD_TIMEOUT
) -> bytes:
    """Shard ``index`` from ``base``, verified against the manifest; ``SourceError`` on wrong bytes."""
    info = manifest.shards[index]
    url = f"{base.rstrip('/')}/v/{manifest.version}/shard/{index}"
    data = await _get(client, url, info.size, timeout)
    if len(data) != info.size or sha256_hex(data) != info.sha256:
        raise CorruptShard(f"{url}: shard bytes do not match the manifest")
    return data


class CorruptShard(SourceError):
    pass


@dataclass
class SourceState:
    url: str
    rate: float | None = None  # bytes/s, exponentially averaged over fetched shards
    inflight: int = 0
    strikes: int = 0
    dead: bool = False
    shards: int = 0
    bytes: int = 0
    corrupt: int = 0


@dataclass
class DownloadStats:
    """Filled in by ``download``: what was fetched from where (for tests, logs and benchmarks)."""

    resumed: int = 0  # shards already on disk and verified at the start
    fetched: list[int] = field(default_factory=list)  # shard indices fetched in this run
    corrupt: int = 0
    failures: int = 0
    bytes: int = 0
    sources: dict[str, SourceState] = field(default_factory=dict)


def _home(url: str, index: int) -> bytes:
    return hashlib.sha256(f"{url}#{index}".encode()).digest()


class _Download:
    def __init__(
        self,
        client: httpx.AsyncClient,
        manifest: Manifest,
        sources: list[str],
        shard_dir: Path,
        pending: list[int],
        stats: DownloadStats,
        max_strikes: int,
        shard_timeout: float,
    ) -> None:
        self.client = client
        self.m = manifest
        self.dir = shard_dir
        self.stats = stats
        self.max_strikes = max_strikes
        self.shard_timeout = shard_timeout
        self.src = [SourceState(u.rstrip("/")) for u in sources]
        stats.sources = {s.url: s for s in self.src}
        self.pending = sorted(pending)
        self.inflight: set[int] = set()
        self.failed_on: dict[int, set[str]] = {}  # sources that failed this shard in the current round
        self.corrupt_on: dict[int, set[str]] = {}  # sources that served wrong bytes for it: never again
        self.rounds: dict[int, int] = {}
        # each shard's home source: the same on every client given the same source list
        self.home = {i: max(self.src, key=lambda s, i=i: _home(s.url, i)).url for i in pending}
        self.changed = trio.Event()
        self.max_rounds = 3

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def _pick(self) -> tuple[SourceState, int] | None:
        alive = [s for s in self.src if not s.dead]
        if not alive:
            raise DownloadError("every source failed")
        known = [s.rate for s in alive if s.rate]
        default = max(known) * 2 if known else 1e12  # untried sources go first
        order = sorted(alive, key=lambda s: (-(s.rate or default) / (s.inflight + 1), s.inflight))
        for s in order:
            best: int | None = None
            for i in self.pending:
                if s.url in self.failed_on.get(i, ()):
                    continue
                if self.home[i] == s.url:
                    best = i
                    break
                if best is None:
                    best = i
            if best is not None:
                return s, best
        for i in self.pending:  # every live source failed this shard: another round, or give up
            if all(s.url in self.failed_on.get(i, ()) for s in alive):
                self.rounds[i] = self.rounds.get(i, 0) + 1
                corrupt = self.corrupt_on.get(i, set())
                if self.rounds[i] >= self.max_rounds or all(s.url in corrupt for s in alive):
                    raise DownloadError(f"no source could supply shard {i} of version {self.m.version}")
                self.failed_on[i] = set(corrupt)
                return self._pick()
        return None

    async def worker(self) -> None:
        while self.pending or self.inflight:
            pick = self._pick()
            if pick is None:
                await self.changed.wait()
                continue
            s, i = pick
            self.pending.remove(i)
            self.inflight.add(i)
            s.inflight += 1
            t0 = trio.current_time()
            ok = False
            try:
                data = await fetch_shard(self.client, s.url, self.m, i, self.shard_timeout)
                write_shard(self.dir, i, data)
                ok = True
            except SourceError as exc:
                log.info("weights: shard %d from %s failed: %s", i, s.url, exc)
                self.stats.failures += 1
                s.strikes += 1
                if isinstance(exc, CorruptShard):
                    s.corrupt += 1
                    self.stats.corrupt += 1
                    self.corrupt_on.setdefault(i, set()).add(s.url)
                self.failed_on.setdefault(i, set()).add(s.url)
                s.rate = (s.rate or 1.0) * 0.25
                if s.strikes >= self.max_strikes:
                    s.dead = True
            finally:
                s.inflight -= 1
                self.inflight.discard(i)
            if ok:
                dt = max(trio.current_time() - t0, 1e-6)
                r = len(data) / dt
                s.rate = r if s.rate is None else 0.5 * s.rate + 0.5 * r
                s.shards += 1
                s.strikes = max(0, s.strikes - 1)
                s.bytes += len(data)
                self.stats.fetched.append(i)
                self.stats.bytes += len(data)
            else:
                self.pending.append(i)
                self.pending.sort()
                if not any(not x.dead for x in self.src):
                    self._notify()
                    raise DownloadError(f"every source failed (last: shard {i} from {s.url})")
                await trio.sleep(0.05 * 2 ** min(self.rounds.get(i, 0), 5))
            self._notify()


def prune_versions(dest: Path, keep: int, current: int | None = None) -> list[int]:
    """Remove all but the newest ``keep`` version folders under ``dest`` (never ``current``)."""
    dest = Path(dest)
    if not dest.is_dir():
        return []
    versions = sorted(int(d.name) for d in dest.iterdir() if d.is_dir() and d.name.isdigit())
    removed = []
    for v in versions[:-keep] if keep > 0 else versions:
        if v == current:
            continue
        shutil.rmtree(dest / str(v), ignore_errors=True)
        removed.append(v)
    return removed


async def download(
    version: int,
    manifest_hash: str,
    sources: list[str],
    dest: Path,
    *,
    parallel: int = 4,
    timeout: float = DOWNLOAD_TIMEOUT,
    manifest_timeout: float = 60.0,
    shard_timeout: float = SHARD_TIMEOUT,
    max_strikes: int = 3,
    keep: int = 3,
    keep_shards: bool = False,
    stats: DownloadStats | None = None,
    client: httpx.AsyncClient | None = None,
) -> Path:
    """Download, verify and assemble ``version``; returns ``dest/<version>/<name>``.

    ``sources`` are base URLs (``http://host:port``) of relays and/or the origin. Raises
    ``DownloadError`` when the manifest is refused or missing, no source can supply a shard,
    ``timeout`` passes, or a local write fails (a full disk). Shards stay under
    ``dest/<version>/shards`` until assembled (then removed unless ``keep_shards``), so calling again
    after an interruption or a failed write resumes with what was already verified.
    """
    if not sources:
        raise DownloadError("no sources")
    stats = stats if stats is not None else DownloadStats()
    vdir = Path(dest) / str(version)
    shard_dir = vdir / "shards"
    own_client = client is None
    http = client if client is not None else make_http_client(max_connections=max(8, parallel * 2))
    try:
        with trio.fail_after(timeout):
            manifest = await _load_manifest(http, vdir, sources, version, manifest_hash, manifest_timeout)
            final = vdir / manifest.name
            if final.is_file() and _file_sha256(final) == manifest.sha256:
                prune_versions(Path(dest), keep, version)
                return final
            shard_dir.mkdir(parents=True, exist_ok=True)
            pending = missing_shards(manifest, shard_dir)
            stats.resumed = len(manifest.shards) - len(pending)
            if pending:
                job = _Download(http, manifest, sources, shard_dir, pending, stats, max_strikes, shard_timeout)
                async with trio.open_nursery() as nursery:
                    for _ in range(max(1, min(parallel, len(pending)))):
                        nursery.start_soon(job.worker)
            assemble(manifest, shard_dir, final)
            if not keep_shards:
                shutil.rmtree(shard_dir, ignore_errors=True)
    except trio.TooSlowError:
        raise DownloadError(f"download of version {version} did not finish within {timeout:.0f} s") from None
    except OSError as exc:  # network errors are SourceErrors by now: this is the local disk
        raise _disk_error(version, Path(dest), exc) from exc
    except IntegrityError as exc:  # shards verified when written no longer match: fetch them again
        shutil.rmtree(shard_dir, ignore_errors=True)
        raise DownloadError(f"version {version}: shards on disk changed since they were verified ({exc})") from exc
    except BaseExceptionGroup as group:  # a worker's DownloadError (or a failed write) inside the nursery
        err = group.subgroup((DownloadError, OSError))
        if err is not None:
            first: BaseException = err
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            if isinstance(first, OSError):
                raise _disk_error(version, Path(dest), first) from first
            raise first from None
        raise
    finally:
        if own_client:
            await http.aclose()
    prune_versions(Path(dest), keep, version)
    return final


async def _load_manifest(
    http: httpx.AsyncClient, vdir: Path, sources: list[str], version: int, manifest_hash: str, timeout: float
) -> Manifest:
    expected = manifest_hash.lower().removeprefix("0x")
    path = vdir / MANIFEST_FILE
    with contextlib.suppress(FileNotFoundError, ValueError):
        body = path.read_bytes()
        if hashlib.sha256(body).hexdigest() == expected:
            return Manifest.from_json(body)
    manifest = await fetch_manifest(http, sources, version, expected, timeout)
    vdir.mkdir(parents=True, exist_ok=True)
    write_manifest(vdir, manifest)
    return manifest


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            h.update(chunk)
    return h.hexdigest()
