"""The approximate CPU first stage: a Faiss HNSW graph over compact codes, rescored from the exact rows.

The graph (``first_stage.hnsw.faiss``, written by ``index.building.ann``) stores each vector as
8-bit (``sq8``) or float16 (``fp16``) scalar-quantized codes, so it adds a quarter or a half of the
float32 copy a flat Faiss index would. It links and walks the rows by inner product (``metric``
``inner_product``), each padded with zeros to a multiple of 16 dims, which Faiss's codes need for SIMD.
Graphs written before were linked by L2 over each row with one more dim, ``sqrt(max_norm2 - |x|²)``
(``l2_augmented``: the L2 order of those is the inner-product order of the originals); they still load
and search, the query padded alike. On rows of unequal norms (the lexical vectors of the DLR and fusion
kinds) that added dim dominates the distances, and the walk lost most neighbours: over 206,821 DLR-768
rows at ``ef_search`` 2048 it found 0.60 (held-out summaries) and 0.30 (MS MARCO questions) of the exact
top 10, where the inner-product graph found 0.998 and 0.978. On unit rows the two graphs find the same.
It only finds candidates: :class:`HnswStore` reads each
query's ``ef_search`` best from the graph and scores them again exactly against ``values`` (the
index's one stored copy, ``vectors.faiss`` memory-mapped, that the rerank reads too), so every score a search reports is exact and only the
candidate set is approximate. A filter that keeps few rows is answered exactly over those rows
(a graph search would visit mostly rows it must skip). Otherwise the walk returns kept rows only and is
widened as the filter keeps fewer. A filter that keeps a query's nearest rows markedly less than the
rest (a filter keeping the rows least like the query) has its best rows away from where the walk goes:
such a search scans the kept rows exactly. Any other filtered answer is checked by :func:`checked`
against a random draw of the kept rows, and one a drawn row beats is replaced the same way. After a fold
added rows to the graph instead of rebuilding it, or once a build added the rows its calibration held out
after the others, its nodes are no longer the rows: ``node_rows`` maps them (-1 for a row a fold dropped,
which the walk passes through but never returns).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.engines.faiss_engine import exact_over, search as faiss_search, search_kept
from densehybrid.index.engines.first_stage_record import FirstStageRecord
from densehybrid.index.engines.host import HostRows
from densehybrid.index.errors import IndexLoadError, SearchError
from densehybrid.index.search import gip
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.vector_store import VectorStore
from densehybrid.index.search.widening import as_float32
from densehybrid.index.storage.files import HNSW_GRAPH, HNSW_NODE_ROWS

ANN_FILE = HNSW_GRAPH  # the file this engine reads (its name is the index layout's, ``index.storage.files``)
NODE_ROWS = HNSW_NODE_ROWS  # node -> row, once nodes are not rows (a fold dropped some, a build added some last)
ENCODINGS = {"sq8": faiss.ScalarQuantizer.QT_8bit, "fp16": faiss.ScalarQuantizer.QT_fp16}
INNER_PRODUCT, L2_AUGMENTED = "inner_product", "l2_augmented"
METRICS = {INNER_PRODUCT: faiss.METRIC_INNER_PRODUCT, L2_AUGMENTED: faiss.METRIC_L2}
# a filter keeping at most this many rows, or this fraction of them, is searched exactly over its rows:
# a scan of 20k rows costs about what a graph walk does, and below 5% the walk meets mostly rows it
# must skip (estimates, not yet measured against each other)
EXACT_KEPT_ROWS = 20_000
EXACT_KEPT_FRACTION = 0.05
# the widest graph walk a search may ask for (a service setting bounds it further)
MAX_EF_SEARCH = 10_000


@dataclass(frozen=True)
class HNSWConfig(FirstStageRecord):
    """A Faiss HNSW first stage: ``m`` links per node, ``ef_construction`` at build time, ``ef_search``
    candidates per query by default, codes in ``encoding`` (``sq8`` or ``fp16``)."""

    m: int = 32
    ef_construction: int = 128
    ef_search: int = 128
    encoding: str = "sq8"
    train_size: int = 65_536
    seed: int = 1234
    max_norm2: float = 0.0  # l2_augmented: the largest squared norm of a row (set by the build, for the added dim)
    metric: str = INNER_PRODUCT

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown HNSW encoding {self.encoding!r}; use one of {', '.join(ENCODINGS)}")
        if self.metric not in METRICS:
            raise ValueError(f"unknown HNSW metric {self.metric!r}; use one of {', '.join(METRICS)}")
        if min(self.m, self.ef_construction, self.ef_search, self.train_size) < 1:
            raise ValueError("HNSW m, ef_construction, ef_search and train_size must be >= 1")

    def to_dict(self) -> dict:
        """The manifest's ``first_stage`` entry."""
        return {"type": "hnsw", "file": ANN_FILE, **asdict(self)}

    @classmethod
    def from_dict(cls, record: dict) -> HNSWConfig:
        """A manifest's entry; one written before graphs were linked by inner product names no metric."""
        return super().from_dict({"metric": L2_AUGMENTED, **record})


def is_hnsw(first_stage: dict) -> bool:
    return first_stage.get("type") == "hnsw"


def read_ann(path: Path, count: int, dim: int) -> faiss.Index:
    """The graph file at ``path`` (codes memory-mapped); ValueError naming the problem when it is not ``count``
    vectors of ``dim``."""
    try:
        # the codes are memory-mapped in place (pages read as walks reach them); the links are read in
        index = faiss.read_index(str(path), getattr(faiss, "IO_FLAG_MMAP_IFC", 0))
    except RuntimeError as exc:
        raise ValueError(f"not a readable Faiss index ({str(exc).splitlines()[0]})") from exc
    if not isinstance(index, faiss.IndexHNSW):
        raise ValueError(f"holds a {type(index).__name__}, expected an HNSW index")
    augmented = index.metric_type == faiss.METRIC_L2
    widths = (dim + 1, graph_width(dim, L2_AUGMENTED)) if augmented else (graph_width(dim),)  # before padding: dim + 1
    if index.ntotal != count or index.d not in widths:
        raise ValueError(f"holds {index.ntotal} vectors of {index.d} dims, expected {count} of {widths[-1]}")
    return index


def check_node_rows(path: Path, node_rows: np.ndarray | None, count: int) -> None:
    """The full check of a node -> row map (reads it): its live nodes are the ``count`` rows, one each."""
    if node_rows is not None and not np.array_equal(np.sort(node_rows[node_rows >= 0]), np.arange(count)):
        raise IndexLoadError(f"{path}: its live nodes are not the index's {count} rows, one each")


# the graph's vectors are padded with zeros to a multiple of this many dims: Faiss's 8-bit codes are compared
# with SIMD only then (at 827k x 384, 385 dims searched 5 times slower than 400)
SIMD_DIMS = 16


def graph_width(dim: int, metric: str = INNER_PRODUCT) -> int:
    """The dims of the graph's vectors for rows of ``dim``, padded to SIMD_DIMS (``l2_augmented``: one more, the
    inner-product dim)."""
    return -(-(dim + (metric == L2_AUGMENTED)) // SIMD_DIMS) * SIMD_DIMS


def graph_rows(xb: np.ndarray, config: HNSWConfig, width: int | None = None) -> np.ndarray:
    """(N, dim) rows -> (N, ``width``) float32 (default :func:`graph_width`), the vectors the graph of ``config``
    holds: the rows and zeros, with ``sqrt(max_norm2 - |x|²)`` after the rows for an ``l2_augmented`` graph
    (whose L2 neighbours of :func:`augment_queries` are then the top inner products)."""
    xb = as_float32(xb)
    out = np.zeros((len(xb), width or graph_width(xb.shape[1], config.metric)), np.float32)
    out[:, :xb.shape[1]] = xb
    if config.metric == L2_AUGMENTED:
        out[:, xb.shape[1]] = np.sqrt(np.maximum(config.max_norm2 - np.einsum("ij,ij->i", xb, xb), 0.0))
    return out


def augment_queries(xq: np.ndarray, width: int) -> np.ndarray:
    """(Q, dim) queries -> (Q, ``width``) float32: the queries, then zeros (the padding, and the added dim of an
    ``l2_augmented`` graph)."""
    out = np.zeros((len(xq), width), np.float32)
    out[:, :xq.shape[1]] = xq
    return out


def rescore(xq: np.ndarray, values: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner products of each query's candidate ``rows`` (Q, K) (-1: none) -> the top ``k`` sorted."""
    valid = rows >= 0
    safe = np.where(valid, rows, 0)
    # one gather and a row-wise product per query: a few hundred rows, too few to pay for a threaded matmul
    scores = np.stack([as_float32(values[r]) @ q for q, r in zip(xq, safe)])
    return gip.sort_by_score(np.where(valid, scores, -np.inf), np.where(valid, rows, -1), k)


def searched_exactly(selection: Selection | None) -> bool:
    """Whether a filter keeps so few rows that scanning them beats walking the graph."""
    return selection is not None and (selection.count <= EXACT_KEPT_ROWS
                                      or selection.fraction < EXACT_KEPT_FRACTION)


def kept_exactly(xq: np.ndarray, values: np.ndarray, selection: Selection | None, depth: int,
                 flat: faiss.Index | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The exact top ``depth`` over the rows ``selection`` keeps (every row for None), read from ``values``, or
    scanned by ``flat`` (the Faiss flat index of the same file, which skips the other rows: over 827k random
    rows of 384 float16 dims, keeping 5 to 80 % of them took 11 to 110 ms where numpy took 50 to 1,500 ms)."""
    if flat is not None:
        return search_kept(flat, xq, depth, np.ones(len(values), bool) if selection is None else selection.mask)
    rows = np.arange(len(values)) if selection is None else np.flatnonzero(selection.mask)
    return exact_over(xq, lambda chunk: as_float32(values[chunk]), rows, depth)


# kept rows scored exactly after an approximate filtered search, to check its answer (about a millisecond)
CHECKED_ROWS = 1024
# the nearest rows of an unfiltered walk whose kept share tells a filter that avoids the query's neighbours
NEIGHBOURS = 64


def settled(xq: np.ndarray, values: np.ndarray, selection: Selection, found: tuple[np.ndarray, np.ndarray],
            aside: np.ndarray, flat: faiss.Index | None = None) -> tuple[np.ndarray, np.ndarray]:
    """An approximate filtered search's answer ``found`` (scores, rows (Q, depth)) made sure of: the queries
    ``aside`` (Q,), whose kept rows lie away from where the search went, scanned exactly over the kept rows;
    the others :func:`checked`."""
    scores, rows = found
    if aside.any():
        scores[aside], rows[aside] = kept_exactly(xq[aside], values, selection, rows.shape[1], flat)
    if (~aside).any():
        scores[~aside], rows[~aside] = checked(xq[~aside], values, selection, (scores[~aside], rows[~aside]), flat)
    return scores, rows


def checked(xq: np.ndarray, values: np.ndarray, selection: Selection, found: tuple[np.ndarray, np.ndarray],
            flat: faiss.Index | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An approximate filtered search's answer ``found`` (scores, rows (Q, depth), -1: none), with each query's
    replaced by the exact top over the kept rows where it is wrong for sure: where a kept row outside it scores
    above its last (or it is short of rows while more are kept). Which kept rows are scored: ``CHECKED_ROWS``
    drawn at random, so an answer far down the kept rows' ranking (as a walk or lists near the query give for
    a filter keeping the rows least like it) is caught almost surely, and a good one costs only the draw."""
    scores, rows = found
    kept = np.flatnonzero(selection.mask)
    drawn = np.unique(kept[np.random.default_rng(seed).integers(0, len(kept), min(CHECKED_ROWS, len(kept)))])
    drawn_scores = xq @ as_float32(values[drawn]).T  # (Q, drawn)
    last = np.where(rows[:, -1] >= 0, scores[:, -1], -np.inf)
    last = last + 1e-6 * np.maximum(1.0, np.abs(np.where(rows[:, -1] >= 0, last, 0.0)))  # not a tie of rounding
    outside = ~(drawn[None, :, None] == rows[:, None, :]).any(axis=2)
    short = (rows >= 0).sum(axis=1) < min(rows.shape[1], selection.count)
    wrong = ((drawn_scores > last[:, None]) & outside).any(axis=1) | short
    if wrong.any():
        scores, rows = scores.copy(), rows.copy()
        scores[wrong], rows[wrong] = kept_exactly(xq[wrong], values, selection, rows.shape[1], flat)
    return scores, rows


class HnswStore(HostRows, VectorStore):
    """HNSW candidates, exact scores: ``hnsw`` (an IndexHNSW over the N rows), values (N, dim) float16 or
    float32, the stored copy memory-mapped, gates (N, G) uint8 or None; ``ef_search`` the default graph breadth per query;
    ``node_rows`` (nodes,) int64 the row of each graph node, -1 dead (None: node i is row i); ``flat`` the Faiss
    flat index of the stored copy, for the exact scans (None: numpy reads ``values``)."""

    first_stage = "hnsw"

    def __init__(self, hnsw: faiss.Index, values: np.ndarray, gates: np.ndarray | None, doc_ids, ef_search: int,
                 node_rows: np.ndarray | None = None, flat: faiss.Index | None = None):
        super().__init__(values, gates, doc_ids)
        self.hnsw, self.ef_search, self.node_rows, self.flat = hnsw, ef_search, node_rows, flat
        live = None if node_rows is None else np.asarray(node_rows) >= 0
        self._live = None if live is None or live.all() else live  # None: every node is a row, none dead
        self._live_bits = None if self._live is None else np.packbits(self._live, bitorder="little")  # the common case

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None, *,
                      ef_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if ef_search is not None and not 1 <= ef_search <= MAX_EF_SEARCH:
            raise SearchError(f"ef_search must be in 1..{MAX_EF_SEARCH}, got {ef_search}")
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if searched_exactly(selection):
            return kept_exactly(xq, self.values, selection, depth, self.flat)
        # the graph keeps its ef best anyway: reading all of them costs nothing and the exact
        # rescoring then orders the top ``depth`` by exact scores
        breadth = max(ef_search or self.ef_search, depth)
        if selection is not None:  # a walk meets kept rows at their rate: widen it as much to find as many
            breadth = min(MAX_EF_SEARCH, int(np.ceil(breadth / selection.fraction)))
        params = faiss.SearchParametersHNSW(efSearch=breadth)
        returned = self._returned_nodes(selection)
        if returned is not None:
            bits = self._live_bits if returned is self._live else np.packbits(returned, bitorder="little")
            params.sel = faiss.IDSelectorBitmap(len(returned), faiss.swig_ptr(bits))  # bits outlive the search
        _, nodes = faiss_search(self.hnsw, augment_queries(xq, self.hnsw.d), breadth, params)
        scores, rows = rescore(xq, self.values, self._rows(nodes), depth)
        if selection is None:
            return scores, rows
        # a filter keeping the query's neighbours less than the rest has its best rows elsewhere
        return settled(xq, self.values, selection, (scores, rows), self._aside(xq, selection), self.flat)

    def _rows(self, nodes: np.ndarray) -> np.ndarray:
        return nodes if self.node_rows is None else np.where(nodes >= 0, self.node_rows[np.maximum(nodes, 0)], -1)

    def _aside(self, xq: np.ndarray, selection: Selection) -> np.ndarray:
        """(Q,) whether a query's ``NEIGHBOURS`` nearest rows (an unfiltered walk) are kept markedly less often
        than all rows are: three standard deviations of a random draw below the kept fraction (a filter
        keeping the rows least like the query keeps none of them)."""
        params = faiss.SearchParametersHNSW(efSearch=NEIGHBOURS)
        if self._live is not None:
            params.sel = faiss.IDSelectorBitmap(len(self._live), faiss.swig_ptr(self._live_bits))
        rows = self._rows(faiss_search(self.hnsw, augment_queries(xq, self.hnsw.d), NEIGHBOURS, params)[1])
        seen = np.maximum(1, (rows >= 0).sum(axis=1))
        share = (selection.mask[np.maximum(rows, 0)] & (rows >= 0)).sum(axis=1) / seen
        fraction = selection.fraction
        return share < fraction - 3 * np.sqrt(fraction * (1 - fraction) / seen)

    def _returned_nodes(self, selection: Selection | None) -> np.ndarray | None:
        """(nodes,) bool: the nodes a walk may return (None: all of them), the live ones of the kept rows."""
        if selection is None:
            return self._live
        if self.node_rows is None:
            return selection.mask
        kept = selection.mask[np.maximum(self.node_rows, 0)]
        return kept if self._live is None else self._live & kept
