"""The one reader of BEIR-style JSONL files (``corpus.jsonl``, ``queries.jsonl``): one JSON object a line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def read_jsonl(path: str | Path, *, required: tuple[str, ...], what: str,
               error: type[Exception] = ValueError) -> Iterator[dict]:
    """Each non-blank line's object, in file order; ``error`` names ``path:line`` when one is not ``what``."""
    return (row for _, row in read_numbered_jsonl(path, required=required, what=what, error=error))


def read_numbered_jsonl(path: str | Path, *, required: tuple[str, ...], what: str,
                        error: type[Exception] = ValueError) -> Iterator[tuple[int, dict]]:
    """:func:`read_jsonl` with each object's line number."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise TypeError(f"a JSON {type(row).__name__}, not an object")
                missing = [name for name in required if name not in row]
                if missing:
                    raise KeyError(", ".join(missing))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise error(f"{path}:{number}: not {what} ({type(exc).__name__}: {exc})") from exc
            yield number, row
