"""Writes yield to searches: while searches are being served, writes take at most a share of the time.

The server runs one Python interpreter, so every write (parsing its documents, encoding them,
logging and applying the change) takes time the searches would otherwise get. A writer that sends
its next batch as soon as the last is acknowledged would take half the server from the searches.
:class:`WritePacer` lets writes through one at a time, in arrival order, and after a write that kept
the server busy for ``t`` seconds holds the next one back ``t * (1 - share) / share`` seconds, but
only while searches are running: with no search in flight or since the last write, writes go at
full speed. A write waiting its turn holds nothing but its request; ``max_waiting`` writes may
wait, and more are refused (the service answers 429 with Retry-After) rather than queued without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator


class WritePacer:
    """``share`` in (0, 1]: the most of the time writes may take while searches run (1: no pacing)."""

    def __init__(self, share: float = 1.0, max_waiting: int = 64, clock: Callable[[], float] = time.monotonic):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share}")
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1, not {max_waiting}")
        self.share = share
        self.max_waiting = max_waiting
        self._clock = clock
        self._lane: asyncio.Lock | None = None  # made on first use, in the server's event loop
        self._waiting = 0
        self._reads = 0  # searches in flight
        self._last_read = float("-inf")  # when the last search finished
        self._last_write = float("-inf")  # when the last write finished
        self._next_write = float("-inf")  # the earliest the next write may start while searches run

    @property
    def waiting(self) -> int:
        """Writes waiting their turn now."""
        return self._waiting

    @property
    def full(self) -> bool:
        """As many writes wait as may: the next is refused."""
        return self._waiting >= self.max_waiting

    def _searching(self) -> bool:
        return self._reads > 0 or self._last_read > self._last_write

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around a search (or any interactive request) while it is served."""
        self._reads += 1
        try:
            yield
        finally:
            self._reads -= 1
            self._last_read = self._clock()

    def hold_back_s(self) -> float:
        """How long a write starting now would wait for its turn (0 when searches are not running)."""
        return max(0.0, self._next_write - self._clock()) if self._searching() else 0.0

    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[Callable[[float], None]]:
        """One write's turn. Yields ``idle(seconds)``: the write reports time it spent waiting on others
        (behind queued searches), which does not count as time it kept the server busy.
        Raises OverflowError when ``max_waiting`` writes are already waiting (check :attr:`full` first)."""
        if self.full:
            raise OverflowError(f"{self._waiting} writes are waiting their turn")
        if self._lane is None:
            self._lane = asyncio.Lock()
        self._waiting += 1
        try:
            await self._lane.acquire()
        finally:
            self._waiting -= 1
        try:
            if (wait := self.hold_back_s()) > 0:
                await asyncio.sleep(wait)
            started = self._clock()
            idle = 0.0

            def report_idle(seconds: float) -> None:
                nonlocal idle
                idle += max(0.0, seconds)

            try:
                yield report_idle
            finally:
                now = self._clock()
                busy = max(0.0, now - started - idle)
                self._last_write = now
                self._next_write = now + busy * (1 - self.share) / self.share
        finally:
            self._lane.release()
