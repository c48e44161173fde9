"""The queries an approximate first stage is calibrated on, in groups; the recall stated is the lowest group's.

- ``in_domain``: a sentence cut from each of a seeded sample of the passages (a passage of one sentence gives
  itself), encoded as queries. Such a query lies on its own passage's row, and a graph walk or the probed lists
  that reach that row reach its neighbours too, so the first stage is built *without* those rows while it is
  measured (``index.building.held_out``) and they are added afterwards: the queries are then as unseen as a
  user's. Their rows are left out of the exact top 10s as well.
- ``other_domain``: sentences of Python's own docstrings (:mod:`index.building.other_domain`), text the corpus
  did not come from. A graph or inverted lists lose most on such queries; the breadth chosen keeps the target
  for both groups, so one figure holds for queries like the corpus and unlike it. Of a larger seeded pool, the
  sentences farthest from the corpus (the lowest 10th-best exact score) are kept.
- ``file``: the user's own queries (``--calibration-queries``, a BEIR queries.jsonl) replace both groups.
- ``rows``: without an encoder (an import without ``--corpus``), a sample of the stored rows, held out the same
  way; passage vectors are not query vectors, so that recall is a rougher guide, and the manifest says so.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from densehybrid.encoder.base import Encoder
from densehybrid.index.building import other_domain
from densehybrid.index.building.calibration import exact_search
from densehybrid.index.building.pseudo_queries import sentences
from densehybrid.index.jsonl import read_jsonl
from densehybrid.index.storage.documents import DOCS, DocTable, Document

QUERIES = 200  # a group's
# the in-domain queries' rows are held out of the first stage while it is measured: at most this share of them
HELD_OUT_SHARE = 0.1
SENTENCE_WORDS = (4, 30)
# the other-domain group keeps this share of a larger pool of docstring sentences: those farthest from the corpus
# (picked on tuning sets at 827k package summaries, of 1 down to 1/32: the farther, the harder for a graph or
# inverted lists, and MS MARCO's sentences harder still; docs/scale.md)
OTHER_DOMAIN_SHARE = 1 / 32


@dataclass(frozen=True)
class Group:
    """Calibration queries of one kind: ``vectors`` (Q, dim) float32, ``own_rows`` (Q,) the row each was cut
    from (held out of the first stage while it is measured), -1 for none."""

    name: str
    vectors: np.ndarray
    own_rows: np.ndarray
    source: str

    def record(self) -> dict:
        return {"name": self.name, "source": self.source, "queries": len(self.vectors)}


@dataclass(frozen=True)
class CalibrationQueries:
    groups: tuple[Group, ...]

    @property
    def vectors(self) -> np.ndarray:
        return np.concatenate([g.vectors for g in self.groups])

    @property
    def own_rows(self) -> np.ndarray:
        return np.concatenate([g.own_rows for g in self.groups])

    @property
    def held_rows(self) -> np.ndarray:
        """The sorted rows the first stage leaves out while it is measured."""
        rows = self.own_rows
        return np.unique(rows[rows >= 0])

    @property
    def source(self) -> str:
        return "; ".join(f"{g.name}: {g.source}" for g in self.groups)

    def numbers(self) -> dict[str, np.ndarray]:
        """Each group's name -> the numbers of its queries among :attr:`vectors`."""
        bounds = np.cumsum([0] + [len(g.vectors) for g in self.groups])
        return {g.name: np.arange(a, b) for g, a, b in zip(self.groups, bounds[:-1], bounds[1:])}


def cut_sentence(doc: Document, rng: np.random.Generator) -> str | None:
    """A seeded sentence of the passage's text of 4 to 30 words (its whole text when it is one such
    sentence); None when it has none."""
    usable = [s for s in sentences(doc.text) if SENTENCE_WORDS[0] <= len(s.split()) <= SENTENCE_WORDS[1]]
    return usable[int(rng.integers(0, len(usable)))] if usable else None


def held_out_count(rows: int) -> int:
    """The in-domain queries of an index of ``rows`` rows: ``QUERIES``, fewer than ``HELD_OUT_SHARE`` of the rows."""
    return max(1, min(QUERIES, int(rows * HELD_OUT_SHARE)))


def from_passages(encoder: Encoder, docs: Sequence[Document], rows: np.ndarray, *, prompt: str = "",
                  seed: int = 0, count: int | None = None) -> Group:
    """Queries cut from ``docs`` (the passages at ``rows`` of the index, a sample) and encoded, ``count`` of them
    (default ``QUERIES``)."""
    rng = np.random.default_rng(seed)
    cuts = [(row, cut_sentence(doc, rng)) for row, doc in zip(rows, docs)]
    cuts = [(row, text) for row, text in cuts if text][:count or QUERIES]
    if not cuts:
        raise ValueError("no sampled passage has a sentence of 4 to 30 words to calibrate on")
    xq = encoder.encode([text for _, text in cuts], "query", prompt=prompt).values
    return Group("in_domain", np.asarray(xq, np.float32), np.array([row for row, _ in cuts], np.int64),
                 f"a sentence cut from each of {len(cuts)} sampled passages, their rows held out")


def from_stdlib(encoder: Encoder, values: np.ndarray, *, prompt: str = "", seed: int = 0,
                share: float = OTHER_DOMAIN_SHARE) -> Group | None:
    """Docstring sentences of Python's standard library, encoded: of ``QUERIES / share`` sampled ones, the
    ``QUERIES`` farthest from ``values`` (the lowest 10th-best exact score); None when there are none."""
    texts = other_domain.stdlib_sentences(int(round(QUERIES / share)), seed)
    if not texts:
        return None
    xq = np.asarray(encoder.encode(texts, "query", prompt=prompt).values, np.float32)
    if len(xq) > QUERIES:
        scores, _ = exact_search(xq, values, np.full(len(xq), -1))
        xq = xq[np.sort(np.argsort(scores[:, -1], kind="stable")[:QUERIES])]
    version = ".".join(platform.python_version_tuple()[:2])
    return Group("other_domain", xq, np.full(len(xq), -1, np.int64),
                 f"{len(xq)} docstring sentences of Python {version}'s standard library"
                 + (f", the farthest from the corpus of {len(texts)}" if len(texts) > len(xq) else ""))


def from_file(encoder: Encoder, path: Path, *, prompt: str = "") -> Group:
    """The queries of a BEIR queries.jsonl (``_id``, ``text``), the first ``QUERIES`` of them, encoded."""
    texts = [str(row["text"]) for row, _ in zip(read_jsonl(path, required=("text",), what="a query line with text"),
                                                 range(QUERIES))]
    if not texts:
        raise ValueError(f"{path}: holds no query")
    xq = encoder.encode(texts, "query", prompt=prompt).values
    return Group("file", np.asarray(xq, np.float32), np.full(len(texts), -1, np.int64),
                 f"{len(texts)} queries of {path.name}")


def from_rows(values: np.ndarray, seed: int = 0) -> Group:
    """A seeded sample of the stored rows as queries (each held out, and left out of its own top 10)."""
    rows = np.sort(np.random.default_rng(seed).choice(len(values), held_out_count(len(values)), replace=False))
    return Group("rows", np.asarray(values[rows], np.float32), rows,
                 f"{len(rows)} stored rows, held out (no texts or query file: a rough guide)")


def sample_rows(count: int, seed: int = 0, size: int = 2 * QUERIES) -> np.ndarray:
    """Sorted rows of a seeded sample to cut queries from (more than needed: some passages have no sentence)."""
    return np.sort(np.random.default_rng(seed).choice(count, min(size, count), replace=False))


def in_domain(encoder: Encoder | None, staged: Path, values: np.ndarray, prompt: str = "") -> Group:
    """Sentences cut from a sample of the staged passages' texts or (without an encoder, or texts to cut from) a
    sample of its rows."""
    rows = sample_rows(len(values))
    if encoder is not None and (staged / DOCS).is_file():
        table = DocTable(staged / DOCS)
        try:
            docs = table.at_rows(rows)
        finally:
            table.close()
        try:
            return from_passages(encoder, docs, rows, prompt=prompt, count=held_out_count(len(values)))
        except ValueError:  # no text to cut a query from (ids alone, or passages of a word or two)
            pass
    return from_rows(values)


def queries_for(encoder: Encoder | None, staged: Path, values: np.ndarray, *, file: Path | None = None,
                prompt: str = "") -> CalibrationQueries:
    """The calibration queries of a staged index: ``file``'s, or the in-domain group (:func:`in_domain`) and,
    with an encoder, the other-domain one (:func:`from_stdlib`)."""
    if encoder is not None and file is not None:
        return CalibrationQueries((from_file(encoder, file, prompt=prompt),))
    groups = (in_domain(encoder, staged, values, prompt),)
    other = from_stdlib(encoder, values, prompt=prompt) if encoder is not None else None
    return CalibrationQueries(groups + ((other,) if other is not None else ()))
