"""An approximate first stage built to a recall target: the breadth that keeps it, measured at build time.

Users of Faiss, Qdrant or Milvus tune ``ef_search`` or ``nprobe`` by hand and rarely know what they lose.
Here the build measures it: held-out queries (sentences cut from sampled passages, or the user's own
``--calibration-queries``) are searched exactly over the stored rows, then through the approximate first
stage at each breadth of a grid, the way a request searches it (candidates rescored exactly). Recall@10 is
the share of each query's exact top 10 the search returns; the curve of recall against single-query
latency goes into the manifest, with the smallest breadth that reaches the target. The service states
the recall of the breadth each answer used, and a request may ask for a recall instead of a breadth.

The queries come in groups (from the corpus, from another domain: ``index.building.calibrate``); each
point's recall is the lowest group's, so a breadth keeps a target only if every group keeps it. A fold
keeps the curve but marks it stale (:func:`after_fold`) once the first stage changed past what was measured.

Pure functions of arrays and a search callable: the timing of a search is measured here, the search
itself is the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from densehybrid.index.search.recall import recall_at_k
from densehybrid.index.search.widening import as_float32
from densehybrid.index.served.stated_recall import Choice, Point, choose

__all__ = ["Choice", "Point", "choose", "measure", "point", "recall_at_k"]

K = 10
_EXACT_CHUNK = 65_536
DEFAULT_TARGET = 0.95
# a fold that adds or drops more than this share of the rows measured marks the calibration stale: at 827k
# package summaries a graph of 4 times the rows lost about 0.01 of recall@10 at the same breadth (200k: 0.9965
# in domain, 0.898 for MS MARCO questions at ef 256; 827k: 0.990, 0.886), so a tenth more rows costs
# about 0.001; what a tenth of new rows unlike the measured ones costs, no size rule predicts
STALE_SHARE = 0.1
# (query number, breadth) -> that query's top K rows (K,), -1 for none; a breadth is known by the median
# latency of its queries, each searched alone
Search = Callable[[int, int], np.ndarray]


def measure(search: Search, queries: int, exact: np.ndarray, breadths: Sequence[int],
            groups: dict[str, np.ndarray] | None = None) -> list[Point]:
    """Each breadth's recall and single-query latency over ``queries`` queries, against ``exact`` (Q, K); with
    ``groups`` (name -> the numbers of its queries) each group's too, the point's recall the lowest group's."""
    points = []
    for breadth in breadths:
        search(0, breadth)  # the first call at a breadth pays for allocations
        found, samples = [], []
        for number in range(queries):
            started = time.perf_counter()
            found.append(search(number, breadth))
            samples.append((time.perf_counter() - started) * 1000.0)
        points.append(point(breadth, recall_at_k(np.asarray(found), exact), samples, groups))
    return points


def point(breadth: float, recalls: np.ndarray, samples: Sequence[float],
          groups: dict[str, np.ndarray] | None = None) -> Point:
    """The Point of per-query ``recalls`` (Q,) and latencies ``samples`` (ms), the lowest group's recall."""
    per = {name: (float(recalls[numbers].mean()), float((recalls[numbers] == 1.0).mean()))
           for name, numbers in (groups or {}).items() if len(numbers)}
    recall, exact_share = (min(r for r, _ in per.values()), min(e for _, e in per.values())) if per else \
        (float(recalls.mean()), float((recalls == 1.0).mean()))
    return Point(breadth, recall, exact_share, float(np.percentile(samples, 50)), float(np.percentile(samples, 99)),
                 per or None)


def after_fold(entry: dict, added: int, dropped: int, rebuilt: bool) -> dict:
    """The calibration ``entry`` a fold that ``added`` and ``dropped`` rows keeps: marked ``stale`` once the
    first stage was ``rebuilt`` (codebooks or lists retrained, the graph built anew) or the rows changed since it
    was measured pass ``STALE_SHARE`` of ``measured_rows`` (unknown for calibrations that did not record it)."""
    changed = int(entry.get("rows_changed", 0)) + added + dropped
    measured = entry.get("measured_rows")
    stale = bool(entry.get("stale")) or rebuilt or measured is None or changed > STALE_SHARE * measured
    return {**entry, "rows_changed": changed, "stale": stale}


def exact_search(xq: np.ndarray, values: np.ndarray, own_rows: np.ndarray, k: int = K,
                 skip: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) scores and rows of each query's exact top ``k`` inner products over ``values`` (read in chunks),
    its own row and the rows ``skip`` (sorted: those held out of the first stage measured) left out."""
    best_scores = np.full((len(xq), 0), -np.inf, np.float32)
    best_rows = np.full((len(xq), 0), -1, np.int64)
    for s in range(0, len(values), _EXACT_CHUNK):
        chunk = as_float32(values[s:s + _EXACT_CHUNK])
        scores = xq @ chunk.T
        rows = np.broadcast_to(np.arange(s, s + len(chunk)), scores.shape)
        scores = np.where(rows == own_rows[:, None], -np.inf, scores)
        if skip is not None and len(skip):
            scores[:, np.isin(rows[0], skip)] = -np.inf
        if scores.shape[1] > k:  # each query's k best of the chunk, unordered (a full sort costs 50 times more)
            part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            scores, rows = np.take_along_axis(scores, part, 1), np.take_along_axis(rows, part, 1)
        merged_scores = np.concatenate([best_scores, scores], 1)
        merged_rows = np.concatenate([best_rows, rows], 1)
        # ties broken by the lower row, as a stable sort of the rows in order breaks them
        top = np.lexsort((merged_rows, -merged_scores), axis=1)[:, :k]
        best_scores, best_rows = np.take_along_axis(merged_scores, top, 1), np.take_along_axis(merged_rows, top, 1)
    return best_scores, best_rows


def exact_top(xq: np.ndarray, values: np.ndarray, own_rows: np.ndarray, k: int = K,
              skip: np.ndarray | None = None) -> np.ndarray:
    """(Q, k) rows of each query's exact top ``k`` inner products over ``values``, its own row and the rows
    ``skip`` left out."""
    return exact_search(xq, values, own_rows, k, skip)[1]
