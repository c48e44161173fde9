"""Background compaction: folds the changes pending in the write-ahead log into a new index generation."""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from densehybrid.index.writes.live import LiveIndex
from densehybrid.service.metrics import ServiceMetrics

log = logging.getLogger(__name__)

COMPACTION_NICENESS = 10


class Compactor:
    """Starts at most one background compaction at a time once ``threshold`` changes are pending."""

    def __init__(self, index: LiveIndex, threshold: int, metrics: ServiceMetrics):
        self.index = index
        self.threshold = threshold
        self.metrics = metrics
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._prepared = False

    def maybe_start(self) -> None:
        if not self._prepared:  # the first write: the fold child imports while the delta fills
            self._prepared = True
            self.index.prepare_compaction()
        with self._lock:
            busy = self._thread is not None and self._thread.is_alive()
            if busy or self._stopping or self.index.pending_changes < self.threshold:
                return
            self._thread = threading.Thread(target=self._run, name="densehybrid-compaction", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        # below the request threads on the CPU (Linux nices threads one by one); best effort
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPACTION_NICENESS)
        try:
            self.index.compact()
            self.metrics.compactions.labels(outcome="ok").inc()
        except Exception:  # noqa: BLE001 - the log keeps every change; the next trigger retries
            self.metrics.compactions.labels(outcome="failed").inc()
            log.exception("compaction failed; the changes stay in the write-ahead log")

    def stop(self, timeout_s: float = 300.0) -> None:
        """Let a running compaction finish (it is safe to kill, but finishing saves the work)."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
