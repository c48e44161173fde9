"""Where the vectors live, seen by the searcher: the exact inner-product first stage and the rerank.

:class:`Searcher` asks a :class:`VectorStore` for the ``depth`` best rows by inner
product, for the exact GIP of candidate rows, and for the ids of rows. The local
index (Faiss + memory-mapped values) and a Milvus collection (``index.milvus``)
both answer these three questions, so the searcher does not branch on the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from densehybrid.index import flat, gip
from densehybrid.index.store import IndexFiles


class VectorStore(Protocol):
    def inner_product(self, xq: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """xq (Q, dim) float32 -> scores, rows (Q, depth), best first, ties by row, -1 where none."""

    def rerank(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact GIP of candidate ``rows`` (Q, K) -> the top ``k`` (scores, rows) per query."""

    def score_rows(self, xqs: Sequence[np.ndarray], gq: np.ndarray | None, rows: np.ndarray) -> list[np.ndarray]:
        """Exact GIP (Q, K) of candidate ``rows`` for each query array in ``xqs`` (the parts of a
        normalised fusion); scores where ``rows`` is -1 are meaningless (callers mask them)."""

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        """Document ids of index rows, in the given order."""


class LocalStore:
    """A loaded index directory: Faiss (CPU) for the first stage, the float16 values for the rerank.

    (The torch engine, ``index.device_search``, is the other local path; the searcher keeps it as is.)
    """

    def __init__(self, index: IndexFiles):
        self.index = index
        self.faiss = index.faiss

    def inner_product(self, xq: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = flat.search(self.faiss, xq, depth)
        return gip.sort_by_score(scores, rows, depth)

    def rerank(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return gip.rerank(xq, gq, self.index.values, self.index.gates, rows, k)

    def score_rows(self, xqs: Sequence[np.ndarray], gq: np.ndarray | None, rows: np.ndarray) -> list[np.ndarray]:
        safe = np.where(rows >= 0, rows, 0)
        return [gip.score_rows(xq, gq, self.index.values, self.index.gates, safe) for xq in xqs]

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        return [self.index.doc_ids[r] for r in rows]


def rerank_fetched(xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int, fetched_rows: np.ndarray,
                   values: np.ndarray, gates: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gip.rerank` over vectors fetched for ``fetched_rows`` (U,) only, e.g. from a remote store.

    ``values`` (U, dim) and ``gates`` (U, G) are the stored vectors of ``fetched_rows``;
    ``rows`` (Q, K) are index rows (-1 = none), every one of them in ``fetched_rows``.
    """
    valid = rows >= 0
    scores = score_fetched([xq], gq, rows, fetched_rows, values, gates)[0]
    return gip.sort_by_score(scores, np.where(valid, rows, -1), k)


def score_fetched(xqs: Sequence[np.ndarray], gq: np.ndarray | None, rows: np.ndarray, fetched_rows: np.ndarray,
                  values: np.ndarray, gates: np.ndarray | None) -> list[np.ndarray]:
    """:func:`gip.score_rows` for each of ``xqs`` over vectors fetched for ``fetched_rows`` only."""
    order = np.argsort(fetched_rows, kind="stable")
    valid = rows >= 0
    position = np.searchsorted(fetched_rows[order], np.where(valid, rows, fetched_rows.min(initial=0)))
    local = order[np.minimum(position, max(len(order) - 1, 0))] if len(order) else np.zeros_like(rows)
    safe = np.where(valid, local, 0)
    return [gip.score_rows(xq, gq, values, gates, safe) for xq in xqs]
