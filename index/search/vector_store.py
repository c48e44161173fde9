"""Where an index's vectors live, as the searcher sees them: one protocol, one implementation per engine.

The engines (``index.engines``): ``faiss_engine.FaissStore`` (CPU; flat or PQ first stage),
``torch_engine.TorchStore`` (exact, resident on CPU or GPU devices) and
``milvus_engine.MilvusStore`` (a collection). :class:`~densehybrid.index.search.searcher.Searcher`
takes one from the index when it is built and never asks which it has.

Shared conventions: ``xq (Q, dim)`` float32 queries, already λ-scaled; ``gq (Q, G)`` uint8
query gates or None; ``rows (Q, K)`` int64 index rows, -1 for none. Results are sorted by
score descending, ties by row ascending, -1 rows (score -inf) last. ``selection``
(:class:`~densehybrid.index.search.filters.Selection`) restricts a first stage to a filter's rows
before its top-k: a mask for the local stores, an expression for Milvus.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from densehybrid.index.search.filters import Selection


@runtime_checkable
class VectorStore(Protocol):
    #: what answers ``inner_product``: ``flat`` (exact), ``hnsw`` or ``pqscan`` (approximate candidates;
    #: ``inner_product`` then also takes ``ef_search``, the graph breadth, or ``margin`` and ``rescore``), or a
    #: Milvus collection's ``hnsw`` or ``ivf`` (``nprobe``, the lists scanned)
    first_stage: str

    def inner_product(self, xq: np.ndarray, depth: int,
                      selection: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        """First stage by plain inner product -> scores, rows (Q, min(depth, N))."""

    def approx_gip(self, xq: np.ndarray, gq: np.ndarray | None, theta: float, depth: int,
                   selection: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        """First stage by approximate GIP (gated query dims above ``theta`` only) -> scores, rows;
        raises :class:`~densehybrid.index.errors.SearchError` where the store cannot."""

    def rerank(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray,
               k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact GIP of the candidate ``rows`` (Q, K) -> the top ``k`` (scores, rows) per query."""

    def part_scores(self, xq: np.ndarray, gq: np.ndarray | None,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact scores (Q, K) float32 of the candidate ``rows`` by each part: (gated GIP, open
        inner product), from one read of the rows; cells where ``rows`` is -1 are meaningless."""

    def hit_parts(self, xq: np.ndarray, gq: np.ndarray | None,
                  rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact (gated part, open part) scores (Q, K) float32 of a page of hits ``rows`` (-1: 0), each
        hit scored on its own (``gip.hit_part_scores``): the same whichever rows come with it."""

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        """Document ids of index rows, in the given order."""
