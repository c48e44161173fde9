"""The approximate CPU first stage by a compressed scan of every row: 4-bit product codes, rescored exactly.

The codes (``first_stage.pqscan.faiss``, written by ``index.building.pqscan``) cut each row into ``m``
sub-vectors of a few dims and store each as the 4-bit number of its nearest of 16 trained centroids: a
row of 384 dims takes 48 bytes (an eighth of its float16 copy). A search scores every row's codes with
Faiss's fast scan (the 16-entry tables of the query's products with the centroids sit in SIMD registers)
and :class:`PQScanStore` scores the best of them again exactly against ``values`` (the index's one stored
copy, that the rerank reads too), so every score a search reports is exact and only the candidate set is
approximate.

Which codes are rescored is decided per query: every row whose code score lies within ``margin`` × |q| of
the k-th best code score (or of the k-th best exact score of the ``rescore`` best codes, where that is
lower), and at least ``rescore`` rows; when more than ``MAX_RESCORE`` rows lie within it, every row is
scanned exactly instead. A lone query finds those rows by one range search placed by a sample of the codes
(``pqscan_sample``), a batch or a filtered one by a top list long enough to hold them. A code score is off
from the exact one by about the same amount for any query of a given norm (it is q · (x − x̂), x̂ the row's
code), so the margin that keeps a query's exact top k inside the rescored set is about the same for queries
like the corpus and from another domain (on 827k package summaries, the 95th percentile of the margin each
query needed was 0.062, 0.063 and 0.066 for held-out summaries, MS MARCO questions and sentences). What
differs is how many rows lie within it: a query far from the corpus has flatter scores, so it gets more
candidates, where a fixed number would lose its exact rows. The build calibrates the margin to a target.

Every row is scanned, so the scan finds a query's neighbours wherever they lie, and keeps the recall of
queries from another domain close to the in-domain queries' (a graph walk loses most there); its cost
grows with the rows, a graph's does not (the scale guide compares them).

A filter is applied inside the scan (a row selector over the codes): a filtered search ranks the kept
rows' code scores alone and treats them exactly as an unfiltered search treats every row, however unlike
the query the kept rows are. A kept row the exact answer holds is missed only when its code is off by
more than the margin. Where the kept rows' best scores are dense (a filter keeping the rows least like
the query), more rows lie within the margin: up to ``MAX_RESCORE`` are rescored, beyond that the kept rows
are scanned exactly (through the flat index when the store has it): up to one exact scan of them.

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
from densehybrid.index.engines.pqscan_sample import CodeSample
from densehybrid.index.engines.pqscan_shards import ShardedScan, split_codes
from densehybrid.index.errors import SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.gip import sort_by_score
from densehybrid.index.search.vector_store import VectorStore
from densehybrid.index.search.widening import as_float32
from densehybrid.index.storage.files import PQSCAN_CODES

ANN_FILE = PQSCAN_CODES
NBITS = 4  # the fast scan's code size
DIMS_PER_CODE = 4  # 384 dims -> 96 codes of 4 bits: 48 bytes a row
# the most candidates a search may rescore (a service setting bounds ``rescore`` further); a query with more
# rows within its margin is scanned exactly
MAX_RESCORE = 10_000
# the code scores a top list holds to pick the rows within the margin from (more: scanned again for MAX_RESCORE)
MAX_WITHIN_MARGIN = 2_000
MAX_MARGIN = 10.0
# a range search and a top list round a code score apart (a few float32 steps): a range is asked a little lower
ROUNDING = 1e-5


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


def read_pqscan(path: Path, count: int, dim: int, config: PQScanConfig) -> ShardedScan:
    """The codes at ``path``, repacked for the fast scan; ValueError naming the problem when they are not
    ``count`` rows of ``dim`` in ``config.m`` 4-bit codes."""
    return code_scan(read_codes(path, count, dim, config))


def read_codes(path: Path, count: int, dim: int, config: PQScanConfig, flags: int = 0) -> faiss.IndexPQ:
    """The codes at ``path`` as written (``flags``: Faiss's read flags, e.g. to map them); ValueError as
    :func:`read_pqscan`."""
    try:
        index = faiss.read_index(str(path), flags)
    except RuntimeError as exc:
        raise ValueError(f"not a readable Faiss index ({str(exc).splitlines()[0]})") from exc
    if not isinstance(index, faiss.IndexPQ):
        raise ValueError(f"holds a {type(index).__name__}, expected product codes (IndexPQ)")
    if index.ntotal != count or index.d != dim or index.pq.M != config.m or index.pq.nbits != NBITS:
        raise ValueError(f"holds {index.ntotal} rows of {index.d} dims in {index.pq.M} codes of {index.pq.nbits} "
                         f"bits, expected {count} of {dim} in {config.m} of {NBITS}")
    return index


def fast_scan(codes: faiss.IndexPQ) -> faiss.IndexIVFPQFastScan:
    """The 4-bit ``codes`` repacked for the fast scan, as one inverted list whose ids are the rows.

    Faiss's fast scan of a plain IndexPQ takes no row selector; its inverted-list form does, and with one
    list and no residual it scans the same codes with the same look-up tables: the same code scores, bit
    for bit. So a filtered search scans every kept row's code, and only those, as an unfiltered one scans
    every row's.
    """
    return split_codes(codes, 1)


def code_scan(codes: faiss.IndexPQ, shards: int = 1, cores: int | None = None) -> ShardedScan:
    """``codes`` as a search reads them: the fast scan in ``shards`` row shards (one query's scan spread over up to
    that many threads) and the sample of the codes that places a lone query's range search."""
    return ShardedScan(split_codes(codes, shards), cores, sample=CodeSample(codes))


def margin_floor(scores: np.ndarray, depth: int, margin: np.ndarray, found: np.ndarray | None = None) -> np.ndarray:
    """(Q,) the lowest code score within ``margin`` (Q,) of the ``depth``-th best of the code ``scores`` (Q, C),
    descending, or of ``found`` (Q,), the ``depth``-th best exact score of the rows rescored so far, where that
    is lower. Where many rows score alike (a filter keeping the rows least like the query), the ``depth``-th
    best code score is the luckiest code's, above the exact score it stands for: the exact one keeps every
    row whose code is off by less than the margin."""
    kth = scores[:, min(depth, scores.shape[1]) - 1]
    return (kth if found is None else np.minimum(kth, found)) - margin


def within_margin(scores: np.ndarray, rows: np.ndarray, depth: int, margin: np.ndarray, least: int | np.ndarray,
                  found: np.ndarray | None = None) -> np.ndarray:
    """``rows`` (Q, C), ordered by code ``scores`` (Q, C) descending, kept where the score is above
    :func:`margin_floor` or among the first ``least`` (or (Q, 1), per query): the rest (and missing rows) -1."""
    keep = (scores >= margin_floor(scores, depth, margin, found)[:, None]) | (np.arange(scores.shape[1]) < least)
    return np.where(keep & (rows >= 0), rows, -1)


class PQScanStore(HostRows, VectorStore):
    """Product-code candidates, exact scores: ``scan`` (:func:`fast_scan` of the N rows' codes, or a
    ``pqscan_shards.ShardedScan`` of them in row shards, which spreads one query's scan over threads), values (N, dim)
    float16 or float32, the stored copy memory-mapped, gates (N, G) uint8 or None; by default a query rescores
    the candidates within ``margin`` × |q| of its k-th best code score, and at least ``rescore``; ``flat`` the
    Faiss flat index of the stored copy, for the exact scans (None: numpy reads ``values``). ``code_rows`` maps
    codes to rows while a calibration holds some rows out of the codes (None: code i is row i)."""

    first_stage = "pqscan"

    def __init__(self, scan: faiss.Index, values: np.ndarray, gates: np.ndarray | None, doc_ids, rescore: int,
                 margin: float = 0.0, flat: faiss.Index | None = None, code_rows: np.ndarray | None = None):
        super().__init__(values, gates, doc_ids)
        self.scan = scan if isinstance(scan, ShardedScan) else ShardedScan(scan)  # one list: scanned in place
        self.rescore, self.margin, self.flat = rescore, margin, flat
        self.code_rows = code_rows  # (codes,) the row of each code (None: code i is row i)

    @property
    def scan_threads(self) -> int:
        """The threads one query's code scan may spread over (its shards)."""
        return self.scan.threads

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None, *,
                      margin: float | None = None, rescore: int | None = None, held: int | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``depth`` of the candidates by exact score; the margin keeps the first ``held`` (None: all) as an exact
        scan would, the rest are the best of the ``depth`` best codes (a rerank's candidates need no margin, which
        at a depth of 1,000 held so many rows that every search became an exact scan)."""
        if rescore is not None and not 1 <= rescore <= MAX_RESCORE:
            raise SearchError(f"rescore must be in 1..{MAX_RESCORE}, got {rescore}")
        if margin is not None and not 0 <= margin <= MAX_MARGIN:
            raise SearchError(f"margin must be in 0..{MAX_MARGIN}, got {margin}")
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if searched_exactly(selection):
            return kept_exactly(xq, self.values, selection, depth, self.flat)
        least = max(rescore or self.rescore, depth)
        margin = self.margin if margin is None else margin
        within = depth if held is None else min(max(held, 1), depth)
        rows, spilled = self._candidates(xq, within, least, margin * np.linalg.norm(xq, axis=1),
                                         max(least + tie_room(least), MAX_WITHIN_MARGIN if margin > 0 else 0),
                                         selection)
        scores, found = rescore_kept(xq, self.values, rows, depth)
        if spilled.any():  # more rows within the margin than the widest scan returns: every kept row, exactly
            scores[spilled], found[spilled] = kept_exactly(xq[spilled], self.values, selection, depth, self.flat)
        return scores, found

    def _candidates(self, xq: np.ndarray, depth: int, least: int, width: np.ndarray, wanted: int,
                    selection: Selection | None) -> tuple[np.ndarray, np.ndarray]:
        """(Q, C) the rows to rescore (-1: none): the kept rows above :func:`margin_floor` (``width`` (Q,)
        below the ``depth``-th best kept code score, or the exact one of the ``least`` best codes where lower)
        and the ``least`` best (with every row tied with the ``least``-th: which of a tied run a scan returns
        is its own choice, so the run is taken whole, the same rows for any number of shards); (Q,) whether a
        query has more kept rows above its floor than ``MAX_RESCORE`` (its rows are then all -1).

        A filter's dropped rows are skipped inside the scan, so its best code scores are the kept rows' best
        and the kept rows are treated exactly as an unfiltered search treats every row. When the lowest
        score returned is still above the floor, one wider scan looks further."""
        count = self.scan.ntotal if selection is None else selection.count
        if (len(xq) == 1 and width[0] > 0 and least > depth and self.scan.sample is not None
                and (selection is None or selection.everything)):
            above = self._candidates_above(xq, depth, least, width, count)
            if above is not None:
                return above
        scores, rows = self._scan(xq, min(wanted, count), selection)
        least = (scores >= scores[:, min(least, scores.shape[1]) - 1:][:, :1]).sum(1, keepdims=True)  # (Q, 1)
        found = None  # without a margin the ``least`` best codes are rescored, and only those
        if width.any():
            found = rescore_kept(xq, self.values, np.where(np.arange(rows.shape[1]) < least, rows, -1), depth)[0][:, -1]
        floor = margin_floor(scores, depth, width, found)
        spilled = (scores[:, -1] > floor) & (wanted < count)
        if spilled.any() and wanted < MAX_RESCORE:
            wider = min(MAX_RESCORE, count)
            more_scores, more_rows = self._scan(xq[spilled], wider, selection)
            scores = np.pad(scores, ((0, 0), (0, wider - scores.shape[1])), constant_values=-np.inf)
            rows = np.pad(rows, ((0, 0), (0, wider - rows.shape[1])), constant_values=-1)
            scores[spilled], rows[spilled] = more_scores, more_rows
            spilled[spilled] = (more_scores[:, -1] > floor[spilled]) & (wider < count)
        rows = within_margin(scores, rows, depth, width, least, found)
        rows[spilled] = -1
        return rows, spilled

    def _candidates_above(self, xq: np.ndarray, depth: int, least: int, width: np.ndarray, count: int
                          ) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`_candidates` of a lone unfiltered query by one range search (``pqscan_sample``); None when the
        sample cannot place the radius or placed it above the floor or the ``least`` best. Taken where ``least`` >
        ``depth``: else their depth-th best exact score is their worst, up to a margin below the code score, and a
        radius from the sample fell above the floor for 2-90 % of queries (at depths 50 to 1,000)."""
        radius = self.scan.sample.radius(xq, depth, float(width[0]))
        if radius is None:
            return None
        scores, codes = self.scan.above(xq, radius - ROUNDING * max(1.0, abs(radius)))  # every score above the radius
        if len(codes) < min(least, count):
            return None
        least, depth = min(least, len(codes)), min(depth, len(codes))
        negated = np.partition(-scores, (depth - 1, least - 1))
        head = scores >= -negated[least - 1]  # the ``least`` best, a run tied with the last of them whole
        rows = self._rows_of(codes)
        found = rescore_kept(xq, self.values, np.where(head, rows, -1)[None], depth)[0][0, -1]
        floor = min(-negated[depth - 1], found) - width[0]  # as :func:`margin_floor` sets it
        if floor <= radius:  # rows on or below the radius may lie above the floor
            return None
        kept = rows[head | (scores >= floor)][None]
        spilled = np.array([kept.shape[1] > MAX_RESCORE])
        return (np.full((1, 0), -1, np.int64) if spilled[0] else kept), spilled

    def _rows_of(self, codes: np.ndarray) -> np.ndarray:
        """The rows of code numbers ``codes`` (-1 stays -1)."""
        return codes if self.code_rows is None else np.where(codes >= 0, self.code_rows[np.maximum(codes, 0)], -1)

    def _scan(self, xq: np.ndarray, wanted: int, selection: Selection | None) -> tuple[np.ndarray, np.ndarray]:
        """The best ``wanted`` code scores (Q, wanted) of the rows ``selection`` keeps, and their rows (-1: none, or
        tied with the score after the cut: the same rows for any number of shards)."""
        params = faiss.SearchParametersIVF(nprobe=1)
        if selection is not None and not selection.everything:
            kept = selection.mask if self.code_rows is None else selection.mask[np.maximum(self.code_rows, 0)]
            bits = np.packbits(kept, bitorder="little")
            params.sel = faiss.IDSelectorBitmap(len(kept), faiss.swig_ptr(bits))  # bits outlive the search
        scores, rows = self.scan.search(xq, wanted, params)
        return scores, self._rows_of(rows)


def tie_room(least: int) -> int:
    """Code scores past the ``least`` best a scan without a margin returns, so that a run of equal scores across
    the ``least``-th usually ends inside the list (a run reaching its end is dropped: ``pqscan_shards``)."""
    return max(8, least // 4)


def rescore_kept(xq: np.ndarray, values: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner products of each query's kept candidate ``rows`` (Q, C) (-1: not kept) -> the top ``k``
    sorted. Only the kept rows are read, in row order (the memory map's pages in sequence): a query keeps a
    few hundred of the candidates the scan returned."""
    best_scores = np.full((len(xq), k), -np.inf, np.float32)
    best_rows = np.full((len(xq), k), -1, np.int64)
    for i, (q, candidates) in enumerate(zip(xq, rows)):
        kept = np.sort(candidates[candidates >= 0])
        scores = as_float32(values[kept]) @ q
        top_scores, top_rows = sort_by_score(scores[None], kept[None], k)
        best_scores[i, :top_scores.shape[1]], best_rows[i, :top_rows.shape[1]] = top_scores[0], top_rows[0]
    return best_scores, best_rows
