"""The approximate CPU first stage by a compressed scan of every row: 4-bit product codes, rescored exactly.

The codes (``first_stage.pqscan.faiss``, written by ``index.building.pqscan``) cut each row into ``m``
sub-vectors of a few dims and store each as the 4-bit number of its nearest of 16 trained centroids: a
row of 384 dims takes 48 bytes (an eighth of its float16 copy). A search scores every row's codes with
Faiss's fast scan (the 16-entry tables of the query's products with the centroids sit in SIMD registers)
and :class:`PQScanStore` scores the best of them again exactly against ``values`` (the index's one stored
copy, that the rerank reads too), so every score a search reports is exact and only the candidate set is
approximate.

Which codes are rescored is decided per query: every row whose code score lies within ``margin`` × |q| of
the k-th best code score, and at least ``rescore`` rows. A code score is off from the exact one by about
the same amount for any query of a given norm (it is q · (x − x̂), x̂ the row's code), so the margin that
keeps a query's exact top k inside the rescored set is about the same for queries like the corpus and for
queries from another domain (measured on 827k package summaries: the 95th percentile of the margin each
query needed was 0.062, 0.063 and 0.066 for held-out summaries, MS MARCO questions and sentences). What
differs is how many rows lie within it: a query far from the corpus has flatter scores, so it gets more
candidates, where a fixed number of candidates would lose its exact rows. The build calibrates the margin
to the recall target.

Every row is scanned, so the scan finds a query's neighbours wherever they lie: where a graph walk or
inverted lists lose most on queries unlike the corpus (another domain), this keeps their recall close
to the in-domain queries'. What it costs grows with the rows (a graph's cost does not), so it suits
corpora of up to a few million rows; the scale guide compares them.

The file holds a plain ``IndexPQ`` of 4-bit codes, one code row per index row in row order, so a fold
copies the kept rows' codes and encodes only the written rows; opening it repacks the codes into the
fast scan's blocked layout in memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.engines.first_stage_record import FirstStageRecord
from densehybrid.index.engines.hnsw_engine import kept_exactly, searched_exactly
from densehybrid.index.engines.host import HostRows
from densehybrid.index.errors import SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.gip import sort_by_score
from densehybrid.index.search.vector_store import VectorStore
from densehybrid.index.storage.files import PQSCAN_CODES

ANN_FILE = PQSCAN_CODES
NBITS = 4  # the fast scan's code size
DIMS_PER_CODE = 4  # 384 dims -> 96 codes of 4 bits: 48 bytes a row
# the most candidates a search may rescore (a service setting bounds ``rescore`` further)
MAX_RESCORE = 10_000
# the most candidates the margin may add (the scan returns this many code scores to pick them from)
MAX_WITHIN_MARGIN = 2_000
MAX_MARGIN = 10.0


def sub_quantizers(dim: int) -> int:
    """Codes per row: the fewest that divide ``dim`` with at most ``DIMS_PER_CODE`` dims each."""
    return min(m for m in range(1, dim + 1) if dim % m == 0 and m * DIMS_PER_CODE >= dim)


@dataclass(frozen=True)
class PQScanConfig(FirstStageRecord):
    """A scan of 4-bit product codes: ``m`` codes a row (0: ``dim / 4``) trained on ``train_size`` sampled
    rows. A query rescores exactly every candidate whose code score is within ``margin`` × |q| of the k-th
    best, and at least ``rescore`` candidates (the build calibrates the margin to a recall target)."""

    m: int = 0
    rescore: int = 50
    margin: float = 0.06
    train_size: int = 65_536
    seed: int = 1234
    trained_rows: int = 0  # the rows when the codebooks were trained (set by the build; a fold retrains past twice)

    def __post_init__(self):
        if self.m < 0 or min(self.rescore, self.train_size) < 1 or self.rescore > MAX_RESCORE:
            raise ValueError(f"pqscan m must be >= 0, rescore in 1..{MAX_RESCORE} and train_size >= 1")
        if not 0 <= self.margin <= MAX_MARGIN:
            raise ValueError(f"pqscan margin must be in 0..{MAX_MARGIN}, got {self.margin}")

    def to_dict(self) -> dict:
        """The manifest's ``first_stage`` entry."""
        return {"type": "pqscan", "file": ANN_FILE, "nbits": NBITS, **asdict(self)}


def is_pqscan(first_stage: dict) -> bool:
    return first_stage.get("type") == "pqscan"


def read_pqscan(path: Path, count: int, dim: int, config: PQScanConfig) -> faiss.Index:
    """The codes at ``path``, repacked for the fast scan; ValueError naming the problem when they are not
    ``count`` rows of ``dim`` in ``config.m`` 4-bit codes."""
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as exc:
        raise ValueError(f"not a readable Faiss index ({str(exc).splitlines()[0]})") from exc
    if not isinstance(index, faiss.IndexPQ):
        raise ValueError(f"holds a {type(index).__name__}, expected product codes (IndexPQ)")
    if index.ntotal != count or index.d != dim or index.pq.M != config.m or index.pq.nbits != NBITS:
        raise ValueError(f"holds {index.ntotal} rows of {index.d} dims in {index.pq.M} codes of {index.pq.nbits} "
                         f"bits, expected {count} of {dim} in {config.m} of {NBITS}")
    return faiss.IndexPQFastScan(index)


def within_margin(scores: np.ndarray, rows: np.ndarray, depth: int, margin: np.ndarray, least: int) -> np.ndarray:
    """``rows`` (Q, C), ordered by code ``scores`` (Q, C) descending, kept where the score is within ``margin``
    (Q,) of the ``depth``-th best or among the first ``least``: the rest (and missing rows) -1."""
    kth = scores[:, min(depth, scores.shape[1]) - 1:min(depth, scores.shape[1])]
    keep = (scores >= kth - margin[:, None]) | (np.arange(scores.shape[1]) < least)
    return np.where(keep & (rows >= 0), rows, -1)


class PQScanStore(HostRows, VectorStore):
    """Product-code candidates, exact scores: ``scan`` (an IndexPQFastScan over the N rows), values (N, dim)
    float16 or float32, the stored copy memory-mapped, gates (N, G) uint8 or None; by default a query rescores
    the candidates within ``margin`` × |q| of its k-th best code score, and at least ``rescore``. ``code_rows``
    maps codes to rows while a calibration holds some rows out of the codes (None: code i is row i)."""

    first_stage = "pqscan"

    def __init__(self, scan: faiss.Index, values: np.ndarray, gates: np.ndarray | None, doc_ids, rescore: int,
                 margin: float = 0.0, code_rows: np.ndarray | None = None):
        super().__init__(values, gates, doc_ids)
        self.scan, self.rescore, self.margin = scan, rescore, margin
        self.code_rows = code_rows  # (codes,) the row of each code (None: code i is row i)

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None, *,
                      margin: float | None = None, rescore: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if rescore is not None and not 1 <= rescore <= MAX_RESCORE:
            raise SearchError(f"rescore must be in 1..{MAX_RESCORE}, got {rescore}")
        if margin is not None and not 0 <= margin <= MAX_MARGIN:
            raise SearchError(f"margin must be in 0..{MAX_MARGIN}, got {margin}")
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if searched_exactly(selection):
            return kept_exactly(xq, self.values, selection, depth)
        least = max(rescore or self.rescore, depth)
        margin = self.margin if margin is None else margin
        wanted = max(least, MAX_WITHIN_MARGIN) if margin > 0 else least
        if selection is not None:
            # the fast scan takes no row selector: it returns as many more candidates as the filter keeps fewer
            # rows, and those the filter drops are not rescored
            wanted = min(MAX_RESCORE, int(np.ceil(wanted / selection.fraction)))
        scores, rows = self.scan.search(xq, min(wanted, self.scan.ntotal))
        if self.code_rows is not None:
            rows = np.where(rows >= 0, self.code_rows[np.maximum(rows, 0)], -1)
        if selection is not None:  # the kept rows first, in code-score order
            kept = (rows >= 0) & selection.mask[np.maximum(rows, 0)]
            order = np.argsort(~kept, axis=1, kind="stable")
            scores = np.where(kept, scores, -np.inf)
            scores, rows = np.take_along_axis(scores, order, 1), np.take_along_axis(np.where(kept, rows, -1), order, 1)
        rows = within_margin(scores, rows, depth, margin * np.linalg.norm(xq, axis=1), least)
        return rescore_kept(xq, self.values, rows, depth)


def rescore_kept(xq: np.ndarray, values: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner products of each query's kept candidate ``rows`` (Q, C) (-1: not kept) -> the top ``k``
    sorted. Only the kept rows are read, in row order (the memory map's pages in sequence): a query keeps a
    few hundred of the candidates the scan returned."""
    best_scores = np.full((len(xq), k), -np.inf, np.float32)
    best_rows = np.full((len(xq), k), -1, np.int64)
    for i, (q, candidates) in enumerate(zip(xq, rows)):
        kept = np.sort(candidates[candidates >= 0])
        scores = np.asarray(values[kept], dtype=np.float32) @ q
        top_scores, top_rows = sort_by_score(scores[None], kept[None], k)
        best_scores[i, :top_scores.shape[1]], best_rows[i, :top_rows.shape[1]] = top_scores[0], top_rows[0]
    return best_scores, best_rows
