"""Typed payload columns of an index: the corpus's chosen ``metadata`` fields, one column per field.

Types: ``keyword`` (a string), ``integer``, ``float``, ``bool`` and ``keyword_list`` (a list of
strings). A JSON integer in a float field widens to float; every other mix of types is an error
naming the field and the corpus line. A missing field, a ``null`` and an empty list are "absent".

Storage (``fields.npz``, written into the index directory before its manifest, which lists the
field names and types under ``fields``): per field ``NAME.present`` (N,) bool and ``NAME.data``:
keyword codes (N,) int32 into the sorted ``NAME.vocab``; keyword_list codes (M,) int32 with
``NAME.offsets`` (N + 1,) int64; integer int64; float float64; bool bool.
"""

from __future__ import annotations

import math
import re
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FIELD_TYPES = ("keyword", "integer", "float", "bool", "keyword_list")
# letters, digits and underscores: the same name is a Milvus scalar field and a filter's "field"
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
PAYLOAD = "fields.npz"
MAX_FIELDS = 64
MAX_KEYWORD_CHARS = 1024
MAX_LIST_ITEMS = 1024
_MASK_CACHE = 16  # filters whose row masks are kept (one byte per row each)


class PayloadError(ValueError):
    """A field value that does not fit the field's type (``field`` names it)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


def check_name(name: str) -> str:
    if not FIELD_NAME.match(name):
        raise PayloadError(name, f"field name {name!r}: use letters, digits and underscores (at most 64, "
                                 "not starting with a digit)")
    return name


def type_of(value) -> str | None:
    """The payload type of one JSON value (None: absent); raises ValueError for values no type holds."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return "float"
    if isinstance(value, str):
        if len(value) > MAX_KEYWORD_CHARS:
            raise ValueError(f"a keyword of {len(value)} characters (at most {MAX_KEYWORD_CHARS})")
        return "keyword"
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise ValueError("a list that is not all strings (only keyword lists are kept)")
        if len(value) > MAX_LIST_ITEMS or any(len(v) > MAX_KEYWORD_CHARS for v in value):
            raise ValueError(f"a keyword list over {MAX_LIST_ITEMS} items or {MAX_KEYWORD_CHARS} characters an item")
        return "keyword_list" if value else None
    raise ValueError(f"a JSON {type(value).__name__} (keep keywords, numbers, booleans or lists of keywords)")


def merge_types(field_name: str, known: str | None, found: str, where: str) -> str:
    """The type of a field after one more value; an integer and a float make a float."""
    if known is None or known == found:
        return found
    if {known, found} == {"integer", "float"}:
        return "float"
    raise PayloadError(field_name, f"{where}: field {field_name!r} is {found} here but {known} on earlier lines")


def check_value(field_name: str, kind: str, value, where: str = "fields"):
    """``value`` as the field's type stores it (an integer in a float field becomes a float)."""
    try:
        found = type_of(value)
    except ValueError as exc:
        raise PayloadError(field_name, f"{where}: field {field_name!r}: {exc}") from None
    if found is None:
        return None
    if found == kind:
        return value
    if (found, kind) == ("integer", "float"):
        return float(value)
    raise PayloadError(field_name, f"{where}: field {field_name!r} is {kind}, got {found} {value!r}")


@dataclass
class Column:
    kind: str
    present: np.ndarray
    data: np.ndarray
    vocab: np.ndarray | None = None  # sorted strings (keyword, keyword_list)
    offsets: np.ndarray | None = None  # keyword_list
    _element_rows: np.ndarray | None = field(default=None, repr=False)

    def code_of(self, values: Iterable[str]) -> np.ndarray:
        """Codes of the given strings that occur in the vocabulary."""
        wanted = np.asarray(list(values), dtype=str)
        if not len(self.vocab) or not len(wanted):
            return np.empty(0, np.int32)
        at = np.searchsorted(self.vocab, wanted)
        at = np.minimum(at, len(self.vocab) - 1)
        return at[self.vocab[at] == wanted].astype(np.int32)

    def element_rows(self) -> np.ndarray:
        """(M,) the row each keyword-list element belongs to."""
        if self._element_rows is None:
            self._element_rows = np.repeat(np.arange(len(self.present), dtype=np.int64), np.diff(self.offsets))
        return self._element_rows

    def value(self, row: int):
        if not self.present[row]:
            return None
        if self.kind == "keyword":
            return str(self.vocab[self.data[row]])
        if self.kind == "keyword_list":
            return [str(self.vocab[c]) for c in self.data[self.offsets[row]:self.offsets[row + 1]]]
        return {"integer": int, "float": float, "bool": bool}[self.kind](self.data[row])


def _column(kind: str, values: Sequence) -> Column:
    present = np.array([v is not None for v in values], dtype=bool)
    if kind in ("keyword", "keyword_list"):
        words = {v for v in values if v is not None} if kind == "keyword" else \
            {w for v in values if v is not None for w in v}
        vocab = np.array(sorted(words), dtype=str) if words else np.array([], dtype="<U1")
        index = {w: i for i, w in enumerate(vocab.tolist())}
        if kind == "keyword":
            return Column(kind, present, np.array([index[v] if v is not None else 0 for v in values], np.int32), vocab)
        lengths = np.array([len(v) if v is not None else 0 for v in values], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        codes = np.array([index[w] for v in values if v is not None for w in v], dtype=np.int32)
        return Column(kind, present, codes, vocab, offsets)
    dtype = {"integer": np.int64, "float": np.float64, "bool": bool}[kind]
    zero = {"integer": 0, "float": 0.0, "bool": False}[kind]
    return Column(kind, present, np.array([zero if v is None else v for v in values], dtype=dtype))


class Payload:
    """Columns of N rows, by field name; rows number as the index's."""

    def __init__(self, count: int, columns: Mapping[str, Column]):
        self.count = count
        self.columns = dict(columns)
        self._masks: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @property
    def schema(self) -> dict[str, str]:
        return {name: column.kind for name, column in self.columns.items()}

    @classmethod
    def from_rows(cls, schema: Mapping[str, str], rows: Sequence[Mapping | None]) -> Payload:
        """Columns of ``rows`` (dicts of field values, None for none), checked against ``schema``."""
        columns = {}
        for name, kind in schema.items():
            values = [check_value(name, kind, (row or {}).get(name), f"row {i}") for i, row in enumerate(rows)]
            columns[name] = _column(kind, values)
        return cls(len(rows), columns)

    def rows(self, rows: Sequence[int], names: Sequence[str] | None = None) -> list[dict]:
        """{name: value} of each row (absent fields left out), for ``names`` or every field."""
        names = list(self.columns) if names is None else names
        out = []
        for r in rows:
            values = {n: self.columns[n].value(int(r)) for n in names}
            out.append({n: v for n, v in values.items() if v is not None})
        return out

    def cached_mask(self, key, compute) -> np.ndarray:
        """The row mask of filter ``key`` (computed once, a few kept): repeated filters cost a lookup."""
        with self._lock:
            if key in self._masks:
                self._masks.move_to_end(key)
                return self._masks[key]
        mask = compute()
        mask.setflags(write=False)
        with self._lock:
            self._masks[key] = mask
            while len(self._masks) > _MASK_CACHE:
                self._masks.popitem(last=False)
        return mask

    def write(self, directory: Path) -> dict:
        """``fields.npz`` in ``directory`` (none when there are no fields) -> the manifest's ``fields`` entry."""
        if not self.columns:
            return {"fields": {}}
        arrays = {}
        for name, c in self.columns.items():
            arrays[f"{name}.present"], arrays[f"{name}.data"] = c.present, c.data
            if c.vocab is not None:
                arrays[f"{name}.vocab"] = c.vocab
            if c.offsets is not None:
                arrays[f"{name}.offsets"] = c.offsets
        # a zip of .npy members as np.savez writes it, with fixed member times: equal inputs, equal bytes
        with zipfile.ZipFile(Path(directory) / PAYLOAD, "w", zipfile.ZIP_STORED) as archive:
            for key, array in arrays.items():
                with archive.open(zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0)), "w",
                                  force_zip64=True) as member:
                    np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
        return {"fields": self.schema}


def load_payload(path: Path, schema: Mapping[str, str], count: int) -> Payload:
    """The columns of ``schema`` from ``fields.npz``; ValueError naming what is wrong."""
    if not schema:
        return Payload(count, {})
    columns = {}
    with np.load(path, allow_pickle=False) as npz:
        for name, kind in schema.items():
            if kind not in FIELD_TYPES:
                raise ValueError(f"field {name!r} has unknown type {kind!r}")
            try:
                present, data = npz[f"{name}.present"], npz[f"{name}.data"]
                vocab = npz[f"{name}.vocab"] if kind in ("keyword", "keyword_list") else None
                offsets = npz[f"{name}.offsets"] if kind == "keyword_list" else None
            except KeyError as exc:
                raise ValueError(f"field {name!r}: column {exc} missing") from None
            if present.shape != (count,) or (offsets is not None and offsets.shape != (count + 1,)):
                raise ValueError(f"field {name!r}: column of {present.shape[0]} rows, expected {count}")
            columns[name] = Column(kind, present, data, vocab, offsets)
    return Payload(count, columns)


class PayloadBuilder:
    """Collects chosen (or all) metadata fields of corpus lines, inferring and checking their types."""

    def __init__(self, names: Sequence[str] | None):
        self.names = None if names is None else [check_name(n) for n in dict.fromkeys(names)]
        self.types: dict[str, str | None] = {n: None for n in self.names or []}
        self.values: dict[str, list] = {n: [] for n in self.names or []}
        self.count = 0

    def add(self, metadata, where: str) -> None:
        if metadata is not None and not isinstance(metadata, dict):
            raise PayloadError("metadata", f"{where}: metadata is a JSON {type(metadata).__name__}, not an object")
        metadata = metadata or {}
        if self.names is None:
            for name in metadata:
                if name not in self.types:
                    check_name(name)
                    if len(self.types) >= MAX_FIELDS:
                        raise PayloadError(name, f"{where}: more than {MAX_FIELDS} metadata fields")
                    self.types[name], self.values[name] = None, [None] * self.count
        for name, column in self.values.items():
            value = metadata.get(name)
            try:
                found = type_of(value)
            except ValueError as exc:
                raise PayloadError(name, f"{where}: field {name!r}: {exc}") from None
            if found is not None:
                self.types[name] = merge_types(name, self.types[name], found, where)
            column.append(value if found is not None else None)
        self.count += 1

    def finish(self) -> Payload:
        """The columns; a field never seen with a value is a keyword column of absent values."""
        schema = {n: t or "keyword" for n, t in self.types.items()}
        columns = {n: _column(schema[n], [float(v) if schema[n] == "float" and v is not None else v
                                          for v in self.values[n]]) for n in schema}
        return Payload(self.count, columns)
