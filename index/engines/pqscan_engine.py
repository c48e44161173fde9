"""The approximate CPU first stage by a compressed scan of every row: 4-bit product codes, rescored exactly.

The codes (``first_stage.pqscan.faiss``, written by ``index.building.pqscan``) cut each row into ``m``
sub-vectors of a few dims and store each as the 4-bit number of its nearest of 16 trained centroids: a
row of 384 dims takes 48 bytes (an eighth of its float16 copy). A search scores every row's codes with
Faiss's fast scan (the 16-entry tables of the query's products with the centroids sit in SIMD registers)
and :class:`PQScanStore` scores its ``rescore`` best again exactly against ``values`` (the index's one
stored copy, that the rerank reads too), so every score a search reports is exact and only the candidate
set is approximate.

Every row is scanned, so the scan finds a query's neighbours wherever they lie: where a graph walk or
inverted lists lose most on queries unlike the corpus (another domain), this keeps their recall close
to the in-domain queries'. What it costs grows with the rows (a graph's cost does not), so it suits
corpora of up to a few million rows; the scale guide compares them.

The file holds a plain ``IndexPQ`` of 4-bit codes, one code row per index row in row order, so a fold
copies the kept rows' codes and encodes only the written rows; opening it repacks the codes into the
fast scan's blocked layout in memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.engines.faiss_engine import exact_over
from densehybrid.index.engines.hnsw_engine import rescore as rescore_rows, searched_exactly
from densehybrid.index.engines.host import HostRows
from densehybrid.index.errors import SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.vector_store import VectorStore
from densehybrid.index.storage.files import PQSCAN_CODES

ANN_FILE = PQSCAN_CODES
NBITS = 4  # the fast scan's code size
DIMS_PER_CODE = 4  # 384 dims -> 96 codes of 4 bits: 48 bytes a row
# the most candidates a search may rescore (a service setting bounds it further)
MAX_RESCORE = 10_000


def sub_quantizers(dim: int) -> int:
    """Codes per row: the fewest that divide ``dim`` with at most ``DIMS_PER_CODE`` dims each."""
    return min(m for m in range(1, dim + 1) if dim % m == 0 and m * DIMS_PER_CODE >= dim)


@dataclass(frozen=True)
class PQScanConfig:
    """A scan of 4-bit product codes: ``m`` codes a row (0: ``dim / 4``) trained on ``train_size`` sampled
    rows; ``rescore`` candidates per query scored again exactly by default (the build calibrates it)."""

    m: int = 0
    rescore: int = 300
    train_size: int = 65_536
    seed: int = 1234
    trained_rows: int = 0  # the rows when the codebooks were trained (set by the build; a fold retrains past twice)

    def __post_init__(self):
        if self.m < 0 or min(self.rescore, self.train_size) < 1 or self.rescore > MAX_RESCORE:
            raise ValueError(f"pqscan m must be >= 0, rescore in 1..{MAX_RESCORE} and train_size >= 1")

    def to_dict(self) -> dict:
        """The manifest's ``first_stage`` entry."""
        return {"type": "pqscan", "file": ANN_FILE, "nbits": NBITS, **asdict(self)}

    @classmethod
    def from_dict(cls, record: dict) -> "PQScanConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


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


class PQScanStore(HostRows, VectorStore):
    """Product-code candidates, exact scores: ``scan`` (an IndexPQFastScan over the N rows), values (N, dim)
    float16 or float32, the stored copy memory-mapped, gates (N, G) uint8 or None; ``rescore`` the candidates
    per query scored again exactly by default."""

    first_stage = "pqscan"

    def __init__(self, scan: faiss.Index, values: np.ndarray, gates: np.ndarray | None, doc_ids, rescore: int):
        super().__init__(values, gates, doc_ids)
        self.scan, self.rescore = scan, rescore

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None, *,
                      rescore: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if rescore is not None and not 1 <= rescore <= MAX_RESCORE:
            raise SearchError(f"rescore must be in 1..{MAX_RESCORE}, got {rescore}")
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if searched_exactly(selection):
            return exact_over(xq, lambda rows: np.asarray(self.values[rows], dtype=np.float32),
                              np.flatnonzero(selection.mask), depth)
        wanted = max(rescore or self.rescore, depth)
        if selection is not None:
            # the fast scan takes no row selector: it returns as many more candidates as the filter keeps fewer
            # rows, and those the filter drops are not rescored
            wanted = min(MAX_RESCORE, int(np.ceil(wanted / selection.fraction)))
        rows = self.scan.search(xq, min(wanted, self.scan.ntotal))[1]
        if selection is not None:
            rows = np.where((rows >= 0) & selection.mask[np.maximum(rows, 0)], rows, -1)
        return rescore_rows(xq, self.values, rows, depth)

