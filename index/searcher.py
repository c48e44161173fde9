"""Two-stage search: first stage over the whole index, exact GIP rerank, top-k.

``Searcher.search`` takes encoded queries (raw, as encoders return them), scales
their open part by λ for ``dhr``/``fusion``, runs the first stage (Faiss ``ip``
or ``approx_gip``) to depth ``candidates``, reranks the candidates by exact GIP
for gated kinds (for ``dhr``/``fusion`` under a normalised method, ``index.fusion``, each part
separately, normalised over the candidates and mixed; their candidates come from each part's own
first stage), and returns ids, scores, rows and per-stage times. Ties are
ordered by row number, so equal inputs give equal outputs on every run. Every stage runs in the index's
:class:`~densehybrid.index.vector_store.VectorStore`, chosen once when the searcher is built.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import numpy as np

from densehybrid.encoder.base import SCALED_KINDS, Encoded
from densehybrid.index import fusion, gip
from densehybrid.index.errors import IndexMismatchError, SearchError
from densehybrid.index.filters import Filter, Selection
from densehybrid.index.served import SearchResults, StoredIndex
from densehybrid.index.vector_store import VectorStore

log = logging.getLogger(__name__)

FirstStage = Literal["ip", "approx_gip"]
FIRST_STAGES: tuple[str, ...] = ("ip", "approx_gip")
MAX_CANDIDATES = 10_000


def resolve_search_device(requested: str | None, index: StoredIndex) -> str:
    """Where the first stage and rerank run, chosen apart from the encoder's device.

    ``auto``/None: a GPU when torch sees one and the index is exact (FlatIP), else the CPU.
    ``cpu``: Faiss on the CPU. ``cuda``/``cuda:N``: exact torch search on that GPU (all GPUs
    for ``cuda``); a PQ index has no exact rows to scan there, so it stays on the CPU (logged).
    """
    import torch

    if index.remote:  # a Milvus collection: Milvus searches, the rerank is local numpy
        if requested not in (None, "", "auto", "cpu"):
            log.info("a Milvus collection searches in Milvus (search device %s ignored)", requested)
        return "cpu"
    pq = index.first_stage_kind == "pq"
    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() and not pq else "cpu"
    if requested == "cpu":
        return "cpu"
    if not requested.startswith("cuda"):
        raise SearchError(f"unknown search device {requested!r}; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise SearchError(f"search device {requested!r} requested but torch sees no CUDA device; use cpu or auto")
    index_no = requested.partition(":")[2]
    if index_no and (not index_no.isdigit() or int(index_no) >= torch.cuda.device_count()):
        raise SearchError(f"search device {requested!r}: only {torch.cuda.device_count()} CUDA devices exist")
    if pq:
        log.info("the index's first stage is PQ: it searches on the CPU (search device %s ignored)", requested)
        return "cpu"
    return requested


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


def resolve_method(index: StoredIndex, method: str | None, lam: float | None) -> str:
    """The weighting a search of ``index`` uses: the one asked for; else the raw λ sum when a λ is
    given (a per-request λ keeps its meaning); else the index's default. Unscaled kinds: ``lambda``."""
    if index.spec.kind not in SCALED_KINDS:
        return "lambda"
    if method is None:
        return "lambda" if lam is not None else index.fusion_method
    if method not in fusion.FUSION_METHODS:
        raise SearchError(f"unknown fusion method {method!r}; use one of {', '.join(fusion.FUSION_METHODS)}")
    return method


def _above_the_cut(scores: np.ndarray, rows: np.ndarray, depth: int) -> np.ndarray:
    """The top ``depth`` rows of a sorted top list (Q, ≥ depth) less those tied with the row after the cut
    (-1 instead); a list of ``depth`` rows or fewer comes back whole.

    Which of a tied group makes the cut is engine-specific (Faiss, torch and Milvus order ties
    differently), so keeping none of it gives every engine the same candidates. Such ties are in
    practice a part's zero scores (no term matched), which the other part's candidates cover.
    """
    if rows.shape[1] <= depth:
        return rows
    keep = scores[:, :depth] > scores[:, depth:depth + 1]
    return np.where(keep, rows[:, :depth], -1)


class Searcher:
    """Searches one stored index (a local directory, ``index.local.IndexFiles``, or a Milvus collection,
    ``index.milvus.MilvusIndex``) through the :class:`VectorStore` the index hands it.

    ``device`` "cpu": Faiss first stage, numpy rerank. A CUDA device (see :func:`resolve_search_device`):
    values and gates are copied to the GPU(s) once and the exact first stage and every rerank run there
    in torch (float16 storage unless ``float16=False``). ``engine="torch"`` runs that same torch path on
    the CPU (float32): the CPU twin tests use it.
    """

    def __init__(self, index: StoredIndex, *, device: str = "cpu", float16: bool | None = None,
                 engine: Literal["faiss", "torch"] | None = None):
        self.index = index
        self.spec = index.spec
        self.device = device
        self.store: VectorStore = index.vector_store(device, float16=float16, engine=engine)

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

    def _first_stage(self, xq: np.ndarray, gq: np.ndarray | None, first_stage: str, depth: int, theta: float,
                     selection: Selection | None = None):
        # a filter's rows are passed only when it drops some: the unfiltered calls stay as they were
        kept = {} if selection is None else {"selection": selection}
        if first_stage == "approx_gip":
            return self.store.approx_gip(xq, gq, theta, depth, **kept)
        return self.store.inner_product(xq, depth, **kept)

    def fusion_method(self, method: str | None, lam: float | None) -> str:
        return resolve_method(self.index, method, lam)

    def _part_query(self, xq: np.ndarray, method: str) -> np.ndarray:
        """A one-part method searches with the other part's dims zeroed; the others with ``xq`` as is."""
        if method not in ("lexical", "dense"):
            return xq
        lexical, dense = fusion.split_query(xq, self.spec.gated_dim)
        return lexical if method == "lexical" else dense

    def _both_parts_first_stage(self, xq: np.ndarray, gq: np.ndarray | None, first_stage: str, depth: int,
                                theta: float, selection: Selection | None = None) -> np.ndarray:
        """Candidate rows (Q, ≤ 2·depth) of a normalised fusion: the union of each part's own top ``depth``.

        The λ sum's top list is mostly the lexical part's (its scores are the larger), so it loses
        the dense part's finds; searching each part with the other's dims zeroed keeps both. The
        dense part's inner product is already exact, so only the lexical search uses ``first_stage``.
        """
        lexical, dense = fusion.split_query(xq, self.spec.gated_dim)
        # one row past the cut shows whether the cut runs through tied scores (see _above_the_cut)
        probe = min(depth + 1, self.index.count if selection is None else selection.count)
        lexical_rows = _above_the_cut(*self._first_stage(lexical, gq, first_stage, probe, theta, selection), depth)
        dense_rows = _above_the_cut(*self._first_stage(dense, None, "ip", probe, theta, selection), depth)
        return fusion.union_rows(lexical_rows, dense_rows)

    def _fused_rerank(self, xq: np.ndarray, gq: np.ndarray, rows: np.ndarray, k: int, method: str,
                      dense_weight: float) -> tuple[np.ndarray, np.ndarray]:
        """Exact part scores of the candidates (in the store), normalised per query over them and mixed; top ``k``."""
        valid = rows >= 0
        lexical, dense = self.store.part_scores(xq, gq, rows)
        fused = fusion.fuse(lexical, dense, method, dense_weight=dense_weight, valid=valid)
        return gip.sort_by_score(fused, np.where(valid, rows, -1), k)

    def search(self, queries: Encoded, *, k: int = 10, first_stage: FirstStage = "ip", candidates: int = 1000,
               theta: float = 0.1, rerank: bool = True, lam: float | None = None, method: str | None = None,
               dense_weight: float | None = None, filter: Filter | None = None) -> SearchResults:
        """Top ``k`` per query. ``candidates`` (K1) is the first-stage depth when reranking.

        ``filter`` (``index.filters``) keeps only the rows it matches, before any top-k: every stage
        sees those rows alone, so the hits are the exact top ``k`` of the filtered rows (and the first
        stage returns all of them when they are fewer than ``candidates``).

        ``method`` (``index.fusion.FUSION_METHODS``) picks how ``dhr``/``fusion`` mix their parts
        (see ``fusion_method``); the normalised ones (``fusion.NORMALISED_METHODS``) take the union of
        each part's own top ``candidates`` (so up to twice as many rows) and normalise each part over
        it, so they need the rerank.
        """
        self._check(queries, k, first_stage, candidates)
        method = self.fusion_method(method, lam)
        dense_weight = self.index.dense_weight if dense_weight is None else dense_weight
        if not 0.0 <= dense_weight <= 1.0:
            raise SearchError(f"dense weight must be in [0, 1], got {dense_weight}")
        selection = None if filter is None else self.index.select(filter)
        selectivity = None if selection is None else selection.fraction
        if selection is not None and selection.everything:
            selection = None
        n = self.index.count if selection is None else selection.count
        if len(queries) == 0 or n == 0:
            empty = [[] for _ in range(len(queries))]
            return SearchResults(empty, [list(e) for e in empty], [list(e) for e in empty],
                                 {"search_ms": 0.0, "rerank_ms": 0.0}, selectivity)
        xq = self._part_query(self.scale(queries.values, lam), method)
        gq = queries.gates if self.reranks else None
        second = rerank and self.reranks
        depth = min(n, max(k, candidates) if second else k)
        fused = second and method in fusion.NORMALISED_METHODS
        start = time.perf_counter()
        if fused:
            rows = self._both_parts_first_stage(xq, gq, first_stage, depth, theta, selection)
        else:
            scores, rows = self._first_stage(xq, gq, first_stage, depth, theta, selection)
        search_ms = _ms(start)
        start = time.perf_counter()
        if fused:
            scores, rows = self._fused_rerank(xq, gq, rows, k, method, dense_weight)
        elif second:
            scores, rows = self.store.rerank(xq, gq, rows, k)
        rerank_ms = _ms(start) if second else 0.0
        found = self._results(scores[:, :k], rows[:, :k], {"search_ms": search_ms, "rerank_ms": rerank_ms})
        found.selectivity = selectivity
        return found

    def _results(self, scores: np.ndarray, rows: np.ndarray, timing: dict[str, float]) -> SearchResults:
        out_scores, out_rows = [], []
        for q_scores, q_rows in zip(scores, rows):
            keep = q_rows >= 0
            out_rows.append([int(r) for r in q_rows[keep]])
            out_scores.append([float(s) for s in q_scores[keep]])
        flat_ids = iter(self.store.ids_of([r for q_rows in out_rows for r in q_rows]))
        ids = [[next(flat_ids) for _ in q_rows] for q_rows in out_rows]
        return SearchResults(ids, out_scores, out_rows, timing)
