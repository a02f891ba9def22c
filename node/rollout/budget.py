"""What reading rollout files may cost, known before a file is read, and the memory all reads share.

`FileLimits` is what a file for one task may hold (its rows and the longest prompt and completion): the
coordinator takes it from the task it issued, a validator from the pool's spec. A file that declares
more in its footer and page headers is refused before a value is decoded.

`MemoryBudget` is shared by every parse in a process: a parse reserves the memory its rows will take as
Python objects (about `PY_BYTES_PER_VALUE` a value: an int or float object and its list slot, ten times
its four bytes in the file) before it decodes them, and waits for others to finish while the budget is
spent. Four hostile files parsed at once then cost at most the budget, not four times their decode.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from node.errors import IntellectError

#: Memory of one decoded value as Python objects (a 28-byte int or 24-byte float and an 8-byte list slot,
#: rounded up for the lists themselves).
PY_BYTES_PER_VALUE = 40
#: Scalars of a row beside its three lists (group, sample, task id, reward, finish reason, proofs), and slack.
ROW_SCALARS = 8
#: What all parses of a process may hold at once, by default.
DEFAULT_PARSE_MEMORY = 768 * 1024 * 1024
#: How long a parse waits for others to free their share before it gives up.
DEFAULT_WAIT = 30.0


class ParseBusy(IntellectError):
    """The process's parse memory is spent by other files: try again later (not a verdict on the file)."""


@dataclass(frozen=True)
class FileLimits:
    """What a rollout file for one task may hold, at most."""

    rows: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def values(self) -> int:
        """Values its pages may declare: prompt and completion tokens, logprobs and the scalars, each at
        most twice (a dictionary-encoded column declares its dictionary's entries besides its values)."""
        return 2 * self.rows * (self.prompt_tokens + 2 * self.completion_tokens + ROW_SCALARS)


class MemoryBudget:
    """Bytes shared by concurrent parses (threads: the daemons parse in `trio.to_thread`)."""

    def __init__(self, total: int = DEFAULT_PARSE_MEMORY, wait: float = DEFAULT_WAIT) -> None:
        self.total = total
        self.wait = wait
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()

    @contextmanager
    def reserve(self, n: int, what: str) -> Iterator[None]:
        """Hold `n` bytes while the block runs; `ParseBusy` if they are not free within `wait` seconds.
        `n` above the whole budget is the caller's to refuse first (see `fits`)."""
        n = min(n, self.total)
        deadline = time.monotonic() + self.wait
        ticket = object()
        with self._cond:
            self._queue.append(ticket)  # first come, first served: a waiting parse is not overtaken
            try:
                while self._queue[0] is not ticket or self.used + n > self.total:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ParseBusy(
                            f"{what}: {self.used >> 20} MiB of the {self.total >> 20} MiB parse budget are in use",
                            "try again in a minute",
                        )
                    self._cond.wait(left)
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()
            self.used += n
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            with self._cond:
                self.used -= n
                self._cond.notify_all()

    def fits(self, n: int) -> bool:
        return n <= self.total


#: The budget every parse of this process shares unless it is given another.
PARSES = MemoryBudget()
