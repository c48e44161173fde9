"""One query's code scan spread over threads: the rows' 4-bit codes in contiguous row shards, scanned apart.

:func:`split_codes` cuts an ``IndexPQ`` of the rows' codes into ``shards`` contiguous runs of rows, each its own
fast-scan index (``pqscan_engine.fast_scan``) of the same trained codebooks whose ids are the global rows (or
code numbers), so a row selector over the global rows filters every shard alike and a shard's hits need no
renumbering. :class:`ShardedScan` scans a query's shards each in a thread of one persistent pool (Faiss
releases the GIL while it scans, and runs one OpenMP thread inside each, so the two kinds of threads never
multiply), merges the shards' top lists and hands them on as one index's top list.

Any number of shards gives the same top list: the same scores, and the same rows but for their order within
a run of equal scores. Which of a tied run a scan keeps at its cut is the scan's own choice (the fast scan's
scores are sums of 8-bit table entries, so runs of equal scores are common), so every shard returns one row
more than asked, and a run tied with the row after the cut is kept by none (its rows come back -1, their
score kept): every shard count, one included, keeps the same rows (``index.search.ties.above_the_cut``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import faiss
import numpy as np

from densehybrid.index.engines.faiss_engine import omp_threads
from densehybrid.index.search.ties import above_the_cut

# The default threads a query's scan spreads over: the cores this process may run on, at most this many. A
# scan of 1.5 ms (827k rows of 384 dims) cut into more pieces spends a growing share of them handing the
# pieces to threads and merging their lists; the cap is a guess, not measured past 2.
MAX_DEFAULT_SCAN_THREADS = 4


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_scan_threads() -> int:
    return max(1, min(available_cores(), MAX_DEFAULT_SCAN_THREADS))


def shard_bounds(count: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous [start, stop) runs of ``count`` rows, as even as whole rows allow (none empty
    unless there are fewer rows than shards)."""
    edges = np.linspace(0, count, max(1, shards) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a] or [(0, 0)]


def split_codes(codes: faiss.IndexPQ, shards: int) -> list[faiss.Index]:
    """The fast scans of ``codes`` cut into ``shards`` contiguous runs of rows, ids the global code numbers."""
    from densehybrid.index.engines.pqscan_engine import fast_scan  # imported here: that module imports this one

    everything = faiss.vector_to_array(codes.codes).reshape(codes.ntotal, codes.code_size)
    out = []
    for start, stop in shard_bounds(codes.ntotal, shards):
        part = faiss.IndexPQ(codes.d, codes.pq.M, codes.pq.nbits, faiss.METRIC_INNER_PRODUCT)
        part.pq, part.is_trained = codes.pq, True
        part.add_sa_codes(everything[start:stop])
        out.append(fast_scan(part, first_id=start))
    return out


class ShardedScan:
    """The fast scans of contiguous row shards (``scans``; ids: the global rows), searched as one index.

    A single query is spread over a persistent pool, one shard a thread, when the searches in flight on this
    scan times the shards fit the cores (:func:`available_cores`); otherwise each shard is scanned in turn on
    the calling thread. Spreading gains latency only where cores are idle: when other searches keep them
    busy, handing shards to threads adds hand-offs and contention, so under load it would cost throughput
    instead. A batch of queries is never spread: Faiss's own threads already share its queries out."""

    def __init__(self, scans: list[faiss.Index], cores: int | None = None):
        self.scans = list(scans)
        self.ntotal = sum(scan.ntotal for scan in self.scans)
        self.cores = cores or available_cores()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._pool = None if len(self.scans) == 1 else ThreadPoolExecutor(
            len(self.scans) - 1, thread_name_prefix="densehybrid-scan", initializer=faiss.omp_set_num_threads,
            initargs=(1,))  # each worker's OpenMP threads: one per shard scan

    @property
    def threads(self) -> int:
        return len(self.scans)

    def search(self, xq: np.ndarray, k: int, params: faiss.SearchParameters | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """xq (Q, d) float32 -> the best ``k`` code scores (Q, k), descending, and their ids (-1: none, or
        tied with the score after the cut), the same for any number of shards."""
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        with self._lock:
            self._in_flight += 1
            spread = self._pool is not None and len(xq) == 1 and self._in_flight * self.threads <= self.cores
        try:
            parts = self._spread(xq, k + 1, params) if spread else self._in_turn(xq, k + 1, params)
        finally:
            with self._lock:
                self._in_flight -= 1
        scores, ids = parts[0] if len(parts) == 1 else _merged(parts, k + 1)
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)  # no row: as Faiss pads, whatever its value
        return scores[:, :k], above_the_cut(scores, ids, k)

    def _in_turn(self, xq, k, params) -> list[tuple[np.ndarray, np.ndarray]]:
        with omp_threads(1) if len(xq) == 1 else contextlib.nullcontext():  # as ``faiss_engine.search`` scans
            return [_scan(scan, xq, k, params) for scan in self.scans]

    def _spread(self, xq, k, params) -> list[tuple[np.ndarray, np.ndarray]]:
        others = [self._pool.submit(_scan, scan, xq, k, params) for scan in self.scans[1:]]
        with omp_threads(1):
            first = _scan(self.scans[0], xq, k, params)  # the calling thread scans a shard too
        return [first, *(other.result() for other in others)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _merged(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of the shards' top lists (each (Q, k), descending): a stable sort of lists already in
    order costs about a pass over them."""
    scores = np.concatenate([np.where(ids < 0, -np.inf, s) for s, ids in parts], 1)
    ids = np.concatenate([ids for _, ids in parts], 1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


def _scan(scan: faiss.Index, xq: np.ndarray, k: int, params) -> tuple[np.ndarray, np.ndarray]:
    return scan.search(xq, k, params=params) if params is not None else scan.search(xq, k)
