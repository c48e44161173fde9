"""Calibrate an approximate first stage to a recall target while it is built (``index build`` and ``index import``).

The queries come in groups, and the recall stated is the lowest group's:

- ``in_domain``: a sentence cut from each of a seeded sample of the passages (a passage of one sentence gives
  itself), encoded as queries. Such a query lies on its own passage's row, and a graph walk or the probed lists
  that reach that row reach its neighbours too, so the first stage is built *without* those rows while it is
  measured (:mod:`index.building.held_out`) and they are added afterwards: the queries are then as unseen as a
  user's. Their own rows are left out of the exact top 10 as well.
- ``other_domain``: sentences of Python's own docstrings (:mod:`index.building.other_domain`), text the corpus
  did not come from. A graph or inverted lists lose most on such queries; the breadth chosen keeps the target
  for both groups, so one figure holds for queries like the corpus and unlike it. Of a larger seeded pool, the
  sentences farthest from the corpus (the lowest 10th-best exact score) are kept.
- ``file``: the user's own queries (``--calibration-queries``, a BEIR queries.jsonl) replace both groups.
- ``rows``: without an encoder (an import without ``--corpus``), a sample of the stored rows, held out the same
  way; passage vectors are not query vectors, so that recall is a rougher guide, and the manifest says so.

Then :mod:`index.building.calibration` measures each breadth of the first stage's grid exactly as a served search
runs (the same store class, candidates rescored), and the cheapest breadth at which every group keeps the target
becomes the default; the curve, the groups, the rows measured and the date go into the manifest's
``first_stage.calibration``.
"""

from __future__ import annotations

import datetime
import logging
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from densehybrid.encoder.base import Encoder
from densehybrid.index.building import calibration, held_out, other_domain
from densehybrid.index.building.first_stage import AnnConfig
from densehybrid.index.building.fusion_auto import sentences
from densehybrid.index.engines import hnsw_engine, ivf_engine, pqscan_engine
from densehybrid.index.jsonl import read_jsonl
from densehybrid.index.search.params import BREADTH
from densehybrid.index.engines.faiss_engine import search as faiss_search
from densehybrid.index.storage.documents import DOCS, DocTable, Document
from densehybrid.index.storage.vectors import VECTORS, open_vectors

log = logging.getLogger(__name__)

QUERIES = 200  # a group's
# the in-domain queries' rows are held out of the first stage while it is measured: at most this share of them
HELD_OUT_SHARE = 0.1
EXACT_TIMED = 20  # queries the exact scan is timed on (a full scan each: at millions of rows, tens of ms)
SENTENCE_WORDS = (4, 30)
# the other-domain group keeps this share of a larger pool of docstring sentences: those farthest from the corpus
OTHER_DOMAIN_SHARE = 1.0
_EXACT_CHUNK = 65_536
# the breadths measured, by first stage (capped by each engine's own maximum)
GRIDS = {"hnsw": (16, 32, 64, 128, 256, 512, 1024, 2048),
         "pqscan": (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15),
         "ivf": tuple(2 ** i for i in range(11))}


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


def exact_search(xq: np.ndarray, values: np.ndarray, own_rows: np.ndarray, k: int = calibration.K,
                 skip: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) scores and rows of each query's exact top ``k`` inner products over ``values`` (read in chunks),
    its own row and the rows ``skip`` (sorted: those held out of the first stage measured) left out."""
    best_scores = np.full((len(xq), 0), -np.inf, np.float32)
    best_rows = np.full((len(xq), 0), -1, np.int64)
    for s in range(0, len(values), _EXACT_CHUNK):
        chunk = np.asarray(values[s:s + _EXACT_CHUNK], dtype=np.float32)
        scores = xq @ chunk.T
        rows = np.broadcast_to(np.arange(s, s + len(chunk)), scores.shape)
        scores = np.where(rows == own_rows[:, None], -np.inf, scores)
        if skip is not None and len(skip):
            scores[:, np.isin(rows[0], skip)] = -np.inf
        if scores.shape[1] > k:  # each query's k best of the chunk, unordered (a full sort costs 50 times more)
            part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            scores, rows = np.take_along_axis(scores, part, 1), np.take_along_axis(rows, part, 1)
        merged_scores = np.concatenate([best_scores, scores], 1)
        merged_rows = np.concatenate([best_rows, rows], 1)
        # ties broken by the lower row, as a stable sort of the rows in order breaks them
        top = np.lexsort((merged_rows, -merged_scores), axis=1)[:, :k]
        best_scores, best_rows = np.take_along_axis(merged_scores, top, 1), np.take_along_axis(merged_rows, top, 1)
    return best_scores, best_rows


def exact_top(xq: np.ndarray, values: np.ndarray, own_rows: np.ndarray, k: int = calibration.K,
              skip: np.ndarray | None = None) -> np.ndarray:
    """(Q, k) rows of each query's exact top ``k`` inner products over ``values``, its own row and the rows
    ``skip`` left out."""
    return exact_search(xq, values, own_rows, k, skip)[1]


def exact_scan_ms(staged: Path, values: np.ndarray, xq: np.ndarray) -> float:
    """The median single-query exact scan of the staged rows, as the flat first stage runs it (Faiss over the
    memory-mapped ``vectors.faiss``): the latency an approximate first stage has to beat."""
    scan, _ = open_vectors(staged / VECTORS, count=len(values), dim=values.shape[1], dtype=str(values.dtype))
    samples = []
    for q in xq:
        started = time.perf_counter()
        faiss_search(scan, q[None], calibration.K)
        samples.append((time.perf_counter() - started) * 1000.0)
    return float(np.median(samples))


def store_of(staged: Path, record: dict, values: np.ndarray):
    """The served store of the staged first stage ``record`` (a graph, lists or codes beside ``values``)."""
    count, dim = values.shape
    kind = record["type"]
    if kind == "hnsw":
        graph = hnsw_engine.read_ann(staged / hnsw_engine.ANN_FILE, record.get("nodes", count), dim)
        nodes = np.load(staged / record["node_rows"]) if record.get("node_rows") else None
        return hnsw_engine.HnswStore(graph, values, None, (), record["ef_search"], nodes)
    if kind == "ivf":
        config = ivf_engine.IVFConfig.from_dict(record)
        return ivf_engine.IvfStore(ivf_engine.read_ivf(staged / ivf_engine.ANN_FILE, count, dim, config), values,
                                   None, (), config.nprobe)
    config = pqscan_engine.PQScanConfig.from_dict(record)
    return pqscan_engine.PQScanStore(pqscan_engine.read_pqscan(staged / pqscan_engine.ANN_FILE, count, dim, config),
                                     values, None, (), config.rescore, config.margin)


def grid(record: dict, count: int) -> list[float]:
    """The breadths measured for ``record``'s first stage over ``count`` rows."""
    kind = record["type"]
    cap = {"hnsw": hnsw_engine.MAX_EF_SEARCH, "pqscan": pqscan_engine.MAX_MARGIN,
           "ivf": int(record.get("nlist", 1))}[kind]
    return sorted({min(b, cap) for b in GRIDS[kind]})


def write_calibrated(values: np.ndarray, staged: Path, config: AnnConfig, queries: CalibrationQueries,
                     target: float | None) -> dict:
    """Build ``config``'s first stage of ``values`` (N, dim) without the rows the ``queries`` were cut from,
    calibrate it (:func:`calibrate`), add those rows and write it into ``staged`` -> the manifest's
    ``first_stage`` record, with its calibration."""
    started = time.perf_counter()
    built = held_out.build(values, staged, config, queries.held_rows)
    log.info("%s first stage built without the %d rows the calibration holds out (%.1f s)", built.record["type"],
             len(queries.held_rows), time.perf_counter() - started)
    calibrated = calibrate(built.store, built.record, values, queries, target, staged, queries.held_rows)
    knob = BREADTH[calibrated["type"]]
    return {**built.finish(), knob: calibrated[knob], "calibration": calibrated["calibration"]}


def calibrate(store, record: dict, values: np.ndarray, queries: CalibrationQueries, target: float | None,
              staged: Path, held: np.ndarray | None = None) -> dict:
    """``record`` (the first stage's manifest entry) with its curve measured on ``queries`` through ``store`` (a
    served store of that first stage, without the rows ``held``, which the exact top 10s leave out too; each
    query's own row is left out of both) and, for a ``target``, the default breadth set to the cheapest at which
    every group keeps it (else the breadth given stays)."""
    started = time.perf_counter()
    knob = BREADTH[record["type"]]
    xq, own = queries.vectors, queries.own_rows
    exact = exact_top(xq, values, own, skip=held)

    def search(number: int, breadth: int) -> np.ndarray:
        rows = store.inner_product(xq[number:number + 1], calibration.K + 1, **{knob: breadth})[1][0]
        return (rows[rows != own[number]] if own[number] >= 0 else rows)[:calibration.K]

    points = calibration.measure(search, len(xq), exact, grid(record, len(values)), queries.numbers())
    chosen = calibration.choose(points, target) if target else None
    default = chosen.point.breadth if chosen else record[knob]
    exact_ms = exact_scan_ms(staged, values, xq[:EXACT_TIMED])
    entry = {"knob": knob, "target_recall": target, "reached": None if chosen is None else chosen.reached,
             "queries": len(xq), "source": queries.source, "groups": [g.record() for g in queries.groups],
             "held_out_rows": len(queries.held_rows), "measured_rows": len(values),
             "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "stale": False, "exact_p50_ms": round(exact_ms, 3),
             "seconds": round(time.perf_counter() - started, 2), "curve": [p.to_dict() for p in points]}
    _log_choice(record["type"], knob, default, chosen, points, target, exact_ms, len(values), entry)
    return {**record, knob: default, "calibration": entry}


def _log_choice(kind, knob, default, chosen, points, target, exact_ms, rows, entry) -> None:
    default_ms = next(p.p50_ms for p in points if p.breadth == default) if chosen else None
    if default_ms is not None and default_ms >= exact_ms:
        log.warning("%s at %s %g takes %.2f ms a query, the exact scan of these %d rows %.2f ms: --ann flat "
                    "serves them exactly and as fast", kind, knob, default, default_ms, rows, exact_ms)
    if chosen is not None and not chosen.reached:
        log.warning("%s: no %s of the grid keeps recall@10 %.3f for every group of calibration queries; the "
                    "default is %g, the best measured (%.3f)", kind, knob, target, default, chosen.point.recall)
    elif chosen is not None:
        log.info("%s: %s %g keeps recall@10 %.3f >= %.3f (p50 %.2f ms) for every group of %d calibration queries "
                 "(%.1f s)", kind, knob, default, chosen.point.recall, target, chosen.point.p50_ms, entry["queries"],
                 entry["seconds"])
