"""A daemon's process: logging, the trio root, signals, the /metrics and /status endpoint, the terminal's
live view, and its fatal error as one `IntellectError` line. Shared by `join`, `validate` and
`coordinator`; each role's own start (chain, pool, network) is in its `run()`."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import trio

from .errors import PeerError
from .protocol import ProtocolError
from .store import DISK_FULL, StoreError

log = logging.getLogger("intellect")

T = TypeVar("T")


def run_trio(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """`trio.run`, with Ctrl-C raised as one `KeyboardInterrupt`, as a command's caller expects: trio
    delivers it inside the main task, so it leaves a nursery wrapped in an exception group (beside the
    `Cancelled` of its siblings). A group with any other error in it is raised as it is: a failure that
    came with the interrupt is shown, not hidden behind "interrupted"."""
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        errors = [e for e in leaves(group) if not isinstance(e, trio.Cancelled)]
        if errors and all(isinstance(e, KeyboardInterrupt) for e in errors):
            raise KeyboardInterrupt from group
        raise


def stop_on_sigterm() -> None:
    """SIGTERM stops a command as Ctrl-C does, through its `finally` blocks (a devnet's stop its
    daemons and anvil). It is passed on as SIGINT, not raised as `KeyboardInterrupt` where it lands:
    inside a trio run, trio's own SIGINT handler delivers it where it is safe. Raised at whatever
    bytecode the signal arrived, also inside trio's loop, it abandoned the run half-way; the garbage
    collector then closed its coroutines outside trio, whose cleanup raised sniffio's
    `AsyncLibraryNotFoundError` (httpcore) or "must be called from async context" (trio's cancel
    scopes). A process started with SIGINT ignored (a background job of a script) gets Python's
    handler for it, or SIGTERM would be ignored too. Daemons use `until_signal` instead."""
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)


def _sigterm_as_sigint(signum: int, frame: Any) -> None:
    signal.raise_signal(signal.SIGINT)


def command_done() -> None:
    """A command that took SIGTERM as Ctrl-C (`stop_on_sigterm`) has finished, its cleanup included:
    a late SIGTERM or Ctrl-C (the second of an impatient user, landing after the first's cleanup was
    already done) is ignored. Python's finalization puts its own handlers back to the default, so such
    a signal killed the exiting process and replaced the exit status it was about to return (130)."""
    if signal.getsignal(signal.SIGTERM) is _sigterm_as_sigint:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_daemon(daemon: Any, metrics: Any, metrics_addr: tuple[str, int] | None, what: str, data_dir: Path) -> None:
    """Run `daemon` (its `run()` and `status()`) as this process's trio root until it fails or a signal
    ends it; a fatal error leaves as one `IntellectError`."""
    with fatal_errors():
        trio.run(serve, daemon, metrics, metrics_addr, what, data_dir)


def make_metrics(role: str) -> Any:
    from .metrics import Metrics

    return Metrics(role)


async def until_signal(cancel: trio.CancelScope, what: str) -> None:
    """Cancel `cancel` on SIGINT or SIGTERM: the daemon's nurseries unwind and it exits cleanly."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for sig in signals:
            log.info("%s: %s received, shutting down", what, signal.Signals(sig).name)
            cancel.cancel()
            return


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from .p2p.host import quiet_libp2p_logs

    quiet_libp2p_logs()
    for noisy in ("httpx", "httpcore", "vllm", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sys.unraisablehook = log_unraisable


def log_unraisable(u: Any) -> None:
    """Python's hook for exceptions nobody can catch (a finaliser, a coroutine closed by the garbage
    collector). They go to the daemon's log with the object, the thread and the traceback, so an
    intermittent one (e.g. async code closed outside trio's context) can be traced to its source."""
    import threading
    import traceback

    tb = "".join(traceback.format_exception(u.exc_type, u.exc_value, u.exc_traceback))
    logging.getLogger("intellect.unraisable").error(
        "%s %r in thread %s:\n%s", u.err_msg or "Exception ignored in", u.object,
        threading.current_thread().name, tb.rstrip(),
    )  # fmt: skip


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside `exc`'s (nested) exception groups, or `exc` itself."""
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            yield from leaves(e)
    else:
        yield exc


@contextlib.contextmanager
def fatal_errors() -> Iterator[None]:
    """A daemon's fatal error as one `IntellectError` for the CLI's one line: trio nurseries wrap it in
    an exception group, a full disk is an `OSError`, and a protocol violation is the peer's fault."""
    try:
        try:
            yield
        except BaseExceptionGroup as group:
            errors = [e for e in leaves(group) if not isinstance(e, trio.Cancelled)]
            if len(errors) != 1:
                raise
            raise errors[0] from None
    except StoreError as exc:
        raise StoreError(exc.message or str(exc), exc.hint or "check --data-dir (writable, space left)") from None
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        raise StoreError(f"out of disk space{where}: {exc.strerror}", "free space under --data-dir") from None
    except ProtocolError as exc:
        raise PeerError(f"the coordinator: {exc.message}", exc.hint) from None


async def serve(
    daemon: Any, metrics: Any, metrics_addr: tuple[str, int] | None, what: str, data_dir: Path, live: bool = True
) -> None:
    """Run `daemon` until it fails or SIGINT/SIGTERM, with its /metrics and /status HTTP endpoint."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(until_signal, nursery.cancel_scope, what)
        if metrics_addr is not None:
            from .metrics import serve_http

            port = await nursery.start(serve_http, metrics, metrics_addr[0], metrics_addr[1], daemon.status)
            (data_dir / "http.json").write_text(json.dumps({"host": metrics_addr[0], "port": port}))
        nursery.start_soon(sync_metrics, daemon, metrics)
        if sys.stdout.isatty() and live:
            nursery.start_soon(live_view, daemon, what)
        await daemon.run()
        nursery.cancel_scope.cancel()
    log.info("%s: shut down", what)


async def sync_metrics(daemon: Any, metrics: Any, every: float = 2.0) -> None:
    """Carry figures the daemon keeps itself (gossip rejections and drops, stake, policy) into metrics."""
    seen_rejected: dict[str, int] = {}
    seen_dropped = 0
    while True:
        await trio.sleep(every)
        net = getattr(daemon, "net", None)
        if net is not None:
            for reason, n in list(net.rejected.items()):
                key = str(getattr(reason, "value", reason))
                delta = n - seen_rejected.get(key, 0)
                if delta > 0:
                    metrics.gossip_rejected.labels(reason=key).inc(delta)
                    seen_rejected[key] = n
            dropped = sum(net.dropped.values()) + net.node.dropped_outbound
            if dropped > seen_dropped:
                metrics.gossip_dropped.inc(dropped - seen_dropped)
                seen_dropped = dropped
        stake = getattr(daemon, "stake_now", None)
        if stake:
            metrics.set_stake(int(stake))
        cfg = getattr(daemon, "cfg", None)
        if cfg is not None and hasattr(cfg, "policy_version"):
            metrics.policy_version.set(cfg.policy_version)


async def live_view(daemon: Any, what: str) -> None:
    """A live panel of the daemon's status in a terminal (logs scroll above it)."""
    from rich.live import Live
    from rich.table import Table

    def render() -> Table:
        t = Table(title=f"intellect-node {what}", show_header=False, expand=False)
        for k, v in daemon.status().items():
            if isinstance(v, dict):
                v = ", ".join(f"{a}={b}" for a, b in v.items()) or "-"
            elif isinstance(v, list):
                v = f"{len(v)} item(s)"
            t.add_row(str(k), str(v))
        return t

    with Live(render(), refresh_per_second=1, transient=True) as view:
        while True:
            await trio.sleep(1.0)
            view.update(render())
