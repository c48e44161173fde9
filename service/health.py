"""Readiness: warmed up, and the served index's store answering.

A remote vector store is asked ``index.healthy()`` by one daemon thread every
``interval_s``; requests and ``/ready`` only read the flag it leaves, so a
store that hangs slows that thread alone, never the event loop.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Health:
    def __init__(self, index, interval_s: float):
        self.index = index
        self.interval_s = interval_s
        self.store_ok = True
        self._losses = 0  # a check that began before the latest loss must not undo it
        self.status = "starting"
        self._warm = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self._warm.is_set() and self.store_ok

    def describe(self) -> str:
        if self._warm.is_set() and not self.store_ok:
            return "vector store unreachable"
        return self.status

    def warmed_up(self) -> None:
        self.status = "ready"
        self._warm.set()

    def lost(self) -> None:
        """A call to the store failed: not ready until a check begun after this succeeds."""
        self._losses += 1
        self.store_ok = False

    def start(self) -> None:
        if self.index is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="densehybrid-store-check", daemon=True)
            self._thread.start()

    def stop(self, status: str = "shutting down") -> None:
        self._warm.clear()
        self.status = status
        self._stopping.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            losses = self._losses
            ok = self._check()
            if not ok or losses == self._losses:
                self.store_ok = ok
            self._stopping.wait(self.interval_s)

    def _check(self) -> bool:
        try:
            return bool(self.index.healthy())
        except Exception:  # noqa: BLE001 - a check that raises means the store does not answer
            log.warning("vector store check failed", exc_info=True)
            return False
