"""Passage texts of an index: the SQLite table ``docs(row, id, title, text)``, written once, read shared."""

from __future__ import annotations

import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DOCS = "docs.sqlite"


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str
    # payload field values of a document written to a live index (``index.storage.payload``); stored ones live in columns
    fields: dict | None = field(default=None, compare=False)


class DocTable:
    """Read-only passage texts in SQLite; safe to share between threads."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        uri = _uri(self.path, "mode=ro&immutable=1")
        self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)

    def _rows(self, sql: str, args: Sequence) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def count(self) -> int:
        return self._rows("SELECT COUNT(*) FROM docs", ())[0][0]

    def get(self, doc_id: str) -> Document | None:
        rows = self._rows("SELECT id, title, text FROM docs WHERE id = ?", (doc_id,))
        return Document(*rows[0]) if rows else None

    def get_many(self, ids: Sequence[str]) -> list[Document | None]:
        """Documents for ``ids`` in the same order; None for unknown ids."""
        found: dict[str, Document] = {}
        unique = list(dict.fromkeys(ids))
        for s in range(0, len(unique), 500):
            chunk = unique[s:s + 500]
            sql = f"SELECT id, title, text FROM docs WHERE id IN ({','.join('?' * len(chunk))})"
            found.update((r[0], Document(*r)) for r in self._rows(sql, chunk))
        return [found.get(i) for i in ids]

    def at_rows(self, rows: Sequence[int]) -> list[Document]:
        """The documents at ``rows`` (index rows, each present), in the same order."""
        found: dict[int, Document] = {}
        for s in range(0, len(rows), 500):
            chunk = [int(r) for r in rows[s:s + 500]]
            sql = f"SELECT row, id, title, text FROM docs WHERE row IN ({','.join('?' * len(chunk))})"
            found.update((r[0], Document(*r[1:])) for r in self._rows(sql, chunk))
        return [found[int(r)] for r in rows]

    def iter_rows(self, batch: int = 10_000) -> Iterable[Document]:
        """Every document in row order."""
        last = -1
        while True:
            rows = self._rows("SELECT row, id, title, text FROM docs WHERE row > ? ORDER BY row LIMIT ?", (last, batch))
            if not rows:
                return
            last = rows[-1][0]
            yield from (Document(*r[1:]) for r in rows)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def write_docs(directory: Path, docs: Iterable[Document]) -> None:
    """The table, written in one transaction so equal inputs give equal bytes."""
    write_docs_at(directory, enumerate(docs))


def _uri(path: Path, query: str = "") -> str:
    return f"file:{urllib.parse.quote(str(path.absolute()))}" + (f"?{query}" if query else "")


def _new_table(directory: Path) -> sqlite3.Connection:
    path = directory / DOCS
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(_uri(path), uri=True)  # a URI: the source a fold attaches is opened read only
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("CREATE TABLE docs (row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT NOT NULL, text TEXT NOT NULL)")
    return conn


def write_docs_at(directory: Path, rows: Iterable[tuple[int, Document]]) -> None:
    """The table from (row, document) pairs in any order (an import's corpus need not follow its rows)."""
    conn = _new_table(directory)
    try:
        with conn:
            conn.executemany("INSERT INTO docs VALUES (?, ?, ?, ?)",
                             ((i, d.id, d.title, d.text) for i, d in rows))
    finally:
        conn.close()


_FOLD_ROWS = 50_000  # source rows copied by one statement: a pacer pauses between them


def write_docs_folded(directory: Path, source: Path, dropped: Sequence[int], added: Sequence[Document],
                      pace: Callable[[Iterable], Iterable] = iter) -> None:
    """The table of ``source`` without its rows ``dropped`` (the rest renumbered from 0, in order), then ``added``.

    SQLite copies the kept rows itself, table to table, a range of source rows at a time (``pace``
    may pause between them): a million passages never become Python objects."""
    conn = _new_table(directory)
    try:
        conn.execute("ATTACH DATABASE ? AS source", (_uri(Path(source), "mode=ro&immutable=1"),))
        conn.execute("CREATE TEMP TABLE dropped (row INTEGER PRIMARY KEY)")
        with conn:
            conn.executemany("INSERT INTO temp.dropped VALUES (?)", ((int(r),) for r in dropped))
            end = (conn.execute("SELECT MAX(row) FROM source.docs").fetchone()[0] or 0) + 1
            kept = 0
            for start in pace(range(0, end, _FOLD_ROWS)):
                kept += conn.execute("INSERT INTO docs SELECT ? + row_number() OVER (ORDER BY row) - 1, id, title, "
                                     "text FROM source.docs WHERE row >= ? AND row < ? AND row NOT IN "
                                     "(SELECT row FROM temp.dropped) ORDER BY row",
                                     (kept, start, start + _FOLD_ROWS)).rowcount
            conn.executemany("INSERT INTO docs VALUES (?, ?, ?, ?)",
                             ((kept + i, d.id, d.title, d.text) for i, d in enumerate(added)))
    finally:
        conn.close()
