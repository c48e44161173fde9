"""A served index that takes writes: a published generation plus a small in-memory delta.

Between compactions the live state is the base generation (read only) and a
:class:`~densehybrid.index.writes.delta.Delta` of the changes since; searches merge the two
(``index.writes.merged.merged_search``). States are immutable and swapped whole: a search reads one
consistent snapshot while writes and compactions build the next. Every change goes to the
write-ahead log (:mod:`index.wal`) before it is applied; :meth:`LiveIndex.compact` folds the log
into a new generation (:mod:`index.compaction`) while searches and writes go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.index.writes.delta import Delta, UnknownDocument, apply, contains, replayed
from densehybrid.index.writes.merged import live_ids, merged_search
from densehybrid.index.writes.compaction import FoldWorker
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.params import SEARCH_FIELDS, SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.served import ManifestView, SearchResults, ServedIndex, StoredIndex
from densehybrid.index.writes.wal import Change, WriteAheadLog

if TYPE_CHECKING:
    from densehybrid.index.search.explain import ExplainedRows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _State:
    base: StoredIndex
    searcher: Searcher
    delta: Delta


@dataclass(frozen=True)
class _DeltaRows:
    """The delta seen as an index (what ``index.search.explain`` reads)."""

    spec: EncoderSpec
    values: np.ndarray
    gates: np.ndarray | None
    count: int


class LiveIndex(ManifestView, ServedIndex):
    """The served index: search, upsert, delete, compact. ``log`` None: read only.

    What it reports of itself (manifest, health, ``remote``) is its base generation's, except
    ``count`` and the documents, which include the pending changes.
    """

    def __init__(self, base: StoredIndex, make_searcher: Callable[[StoredIndex], Searcher],
                 log_: WriteAheadLog | None = None):
        self._make_searcher = make_searcher
        self.log = log_
        self._state = _State(base, make_searcher(base), Delta())
        self._breadth: dict[str, float] = {}  # a default breadth set while serving (set_default_breadth)
        self._write_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._since_rotation: list[Change] | None = None
        self._folder = FoldWorker() if log_ is not None else None  # its child starts when first needed
        self.last_compaction: float | None = None
        applied = int(base.manifest.get("writes", {}).get("applied_seq", 0))
        self._seq = applied
        if log_ is not None:
            delta = replayed(base, log_.recovered, applied)
            self._seq = max([applied, *(change.seq for change in log_.recovered)])
            self._state = replace(self._state, delta=delta)
            if log_.recovered:
                log.info("replayed %d logged changes (%d after the generation)", len(log_.recovered), delta.changes)
            log_.recovered = []  # the delta holds them now

    @classmethod
    def open(cls, path: Path, make_searcher: Callable[[StoredIndex], Searcher], *, log_dir: Path | None,
             base: StoredIndex | None = None) -> LiveIndex:
        base = base if base is not None else load_index(path)
        return cls(base, make_searcher, WriteAheadLog.open(log_dir) if log_dir is not None else None)

    @property
    def base(self) -> StoredIndex:
        return self._state.base

    @property
    def manifest(self) -> dict:
        return self.base.manifest

    @property
    def search_device(self) -> str:
        """Where the current searcher runs ("cpu", "cuda", "cuda:N"); compaction keeps it."""
        return self._state.searcher.device

    @property
    def first_stage(self) -> dict:
        """What answers the ``ip`` first stage: {"type": flat|hnsw|pqscan|milvus} and, for a graph, its
        default ``ef_search`` (for a Milvus IVF collection, its default ``nprobe``; for product codes, ``margin``,
        ``rescore`` and ``scan_threads``), with
        the build's recall calibration when it has one."""
        store = self._state.searcher.store
        ef = {"ef_search": store.ef_search} if store.first_stage == "hnsw" else {}
        ef |= {"nprobe": store.nprobe} if store.first_stage == "ivf" else {}
        if self.base.remote:
            return {"type": "milvus", "index_type": store.index_type, **ef}
        knobs = SEARCH_FIELDS.get(store.first_stage, ())
        ef = {knob: getattr(store, knob) for knob in knobs}
        calibration = self.base.manifest["first_stage"].get("calibration") if knobs else None
        ef |= {"scan_threads": store.scan_threads} if store.first_stage == "pqscan" else {}
        return {"type": store.first_stage, **ef, **({"calibration": calibration} if calibration else {})}

    @property
    def spec(self):
        return self.base.spec

    @property
    def remote(self) -> bool:
        return self.base.remote

    @property
    def writable(self) -> bool:
        return self.log is not None

    def healthy(self) -> bool:
        return self.base.healthy()

    @property
    def count(self) -> int:
        state = self._state
        return state.base.count - len(state.delta.hidden) + len(state.delta)

    @property
    def pending_changes(self) -> int:
        return self._state.delta.changes

    def contains(self, doc_id: str) -> bool:
        state = self._state
        return contains(state.delta, state.base, doc_id)

    def get_many(self, ids: Sequence[str]) -> list[Document | None]:
        state = self._state
        base_docs = state.base.get_many(ids)
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

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        state = self._state
        return live_ids(state.base, state.delta, rows)

    def field_values(self, rows: Sequence[int], names: Sequence[str]) -> list[dict]:
        """Field values of live rows: the base's columns, and the fields each written document carried."""
        state = self._state
        count = state.base.count
        base_values = iter(state.base.field_values([r for r in rows if r < count], names))
        return [next(base_values) if r < count
                else {n: v for n, v in (state.delta.docs[r - count].fields or {}).items() if n in names}
                for r in rows]

    def locate(self, row: int) -> tuple[ExplainedRows, int]:
        """(the rows holding it, its row there) for a live row number, for ``index.search.explain``."""
        state = self._state
        if row < state.base.count:
            return state.base, row
        d = state.delta
        return _DeltaRows(state.base.spec, d.values16, d.gates, d.rows), row - state.base.count

    # -- search --
    def first_stage_recall(self, queries: Encoded, params: SearchParams, k: int = 10) -> np.ndarray:
        """(Q,) recall@``k`` of the base's first stage for ``queries`` at ``params``, against an exact scan of the
        same rows (``Searcher.first_stage_recall``); the rows written since the last fold are searched exactly
        anyway, so they are left out of both."""
        return self._state.searcher.first_stage_recall(queries, params, k)

    def set_default_breadth(self, knob: str, breadth: float) -> None:
        """Search with ``breadth`` as the first stage's default ``knob`` (ef_search, nprobe or margin) from now on,
        in this generation and the ones compactions publish (the manifest keeps the build's)."""
        self._breadth = {knob: breadth}
        _set_breadth(self._state.searcher.store, self._breadth)

    def sample_rows(self, count: int, seed: int = 0) -> Encoded:
        """A seeded sample of ``count`` of the base's rows as queries: their stored vectors (float32) and gates."""
        base = self._state.base
        rows = np.sort(np.random.default_rng(seed).choice(base.count, min(count, base.count), replace=False))
        return Encoded(np.asarray(base.values[rows], np.float32), None if base.gates is None else base.gates[rows])

    def search(self, queries: Encoded, params: SearchParams = SearchParams()) -> SearchResults:
        state = self._state
        return merged_search(state.searcher, state.delta, queries, params)

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
    def prepare_compaction(self) -> None:
        """Start the fold child now (its imports take seconds at low priority), before a compaction needs it."""
        if self._folder is not None:
            self._folder.start()

    def compact(self) -> bool:
        """Fold the logged changes into a new generation, publish it, then drop the folded log.

        Searches and writes go on meanwhile; changes that arrive during the fold stay in the
        delta of the new generation. Returns False when there was nothing to fold.
        """
        if self.log is None:
            return False
        with self._compact_lock:
            with self._write_lock:
                state, seq = self._state, self._seq
                if state.delta.empty and state.delta.changes == 0:
                    return False
                segment = self.log.rotate()
                self._since_rotation = []
            try:
                self._folder.fold(state.base.path, self.log.directory, segment, seq)
                base = load_index(state.base.path)
                base.contains("")  # an id list of format 2 sorts its lookup now, not under the write lock below
                searcher = self._make_searcher(base)
                _set_breadth(searcher.store, self._breadth)
            except BaseException:
                with self._write_lock:  # the rotated segments stay; they are folded next time
                    self._since_rotation = None
                raise
            with self._write_lock:
                self._state = _State(base, searcher, replayed(base, self._since_rotation))
                self._since_rotation = None
            self.log.drop_through(segment)
            self.last_compaction = time.time()
            log.info("compacted %d changes into a generation of %d documents", state.delta.changes, base.count)
            return True

    def close(self) -> None:
        if self._folder is not None:
            self._folder.close()
        if self.log is not None:
            self.log.close()


def _set_breadth(store, breadth: dict[str, float]) -> None:
    """A store's default breadth, where it has that knob (a steered breadth outlives a compaction)."""
    for knob, value in breadth.items():
        if knob in SEARCH_FIELDS.get(store.first_stage, ()):
            setattr(store, knob, int(value) if knob in ("ef_search", "nprobe") else float(value))

