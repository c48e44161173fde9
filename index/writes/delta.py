"""The writes since a published generation, in memory: a :class:`Delta`.

A delta holds rows added since the base generation (searched exactly, next to the base's
vector store, by ``index.writes.merged``) and the base rows hidden because their id was deleted
or replaced. Rows number the base first (``0..base.count-1``), then the delta. Deltas are
immutable: every operation returns a new one (``index.writes.live.LiveIndex`` swaps them whole).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from densehybrid.index.storage.documents import Document
from densehybrid.index.storage.payload import Payload
from densehybrid.index.search.served import StoredIndex
from densehybrid.index.writes.wal import Change


class UnknownDocument(KeyError):
    """A delete named an id that is not in the index."""


# rows a delta allocates room for at first; the room doubles whenever it runs out
_FIRST_CAPACITY = 256
# a delta re-packs its rows once the dead ones outnumber the live ones (and at least this many)
_MIN_DEAD_TO_REPACK = 64


class _Rows:
    """Row storage that successive deltas share: each delta sees the first ``n`` rows (views), and a
    delta grows by writing rows past the end of what any delta has seen, so a published delta's rows
    never change. Appending a batch is O(batch) (amortized): copying the whole delta on every write
    made writes cost more the longer compaction took, and that CPU came out of the searches."""

    def __init__(self, dim: int, gated_dim: int | None, capacity: int):
        self.values = np.empty((capacity, dim), np.float32)
        self.values16 = np.empty((capacity, dim), np.float16)  # as a stored generation holds them (the rerank reads these)
        self.gates = None if gated_dim is None else np.empty((capacity, gated_dim), np.uint8)
        self._filled = 0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, values: np.ndarray, gates: np.ndarray | None, capacity: int) -> _Rows:
        rows = cls(values.shape[1], None if gates is None else gates.shape[1], max(capacity, len(values)))
        if not rows.append_at(0, values, gates):
            raise AssertionError("a new row store has room for its first rows")
        return rows

    def fits(self, values: np.ndarray, gates: np.ndarray | None) -> bool:
        return values.shape[1] == self.values.shape[1] and (gates is None) == (self.gates is None) and (
            gates is None or gates.shape[1] == self.gates.shape[1])

    def append_at(self, n: int, values: np.ndarray, gates: np.ndarray | None) -> bool:
        """Write ``values`` (and ``gates``) as rows ``n..``; False (nothing written) when another delta has
        already grown past ``n`` or there is no room."""
        end = n + len(values)
        with self._lock:
            if n != self._filled or end > len(self.values) or not self.fits(values, gates):
                return False
            self._filled = end
        self.values[n:end] = values
        self.values16[n:end] = values
        if gates is not None:
            self.gates[n:end] = gates
        return True


@dataclass(frozen=True)
class Delta:
    """Rows added since the base generation and base rows hidden since. values (n, dim) float32,
    values16 the same as float16, gates (n, G) uint8 or None; ``hidden`` are base row numbers.

    Rows are only appended: a replaced or deleted delta row stays, listed in ``dead``, until the
    dead rows outnumber the live ones and the delta re-packs. ``len`` counts live rows, ``rows``
    all of them (row numbers run over all of them); ``row_of`` maps the live ids to their rows."""

    docs: tuple[Document, ...] = ()
    values: np.ndarray | None = None
    gates: np.ndarray | None = None
    hidden: frozenset[int] = frozenset()
    changes: int = 0
    row_of: dict[str, int] = field(default_factory=dict)
    values16: np.ndarray | None = None
    dead: frozenset[int] = frozenset()
    store: _Rows | None = field(default=None, repr=False, compare=False)
    # the rows' field columns by schema, built on first use; not an init field, so replace() starts afresh
    _payloads: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.values is not None and self.store is None:  # built from whole arrays: give it a store
            store = _Rows.of(np.asarray(self.values, np.float32), self.gates, len(self.values))
            n = len(self.values)
            for name, array in (("values", store.values), ("values16", store.values16), ("gates", store.gates)):
                object.__setattr__(self, name, None if array is None else array[:n])
            object.__setattr__(self, "store", store)

    def __len__(self) -> int:
        return len(self.docs) - len(self.dead)

    @property
    def rows(self) -> int:
        """Rows held, dead ones included (row numbers run over these)."""
        return len(self.docs)

    @property
    def empty(self) -> bool:
        return not len(self) and not self.hidden

    @functools.cached_property
    def live_rows(self) -> np.ndarray:
        """Row numbers of the live rows, ascending."""
        if not self.dead:
            return np.arange(self.rows, dtype=np.int64)
        return np.setdiff1d(np.arange(self.rows, dtype=np.int64), np.fromiter(self.dead, np.int64, len(self.dead)))

    def live(self) -> tuple[tuple[Document, ...], np.ndarray | None, np.ndarray | None]:
        """(docs, values, gates) of the live rows only, in row order (what a compaction folds)."""
        if not self.dead:
            return self.docs, self.values, self.gates
        keep = self.live_rows
        return (tuple(self.docs[i] for i in keep), self.values[keep],
                None if self.gates is None else self.gates[keep])

    def payload(self, schema: dict[str, str]) -> Payload:
        """Every row's field values as columns, dead rows too (row numbers run over all of them); built on
        first use: a delta's rows never change."""
        key = tuple(schema.items())
        if key not in self._payloads:
            self._payloads[key] = Payload.from_rows(schema, [d.fields for d in self.docs])
        return self._payloads[key]


def _appended(delta: Delta, docs: Sequence[Document], values: np.ndarray, gates: np.ndarray | None) -> tuple:
    """(store, values, values16, gates) of ``delta``'s rows followed by the new ones, appended in place
    when the store has room, else in a new store of twice the size (amortized O(new rows))."""
    n = delta.rows
    store = delta.store
    if store is not None and not store.fits(values, gates):
        raise ValueError(f"rows of shape {values.shape} do not fit a delta of {store.values.shape[1]} dims "
                         f"({'with' if store.gates is not None else 'without'} gates)")
    if store is None or not store.append_at(n, values, gates):
        capacity = max(_FIRST_CAPACITY, 2 * (n + len(values)))
        store = _Rows.of(values, gates, capacity) if store is None or n == 0 else _Rows.of(
            delta.values, delta.gates, capacity)
        if n and not store.append_at(n, values, gates):
            raise AssertionError("a new row store has room for the rows it was sized for")
    end = n + len(values)
    return (store, store.values[:end], store.values16[:end], None if store.gates is None else store.gates[:end])


def _repacked(delta: Delta) -> Delta:
    """The same delta with its dead rows dropped and the live ones renumbered (O(rows), rare)."""
    if len(delta.dead) < max(_MIN_DEAD_TO_REPACK, len(delta)):
        return delta
    docs, values, gates = delta.live()
    if not docs:
        return Delta(hidden=delta.hidden, changes=delta.changes)
    store = _Rows.of(values, gates, max(_FIRST_CAPACITY, 2 * len(docs)))
    n = len(docs)
    return Delta(docs, store.values[:n], None if gates is None else store.gates[:n], delta.hidden, delta.changes,
                 {d.id: i for i, d in enumerate(docs)}, store.values16[:n], frozenset(), store)


def upsert(delta: Delta, base: StoredIndex, docs: Sequence[Document], values: np.ndarray,
           gates: np.ndarray | None) -> Delta:
    """``delta`` with ``docs`` added, replacing any earlier version (in the base or the delta)."""
    ids = [d.id for d in docs]
    replaced = {delta.row_of[i] for i in ids if i in delta.row_of}
    hidden = delta.hidden | {int(r) for r in base.rows_of(ids) if r >= 0}
    values = np.asarray(values, dtype=np.float32)
    gates = None if gates is None else np.asarray(gates, dtype=np.uint8)
    store, all_values, values16, all_gates = _appended(delta, docs, values, gates)
    row_of = dict(delta.row_of)
    n = delta.rows
    for i, doc in enumerate(docs):  # a later duplicate in the same batch wins; the earlier row is dead
        if doc.id in row_of and row_of[doc.id] >= n:
            replaced.add(row_of[doc.id])
        row_of[doc.id] = n + i
    return _repacked(Delta(delta.docs + tuple(docs), all_values, all_gates, hidden, delta.changes + 1, row_of,
                           values16, delta.dead | replaced, store))


def delete(delta: Delta, base: StoredIndex, doc_id: str) -> Delta:
    """``delta`` without ``doc_id``; raises :class:`UnknownDocument` when the id is not live."""
    if not contains(delta, base, doc_id):
        raise UnknownDocument(doc_id)
    row = base.row_of(doc_id)
    hidden = delta.hidden | ({row} if row is not None else set())
    row_of = dict(delta.row_of)
    gone = row_of.pop(doc_id, None)
    dead = delta.dead if gone is None else delta.dead | {gone}
    return _repacked(replace(delta, hidden=hidden, changes=delta.changes + 1, row_of=row_of, dead=dead))


def contains(delta: Delta, base: StoredIndex, doc_id: str) -> bool:
    if doc_id in delta.row_of:
        return True
    row = base.row_of(doc_id)
    return row is not None and row not in delta.hidden


def replayed(base: StoredIndex, changes: Iterable[Change], after: int = 0) -> Delta:
    """The delta of the logged ``changes`` numbered after ``after`` (``base`` holds the earlier ones)."""
    delta = Delta()
    for change in changes:
        if change.seq > after:
            delta = apply(delta, base, change, replaying=True)
    return delta


def apply(delta: Delta, base: StoredIndex, change: Change, *, replaying: bool = False) -> Delta:
    if change.op == "upsert":
        return upsert(delta, base, change.docs, change.values, change.gates)
    try:
        return delete(delta, base, change.docs[0].id)
    except UnknownDocument:
        if replaying:  # folded already (a crash between publishing a generation and dropping its log)
            return replace(delta, changes=delta.changes + 1)
        raise
