"""One query's code scan spread over threads: the rows' 4-bit codes in contiguous row shards, scanned apart.

:func:`split_codes` repacks an ``IndexPQ`` of the rows' codes for Faiss's fast scan as ``shards`` inverted
lists, list i the i-th contiguous run of rows, with the same trained codebooks and no residuals (so every
list scores its codes as one list of every row would) and the global rows (or code numbers) as ids: a row
selector over the global rows filters every shard alike and a shard's hits need no renumbering. The codes
are held once. :class:`ShardedScan` scans a lone query's lists each in a thread of one persistent pool
(Faiss releases the GIL while it scans, and runs one OpenMP thread inside each, so the two kinds of threads
never multiply) and merges their top lists; otherwise one Faiss search scans every list in turn.

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
# A shard of fewer rows does not pay for handing it to a thread and merging its list, so by default a smaller
# index is not spread. One query's whole search (scan, merge, rescoring), two threads against one, two shared
# cores: 384-dim MiniLM rows 1.02x at 100k and 0.90x at 200k; 768-dim DLR rows 1.28x at 50k, 1.11x at 100k and
# 0.85x at 207k. (The code scan alone splits earlier: 0.84-0.92x at 100k rows of 384 dims.)
MIN_DEFAULT_SHARD_ROWS = 100_000


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_scan_threads(rows: int | None = None) -> int:
    """The threads a query's scan spreads over by default: the cores, at most ``MAX_DEFAULT_SCAN_THREADS``, and
    no more than shards of ``MIN_DEFAULT_SHARD_ROWS`` each of ``rows`` (None: no bound)."""
    threads = min(available_cores(), MAX_DEFAULT_SCAN_THREADS)
    return max(1, threads if rows is None else min(threads, rows // MIN_DEFAULT_SHARD_ROWS))


def shard_bounds(count: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous [start, stop) runs of ``count`` rows, as even as whole rows allow (none empty
    unless there are fewer rows than shards)."""
    edges = np.linspace(0, count, max(1, shards) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a] or [(0, 0)]


def split_codes(codes: faiss.IndexPQ, shards: int) -> faiss.IndexIVFPQFastScan:
    """The fast scan of ``codes`` as ``shards`` inverted lists of contiguous rows, ids the global code numbers
    (as ``pqscan_engine.fast_scan`` repacks them as one list)."""
    everything = code_rows_of(codes)
    return lists_scan(codes, [(np.arange(start, stop, dtype=np.int64), everything[start:stop])
                              for start, stop in shard_bounds(codes.ntotal, shards)])


def code_rows_of(codes: faiss.IndexPQ) -> np.ndarray:
    """(N, code size) uint8: ``codes``' rows as stored, a view of them for as long as ``codes`` lives (the shards
    and the code sample each take their rows from it, so the codes, 845 MB at 8.8M rows of 768 dims, are not
    copied whole on the way)."""
    if codes.ntotal == 0:
        return np.zeros((0, codes.code_size), np.uint8)
    return faiss.rev_swig_ptr(codes.codes.data(), codes.ntotal * codes.code_size).reshape(codes.ntotal, codes.code_size)


def lists_scan(codes: faiss.IndexPQ, lists: list[tuple[np.ndarray, np.ndarray]]) -> faiss.IndexIVFPQFastScan:
    """A fast scan of ``codes``' codebooks over inverted lists, list i holding the code rows ``lists[i][1]`` with
    the ids ``lists[i][0]``; no residuals, so every list scores its codes as one list of them all would."""
    quantizer = faiss.IndexFlatIP(codes.d)
    quantizer.add(np.zeros((len(lists), codes.d), np.float32))  # the lists' centres, unused without residuals
    ivf = faiss.IndexIVFPQ(quantizer, codes.d, len(lists), codes.pq.M, codes.pq.nbits, faiss.METRIC_INNER_PRODUCT)
    ivf.by_residual, ivf.pq, ivf.is_trained = False, codes.pq, True
    for number, (ids, rows) in enumerate(lists):
        ids, rows = np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(rows)
        ivf.invlists.add_entries(number, len(ids), faiss.swig_ptr(ids), faiss.swig_ptr(rows))
    ivf.ntotal = sum(len(ids) for ids, _ in lists)
    scan = faiss.IndexIVFPQFastScan(ivf)
    scan.referenced_objects = [quantizer]  # the scan points at it, and Python would free it with ``ivf``
    return scan


def list_view(scan: faiss.IndexIVFPQFastScan, number: int) -> faiss.IndexIVFPQFastScan:
    """``scan`` seen as its list ``number`` alone: the same codes (not copied), a one-probe search of any query
    scans that list. Faiss's range search of a fast scan takes no lists chosen by the caller, so a thread that
    scans one list for a range search asks a view whose coarse quantizer names that list."""
    quantizer = faiss.IndexIDMap(faiss.IndexFlatIP(scan.d))
    quantizer.add_with_ids(np.zeros((1, scan.d), np.float32), np.array([number], np.int64))
    ivf = faiss.IndexIVFPQ(quantizer, scan.d, scan.nlist, scan.pq.M, scan.pq.nbits, faiss.METRIC_INNER_PRODUCT)
    ivf.by_residual, ivf.pq, ivf.is_trained = False, scan.pq, True
    view = faiss.IndexIVFPQFastScan(ivf)
    view.replace_invlists(scan.invlists, False)
    view.ntotal = scan.ntotal
    view.referenced_objects = [quantizer, scan]  # the view reads the scan's lists
    return view


class ShardedScan:
    """A fast scan whose inverted lists are contiguous row shards (``scan``, :func:`split_codes`; one list:
    ``pqscan_engine.fast_scan``), searched as one index.

    A single query is spread over a persistent pool, one list a thread, when the searches in flight on this
    scan times the lists fit the cores (:func:`available_cores`); otherwise one Faiss search scans every list
    on the calling thread, as an unsharded scan would. Spreading gains latency only where cores are idle: when
    other searches keep them busy, handing lists to threads adds hand-offs and contention, so under load it
    would cost throughput instead. A batch of queries is never spread: Faiss's own threads already share its
    queries out."""

    def __init__(self, scan: faiss.Index, cores: int | None = None, sample=None):
        self.scan, self.ntotal = scan, scan.ntotal
        self.sample = sample  # a ``pqscan_sample.CodeSample`` of the codes, or None: no range searches
        self.threads = scan.nlist
        self.cores = cores or available_cores()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._pool = None if self.threads == 1 else ThreadPoolExecutor(
            self.threads - 1, thread_name_prefix="densehybrid-scan", initializer=faiss.omp_set_num_threads,
            initargs=(1,))  # each worker's OpenMP threads: one per list scanned
        # What a lone query's scan of one list passes Faiss besides the query, made once: the threads of a spread
        # query take the GIL in turns between their Faiss calls, so every Python step before a list's scan starts
        # delays the others' (building these per search cost 0.05-0.18 ms of a 1.8 ms two-thread scan of 827k rows).
        self._list_of = [np.full((1, 1), number, np.int64) for number in range(self.threads)]
        self._no_centre = np.zeros((1, 1), np.float32)
        self._pointers = [(faiss.swig_ptr(chosen), faiss.swig_ptr(self._no_centre)) for chosen in self._list_of]
        self._unfiltered = faiss.SearchParametersIVF(nprobe=1)
        self._every_list = faiss.SearchParametersIVF(nprobe=self.threads)
        self._views = [list_view(scan, number) for number in range(self.threads)] if self._pool else []

    @contextlib.contextmanager
    def _spreading(self, lone: bool):
        """Whether this search (``lone``: one query) is spread over the pool: only while the searches in flight
        times the lists fit the cores."""
        with self._lock:
            self._in_flight += 1
            spread = self._pool is not None and lone and self._in_flight * self.threads <= self.cores
        try:
            yield spread
        finally:
            with self._lock:
                self._in_flight -= 1

    def search(self, xq: np.ndarray, k: int, params: faiss.SearchParameters | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """xq (Q, d) float32 -> the best ``k`` code scores (Q, k), descending, and their ids (-1: none, or
        tied with the score after the cut), the same for any number of lists; ``params``: its row selector."""
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        selector = None if params is None else params.sel
        with self._spreading(len(xq) == 1) as spread:
            scores, ids = self._spread(xq, k + 1, selector) if spread else self._scan_all(xq, k + 1, selector)
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)  # no row: as Faiss pads, whatever its value
        return scores[:, :k], above_the_cut(scores, ids, k)

    def above(self, xq: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        """A lone query ``xq`` (1, d) -> every code score above ``radius`` (C,) and its id (C,), in no order (a
        score within rounding of the radius may come back or not): a range search, whose cost grows less with the
        rows it returns than a top list's does, spread over the lists like :meth:`search`."""
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        with self._spreading(True) as spread, omp_threads(1):
            if not spread:
                _, scores, ids = self.scan.range_search(xq, radius, params=self._every_list)
                return scores, ids
            others = [self._pool.submit(self._range_list, number, xq, radius) for number in range(1, self.threads)]
            parts = [self._range_list(0, xq, radius), *(other.result() for other in others)]
        return np.concatenate([scores for scores, _ in parts]), np.concatenate([ids for _, ids in parts])

    def _range_list(self, number: int, xq: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        _, scores, ids = self._views[number].range_search(xq, radius, params=self._unfiltered)
        return scores, ids

    def _scan_all(self, xq, k, selector) -> tuple[np.ndarray, np.ndarray]:
        params = faiss.SearchParametersIVF(nprobe=self.threads, sel=selector)
        with omp_threads(1) if len(xq) == 1 else contextlib.nullcontext():  # as ``faiss_engine.search`` scans
            return self.scan.search(xq, k, params=params)

    def _spread(self, xq, k, selector) -> tuple[np.ndarray, np.ndarray]:
        """A lone query ``xq`` (1, d): list 0 scanned on the calling thread, the others on the pool."""
        params = self._unfiltered if selector is None else faiss.SearchParametersIVF(nprobe=1, sel=selector)
        with omp_threads(1):  # set before the pool starts, so that setting it waits for no other thread
            others = [self._pool.submit(self._scan_list, number, xq, k, params) for number in range(1, self.threads)]
            first = self._scan_list(0, xq, k, params)
        return _merged([first, *(other.result() for other in others)], k)

    def _scan_list(self, number: int, xq: np.ndarray, k: int, params) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` of list ``number`` alone for a lone query ``xq`` (1, d) (Faiss's search of a list chosen
        for it); ``params``: one probe, and the row selector if any."""
        scores, ids = np.empty((1, k), np.float32), np.empty((1, k), np.int64)
        chosen, no_centre = self._pointers[number]
        self.scan.search_preassigned_c(1, faiss.swig_ptr(xq), k, chosen, no_centre, faiss.swig_ptr(scores),
                                       faiss.swig_ptr(ids), False, params)
        return scores, ids


def _merged(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of the lists' top lists (each (Q, k), descending): a stable sort of lists already in
    order costs about a pass over them."""
    scores = np.concatenate([np.where(ids < 0, -np.inf, s) for s, ids in parts], 1)
    ids = np.concatenate([ids for _, ids in parts], 1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
