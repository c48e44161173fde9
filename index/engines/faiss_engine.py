"""The Faiss engine: search the exact flat first stage fast, and :class:`FaissStore`.

Faiss runs on the CPU only: the GPU engine is :mod:`densehybrid.index.engines.torch_engine`
(exact torch matmul + top-k), because the faiss-gpu-cu12 wheels carry no sm_90 kernels and a
Faiss assertion aborts the whole process. Facts this module builds on (measured on the
2-core build box):

- batch-1 scans are faster with one OpenMP thread (memory bound; a second
  thread only adds contention), so ``search`` drops to one thread for nq == 1;
- Faiss only switches to BLAS above ``distance_compute_blas_threshold``
  (128 000 by default in 1.15, compared with nq·d); below that it scans the
  index once per query. ``tune_blas`` lowers it so that batches of 16 or more
  queries share one BLAS pass.
"""

from __future__ import annotations

import contextlib
import logging

import faiss
import numpy as np

from densehybrid.index.search import gip
from densehybrid.index.engines.host import HostRows
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.vector_store import VectorStore

log = logging.getLogger(__name__)

# nq * d above which Faiss uses BLAS: 16 queries at d = 768. Measured here (200k x 768, faiss-cpu
# 1.15 generic build, shared 2-core box): BLAS loses at 8 queries (6.3 vs 9.7 q/s), wins from 16
# (11.4 vs 8.9) and by far at 128 (150 vs 14 q/s); the default (128 000) starts only at 167.
BATCHED_BLAS_THRESHOLD = 16 * 768


def train_sample(n: int, size: int, seed: int) -> np.ndarray:
    """Sorted row numbers of a seeded sample of ``size`` of ``n`` rows to train codes on (deterministic)."""
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size, replace=False))


@contextlib.contextmanager
def omp_threads(n: int):
    """Run a block with ``n`` OpenMP threads in the calling thread.

    ``omp_set_num_threads`` changes the calling thread's setting only, so concurrent
    searches on other threads keep theirs (checked in tests/test_search.py).
    """
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def tune_blas(threshold: int = BATCHED_BLAS_THRESHOLD) -> None:
    """Let batched searches use one BLAS pass instead of one scan per query."""
    faiss.cvar.distance_compute_blas_threshold = threshold


def search(index: faiss.Index, xq: np.ndarray, k: int, params: faiss.SearchParameters | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """xq (Q, d) float32 -> scores (Q, k) float32, rows (Q, k) int64 (-1 where fewer than k rows)."""
    xq = np.ascontiguousarray(xq, dtype=np.float32)
    extra = {} if params is None else {"params": params}
    with omp_threads(1) if xq.shape[0] == 1 else contextlib.nullcontext():
        return index.search(xq, k, **extra)


_KEPT_CHUNK = 65_536


def exact_over(xq: np.ndarray, read_rows, kept: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top ``k`` inner products of ``xq`` (Q, dim) float32 over the rows ``kept`` (sorted) only;
    ``read_rows(rows)`` gives those rows' vectors (R, dim) float32, read a chunk at a time."""
    best_scores = np.full((len(xq), 0), -np.inf, np.float32)
    best_rows = np.full((len(xq), 0), -1, np.int64)
    for s in range(0, len(kept), _KEPT_CHUNK):
        rows = kept[s:s + _KEPT_CHUNK]
        scores = xq @ read_rows(rows).T
        best_scores, best_rows = gip.sort_by_score(np.concatenate([best_scores, scores], 1),
                                                   np.concatenate([best_rows, np.broadcast_to(rows, scores.shape)], 1), k)
    return best_scores, best_rows


def search_kept(index: faiss.Index, xq: np.ndarray, k: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search` of the flat ``index`` over the rows ``mask`` (N,) keeps only, exactly: the top ``k`` of
    those rows. The other rows are skipped through an ID selector (no distance is computed for them)."""
    bits = np.packbits(mask, bitorder="little")
    selector = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
    scores, rows = search(index, xq, k, faiss.SearchParameters(sel=selector))
    return gip.sort_by_score(scores, rows, k)


class FaissStore(HostRows, VectorStore):
    """A local index on the CPU: Faiss's exact scan (``faiss_index``, the flat index of the N rows) for the first
    stage, numpy over the rows of :class:`HostRows` for the rerank."""

    first_stage = "flat"

    def __init__(self, faiss_index: faiss.Index, values: np.ndarray, gates: np.ndarray | None, doc_ids):
        super().__init__(values, gates, doc_ids)
        self.faiss = faiss_index
        tune_blas()

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        if selection is not None:
            return search_kept(self.faiss, xq, depth, selection.mask)
        scores, rows = search(self.faiss, xq, depth)
        return gip.sort_by_score(scores, rows, depth)
