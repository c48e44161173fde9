"""The recall users get, measured on their own queries: a sampled share of searches scanned exactly, off the
request path.

An approximate first stage states the recall its build measured on calibration queries; real queries come from
elsewhere, carry filters and move over time. So a share of them (``recall_sample_rate``, each query drawn on
its own) is handed, with its filter and breadth, to one background thread that runs the first stage again
beside an exact scan of the same rows (``Searcher.first_stage_recall``) and keeps the recall@10 of the last
``recall_window`` samples: ``/info``'s ``index.first_stage.live_recall``, the
``densehybrid_first_stage_recall`` histogram and its alert.

It never delays an answer: offering a query costs a random draw and, when drawn, a queue put that never
blocks; a full queue drops the sample and counts it. One exact scan per sample, on one thread at the lowest
CPU priority (on Linux, where each thread has its own), so the scans take what the request threads leave: at
1 % of queries that is about 1 % of a flat index's search work.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import Encoded
from densehybrid.index.search.params import SearchParams

log = logging.getLogger(__name__)

# (queries, params) -> (Q,) recall@10 of each query's first stage against the exact scan
Measure = Callable[[Encoded, SearchParams], np.ndarray]
# (filtered, recall) of one measured query; (outcome) of one offered sample: measured, dropped or failed
RecallObserver = Callable[[bool, float], None]
# (params, filtered, recall) of one measured query: what steers the default breadth (service.recall_steering)
SampleObserver = Callable[[SearchParams, bool, float], None]
OutcomeCounter = Callable[[str], None]
NICENESS = 19  # the sampling thread's: the exact scans run on what the request threads leave


@dataclass(frozen=True)
class _Sample:
    queries: Encoded
    params: SearchParams


def lower_priority(niceness: int = NICENESS) -> None:
    """Lower the calling thread's CPU priority (Linux keeps one per thread): its scans then take the cores only
    when the request threads leave them. Elsewhere it runs as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed
        log.info("the live recall thread keeps its priority (%s)", exc)


def sampled(params: SearchParams) -> bool:
    """Whether a search is of the kind the live recall measures: the ``ip`` first stage of a real request (the
    start-up warm-up's bounded search is none)."""
    return params.first_stage == "ip" and params.row_limit is None


def window_summary(recalls: list[float]) -> dict:
    return {"recall_at_10": round(float(np.mean(recalls)), 4) if recalls else None, "count": len(recalls)}


class LiveRecall:
    """Samples queries at ``rate`` into a queue of ``queue_size`` that one thread drains through ``measure``,
    keeping the last ``window`` recalls."""

    def __init__(self, measure: Measure, *, rate: float, queue_size: int = 32, window: int = 1000,
                 seed: int | None = None):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"recall sample rate must be in [0, 1], got {rate}")
        self.rate, self.window = rate, window
        self._measure = measure
        self._observe: RecallObserver = lambda filtered, recall: None
        self._count: OutcomeCounter = lambda outcome: None
        self._steer: SampleObserver = lambda params, filtered, recall: None
        self._queue: queue.Queue[_Sample | None] = queue.Queue(maxsize=queue_size)
        self._recent: deque[tuple[bool, float]] = deque(maxlen=window)
        self._lock = threading.Lock()
        self._random = np.random.default_rng(seed)
        self._draw_lock = threading.Lock()  # a Generator is not safe to share between threads
        self.measured = self.dropped = self.failed = 0
        self.busy_s = 0.0  # CPU time the thread spent measuring: its share of the wall clock is the sampling's cost
        self._thread: threading.Thread | None = None

    def report_to(self, observe: RecallObserver, count: OutcomeCounter) -> None:
        """Where each measured recall and each sample's outcome are reported (the metrics)."""
        self._observe, self._count = observe, count

    def steer_with(self, observer: SampleObserver) -> None:
        """Hand every measured sample, with its search's parameters, to ``observer`` too."""
        self._steer = observer

    def start(self) -> None:
        if self.rate > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="densehybrid-live-recall", daemon=True)
            self._thread.start()

    def offer(self, queries: Encoded, params: SearchParams) -> None:
        """From a search thread, after a search: each query is drawn at ``rate``; the drawn ones are queued, or
        dropped (and counted) when the queue is full. Never blocks."""
        if self._thread is None or not sampled(params) or len(queries) == 0:
            return
        with self._draw_lock:
            drawn = np.flatnonzero(self._random.random(len(queries)) < self.rate)
        for q in drawn:
            try:
                self._queue.put_nowait(_Sample(queries[int(q):int(q) + 1], params))
            except queue.Full:
                with self._lock:  # offers come from every search thread
                    self.dropped += 1
                self._count("dropped")

    def _run(self) -> None:
        lower_priority()
        while (sample := self._queue.get()) is not None:
            started = time.thread_time()  # CPU time: at the lowest priority the scan may wait for the cores
            try:
                recall = float(self._measure(sample.queries, sample.params)[0])
            except Exception as exc:  # noqa: BLE001 - a sample that cannot be measured is counted, never fatal
                self.busy_s += time.thread_time() - started
                self.failed += 1
                self._count("failed")
                log.warning("live recall sample failed: %s: %s", type(exc).__name__, exc)
                continue
            self.busy_s += time.thread_time() - started
            self.record(sample.params.filter is not None, recall)
            try:
                self._steer(sample.params, sample.params.filter is not None, recall)
            except Exception as exc:  # noqa: BLE001 - steering that fails leaves the breadth as it was
                log.warning("recall steering failed: %s: %s", type(exc).__name__, exc)

    def record(self, filtered: bool, recall: float) -> None:
        with self._lock:
            self._recent.append((filtered, recall))
            self.measured += 1
        self._observe(filtered, recall)
        self._count("measured")

    def summary(self) -> dict:
        """/info's ``live_recall``: the mean recall@10 of the last ``window`` samples (None before the first), their
        count, split by filtered and unfiltered searches, with the sampling's own counts."""
        with self._lock:
            recent = list(self._recent)
        return {**window_summary([r for _, r in recent]), "window": self.window,
                "unfiltered": window_summary([r for f, r in recent if not f]),
                "filtered": window_summary([r for f, r in recent if f]),
                "sample_rate": self.rate, "measured": self.measured, "dropped": self.dropped, "failed": self.failed,
                "busy_s": round(self.busy_s, 3)}

    def mean(self, filtered: bool) -> float:
        """The window's mean recall of filtered or unfiltered searches (NaN before the first): a gauge's value."""
        with self._lock:
            recalls = [r for f, r in self._recent if f == filtered]
        return float(np.mean(recalls)) if recalls else float("nan")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread once the sample it is measuring is done; queued samples are dropped."""
        thread, self._thread = self._thread, None  # offers stop here
        if thread is None:
            return
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:  # an offer raced the drain: the daemon thread ends with the process
            return
        thread.join(timeout_s)
