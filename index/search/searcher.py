"""Two-stage search: first stage over the whole index, exact GIP rerank, top-k.

``Searcher.search`` takes encoded queries (raw, as encoders return them), scales
their open part by λ for ``dhr``/``fusion``, runs the first stage (Faiss ``ip``
or ``approx_gip``) to depth ``candidates``, reranks the candidates by exact GIP
for gated kinds (for ``dhr``/``fusion`` under a normalised method, ``index.search.fusion``, each part
separately, normalised over the candidates and mixed; their candidates come from each part's own
first stage), and returns ids, scores, rows and per-stage times. Ties are
ordered by row number, so equal inputs give equal outputs on every run. ``offset`` skips the first
hits of that order (pagination): a page is a slice of the top ``offset + k``, found with at least
that many candidates. For ``dhr``/``fusion`` each hit also carries its exact lexical and dense part
scores. Every stage runs in the index's :class:`~densehybrid.index.search.vector_store.VectorStore`, chosen
once when the searcher is built.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np

from densehybrid.encoder.base import SCALED_KINDS, Encoded
from densehybrid.index.search import fusion, gip
from densehybrid.index.errors import IndexMismatchError, SearchError
from densehybrid.index.search.filters import Selection, rows_below
from densehybrid.index.search.mix import resolve_mix
from densehybrid.index.search.params import SEARCH_FIELDS, SearchParams
from densehybrid.index.search.recall import recall_at_k
from densehybrid.index.search.ties import above_the_cut, run_reaches_the_end, tied_at_cut
from densehybrid.index.search.served import SearchResults, StoredIndex
from densehybrid.index.search.vector_store import VectorStore

FIRST_STAGES: tuple[str, ...] = ("ip", "approx_gip")
MAX_CANDIDATES = 10_000
# a run of equal first-stage scores across the cut is read in full up to this depth (see _ranked_first_stage)
MAX_TIE_DEPTH = MAX_CANDIDATES
TIE_PROBE = 16  # rows read past the cut of a ranked first stage, to see where a run of equal scores ends


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


class Searcher:
    """Searches one stored index (a local directory, ``index.served.local.IndexFiles``, or a Milvus collection,
    ``index.served.milvus.MilvusIndex``) through the :class:`VectorStore` the index hands it.

    ``device`` "cpu": Faiss first stage, numpy rerank. A CUDA device (see :func:`~densehybrid.index.search.search_device.resolve_search_device`):
    values and gates are copied to the GPU(s) once and the exact first stage and every rerank run there
    in torch (float16 storage unless ``float16=False``). ``engine="torch"`` runs that same torch path on
    the CPU (float32): the CPU twin tests use it. ``scan_threads``: the threads a pqscan first stage may spread
    one query's code scan over.
    """

    def __init__(self, index: StoredIndex, *, device: str = "cpu", float16: bool | None = None,
                 engine: Literal["faiss", "torch"] | None = None, scan_threads: int = 1):
        self.index = index
        self.spec = index.spec
        self.device = device
        self.store: VectorStore = index.vector_store(device, float16=float16, engine=engine, scan_threads=scan_threads)
        self._exact: VectorStore | None = None if self.store.first_stage != "flat" else self.store

    @property
    def name(self) -> str:
        return self.index.name

    @property
    def first_stage(self) -> str:
        """What answers a first stage ``ip``: ``flat`` (exact), ``hnsw`` or ``pqscan`` (approximate), or a
        Milvus collection's ``hnsw`` or ``ivf``."""
        return self.store.first_stage

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

    def _check(self, queries: Encoded, params: SearchParams) -> None:
        if params.k < 1:
            raise SearchError(f"k must be >= 1, got {params.k}")
        if params.offset < 0:
            raise SearchError(f"offset must be >= 0, got {params.offset}")
        if params.first_stage not in FIRST_STAGES:
            raise SearchError(f"unknown first stage {params.first_stage!r}; use one of {', '.join(FIRST_STAGES)}")
        if params.row_limit is not None and params.row_limit < 1:
            raise SearchError(f"row_limit must be >= 1, got {params.row_limit}")
        if not 1 <= params.candidates <= MAX_CANDIDATES:
            raise SearchError(f"candidates must be in 1..{MAX_CANDIDATES}, got {params.candidates}")
        if queries.values.ndim != 2 or queries.values.shape[1] != self.spec.dim:
            raise IndexMismatchError(f"query vectors have shape {queries.values.shape}, the index has dim {self.spec.dim}")
        if self.reranks and (queries.gates is None or queries.gates.shape != (len(queries), self.spec.gated_dim)):
            raise IndexMismatchError(f"the index needs query gates of {self.spec.gated_dim} dims")

    def _first_stage(self, xq: np.ndarray, gq: np.ndarray | None, params: SearchParams, depth: int,
                     selection: Selection | None = None, held: int | None = None):
        """The first stage's top ``depth``; ``held``: how many leading rows an approximate stage must find as the
        exact scan would (the page's hits; the rest are a rerank's candidates or probe the page's cut)."""
        # a filter's rows only when it drops some; a graph breadth or lists to scan only to a store that has them
        kept = {} if selection is None else {"selection": selection}
        if params.first_stage == "approx_gip":  # a scan of the query's active columns: no graph to widen
            return self.store.approx_gip(xq, gq, params.theta, depth, **kept)
        if held is not None and self.first_stage == "pqscan":
            kept["held"] = held
        kept |= {field: getattr(params, field) for field in SEARCH_FIELDS.get(self.first_stage, ())
                 if getattr(params, field) is not None}
        return self.store.inner_product(xq, depth, **kept)

    def _ranked_first_stage(self, xq: np.ndarray, gq: np.ndarray | None, params: SearchParams, depth: int,
                            selection: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The first stage's top ``depth`` in the one order of every engine: score, then row.

        Which rows of a run of equal scores make the cut is each engine's choice (Faiss, torch and
        Milvus differ, and so does one engine asked for different depths), which would show when the
        first stage is the ranking: a page of ``offset + k`` would not continue the page before it.
        ``TIE_PROBE`` rows past the cut show whether the cut runs through such a run and whether the run
        ends before them (float16 scores on a GPU tie often, in short runs); only a longer run is read
        again, whole (up to ``MAX_TIE_DEPTH`` rows). The lowest rows of the run are kept.
        """
        n = self.index.count if selection is None else selection.count
        probe = min(n, depth + TIE_PROBE)
        scores, rows = self._first_stage(xq, gq, params, probe, selection, held=depth)
        if probe > depth and tied_at_cut(scores, rows, depth) and run_reaches_the_end(scores, rows, depth):
            wider = min(n, max(2 * probe, MAX_TIE_DEPTH))
            if wider > probe:
                scores, rows = self._first_stage(xq, gq, params, wider, selection, held=depth)
        return scores[:, :depth], rows[:, :depth]

    def part_query(self, xq: np.ndarray, method: str) -> np.ndarray:
        """A one-part method searches with the other part's dims zeroed; the others with ``xq`` as is."""
        if method not in ("lexical", "dense"):
            return xq
        lexical, dense = fusion.split_query(xq, self.spec.gated_dim)
        return lexical if method == "lexical" else dense

    def _both_parts_first_stage(self, xq: np.ndarray, gq: np.ndarray | None, params: SearchParams, depth: int,
                                selection: Selection | None = None, held: int | None = None) -> np.ndarray:
        """Candidate rows (Q, ≤ 2·depth) of a normalised fusion: the union of each part's own top ``depth``.

        The λ sum's top list is mostly the lexical part's (its scores are the larger), so it loses
        the dense part's finds; searching each part with the other's dims zeroed keeps both. The
        dense part's inner product is already exact, so only the lexical search uses ``first_stage``.
        """
        lexical, dense = fusion.split_query(xq, self.spec.gated_dim)
        # one row past the cut shows whether the cut runs through tied scores (see above_the_cut)
        probe = min(depth + 1, self.index.count if selection is None else selection.count)
        lexical_rows = above_the_cut(*self._first_stage(lexical, gq, params, probe, selection, held), depth)
        dense = self._first_stage(dense, None, params.but(first_stage="ip"), probe, selection, held)
        dense_rows = above_the_cut(*dense, depth)
        return fusion.union_rows(lexical_rows, dense_rows)

    def _fused_rerank(self, xq: np.ndarray, gq: np.ndarray, rows: np.ndarray, k: int, method: str,
                      dense_weight: float, rrf_k: float) -> tuple[np.ndarray, np.ndarray]:
        """Exact part scores of the candidates (in the store), normalised (or ranked) per query over them
        and mixed; top ``k``."""
        valid = rows >= 0
        lexical, dense = self.store.part_scores(xq, gq, rows)
        fused = fusion.fuse(lexical, dense, method, dense_weight=dense_weight, rrf_k=rrf_k, valid=valid)
        return gip.sort_by_score(fused, np.where(valid, rows, -1), k)

    @property
    def has_parts(self) -> bool:
        """Whether the index's rows have a lexical and a dense part whose scores each hit reports."""
        return self.spec.kind in SCALED_KINDS

    def search(self, queries: Encoded, params: SearchParams = SearchParams()) -> SearchResults:
        """Hits ``offset`` to ``offset + k`` per query (a page of the score-then-row order). ``candidates``
        (K1) is the first-stage depth when reranking, raised to ``offset + k``.

        ``filter`` (``index.search.filters``) keeps only the rows it matches, before any top-k: every stage
        sees those rows alone, so the hits are the exact top ``k`` of the filtered rows (and the first
        stage returns all of them when they are fewer than ``candidates``).

        ``method`` (``index.search.fusion.FUSION_METHODS``) picks how ``dhr``/``fusion`` mix their parts
        (see ``fusion_method``); the per-query ones (``fusion.PER_QUERY_METHODS``: the normalised ones
        and ``rrf``, with ``rrf_k``, default the index's) take the union of each part's own top
        ``candidates`` (so up to twice as many rows) and score each part over it, so they need the rerank.
        """
        k, offset, candidates, lam = params.k, params.offset, params.candidates, params.lam
        self._check(queries, params)
        method, dense_weight = resolve_mix(self.index, params)
        if not 0.0 <= dense_weight <= 1.0:
            raise SearchError(f"dense weight must be in [0, 1], got {dense_weight}")
        rrf_k = self.index.rrf_k if params.rrf_k is None else params.rrf_k
        if not (np.isfinite(rrf_k) and rrf_k >= 0):
            raise SearchError(f"rrf_k must be a finite number >= 0, got {rrf_k}")
        selection, selectivity = self._selection(params)
        n = self.index.count if selection is None else selection.count
        if len(queries) == 0 or n <= offset:
            none = np.zeros((len(queries), 0))
            parts = [none, none] if self.has_parts else None
            return self._results(none, none.astype(np.int64), {"search_ms": 0.0, "rerank_ms": 0.0}, parts, selectivity)
        scaled = self.scale(queries.values, lam)
        xq = self.part_query(scaled, method)
        gq = queries.gates if self.reranks else None
        second = params.rerank and self.reranks
        ranked = min(n, offset + k)  # the hits a page is cut from
        depth = min(n, max(ranked, candidates) if second else ranked)
        fused = second and method in fusion.PER_QUERY_METHODS
        start = time.perf_counter()
        if fused:
            rows = self._both_parts_first_stage(xq, gq, params, depth, selection, held=ranked)
        elif second:
            scores, rows = self._first_stage(xq, gq, params, depth, selection, held=ranked)
        else:
            scores, rows = self._ranked_first_stage(xq, gq, params, depth, selection)
        search_ms = _ms(start)
        start = time.perf_counter()
        if fused:
            scores, rows = self._fused_rerank(xq, gq, rows, ranked, method, dense_weight, rrf_k)
        elif second:
            scores, rows = self.store.rerank(xq, gq, rows, ranked)
        page = slice(offset, offset + k)
        scores, rows = scores[:, page], rows[:, page]
        # each hit's part scores, of the whole query (a one-part method searched with the other part zeroed)
        parts = list(self.store.hit_parts(scaled, gq, rows)) if self.has_parts else None
        rerank_ms = _ms(start)
        timing = {"search_ms": search_ms + (0.0 if second else rerank_ms), "rerank_ms": rerank_ms if second else 0.0}
        return self._results(scores, rows, timing, parts, selectivity)

    def _selection(self, params: SearchParams) -> tuple[Selection | None, float | None]:
        """The rows a search may return (None: all) and the fraction its filter keeps (None: no filter)."""
        selection = None if params.filter is None else self.index.select(params.filter)
        selectivity = None if selection is None else selection.fraction
        if params.row_limit is not None:  # after the selectivity: a bound is no filter to report
            selection = rows_below(params.row_limit, self.index.count, selection)
        if selection is not None and selection.everything:
            selection = None
        return selection, selectivity

    def first_stage_recall(self, queries: Encoded, params: SearchParams, k: int = 10) -> np.ndarray:
        """(Q,) recall@``k`` of the ``ip`` first stage as a search with ``params`` runs it (its breadth, filter and
        depth: ``offset + k`` hits, or ``candidates`` before a rerank): the share of each query's exact top ``k``
        inner products over the rows the filter keeps that the first stage's top ``k`` holds (the λ-scaled query
        over the whole vector, as the build's calibration measures it). The exact top comes from a scan of every
        kept row (:meth:`StoredIndex.exact_store`), so this costs a full scan a query."""
        self._check(queries, params)
        selection, _ = self._selection(params)
        n = self.index.count if selection is None else selection.count
        k = min(k, n)
        if k < 1 or len(queries) == 0:
            return np.ones(len(queries))
        xq = self.scale(queries.values, params.lam)
        gq = queries.gates if self.reranks else None
        ip = params.but(first_stage="ip")
        if params.rerank and self.reranks:  # the candidates a rerank would take, in first-stage order
            found = self._first_stage(xq, gq, ip, min(n, max(params.offset + params.k, params.candidates, k)),
                                      selection, held=min(n, max(params.offset + params.k, k)))[1]
        else:  # the ranked first stage an answer's hits come from (rows past the cut probe for ties)
            found = self._ranked_first_stage(xq, gq, ip, min(n, max(params.offset + params.k, k)), selection)[1]
        found = found[:, :k]
        if self._exact is None:
            self._exact = self.index.exact_store()
        exact = self._exact.inner_product(xq, k, **({} if selection is None else {"selection": selection}))[1]
        return recall_at_k(found, exact)

    def _results(self, scores: np.ndarray, rows: np.ndarray, timing: dict[str, float],
                 parts: list[np.ndarray] | None, selectivity: float | None) -> SearchResults:
        out_scores, out_rows, out_parts = [], [], [[], []]
        for q, (q_scores, q_rows) in enumerate(zip(scores, rows)):
            keep = q_rows >= 0
            out_rows.append([int(r) for r in q_rows[keep]])
            out_scores.append([float(s) for s in q_scores[keep]])
            for got, part in zip(out_parts, parts or ()):
                got.append([float(s) for s in part[q][keep]])
        flat_ids = iter(self.store.ids_of([r for q_rows in out_rows for r in q_rows]))
        ids = [[next(flat_ids) for _ in q_rows] for q_rows in out_rows]
        lexical, dense = out_parts if parts is not None else (None, None)
        return SearchResults(ids, out_scores, out_rows, timing, lexical, dense, selectivity)


class CpuSearch:
    """``search`` of a stored index through a CPU :class:`Searcher` built on first use (for scripts and
    tests; a server builds its own searcher for its search device)."""

    _searcher: Searcher | None = None

    def search(self, queries: Encoded, params: SearchParams = SearchParams()) -> SearchResults:
        if self._searcher is None:
            self._searcher = Searcher(self)
        return self._searcher.search(queries, params)
