"""A fold yields to searches: it pauses between blocks so that it works at most a share of the time.

A server's fold copies the whole index beside the searches: at a million rows 1.5 GB of vectors,
the same bytes its searches scan, so both wait on the same memory bandwidth, which niceness does not
share out. :class:`FoldPacer` lets the copy work in short blocks and after a block that took ``t``
seconds (of wall time: on a busy machine a block takes longer, and the fold backs off further) pauses
``t * (1 - share) / share`` seconds. The pauses of one fold add up to at most ``max_pause_s``, so a
fold still ends in its work time plus that, however busy the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

DEFAULT_SHARE = 0.5
DEFAULT_MAX_PAUSE_S = 10.0


class FoldPacer:
    """``share`` in (0, 1]: the most of the time a fold works (1: no pauses)."""

    def __init__(self, share: float = DEFAULT_SHARE, max_pause_s: float = DEFAULT_MAX_PAUSE_S,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share}")
        if max_pause_s < 0:
            raise ValueError(f"max_pause_s must be at least 0, not {max_pause_s}")
        self.share = share
        self._clock, self._sleep = clock, sleep
        self.paused_s = 0.0  # in this fold so far
        self._pause_left = max_pause_s

    def pause_after(self, work_s: float) -> float:
        """Pause after ``work_s`` seconds of work -> the seconds paused."""
        pause = min(max(0.0, work_s) * (1 - self.share) / self.share, self._pause_left)
        if pause > 0:
            self._sleep(pause)
            self._pause_left -= pause
            self.paused_s += pause
        return pause

    def paced(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, pausing after each in proportion to the time taken to make it and to use it (the
        caller's work until it asks for the next)."""
        started = self._clock()
        for item in items:
            yield item
            self.pause_after(self._clock() - started)
            started = self._clock()
