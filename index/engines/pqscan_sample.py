"""How far a lone query's code scan must reach, guessed before the scan from a sample of the codes.

A search rescores every row whose code score lies within its margin of the k-th best (``pqscan_engine``), so
it needs every such row from the scan. Asked as a top list long enough to hold them (2,000 rows by default),
Faiss's fast scan keeps a reservoir of that many rows and refills it whenever it passes better ones: on 827k
rows of 384 dims, one thread, that took 2.6 ms against 1.7 ms for a top 10, and spreading the scan over
threads does not shrink it, since every shard keeps a reservoir as long. A range search (every code score
above a radius) costs about what the top 10 does, and splits over threads, but its radius has to lie below the
floor the search sets, which is known only once the k-th best is.

So a scan of one row in ``STRIDE`` (drawn at random, held beside the codes; a thirty-second of the scan's
work) comes first: its r-th best code score stands for about the whole's (r × ``STRIDE``)-th best, and the
radius is that score less the margin. ``rank`` sets r so that the whole's ``depth`` best rows rarely hold r
rows of the sample (a binomial count, mean ``depth / STRIDE``): the radius then lies below the floor. With 250
queries (held-out summaries and MS MARCO questions), the guess lay above the floor for 3 queries at 827k rows
of 384 dims and for none at 207k rows of 768 (the floor is lower where the exact scores of the best codes are
lower than their code scores); the store then scans those again for the top list. A sample that expects more
rows above the radius than :data:`MAX_ABOVE` (flat scores: a query far from every row) leaves the query to
the top list, whose length is bounded.
"""

from __future__ import annotations

import math

import faiss
import numpy as np

from densehybrid.index.engines.faiss_engine import omp_threads
from densehybrid.index.engines.pqscan_shards import code_rows_of, lists_scan

STRIDE = 32
# The most rows a range search may be expected to return (the sample's count above the radius times the
# stride): 12 bytes each, so a query far from every row cannot ask for a copy of the index's ids.
MAX_ABOVE = 200_000


class CodeSample:
    """One row in ``stride`` of ``codes`` (an ``IndexPQ``), drawn at random (``seed``), as one fast-scan list with the
    rows' ids. At random, not every ``stride``-th row: a corpus in some order (by name, by source) holds runs of
    like rows, so the best rows of a query often lie together."""

    def __init__(self, codes: faiss.IndexPQ, stride: int = STRIDE, seed: int = 0):
        self.stride = stride
        count = -(-codes.ntotal // stride)
        rows = np.sort(np.random.default_rng(seed).choice(codes.ntotal, count, replace=False)).astype(np.int64)
        self.scan = lists_scan(codes, [(rows, code_rows_of(codes)[rows])])
        self.rows = len(rows)
        self._params = faiss.SearchParametersIVF(nprobe=1)

    def rank(self, depth: int) -> int:
        """The sample's rank whose score the radius starts from for a search of ``depth``: past the mean count
        of the whole's ``depth`` best rows that fall in the sample by three standard deviations, and one more."""
        expected = depth / self.stride
        return math.ceil(expected + 3 * math.sqrt(expected)) + 1

    def radius(self, xq: np.ndarray, depth: int, width: float) -> float | None:
        """The radius of a lone query ``xq`` (1, d) float32: the sample's :meth:`rank`-th best code score less
        ``width`` (its margin); None when the sample is too small to say, or expects more than
        :data:`MAX_ABOVE` rows above it."""
        rank = self.rank(depth)
        if rank > self.rows:
            return None
        with omp_threads(1):
            scores, _ = self.scan.search(xq, rank, params=self._params)
            radius = float(scores[0, rank - 1]) - width
            if not np.isfinite(radius):
                return None
            limits, _, _ = self.scan.range_search(xq, radius, params=self._params)
        return radius if int(limits[1]) * self.stride <= MAX_ABOVE else None
