"""What the local stores share: rows held in this process (memory maps of the index files)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from densehybrid.index.search import fusion, gip
from densehybrid.index.search.filters import Selection


class HostRows:
    """values (N, dim) float16 (a memory map is fine), gates (N, G) uint8 or None, ids in row order."""

    def __init__(self, values: np.ndarray, gates: np.ndarray | None, doc_ids: Sequence[str]):
        self.values, self.gates, self.doc_ids = values, gates, doc_ids

    def approx_gip(self, xq: np.ndarray, gq: np.ndarray | None, theta: float, depth: int,
                   selection: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        # a scan that reads only the query's active columns: it stays on the host for every engine
        return gip.approx_topk(xq, gq, self.values, self.gates, theta, depth,
                               mask=None if selection is None else selection.mask)

    # exact scores of candidate rows, read from the host copy
    def rerank(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return gip.rerank(xq, gq, self.values, self.gates, rows, k)

    def part_scores(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        safe = np.where(rows >= 0, rows, 0)
        lexical, dense = fusion.split_query(xq, 0 if self.gates is None else self.gates.shape[1])
        return (gip.score_rows(lexical, gq, self.values, self.gates, safe),
                gip.score_rows(dense, gq, self.values, self.gates, safe))

    def hit_parts(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # a page of rows read from the host copy, also for a store resident on a GPU
        return gip.hit_part_scores(xq, gq, self.values, self.gates, rows)

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        return [self.doc_ids[r] for r in rows]
