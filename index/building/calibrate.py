"""Calibrate an approximate first stage to a recall target while it is built (``index build`` and ``index import``).

The first stage is built without the rows the in-domain calibration queries were cut from
(:mod:`index.building.held_out`), so that they are as unseen as a user's, and measured on the groups of
:mod:`index.building.calibration_queries` (from the corpus, from another domain, or the user's own). Then
:mod:`index.building.calibration` measures each breadth of the first stage's grid exactly as a served search
runs (the same store class, candidates rescored), the cheapest breadth at which every group keeps the target
becomes the default, and the held-out rows are added. The curve (each group's recall, the lowest stated), the
groups, the rows measured and the date go into the manifest's ``first_stage.calibration``.
"""

from __future__ import annotations

import datetime
import logging
import time
from pathlib import Path

import numpy as np

from densehybrid.index.building import calibration, held_out
from densehybrid.index.building.calibration import exact_top
from densehybrid.index.building.calibration_queries import CalibrationQueries
from densehybrid.index.building.first_stage import AnnConfig
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.search.params import BREADTH
from densehybrid.index.engines.faiss_engine import search as faiss_search
from densehybrid.index.storage.vectors import VECTORS, open_vectors

log = logging.getLogger(__name__)

EXACT_TIMED = 20  # queries the exact scan is timed on (a full scan each: at millions of rows, tens of ms)
# the breadths measured, by first stage (capped by each engine's own maximum)
GRIDS = {"hnsw": (16, 32, 64, 128, 256, 512, 1024, 2048),
         # up to 1: the code-score error of unnormalised rows (a DLR's lexical values) is several tenths of |q|
         "pqscan": (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0)}


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
    """The served store of the staged first stage ``record`` (a graph or codes beside ``values``), with
    the flat index of the staged ``vectors.faiss`` for its exact scans when there is one."""
    count, dim = values.shape
    kind = record["type"]
    flat = flat_of(staged, values)
    if kind == "hnsw":
        graph = hnsw_engine.read_ann(staged / hnsw_engine.ANN_FILE, record.get("nodes", count), dim)
        nodes = np.load(staged / record["node_rows"]) if record.get("node_rows") else None
        return hnsw_engine.HnswStore(graph, values, None, (), record["ef_search"], nodes, flat=flat)
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
    cap = {"hnsw": hnsw_engine.MAX_EF_SEARCH, "pqscan": pqscan_engine.MAX_MARGIN}[kind]
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
