"""A served index that takes writes: a published generation plus a small in-memory delta.

Between compactions the live state is the base generation (Faiss + memory maps, read only)
and a :class:`Delta`: rows added since (searched exactly, next to the Faiss index) and the
base rows hidden because their id was deleted or replaced. A search asks the base for
``k + hidden`` hits (and as many more candidates), drops the hidden ones, scores the delta
rows the way the base scores its own (exact GIP for a reranked gated kind, approximate GIP
or the plain inner product otherwise), and merges by score. Rows number the base first
(``0..base.count-1``), then the delta.

States are immutable and swapped whole: a search reads one consistent snapshot while
writes and compactions build the next. Every change goes to the write-ahead log
(:mod:`index.wal`) before it is applied; :meth:`LiveIndex.compact` folds the log into a new
generation (:mod:`index.compaction`) while searches and writes go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from densehybrid.encoder.base import Encoded
from densehybrid.index import gip
from densehybrid.index.fusion import NORMALISED_METHODS
from densehybrid.index.searcher import MAX_CANDIDATES, SearchResults, Searcher, resolve_method
from densehybrid.index.store import Document, IndexFiles, load_index
from densehybrid.index.wal import Change, WriteAheadLog

log = logging.getLogger(__name__)


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


def upsert(delta: Delta, base: IndexFiles, docs: Sequence[Document], values: np.ndarray,
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


def delete(delta: Delta, base: IndexFiles, doc_id: str) -> Delta:
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


def contains(delta: Delta, base: IndexFiles, doc_id: str) -> bool:
    if doc_id in delta.row_of:
        return True
    row = base.row_of(doc_id)
    return row is not None and row not in delta.hidden


def apply(delta: Delta, base: IndexFiles, change: Change, *, replaying: bool = False) -> Delta:
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
                candidates: int, theta: float, second: bool) -> tuple[np.ndarray, np.ndarray]:
    """(scores, delta rows) (Q, m) of the delta, two stages like the base: the top ``candidates`` of the
    first stage, reranked by exact GIP (on float16 values, as a stored generation holds them)."""
    scores = _delta_first_stage(searcher, delta, xq, gq, first_stage, theta)
    rows = np.broadcast_to(np.arange(len(delta), dtype=np.int64), scores.shape)
    if not second:
        return scores, rows
    if candidates < len(delta):
        scores, rows = gip.sort_by_score(scores, np.ascontiguousarray(rows), candidates)
    return gip.score_rows(xq, gq, delta.values16, delta.gates, np.ascontiguousarray(rows)), rows


def merged_search(searcher: Searcher, delta: Delta, queries: Encoded, *, k: int, first_stage: str = "ip",
                  candidates: int = 1000, theta: float = 0.1, rerank: bool = True,
                  lam: float | None = None, method: str | None = None,
                  dense_weight: float | None = None) -> SearchResults:
    """Top ``k`` of the base (hidden rows dropped) and the delta together, same scoring as the base.

    A per-query normalised fusion (``zscore``, ``minmax``) scores each hit relative to the base's
    candidates alone, so it cannot rank delta rows beside them: while changes are pending (until the
    next compaction) a fused index ranks by the raw λ sum, the scoring delta rows share with the base.
    """
    if delta.empty:
        return searcher.search(queries, k=k, first_stage=first_stage, candidates=candidates, theta=theta,
                               rerank=rerank, lam=lam, method=method, dense_weight=dense_weight)
    if resolve_method(searcher.index, method, lam) in NORMALISED_METHODS:
        lam = searcher.index.lam if lam is None else lam
    hidden = len(delta.hidden)
    base = searcher.index
    found = searcher.search(queries, k=min(k + hidden, max(base.count, 1)), first_stage=first_stage,
                            candidates=min(candidates + hidden, MAX_CANDIDATES), theta=theta, rerank=rerank, lam=lam)
    started = time.perf_counter()
    extra_scores = np.empty((len(queries), 0), np.float32)
    extra_rows = np.empty((len(queries), 0), np.int64)
    if len(delta):
        xq = searcher.scale(queries.values, lam)
        gq = queries.gates if searcher.reranks else None
        extra_scores, extra_rows = _delta_hits(searcher, delta, xq, gq, first_stage, candidates, theta,
                                               rerank and searcher.reranks)
    ids, scores, rows = [], [], []
    for q in range(len(queries)):
        keep = [i for i, r in enumerate(found.rows[q]) if r not in delta.hidden]
        q_rows = np.array([found.rows[q][i] for i in keep] + list(extra_rows[q] + base.count), dtype=np.int64)
        q_scores = np.array([found.scores[q][i] for i in keep] + list(extra_scores[q]), dtype=np.float32)
        top_scores, top_rows = gip.sort_by_score(q_scores[None], q_rows[None], k)
        rows.append([int(r) for r in top_rows[0]])
        scores.append([float(s) for s in top_scores[0]])
        ids.append([base.doc_ids[r] if r < base.count else delta.docs[r - base.count].id for r in rows[-1]])
    timing = dict(found.timing)
    timing["search_ms"] = timing.get("search_ms", 0.0) + (time.perf_counter() - started) * 1000
    return SearchResults(ids, scores, rows, timing)


# -- the live index -------------------------------------------------------------------------

@dataclass(frozen=True)
class _State:
    base: IndexFiles
    searcher: Searcher
    delta: Delta


@dataclass(frozen=True)
class _DeltaRows:
    """The delta seen as an index (what ``index.explain`` reads)."""

    spec: object
    values: np.ndarray
    gates: np.ndarray | None
    count: int


class LiveIndex:
    """The served index: search, upsert, delete, compact. ``log`` None: read only."""

    def __init__(self, base: IndexFiles, make_searcher: Callable[[IndexFiles], Searcher],
                 log_: WriteAheadLog | None = None):
        self._make_searcher = make_searcher
        self.log = log_
        self._state = _State(base, make_searcher(base), Delta())
        self._write_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._since_rotation: list[Change] | None = None
        self.last_compaction: float | None = None
        self.compacting = False
        applied = int(base.manifest.get("writes", {}).get("applied_seq", 0))
        self._seq = applied
        if log_ is not None:
            delta = Delta()
            for change in log_.recovered:
                if change.seq > applied:
                    delta = apply(delta, base, change, replaying=True)
                self._seq = max(self._seq, change.seq)
            self._state = replace(self._state, delta=delta)
            if log_.recovered:
                log.info("replayed %d logged changes (%d after the generation)", len(log_.recovered), delta.changes)
            log_.recovered = []  # the delta holds them now

    @classmethod
    def open(cls, path: Path, make_searcher: Callable[[IndexFiles], Searcher], *, log_dir: Path | None,
             base: IndexFiles | None = None) -> LiveIndex:
        base = base if base is not None else load_index(path)
        return cls(base, make_searcher, WriteAheadLog.open(log_dir) if log_dir is not None else None)

    # -- what handlers read (the same names as IndexFiles) --
    @property
    def base(self) -> IndexFiles:
        return self._state.base

    @property
    def search_device(self) -> str:
        """Where the current searcher runs ("cpu", "cuda", "cuda:N"); compaction keeps it."""
        return self._state.searcher.device

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def spec(self):
        return self.base.spec

    @property
    def lam(self) -> float:
        return self.base.lam

    @property
    def count(self) -> int:
        state = self._state
        return state.base.count - len(state.delta.hidden) + len(state.delta)

    @property
    def pending_changes(self) -> int:
        return self._state.delta.changes

    @property
    def docs(self) -> LiveIndex:
        return self

    def contains(self, doc_id: str) -> bool:
        state = self._state
        return contains(state.delta, state.base, doc_id)

    def get_many(self, ids: Sequence[str]) -> list[Document | None]:
        state = self._state
        base_docs = state.base.docs.get_many(ids)
        out = []
        for doc_id, doc in zip(ids, base_docs):
            row = state.delta.row_of.get(doc_id)
            out.append(state.delta.docs[row] if row is not None else doc if self.contains(doc_id) else None)
        return out

    def get(self, doc_id: str) -> Document | None:
        return self.get_many([doc_id])[0]

    def row_of(self, doc_id: str) -> int | None:
        state = self._state
        row = state.delta.row_of.get(doc_id)
        if row is not None:
            return state.base.count + row
        row = state.base.row_of(doc_id)
        return row if row is not None and row not in state.delta.hidden else None

    def locate(self, row: int):
        """(an index-like object, its row) for a live row number, for ``index.explain``."""
        state = self._state
        if row < state.base.count:
            return state.base, row
        d = state.delta
        return _DeltaRows(state.base.spec, d.values16, d.gates, len(d)), row - state.base.count

    # -- search --
    def search(self, queries: Encoded, **params) -> SearchResults:
        state = self._state
        return merged_search(state.searcher, state.delta, queries, **params)

    # -- writes --
    def _commit(self, make_change: Callable[[int], Change], check: Callable[[_State], None] = lambda s: None) -> int:
        if self.log is None:
            raise PermissionError("this index is read only (writes are off)")
        with self._write_lock:
            state = self._state
            check(state)
            change = make_change(self._seq + 1)
            self.log.append(change)  # durable before it is visible or acknowledged
            self._seq = change.seq
            self._state = replace(state, delta=apply(state.delta, state.base, change))
            if self._since_rotation is not None:
                self._since_rotation.append(change)
            return change.seq

    def upsert(self, docs: Sequence[Document], values: np.ndarray, gates: np.ndarray | None) -> int:
        """Add or replace ``docs`` (values (n, dim), gates (n, G)); returns the change's sequence number."""
        return self._commit(lambda seq: Change(seq, "upsert", tuple(docs), np.asarray(values, np.float32),
                                               None if gates is None else np.asarray(gates, np.uint8)))

    def delete(self, doc_id: str) -> int:
        """Remove ``doc_id``; raises :class:`UnknownDocument` (nothing logged) when it is not live."""
        def check(state: _State) -> None:
            if not contains(state.delta, state.base, doc_id):
                raise UnknownDocument(doc_id)

        return self._commit(lambda seq: Change(seq, "delete", (Document(doc_id, "", ""),)), check)

    # -- compaction --
    def compact(self) -> bool:
        """Fold the logged changes into a new generation, publish it, then drop the folded log.

        Searches and writes go on meanwhile; changes that arrive during the fold stay in the
        delta of the new generation. Returns False when there was nothing to fold.
        """
        from densehybrid.index.compaction import fold_in_subprocess

        if self.log is None:
            return False
        with self._compact_lock:
            with self._write_lock:
                state, seq = self._state, self._seq
                if state.delta.empty and state.delta.changes == 0:
                    return False
                segment = self.log.rotate()
                self._since_rotation = []
            self.compacting = True
            try:
                fold_in_subprocess(state.base.path, self.log.directory, segment, seq)
                base = load_index(state.base.path)
                searcher = self._make_searcher(base)
            except BaseException:
                with self._write_lock:  # the rotated segments stay; they are folded next time
                    self._since_rotation = None
                raise
            finally:
                self.compacting = False
            with self._write_lock:
                delta = Delta()
                for change in self._since_rotation:
                    delta = apply(delta, base, change, replaying=True)
                self._state = _State(base, searcher, delta)
                self._since_rotation = None
            self.log.drop_through(segment)
            self.last_compaction = time.time()
            log.info("compacted %d changes into a generation of %d documents", state.delta.changes, base.count)
            return True

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
