"""The ids of an index's rows: two memory-mapped arrays, opened in constant time at any size.

``doc_ids.npy`` (N,) fixed-width bytes: row r holds the UTF-8 of its id followed by one ``0xff`` byte
(a byte UTF-8 never uses). The end mark keeps every id exact: numpy drops trailing NUL bytes from
fixed-width strings, so without it "a" and "a\\x00" would read back as one. ``doc_ids.order.npy``
(N,) int64: the rows in the byte order of their ids, computed when the index is written, so a lookup
is a binary search over the memory maps and opening the index reads neither file.

Indexes of format 2 and older store ``doc_ids.json``, a JSON list read into Python (about 80 ms at
1M ids, while a reload held the GIL); they still open, their order sorted on the first lookup.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from densehybrid.index.errors import IndexLoadError

IDS = "doc_ids.npy"
ORDER = "doc_ids.order.npy"
LEGACY_JSON = "doc_ids.json"
_END = b"\xff"


def encode(doc_ids: Iterable[str]) -> np.ndarray:
    """(N,) fixed-width bytes: each id's UTF-8 and the end mark (the layout of ``doc_ids.npy``)."""
    # surrogatepass: a JSON request may carry a lone surrogate ("\ud800"); it must look up as missing, not fail
    keys = np.array([d.encode("utf-8", "surrogatepass") + _END for d in doc_ids], dtype=bytes)
    return keys if len(keys) else np.empty(0, "S1")


def _decode(key: bytes) -> str:
    # numpy hands back the stored bytes, end mark included (it is never a NUL, so nothing was dropped)
    return key[:-1].decode("utf-8", "surrogatepass")


class DocIds(Sequence[str]):
    """Ids in row order over ``keys`` (the array of :func:`encode`, memory-mapped or not) and ``order``
    (the rows sorted by key; computed on the first lookup when not given). Reads like a list of str."""

    def __init__(self, keys: np.ndarray, order: np.ndarray | None = None):
        self.keys, self._order = keys, order

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [_decode(k) for k in self.keys[row].tolist()]
        return _decode(self.keys[row])

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self.keys), 65_536):
            yield from self[start:start + 65_536]

    def __eq__(self, other) -> bool:
        if isinstance(other, (DocIds, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # a list-like: compared by value

    def __repr__(self) -> str:
        return f"DocIds({len(self)} ids)"

    @property
    def order(self) -> np.ndarray:
        """(N,) int64: the rows sorted by id bytes."""
        if self._order is None:
            self._order = sorted_order(self.keys)
        return self._order

    def rows_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        """(n,) int64: the row of each id, -1 for an id not held (one vectorised binary search)."""
        wanted = encode(doc_ids)
        if not len(self.keys) or not len(wanted):
            return np.full(len(wanted), -1, np.int64)
        # to the stored width, so numpy never widens (copies) the stored array; a cut id has lost its
        # end mark and so matches nothing, as an id longer than every stored one must
        wanted = wanted.astype(self.keys.dtype)
        order = self.order
        at = np.minimum(np.searchsorted(self.keys, wanted, sorter=order), len(order) - 1)
        rows = np.asarray(order[at], dtype=np.int64)
        return np.where(self.keys[rows] == wanted, rows, -1)


def sorted_order(keys: np.ndarray) -> np.ndarray:
    return np.argsort(keys, kind="stable").astype(np.int64)


def write(directory: Path, doc_ids: Iterable[str] | np.ndarray) -> None:
    """Write ``doc_ids.npy`` and ``doc_ids.order.npy``; ``doc_ids`` as str, or keys of :func:`encode`."""
    keys = doc_ids.keys if isinstance(doc_ids, DocIds) else (
        doc_ids if isinstance(doc_ids, np.ndarray) else encode(doc_ids))
    np.save(directory / IDS, keys, allow_pickle=False)
    np.save(directory / ORDER, sorted_order(keys), allow_pickle=False)


def load(directory: Path, count: int, *, legacy: bool = False) -> DocIds:
    """The ids of ``directory``, memory-mapped (``legacy``: its ``doc_ids.json``); IndexLoadError naming
    the file and the problem."""
    if legacy:
        return _load_json(directory / LEGACY_JSON, count)
    try:
        keys = np.load(directory / IDS, mmap_mode="r", allow_pickle=False)
        order = np.load(directory / ORDER, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise IndexLoadError(f"{directory / IDS}: not a readable id array ({exc})") from exc
    if keys.dtype.kind != "S" or keys.shape != (count,):
        raise IndexLoadError(f"{directory / IDS}: holds {keys.dtype} {keys.shape}, expected {count} fixed-width ids")
    if order.dtype != np.int64 or order.shape != (count,):
        raise IndexLoadError(f"{directory / ORDER}: holds {order.dtype} {order.shape}, expected int64 ({count},)")
    return DocIds(keys, order)


def _load_json(path: Path, count: int) -> DocIds:
    try:
        doc_ids = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexLoadError(f"{path}: unreadable id list ({exc})") from exc
    if not isinstance(doc_ids, list) or len(doc_ids) != count or not all(isinstance(d, str) for d in doc_ids):
        raise IndexLoadError(f"{path}: expected a list of {count} ids")
    return DocIds(encode(doc_ids))


def check(directory: Path, ids: DocIds) -> None:
    """The full check (reads both arrays): every key ends with the mark, the order is the ids' order,
    no id twice. IndexLoadError naming the problem."""
    keys, order = ids.keys, np.asarray(ids.order)
    if len(keys) and not all(np.char.endswith(keys[s:s + 65_536], _END).all()
                             for s in range(0, len(keys), 65_536)):
        raise IndexLoadError(f"{directory / IDS}: an id lacks its end mark (not written by this format)")
    if not np.array_equal(np.sort(order), np.arange(len(keys))):
        raise IndexLoadError(f"{directory / ORDER}: not an ordering of the rows")
    ordered = keys[order]
    if len(ordered) > 1 and not (ordered[1:] > ordered[:-1]).all():
        raise IndexLoadError(f"{directory / ORDER}: ids not in sorted order, or an id held twice")
