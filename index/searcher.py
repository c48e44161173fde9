"""Two-stage search (DESIGN §2.6): first stage over the whole index, exact GIP rerank, top-k.

``Searcher.search`` takes encoded queries (raw, as encoders return them), scales
their open part by λ for ``dhr``/``fusion``, runs the first stage (Faiss ``ip``
or ``approx_gip``) to depth ``candidates``, reranks the candidates by exact GIP
for gated kinds, and returns ids, scores, rows and per-stage times. Ties are
ordered by row number, so equal inputs give equal outputs on every run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from densehybrid.encoder.base import SCALED_KINDS, Encoded
from densehybrid.index import flat, gip
from densehybrid.index.first_stage import LocalStore, VectorStore
from densehybrid.index.store import IndexFiles, IndexMismatchError

log = logging.getLogger(__name__)

FirstStage = Literal["ip", "approx_gip"]
FIRST_STAGES: tuple[str, ...] = ("ip", "approx_gip")
MAX_CANDIDATES = 10_000


class SearchError(ValueError):
    """A search request is out of range (k, candidates, first stage, λ)."""


@dataclass
class SearchResults:
    """Per query: ids, scores and index rows, best first; ``timing`` in milliseconds."""

    ids: list[list[str]]
    scores: list[list[float]]
    rows: list[list[int]]
    timing: dict[str, float] = field(default_factory=dict)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


class Searcher:
    """Searches one loaded index: a local directory (Faiss placed on ``device`` once) or a
    Milvus collection (``index.milvus.MilvusIndex``, which brings its own :class:`VectorStore`)."""

    def __init__(self, index: IndexFiles, *, device: str = "cpu", float16: bool = False):
        self.index = index
        self.spec = index.spec
        self.device = device
        flat.tune_blas()
        remote = getattr(index, "vector_store", None)
        self.store: VectorStore = remote if remote is not None else LocalStore(index, device=device, float16=float16)

    @property
    def reranks(self) -> bool:
        """Whether this index has gates, i.e. a second stage changes the scores."""
        return self.spec.gated_dim > 0

    def scale(self, values: np.ndarray, lam: float | None) -> np.ndarray:
        """Raw query values -> the vectors scored against the index (λ on the open part)."""
        if self.spec.kind not in SCALED_KINDS:
            return np.ascontiguousarray(values, dtype=np.float32)
        lam = self.index.lam if lam is None else lam
        if not np.isfinite(lam):
            raise SearchError(f"lambda must be a finite number, got {lam}")
        return gip.scale_queries(values, self.spec.gated_dim, lam)

    def _check(self, queries: Encoded, k: int, first_stage: str, candidates: int) -> None:
        if k < 1:
            raise SearchError(f"k must be >= 1, got {k}")
        if first_stage not in FIRST_STAGES:
            raise SearchError(f"unknown first stage {first_stage!r}; use one of {', '.join(FIRST_STAGES)}")
        if not 1 <= candidates <= MAX_CANDIDATES:
            raise SearchError(f"candidates must be in 1..{MAX_CANDIDATES}, got {candidates}")
        if queries.values.ndim != 2 or queries.values.shape[1] != self.spec.dim:
            raise IndexMismatchError(f"query vectors have shape {queries.values.shape}, the index has dim {self.spec.dim}")
        if self.reranks and (queries.gates is None or queries.gates.shape != (len(queries), self.spec.gated_dim)):
            raise IndexMismatchError(f"the index needs query gates of {self.spec.gated_dim} dims")

    def _first_stage(self, xq: np.ndarray, gq: np.ndarray | None, first_stage: str, depth: int, theta: float):
        if first_stage == "approx_gip":
            if not isinstance(self.store, LocalStore):
                raise SearchError("first stage approx_gip needs a local index; a Milvus collection serves ip")
            return gip.approx_topk(xq, gq, self.index.values, self.index.gates, theta, depth)
        return self.store.inner_product(xq, depth)

    def search(self, queries: Encoded, *, k: int = 10, first_stage: FirstStage = "ip", candidates: int = 1000,
               theta: float = 0.1, rerank: bool = True, lam: float | None = None) -> SearchResults:
        """Top ``k`` per query. ``candidates`` (K1) is the first-stage depth when reranking."""
        self._check(queries, k, first_stage, candidates)
        n = self.index.count
        if len(queries) == 0 or n == 0:
            empty = [[] for _ in range(len(queries))]
            return SearchResults(empty, [list(e) for e in empty], [list(e) for e in empty], {"search_ms": 0.0, "rerank_ms": 0.0})
        xq = self.scale(queries.values, lam)
        gq = queries.gates if self.reranks else None
        second = rerank and self.reranks
        depth = min(n, max(k, candidates) if second else k)
        start = time.perf_counter()
        scores, rows = self._first_stage(xq, gq, first_stage, depth, theta)
        search_ms = _ms(start)
        start = time.perf_counter()
        if second:
            scores, rows = self.store.rerank(xq, gq, rows, k)
        rerank_ms = _ms(start) if second else 0.0
        return self._results(scores[:, :k], rows[:, :k], {"search_ms": search_ms, "rerank_ms": rerank_ms})

    def _results(self, scores: np.ndarray, rows: np.ndarray, timing: dict[str, float]) -> SearchResults:
        out_scores, out_rows = [], []
        for q_scores, q_rows in zip(scores, rows):
            keep = q_rows >= 0
            out_rows.append([int(r) for r in q_rows[keep]])
            out_scores.append([float(s) for s in q_scores[keep]])
        flat_ids = iter(self.store.ids_of([r for q_rows in out_rows for r in q_rows]))
        ids = [[next(flat_ids) for _ in q_rows] for q_rows in out_rows]
        return SearchResults(ids, out_scores, out_rows, timing)
