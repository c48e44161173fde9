"""An approximate first stage built to a recall target: the breadth that keeps it, measured at build time.

Users of Faiss, Qdrant or Milvus tune ``ef_search`` or ``nprobe`` by hand and rarely know what they lose.
Here the build measures it: held-out queries (sentences cut from sampled passages, or the user's own
``--calibration-queries``) are searched exactly over the stored rows, then through the approximate first
stage at each breadth of a grid, the way a request searches it (candidates rescored exactly). Recall@10 is
the share of each query's exact top 10 the search returns; the curve of recall against single-query
latency goes into the manifest, with the smallest breadth that reaches the target. The service states
the recall of the breadth each answer used, and a request may ask for a recall instead of a breadth.

Pure functions of arrays and a search callable: the timing of a search is measured here, the search
itself is the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from densehybrid.index.search.recall import recall_at_k
from densehybrid.index.served.stated_recall import Choice, Point, choose

__all__ = ["Choice", "Point", "choose", "measure", "recall_at_k"]

K = 10
DEFAULT_TARGET = 0.95
# (query number, breadth) -> that query's top K rows (K,), -1 for none; a breadth is known by the median
# latency of its queries, each searched alone
Search = Callable[[int, int], np.ndarray]


def measure(search: Search, queries: int, exact: np.ndarray, breadths: Sequence[int]) -> list[Point]:
    """Each breadth's recall and single-query latency over ``queries`` queries, against ``exact`` (Q, K)."""
    points = []
    for breadth in breadths:
        search(0, breadth)  # the first call at a breadth pays for allocations
        found, samples = [], []
        for number in range(queries):
            started = time.perf_counter()
            found.append(search(number, breadth))
            samples.append((time.perf_counter() - started) * 1000.0)
        recalls = recall_at_k(np.asarray(found), exact)
        points.append(Point(breadth, float(recalls.mean()), float((recalls == 1.0).mean()),
                            float(np.percentile(samples, 50)), float(np.percentile(samples, 99))))
    return points
