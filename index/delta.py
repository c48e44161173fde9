"""The writes since a published generation, in memory: a :class:`Delta`, and search over base + delta.

A delta holds rows added since the base generation (searched exactly, next to the base's
vector store) and the base rows hidden because their id was deleted or replaced. A search
asks the base for ``k + hidden`` hits (and as many more candidates), drops the hidden ones,
scores the delta rows the way the base scores its own (exact GIP for a reranked gated kind,
approximate GIP or the plain inner product otherwise), and merges by score. Rows number the
base first (``0..base.count-1``), then the delta. Deltas are immutable: every operation
returns a new one (``index.live.LiveIndex`` swaps them whole).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from densehybrid.encoder.base import Encoded
from densehybrid.index import gip
from densehybrid.index.documents import Document
from densehybrid.index.filters import Filter, row_mask
from densehybrid.index.fusion import PER_QUERY_METHODS
from densehybrid.index.payload import Payload
from densehybrid.index.searcher import MAX_CANDIDATES, Searcher, resolve_method
from densehybrid.index.served import SearchResults, StoredIndex
from densehybrid.index.wal import Change


class UnknownDocument(KeyError):
    """A delete named an id that is not in the index."""


@dataclass(frozen=True)
class Delta:
    """Rows added since the base generation and base rows hidden since. values (n, dim) float32,
    gates (n, G) uint8 or None; ``hidden`` are base row numbers."""

    docs: tuple[Document, ...] = ()
    values: np.ndarray | None = None
    gates: np.ndarray | None = None
    hidden: frozenset[int] = frozenset()
    changes: int = 0
    row_of: dict[str, int] = field(default_factory=dict)
    values16: np.ndarray | None = None  # values as a stored generation holds them (the rerank reads these)
    _payload: list = field(default_factory=list, compare=False, repr=False)  # the columns, once built

    def payload(self, schema: dict[str, str]) -> Payload:
        """The delta rows' field values as columns (built on first use; a delta never changes)."""
        if not self._payload:
            self._payload.append(Payload.from_rows(schema, [d.fields for d in self.docs]))
        return self._payload[0]

    def __post_init__(self):
        if self.values is not None and self.values16 is None:
            object.__setattr__(self, "values16", self.values.astype(np.float16))

    def __len__(self) -> int:
        return len(self.docs)

    @property
    def empty(self) -> bool:
        return not self.docs and not self.hidden


def _without(delta: Delta, ids: set[str]) -> tuple[list[Document], list[int]]:
    keep = [i for i, d in enumerate(delta.docs) if d.id not in ids]
    return [delta.docs[i] for i in keep], keep


def upsert(delta: Delta, base: StoredIndex, docs: Sequence[Document], values: np.ndarray,
           gates: np.ndarray | None) -> Delta:
    """``delta`` with ``docs`` added, replacing any earlier version (in the base or the delta)."""
    ids = {d.id for d in docs}
    kept_docs, keep = _without(delta, ids)
    hidden = delta.hidden | {r for r in (base.row_of(i) for i in ids) if r is not None}
    all_docs = tuple(kept_docs) + tuple(docs)
    values = np.asarray(values, dtype=np.float32)
    gates = None if gates is None else np.asarray(gates, dtype=np.uint8)
    if delta.values is None:
        return Delta(all_docs, values.copy(), None if gates is None else gates.copy(), hidden, delta.changes + 1,
                     {d.id: i for i, d in enumerate(all_docs)})
    # the float16 copy grows with the rows (converting the whole delta on every write was most of its cost)
    return Delta(all_docs, np.concatenate([delta.values[keep], values]),
                 None if gates is None else np.concatenate([delta.gates[keep], gates]), hidden, delta.changes + 1,
                 {d.id: i for i, d in enumerate(all_docs)},
                 np.concatenate([delta.values16[keep], values.astype(np.float16)]))


def delete(delta: Delta, base: StoredIndex, doc_id: str) -> Delta:
    """``delta`` without ``doc_id``; raises :class:`UnknownDocument` when the id is not live."""
    if not contains(delta, base, doc_id):
        raise UnknownDocument(doc_id)
    kept_docs, keep = _without(delta, {doc_id})
    row = base.row_of(doc_id)
    hidden = delta.hidden | ({row} if row is not None else set())
    values = delta.values[keep] if delta.values is not None else None
    values16 = delta.values16[keep] if delta.values16 is not None else None
    gates = delta.gates[keep] if delta.gates is not None else None
    return Delta(tuple(kept_docs), values, gates, hidden, delta.changes + 1,
                 {d.id: i for i, d in enumerate(kept_docs)}, values16)


def contains(delta: Delta, base: StoredIndex, doc_id: str) -> bool:
    if doc_id in delta.row_of:
        return True
    row = base.row_of(doc_id)
    return row is not None and row not in delta.hidden


def apply(delta: Delta, base: StoredIndex, change: Change, *, replaying: bool = False) -> Delta:
    if change.op == "upsert":
        return upsert(delta, base, change.docs, change.values, change.gates)
    try:
        return delete(delta, base, change.docs[0].id)
    except UnknownDocument:
        if replaying:  # folded already (a crash between publishing a generation and dropping its log)
            return replace(delta, changes=delta.changes + 1)
        raise


# -- search --------------------------------------------------------------------------------

def _delta_first_stage(searcher: Searcher, delta: Delta, xq: np.ndarray, gq: np.ndarray | None, first_stage: str,
                       theta: float) -> np.ndarray:
    """(Q, n) first-stage scores of every delta row, as the base's first stage scores its rows."""
    if first_stage == "approx_gip":
        scores, rows = gip.approx_topk(xq, gq, delta.values16, delta.gates if searcher.reranks else None, theta,
                                       len(delta))
        out = np.empty_like(scores)
        np.put_along_axis(out, rows, scores, 1)
        return out
    # einsum, not BLAS: the delta is small, and a multi-threaded BLAS call on a busy 2-core box took
    # ~30 ms for 1120 rows where this single-threaded loop takes ~0.2 ms (measured here)
    return np.einsum("qd,nd->qn", xq, delta.values)


def _delta_hits(searcher: Searcher, delta: Delta, xq: np.ndarray, gq: np.ndarray | None, first_stage: str,
                candidates: int, theta: float, second: bool,
                kept: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores, delta rows) (Q, m) of the delta, two stages like the base: the top ``candidates`` of the
    first stage, reranked by exact GIP (on float16 values, as a stored generation holds them).
    ``kept``: the delta rows a filter keeps (None: all)."""
    scores = _delta_first_stage(searcher, delta, xq, gq, first_stage, theta)
    rows = np.broadcast_to(np.arange(len(delta), dtype=np.int64), scores.shape)
    if kept is not None:
        scores, rows = scores[:, kept], np.broadcast_to(kept.astype(np.int64), (len(xq), len(kept)))
    if not second:
        return scores, rows
    if candidates < rows.shape[1]:
        scores, rows = gip.sort_by_score(scores, np.ascontiguousarray(rows), candidates)
    return gip.score_rows(xq, gq, delta.values16, delta.gates, np.ascontiguousarray(rows)), rows


def live_ids(base: StoredIndex, delta: Delta, rows: Sequence[int]) -> list[str]:
    """Ids of live rows (base rows first, then delta rows)."""
    base_ids = iter(base.ids_of([r for r in rows if r < base.count]))
    return [next(base_ids) if r < base.count else delta.docs[r - base.count].id for r in rows]


def merged_search(searcher: Searcher, delta: Delta, queries: Encoded, *, k: int, offset: int = 0,
                  first_stage: str = "ip", candidates: int = 1000, theta: float = 0.1, rerank: bool = True,
                  lam: float | None = None, method: str | None = None,
                  dense_weight: float | None = None, rrf_k: float | None = None,
                  filter: Filter | None = None) -> SearchResults:
    """Hits ``offset`` to ``offset + k`` of the base (hidden rows dropped) and the delta together, same
    scoring as the base; equal scores in row order (base rows first, then the delta's).

    A per-query fusion (``zscore``, ``minmax``, ``adaptive``, ``rrf``) scores each hit relative to the
    base's candidates alone, so it cannot rank delta rows beside them: while changes are pending (until
    the next compaction) a fused index ranks by the raw λ sum, the scoring delta rows share with the base.
    A ``filter`` applies to the base's search and to the delta rows alike (each by its own columns).
    """
    if delta.empty:
        return searcher.search(queries, k=k, offset=offset, first_stage=first_stage, candidates=candidates,
                               theta=theta, rerank=rerank, lam=lam, method=method, dense_weight=dense_weight,
                               rrf_k=rrf_k, filter=filter)
    if resolve_method(searcher.index, method, lam) in PER_QUERY_METHODS:
        lam = searcher.index.lam if lam is None else lam
    hidden = len(delta.hidden)
    base = searcher.index
    ranked = offset + k  # the merged hits a page is cut from
    found = searcher.search(queries, k=min(ranked + hidden, max(base.count, 1)), first_stage=first_stage,
                            candidates=min(candidates + hidden, MAX_CANDIDATES), theta=theta, rerank=rerank, lam=lam,
                            filter=filter)
    started = time.perf_counter()
    extra_scores = np.empty((len(queries), 0), np.float32)
    extra_rows = np.empty((len(queries), 0), np.int64)
    kept = None if filter is None else np.flatnonzero(row_mask(filter, delta.payload(base.field_types)))
    selectivity = None
    if filter is not None:
        base_kept = found.selectivity * base.count if found.selectivity is not None else 0.0
        selectivity = (base_kept + len(kept)) / max(1, base.count + len(delta))
    with_parts = found.lexical_scores is not None
    xq = searcher.scale(queries.values, lam)
    gq = queries.gates if searcher.reranks else None
    if len(delta) and (kept is None or len(kept)):
        extra_scores, extra_rows = _delta_hits(searcher, delta, xq, gq, first_stage, candidates, theta,
                                               rerank and searcher.reranks, kept)
    ids, scores, rows, lexical, dense = [], [], [], [], []
    for q in range(len(queries)):
        keep = [i for i, r in enumerate(found.rows[q]) if r not in delta.hidden]
        q_rows = np.array([found.rows[q][i] for i in keep] + list(extra_rows[q] + base.count), dtype=np.int64)
        q_scores = np.array([found.scores[q][i] for i in keep] + list(extra_scores[q]), dtype=np.float32)
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
