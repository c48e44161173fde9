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
from dataclasses import dataclass

import numpy as np

K = 10
DEFAULT_TARGET = 0.95
# (query number, breadth) -> that query's top K rows (K,), -1 for none; a breadth is known by the median
# latency of its queries, each searched alone
Search = Callable[[int, int], np.ndarray]


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Per query, the share of its exact top-k rows (Q, k) that ``found`` (Q, k') holds (-1s never count)."""
    return np.array([len(set(f[f >= 0].tolist()) & set(e[e >= 0].tolist())) / max(1, int((e >= 0).sum()))
                     for f, e in zip(found, exact)])


@dataclass(frozen=True)
class Point:
    """One breadth's measurement over the calibration queries."""

    breadth: float  # ef_search, nprobe (whole numbers) or a pqscan margin
    recall: float  # mean recall@10
    exact_share: float  # share of queries whose top 10 is the exact one entire
    p50_ms: float
    p99_ms: float

    def to_dict(self) -> dict:
        return {"breadth": self.breadth, "recall_at_10": round(self.recall, 4), "exact_top10": round(self.exact_share, 4),
                "p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3)}

    @classmethod
    def from_dict(cls, record: dict) -> "Point":
        return cls(record["breadth"], float(record["recall_at_10"]), float(record["exact_top10"]),
                   float(record["p50_ms"]), float(record["p99_ms"]))


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


@dataclass(frozen=True)
class Choice:
    point: Point
    reached: bool  # whether ``point`` keeps the target; else the best recall the grid found
    target: float


def choose(points: Sequence[Point], target: float) -> Choice:
    """The narrowest breadth at which at least ``target`` of the calibration queries find their whole exact top 10
    (so their mean recall@10 is at least that too); without one, the breadth of the best recall.

    Whole top 10s, not a mean recall: queries unlike the calibration queries (another domain) lose more of
    their top 10 at a breadth, and a breadth that leaves few calibration queries short keeps more of theirs
    (on 827k package summaries, a pqscan margin chosen for a mean recall of 0.95 on queries cut from the
    corpus gave MS MARCO questions 0.948; one chosen for whole top 10s, 0.988 at 4 % more time). The
    narrowest, not the fastest measured: a wider breadth costs more, and a busy machine's timings vary."""
    if not points:
        raise ValueError("no breadth was measured")
    reaching = [p for p in points if p.exact_share >= target]
    if reaching:
        return Choice(min(reaching, key=lambda p: p.breadth), True, target)
    return Choice(max(points, key=lambda p: (p.recall, -p.breadth)), False, target)


def breadth_for(curve: Sequence[dict], recall: float) -> dict:
    """The manifest curve's narrowest point (a ``Point.to_dict``) where ``recall`` of the calibration queries found
    their whole top 10 (:func:`choose`); the best one there is when none does."""
    points = [Point.from_dict(p) for p in curve]
    return choose(points, recall).point.to_dict()


def recall_at(curve: Sequence[dict], breadth: float) -> float | None:
    """The recall the manifest curve measured at ``breadth``, or for a breadth between its points the recall of
    the widest one below it (a wider search finds at least as much); None below the narrowest."""
    below = [p["recall_at_10"] for p in curve if p["breadth"] <= breadth]
    return max(below) if below else None
