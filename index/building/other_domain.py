"""Calibration queries from another domain that every build can make: sentences of Python's own docstrings.

An approximate first stage loses most on queries unlike its corpus (a graph walk or the probed lists stay
near where the corpus is dense), and a build has no user query to measure that on. Every Python ships
its standard library's sources, so the first sentences of their docstrings (modules, classes, functions)
are a second group of queries from text the corpus did not come from. They are read from the sources
with :mod:`ast` (no module is imported), in sorted file order, and a seeded sample is drawn.
"""

from __future__ import annotations

import ast
import functools
import re
import sysconfig
from pathlib import Path

import numpy as np

WORDS = (4, 30)
_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s")
_SKIPPED = {"test", "tests", "idle_test", "site-packages", "lib2to3", "turtledemo", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def docstring_sentence(doc: str) -> str | None:
    """The first sentence of a docstring's summary paragraph, when it has 4 to 30 words; else None."""
    summary = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = _FIRST_SENTENCE.split(summary, maxsplit=1)[0]
    return sentence if WORDS[0] <= len(sentence.split()) <= WORDS[1] else None


def file_sentences(path: Path) -> list[str]:
    """The docstring sentences of one source file (module, classes, functions), in source order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    docs = (ast.get_docstring(n) for n in nodes)
    return [s for s in (docstring_sentence(d) for d in docs if d) if s]


def source_files(root: Path) -> list[Path]:
    """The standard library's .py files under ``root``, sorted, tests and demos left out."""
    return sorted(p for p in root.rglob("*.py") if not _SKIPPED & set(p.relative_to(root).parts))


@functools.lru_cache(maxsize=2)
def all_sentences(root: Path) -> tuple[str, ...]:
    """Every distinct docstring sentence under ``root``, in file order (read once a process: a few seconds)."""
    seen: dict[str, None] = {}
    for path in source_files(root):
        seen.update(dict.fromkeys(file_sentences(path)))
    return tuple(seen)


def stdlib_sentences(count: int, seed: int = 0, root: Path | None = None) -> list[str]:
    """A seeded sample of ``count`` distinct docstring sentences of the standard library (fewer if it has fewer)."""
    pool = all_sentences(root or stdlib_dir())
    picked = np.random.default_rng(seed).choice(len(pool), min(count, len(pool)), replace=False) if pool else []
    return [pool[i] for i in sorted(picked)]
