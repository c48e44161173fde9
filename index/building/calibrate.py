"""Calibrate a written approximate first stage to a recall target (``index build`` and ``index import``).

The queries: by default a sentence cut from each of a seeded sample of the passages (a passage of one
sentence gives itself), encoded as queries; or the user's own (``--calibration-queries``, a BEIR
queries.jsonl). A query cut from a passage would find that passage first, which no real query does, so
each query's own passage is left out of its exact top 10 and of what the first stage returns. Without
texts or a file (an import without ``--corpus``), a sample of the stored rows serves as queries, and the
manifest says so: passage vectors are not query vectors, so that recall is a rougher guide.

Then :mod:`index.building.calibration` measures each breadth of the first stage's grid on the staged
files, exactly as a served search runs (the same store class, candidates rescored), and the cheapest
breadth that keeps the target becomes the default; the curve goes into the manifest's ``first_stage``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from densehybrid.encoder.base import Encoder
from densehybrid.index.building import calibration
from densehybrid.index.building.fusion_auto import sentences
from densehybrid.index.engines import hnsw_engine, ivf_engine, pqscan_engine
from densehybrid.index.jsonl import read_jsonl
from densehybrid.index.search.params import BREADTH
from densehybrid.index.engines.faiss_engine import search as faiss_search
from densehybrid.index.storage.documents import DOCS, DocTable, Document
from densehybrid.index.storage.vectors import VECTORS, open_vectors

log = logging.getLogger(__name__)

QUERIES = 200
EXACT_TIMED = 20  # queries the exact scan is timed on (a full scan each: at millions of rows, tens of ms)
SENTENCE_WORDS = (4, 30)
_EXACT_CHUNK = 65_536
# the breadths measured, by first stage (capped by each engine's own maximum)
GRIDS = {"hnsw": (16, 32, 64, 128, 256, 512, 1024, 2048),
         # up to 1: the code-score error of unnormalised rows (a DLR's lexical values) is several tenths of |q|
         "pqscan": (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0),
         "ivf": tuple(2 ** i for i in range(11))}


@dataclass(frozen=True)
class CalibrationQueries:
    vectors: np.ndarray  # (Q, dim) float32
    own_rows: np.ndarray  # (Q,) the row each was cut from, -1 for none
    source: str


def cut_sentence(doc: Document, rng: np.random.Generator) -> str | None:
    """A seeded sentence of the passage's text of 4 to 30 words (its whole text when it is one such
    sentence); None when it has none."""
    usable = [s for s in sentences(doc.text) if SENTENCE_WORDS[0] <= len(s.split()) <= SENTENCE_WORDS[1]]
    return usable[int(rng.integers(0, len(usable)))] if usable else None


def from_passages(encoder: Encoder, docs: Sequence[Document], rows: np.ndarray, *, prompt: str = "",
                  seed: int = 0) -> CalibrationQueries:
    """Queries cut from ``docs`` (the passages at ``rows`` of the index, a sample) and encoded."""
    rng = np.random.default_rng(seed)
    cuts = [(row, cut_sentence(doc, rng)) for row, doc in zip(rows, docs)]
    cuts = [(row, text) for row, text in cuts if text][:QUERIES]
    if not cuts:
        raise ValueError("no sampled passage has a sentence of 4 to 30 words to calibrate on")
    xq = encoder.encode([text for _, text in cuts], "query", prompt=prompt).values
    return CalibrationQueries(np.asarray(xq, np.float32), np.array([row for row, _ in cuts], np.int64),
                              f"a sentence cut from each of {len(cuts)} sampled passages")


def from_file(encoder: Encoder, path: Path, *, prompt: str = "") -> CalibrationQueries:
    """The queries of a BEIR queries.jsonl (``_id``, ``text``), the first ``QUERIES`` of them, encoded."""
    texts = [str(row["text"]) for row, _ in zip(read_jsonl(path, required=("text",), what="a query line with text"),
                                                 range(QUERIES))]
    if not texts:
        raise ValueError(f"{path}: holds no query")
    xq = encoder.encode(texts, "query", prompt=prompt).values
    return CalibrationQueries(np.asarray(xq, np.float32), np.full(len(texts), -1, np.int64),
                              f"{len(texts)} queries of {path.name}")


def from_rows(values: np.ndarray, seed: int = 0) -> CalibrationQueries:
    """A seeded sample of the stored rows as queries (each leaving its own row out)."""
    rows = np.sort(np.random.default_rng(seed).choice(len(values), min(QUERIES, len(values)), replace=False))
    return CalibrationQueries(np.asarray(values[rows], np.float32), rows,
                              f"{len(rows)} stored rows (no texts or query file: a rough guide)")


def sample_rows(count: int, seed: int = 0, size: int = 2 * QUERIES) -> np.ndarray:
    """Sorted rows of a seeded sample to cut queries from (more than needed: some passages have no sentence)."""
    return np.sort(np.random.default_rng(seed).choice(count, min(size, count), replace=False))


def queries_for(encoder: Encoder | None, staged: Path, values: np.ndarray, *, file: Path | None = None,
                prompt: str = "") -> CalibrationQueries:
    """The calibration queries of a staged index: ``file``'s, or cut from a sample of its passages' texts, or
    (without an encoder, or texts to cut from) a sample of its rows."""
    if encoder is not None and file is not None:
        return from_file(encoder, file, prompt=prompt)
    rows = sample_rows(len(values))
    if encoder is not None and (staged / DOCS).is_file():
        table = DocTable(staged / DOCS)
        try:
            docs = table.at_rows(rows)
        finally:
            table.close()
        try:
            return from_passages(encoder, docs, rows, prompt=prompt)
        except ValueError:  # no text to cut a query from (ids alone, or passages of a word or two)
            pass
    return from_rows(values)


def exact_top(xq: np.ndarray, values: np.ndarray, own_rows: np.ndarray, k: int = calibration.K) -> np.ndarray:
    """(Q, k) rows of each query's exact top ``k`` inner products over ``values`` (read in chunks), its own row
    left out."""
    best_scores = np.full((len(xq), 0), -np.inf, np.float32)
    best_rows = np.full((len(xq), 0), -1, np.int64)
    for s in range(0, len(values), _EXACT_CHUNK):
        chunk = np.asarray(values[s:s + _EXACT_CHUNK], dtype=np.float32)
        scores = xq @ chunk.T
        rows = np.broadcast_to(np.arange(s, s + len(chunk)), scores.shape)
        scores = np.where(rows == own_rows[:, None], -np.inf, scores)
        merged_scores = np.concatenate([best_scores, scores], 1)
        merged_rows = np.concatenate([best_rows, rows], 1)
        top = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
        best_scores, best_rows = np.take_along_axis(merged_scores, top, 1), np.take_along_axis(merged_rows, top, 1)
    return best_rows


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
    """The served store of the staged first stage ``record`` (a graph, lists or codes beside ``values``), with
    the flat index of the staged ``vectors.faiss`` for its exact scans when there is one."""
    count, dim = values.shape
    kind = record["type"]
    flat = flat_of(staged, values)
    if kind == "hnsw":
        return hnsw_engine.HnswStore(hnsw_engine.read_ann(staged / hnsw_engine.ANN_FILE, count, dim), values, None, (),
                                     record["ef_search"], flat=flat)
    if kind == "ivf":
        config = ivf_engine.IVFConfig.from_dict(record)
        return ivf_engine.IvfStore(ivf_engine.read_ivf(staged / ivf_engine.ANN_FILE, count, dim, config), values,
                                   None, (), config.nprobe, flat=flat)
    config = pqscan_engine.PQScanConfig.from_dict(record)
    return pqscan_engine.PQScanStore(pqscan_engine.read_pqscan(staged / pqscan_engine.ANN_FILE, count, dim, config),
                                     values, None, (), config.rescore, config.margin, flat=flat)


def flat_of(staged: Path, values: np.ndarray):
    """The flat Faiss index of ``staged``'s ``vectors.faiss`` (``values``' file), None when it has none."""
    if not (staged / VECTORS).exists():
        return None
    return open_vectors(staged / VECTORS, count=len(values), dim=values.shape[1], dtype=str(values.dtype))[0]


def grid(record: dict, count: int) -> list[float]:
    """The breadths measured for ``record``'s first stage over ``count`` rows."""
    kind = record["type"]
    cap = {"hnsw": hnsw_engine.MAX_EF_SEARCH, "pqscan": pqscan_engine.MAX_MARGIN,
           "ivf": int(record.get("nlist", 1))}[kind]
    return sorted({min(b, cap) for b in GRIDS[kind]})


def calibrate(staged: Path, record: dict, values: np.ndarray, queries: CalibrationQueries,
              target: float | None) -> dict:
    """``record`` (the staged first stage's manifest entry) with its curve measured on ``queries`` and, for a
    ``target``, the default breadth set to the cheapest that keeps it (else the breadth given stays)."""
    started = time.perf_counter()
    knob = BREADTH[record["type"]]
    store = store_of(staged, record, values)
    exact = exact_top(queries.vectors, values, queries.own_rows)
    own = queries.own_rows

    def search(number: int, breadth: int) -> np.ndarray:
        rows = store.inner_product(queries.vectors[number:number + 1], calibration.K + 1, **{knob: breadth})[1][0]
        return rows[rows != own[number]][:calibration.K]

    points = calibration.measure(search, len(queries.vectors), exact, grid(record, len(values)))
    chosen = calibration.choose(points, target) if target else None
    default = chosen.point.breadth if chosen else record[knob]
    exact_ms = exact_scan_ms(staged, values, queries.vectors[:EXACT_TIMED])
    entry = {"knob": knob, "target_recall": target, "reached": None if chosen is None else chosen.reached,
             "queries": len(queries.vectors), "source": queries.source, "exact_p50_ms": round(exact_ms, 3),
             "seconds": round(time.perf_counter() - started, 2), "curve": [p.to_dict() for p in points]}
    default_ms = next(p.p50_ms for p in points if p.breadth == default) if chosen else None
    if default_ms is not None and default_ms >= exact_ms:
        log.warning("%s at %s %g takes %.2f ms a query, the exact scan of these %d rows %.2f ms: --ann flat "
                    "serves them exactly and as fast", record["type"], knob, default, default_ms, len(values), exact_ms)
    if chosen is not None and not chosen.reached:
        log.warning("%s: no %s of the grid keeps recall@10 %.3f on the calibration queries; the default is %g, "
                    "the best measured (%.3f)", record["type"], knob, target, default, chosen.point.recall)
    elif chosen is not None:
        log.info("%s: %s %g keeps recall@10 %.3f >= %.3f (p50 %.2f ms) on %d calibration queries (%.1f s)",
                 record["type"], knob, default, chosen.point.recall, target, chosen.point.p50_ms,
                 len(queries.vectors), entry["seconds"])
    return {**record, knob: default, "calibration": entry}
