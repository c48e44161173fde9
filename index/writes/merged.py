"""Search over a base generation and the writes since (a :class:`~densehybrid.index.writes.delta.Delta`).

The base is asked for ``k + hidden`` hits (and as many more candidates), the hidden ones are
dropped, the delta rows are scored the way the base scores its own (exact GIP for a reranked gated
kind, approximate GIP or the plain inner product otherwise), and both are merged by score. Rows
number the base first (``0..base.count-1``), then the delta.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from densehybrid.encoder.base import Encoded
from densehybrid.index.search import gip
from densehybrid.index.search.filters import row_mask
from densehybrid.index.search.fusion import PER_QUERY_METHODS
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.mix import resolve_mix
from densehybrid.index.search.searcher import MAX_CANDIDATES, Searcher
from densehybrid.index.search.served import SearchResults, StoredIndex
from densehybrid.index.writes.delta import Delta


def _delta_first_stage(searcher: Searcher, delta: Delta, xq: np.ndarray, gq: np.ndarray | None,
                       params: SearchParams) -> np.ndarray:
    """(Q, rows) first-stage scores of every delta row (dead ones too), as the base's first stage scores its rows."""
    if params.first_stage == "approx_gip":
        scores, rows = gip.approx_topk(xq, gq, delta.values16, delta.gates if searcher.reranks else None, params.theta,
                                       delta.rows)
        out = np.empty_like(scores)
        np.put_along_axis(out, rows, scores, 1)
        return out
    # einsum, not BLAS: the delta is small, and a multi-threaded BLAS call on a busy box waits for its
    # threads far longer than this single-threaded loop takes (docs/performance.md, "What each change measured")
    return np.einsum("qd,nd->qn", xq, delta.values)


def top_by_score(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``gip.sort_by_score(scores, rows, k)`` in O(K) per query rather than a sort of all K columns.

    scores (Q, K) float32 (finite), rows (Q, K) int64 >= 0 -> (Q, min(k, K)). Each query's rows
    scoring at least its k-th best score (ties at the cut included) are sorted as ``sort_by_score``
    sorts, so the answer is the same."""
    if k >= scores.shape[1]:
        return gip.sort_by_score(scores, rows, k)
    cut = np.partition(scores, scores.shape[1] - k, axis=1)[:, scores.shape[1] - k]
    out_scores = np.empty((len(scores), k), np.float32)
    out_rows = np.empty((len(scores), k), np.int64)
    for q in range(len(scores)):
        keep = np.flatnonzero(scores[q] >= cut[q])
        out_scores[q], out_rows[q] = (a[0] for a in gip.sort_by_score(scores[q:q + 1, keep], rows[q:q + 1, keep], k))
    return out_scores, out_rows


def _delta_hits(searcher: Searcher, delta: Delta, xq: np.ndarray, gq: np.ndarray | None, params: SearchParams, k: int,
                kept: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores, delta rows) (Q, m) of the live delta rows, two stages like the base: the top ``candidates``
    of the first stage, reranked by exact GIP (on float16 values, as a stored generation holds them);
    without the second stage, the first stage's top ``k``. ``kept``: the rows a filter keeps (None: all)."""
    scores = _delta_first_stage(searcher, delta, xq, gq, params)
    live = delta.live_rows if kept is None else np.intersect1d(delta.live_rows, kept)
    if delta.dead or kept is not None:
        scores = scores[:, live]
    rows = np.broadcast_to(live, scores.shape)
    if not (params.rerank and searcher.reranks):  # only the delta's own top k can reach the merged top k
        return top_by_score(scores, np.ascontiguousarray(rows), k)
    if params.candidates < len(live):
        scores, rows = top_by_score(scores, np.ascontiguousarray(rows), params.candidates)
    return gip.score_rows(xq, gq, delta.values16, delta.gates, np.ascontiguousarray(rows)), rows


def live_ids(base: StoredIndex, delta: Delta, rows: Sequence[int]) -> list[str]:
    """Ids of live rows (base rows first, then delta rows)."""
    base_ids = iter(base.ids_of([r for r in rows if r < base.count]))
    return [next(base_ids) if r < base.count else delta.docs[r - base.count].id for r in rows]


def merged_search(searcher: Searcher, delta: Delta, queries: Encoded, params: SearchParams) -> SearchResults:
    """Hits ``offset`` to ``offset + k`` of the base (hidden rows dropped) and the delta together, same
    scoring as the base; equal scores in row order (base rows first, then the delta's).

    A per-query fusion (``zscore``, ``minmax``, ``adaptive``, ``rrf``) scores each hit relative to the
    base's candidates alone, so it cannot rank delta rows beside them: while changes are pending (until
    the next compaction) a fused index ranks by the raw λ sum, the scoring delta rows share with the base.
    A one-part method (``lexical``, ``dense``) ranks base and delta rows by that part alike. A ``filter``
    applies to the base's search and to the delta rows alike (each by its own columns).
    """
    if delta.empty:
        return searcher.search(queries, params)
    lam, offset, filter = params.lam, params.offset, params.filter
    method = resolve_mix(searcher.index, params)[0]
    if method in PER_QUERY_METHODS:
        method, lam = "lambda", searcher.index.lam if lam is None else lam
    hidden = len(delta.hidden)
    base = searcher.index
    ranked = offset + params.k  # the merged hits a page is cut from
    # the base's search ranks by the raw λ sum (or one part: no dense weight, no rrf k) from its first hit:
    # the page is cut after the merge
    found = searcher.search(queries, params.but(
        k=min(ranked + hidden, max(base.count, 1)), offset=0, candidates=min(params.candidates + hidden, MAX_CANDIDATES),
        lam=lam, method=method, dense_weight=None, rrf_k=None))
    started = time.perf_counter()
    extra_scores = np.empty((len(queries), 0), np.float32)
    extra_rows = np.empty((len(queries), 0), np.int64)
    kept = None if filter is None else np.flatnonzero(row_mask(filter, delta.payload(base.field_types)))
    selectivity = None
    if filter is not None:
        base_kept = found.selectivity * base.count if found.selectivity is not None else 0.0
        live_kept = len(np.intersect1d(delta.live_rows, kept))
        selectivity = (base_kept + live_kept) / max(1, base.count + len(delta))
    with_parts = found.lexical_scores is not None
    xq = searcher.scale(queries.values, lam)
    gq = queries.gates if searcher.reranks else None
    if len(delta) and (kept is None or len(kept)):  # live rows
        # a one-part method scores added rows with that part of the query alone, as the base's search does
        part = searcher.part_query(xq, method)
        extra_scores, extra_rows = _delta_hits(searcher, delta, part, gq, params, ranked, kept)
    ids, scores, rows, lexical, dense = [], [], [], [], []
    for q in range(len(queries)):
        keep = [i for i, r in enumerate(found.rows[q]) if r not in delta.hidden]
        q_rows = np.concatenate([np.array([found.rows[q][i] for i in keep], np.int64), extra_rows[q] + base.count])
        q_scores = np.concatenate([np.array([found.scores[q][i] for i in keep], np.float32),
                                   extra_scores[q].astype(np.float32, copy=False)])
        q_scores, order = gip.score_order(q_scores[None], q_rows[None], ranked)
        page = order[0, offset:]
        rows.append([int(r) for r in q_rows[page]])
        scores.append([float(s) for s in q_scores[0, page]])
        ids.append(live_ids(base, delta, rows[-1]))
        if with_parts:  # base hits as the base reported them; added rows from the delta's float16 copy
            base_parts = {r: (found.lexical_scores[q][i], found.dense_scores[q][i]) for i, r in enumerate(found.rows[q])}
            added = np.array([[r - base.count if r >= base.count else -1 for r in rows[-1]]], dtype=np.int64)
            added_parts = gip.hit_part_scores(xq[q:q + 1], None if gq is None else gq[q:q + 1], delta.values16,
                                              delta.gates, added)
            for out, part in ((lexical, 0), (dense, 1)):
                out.append([float(added_parts[part][0, j]) if r >= base.count else base_parts[r][part]
                            for j, r in enumerate(rows[-1])])
    timing = dict(found.timing)
    timing["search_ms"] = timing.get("search_ms", 0.0) + (time.perf_counter() - started) * 1000
    return SearchResults(ids, scores, rows, timing, *((lexical, dense) if with_parts else (None, None)),
                         selectivity=selectivity)
