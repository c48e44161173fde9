"""How each first stage's recall, latency and build time grow with the rows, on prefixes of a real corpus.

    python -m densehybrid.bench.scale.growth INDEX --scratch DIR --queries NAME=FILE[:N] [--queries ...] [--reuse]
        [--sizes 100000 200000 400000 0] [--max-margin M] [--out growth.json] [--plot growth.png]

INDEX is a built index of the corpus (its vectors and texts are read, never written; its own encoder encodes
every query). For each size (the first N rows; 0: all of them) the rows are written as their own
``vectors.faiss`` in ``DIR/<size>``, and ``--ann pqscan`` and ``--ann hnsw`` are built and calibrated there as
``index build`` builds them (``calibrate.write_calibrated``, every core, the build's own calibration queries
cut from those N rows; ``--reuse`` measures what an earlier run built there instead). Then every ``--queries`` set (queries no build saw) is searched by

- ``flat``: the exact scan of the N rows (Faiss over the stored rows, as the flat first stage serves them);
- ``pqscan``: the codes at the margin the build chose, one scan thread; ``pqscan-2t``: the same codes in two
  row shards, one query spread over two threads (``serve --scan-threads 2``);
- ``hnsw``: the graph at the ``ef_search`` the build chose,

every candidate rescored exactly as a served search does. Per set: recall@10 against the exact scan of the same N
rows and the share of whole top 10s; over all sets: single-query p50/p99, the first stages taking turns in blocks
of queries (so a shared machine's drift hits them alike, while each keeps its own data in the caches as a server
does). One thread a query, except ``pqscan-2t``.

``growth_report`` fits each cost's exponent in the rows and projects it (``--project-rows``, ``--project-dim``,
``--project-cores``); the assumptions are written beside the projection.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale import growth_report
from densehybrid.bench.scale.real import encoded_queries
from densehybrid.bench.timing import summarize
from densehybrid.index.building import calibrate, calibration, calibration_queries
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.engines import faiss_engine, pqscan_engine
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.engines.pqscan_engine import PQScanConfig
from densehybrid.index.served.loading import load_index
from densehybrid.index.served.stated_recall import recall_at
from densehybrid.index.storage.vectors import VECTORS, open_vectors, write_vectors

log = logging.getLogger(__name__)

K = calibration.K
BUILT = {"pqscan": PQScanConfig(), "hnsw": HNSWConfig()}
BLOCK = 65_536
RECORD = "record.json"
TURN = 25  # queries a store answers in a row while the stores take turns


def prefix_rows(index_dir: Path, values: np.ndarray, size: int, rows_dir: Path) -> np.ndarray:
    """The first ``size`` rows as their own ``vectors.faiss`` in ``rows_dir`` (a build's exact scans read it),
    beside the index's texts (row r's text is row r's, so a prefix keeps them) -> the rows, memory-mapped."""
    rows_dir.mkdir(parents=True, exist_ok=True)
    path = rows_dir / VECTORS
    if path.is_symlink() or path.exists():
        path.unlink()
    if size == len(values):
        path.symlink_to((index_dir / VECTORS).resolve())
    else:
        parts = (np.asarray(values[s:min(s + BLOCK, size)]) for s in range(0, size, BLOCK))
        write_vectors(path, parts, count=size, dim=values.shape[1], dtype=str(values.dtype))
    docs = rows_dir / "docs.sqlite"
    if not docs.exists():
        docs.symlink_to((index_dir / "docs.sqlite").resolve())
    return open_vectors(path, count=size, dim=values.shape[1], dtype=str(values.dtype))[1]


def built(name: str, rows: np.ndarray, rows_dir: Path, queries) -> tuple[Path, dict]:
    """``name``'s first stage written and calibrated as a build does it, in ``rows_dir/name`` -> (that folder, its
    record with ``build_s`` (writing the first stage) apart from ``calibration_s`` (measuring its breadths)).
    The record is kept there as ``record.json``: a later run with ``queries`` None measures that build again."""
    staged = rows_dir / name
    if queries is None:
        return staged, json.loads((staged / RECORD).read_text())
    staged.mkdir(exist_ok=True)
    for shared in ("docs.sqlite", VECTORS):
        if not (staged / shared).exists():
            (staged / shared).symlink_to((rows_dir / shared).resolve())
    started = time.perf_counter()
    with faiss_engine.omp_threads(os.cpu_count() or 1):
        record = calibrate.write_calibrated(rows, staged, BUILT[name], queries, calibration.DEFAULT_TARGET)
    measuring = record["calibration"]["seconds"]
    record["build_s"] = round(time.perf_counter() - started - measuring, 1)
    record["calibration_s"] = round(measuring, 1)
    record["load_average_built"] = [round(x, 2) for x in os.getloadavg()]
    (staged / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return staged, record


def stores_of(rows: np.ndarray, staged: dict[str, Path], records: dict[str, dict]) -> dict[str, object]:
    """The served stores measured at one size: the exact scan, pqscan on one and on two threads, the graph."""
    count, dim = rows.shape
    pqscan_dir, pqscan = staged["pqscan"], records["pqscan"]
    config = PQScanConfig.from_dict(pqscan)
    flat = calibrate.flat_of(pqscan_dir, rows)
    two = pqscan_engine.code_scan(pqscan_engine.read_codes(pqscan_dir / pqscan_engine.ANN_FILE, count, dim, config), 2)
    return {"flat": faiss_engine.FaissStore(flat, rows, None, ()),
            "pqscan": calibrate.store_of(pqscan_dir, pqscan, rows),
            "pqscan-2t": pqscan_engine.PQScanStore(two, rows, None, (), config.rescore, config.margin, flat),
            "hnsw": calibrate.store_of(staged["hnsw"], records["hnsw"], rows)}


def measure(stores: dict[str, object], sets: dict[str, np.ndarray], exact: dict[str, np.ndarray]) -> dict:
    """Per store: recall@10 and whole top 10s per set, single-query p50/p99 over every set.

    The stores take turns in blocks of ``TURN`` queries, each block started by one untimed query: a server
    holds one first stage, whose codes or graph stay in the caches, while the exact scan read between two
    of its queries here would evict them; the turns keep a shared machine's drift from favouring one."""
    every = np.concatenate(list(sets.values()))
    found = {name: [None] * len(every) for name in stores}
    samples = {name: [] for name in stores}
    faiss_engine.faiss.omp_set_num_threads(1)  # searched as served: one thread a query
    for start in range(0, len(every), TURN):
        for name, store in stores.items():
            store.inner_product(every[start][None], K)
            for i in range(start, min(start + TURN, len(every))):
                began = time.perf_counter()
                found[name][i] = store.inner_product(every[i][None], K)[1][0]
                samples[name].append((time.perf_counter() - began) * 1000.0)
    result = {}
    for name in stores:
        timing, per_set, first = summarize(samples[name]), {}, 0
        for set_name, xq in sets.items():
            recalls = calibration.recall_at_k(np.array(found[name][first:first + len(xq)]), exact[set_name])
            per_set[set_name] = {"recall_at_10": round(float(recalls.mean()), 4),
                                 "exact_top10": round(float((recalls == 1.0).mean()), 4)}
            first += len(xq)
        result[name] = {"sets": per_set, "p50_ms": round(timing.p50, 3), "p99_ms": round(timing.p99, 3)}
    return result


def one_size(index_dir: Path, values: np.ndarray, size: int, scratch: Path, encoder, sets, reuse: bool) -> dict:
    rows_dir = scratch / str(size)
    if reuse:  # the rows and first stages an earlier run built: measured again, not rebuilt
        rows = open_vectors(rows_dir / VECTORS, count=size, dim=values.shape[1], dtype=str(values.dtype))[1]
        queries = None
    else:
        rows = prefix_rows(index_dir, values, size, rows_dir)
        queries = calibration_queries.queries_for(encoder, rows_dir, rows)
    exact = {name: calibration.exact_top(xq, rows, np.full(len(xq), -1)) for name, xq in sets.items()}
    staged, records = {}, {}
    for name in BUILT:
        staged[name], records[name] = built(name, rows, rows_dir, queries)
    measured = measure(stores_of(rows, staged, records), sets, exact)
    for name, record in records.items():
        knob = "margin" if name == "pqscan" else "ef_search"
        chosen = {"build_s": record["build_s"], "calibration_s": record["calibration_s"], knob: record[knob],
                  "stated_recall": recall_at(record["calibration"]["curve"], record[knob]),
                  "files_mb": round(sum(p.stat().st_size for p in staged[name].iterdir()
                                        if p.is_file() and not p.is_symlink()) / 1e6, 1)}
        for served in [s for s in measured if s.startswith(name)]:
            measured[served] |= chosen
    load = os.getloadavg()
    log.info("%d rows (load %.1f): %s", size, load[0], json.dumps(
        {n: {k: v for k, v in m.items() if k in ("p50_ms", "sets", "build_s")} for n, m in measured.items()}))
    return {"rows": size, "load_average": [round(x, 2) for x in load], **measured}


def run(index_dir: Path, scratch: Path, query_specs: list[str], sizes: list[int], out: Path | None = None,
        reuse: bool = False) -> dict:
    index = load_index(index_dir)
    encoder = encoder_for_index(index, device="cpu")
    sets = encoded_queries(encoder, query_specs)
    result = {"index": str(index_dir), "dim": int(index.values.shape[1]), "model": index.spec.model_id,
              "queries": {name: len(xq) for name, xq in sets.items()}, "cpus": os.cpu_count(), "sizes": []}
    for size in sizes:
        result["sizes"].append(one_size(index_dir, index.values, size or index.count, scratch, encoder, sets,
                                           reuse))
        if out is not None:  # what is measured so far, should a later size not finish
            out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--scratch", type=Path, required=True, help="where the prefixes and first stages are built")
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 200_000, 400_000, 0])
    parser.add_argument("--reuse", action="store_true", help="measure the first stages an earlier run built in "
                                                                 "--scratch again (on a quieter machine) instead of building")
    parser.add_argument("--max-margin", type=float, help="measure the build's margins up to this one only (the "
                                                             "wide ones rescore most rows: minutes a size)")
    growth_report.add_projection_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("growth.json"))
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.max_margin is not None:
        calibrate.GRIDS["pqscan"] = tuple(m for m in calibrate.GRIDS["pqscan"] if m <= args.max_margin)
    result = run(args.index, args.scratch, args.queries, args.sizes, args.out, args.reuse)
    result["fit"] = growth_report.fit(result)
    result["projection"] = growth_report.project(result, args.project_rows, args.project_dim, args.project_cores)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(growth_report.markdown(result))
    if args.plot:
        growth_report.plot(result, args.plot)


if __name__ == "__main__":
    main()
