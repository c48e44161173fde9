"""The HNSW graph of ``--ann hnsw`` (Faiss) beside maintained graph libraries, on a sample of a real index's rows.

    python -m densehybrid.bench.peers.graphs INDEX --queries NAME=FILE[:N] [--queries ...]
        [--rows 200000] [--added 20000] [--peers hnswlib usearch] [--out graphs.json]

A seeded sample of ``--rows`` stored rows is the base and ``--added`` more are the rows a fold adds. Each
graph is built over the base on two threads (Faiss as ``index build`` writes it: M 32, 8-bit codes; the
peers M 16, ef_construction 128) and measured with one thread: bytes a row in memory, recall@10 per query
group against the exact top 10 and p50 at ``ef`` 256 and 1024, unfiltered and under seeded random filters
keeping 50 % and 20 % of the rows, then the time to add the rows a fold adds. Every graph's candidates
are rescored by the same exact code. A filter is the engine's own where it has one: Faiss's bitmap
selector with the walk widened by the inverse of the kept fraction (as the served search does), hnswlib's
per-node callable; usearch's Python API has none, so it fetches that many more and drops the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale.real import read_queries
from densehybrid.index.building.calibration import exact_top
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.building.first_stage import write_approximate
from densehybrid.index.engines import faiss_engine, hnsw_engine
from densehybrid.index.engines.hnsw_engine import HNSWConfig, rescore
from densehybrid.index.search.filters.rows import Selection
from densehybrid.index.served.loading import load_index

K = 10
BREADTHS = (256, 1024)
KEPT = {"none": 1.0, "50%": 0.5, "20%": 0.2}
PEER_SETTINGS = {"m": 16, "ef_construction": 128}
MAX_FETCHED = 4096


def _measure(search, groups: dict[str, np.ndarray], exact: dict[str, np.ndarray]) -> dict:
    """Recall@10 per group and single-query p50 of ``search(q (1, dim)) -> rows``."""
    out, samples = {}, []
    for name, xq in groups.items():
        found = []
        for q in xq:
            started = time.perf_counter()
            found.append(search(q[None]))
            samples.append((time.perf_counter() - started) * 1000.0)
        out[name] = round(float(np.mean([len(set(f[f >= 0]) & set(t)) / K for f, t in zip(found, exact[name])])), 4)
    return out | {"p50_ms": round(float(np.median(samples)), 3)}


class FaissGraph:
    """Ours, as ``index build --ann hnsw`` writes and the served search walks it."""

    name = "faiss (ours: M 32, sq8)"

    def build(self, base: np.ndarray) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="densehybrid-graphs-"))
        with faiss_engine.omp_threads(2):
            write_approximate(base.astype(np.float16), self.directory, HNSWConfig())
        self.path = self.directory / hnsw_engine.ANN_FILE
        self.base = base
        self.store = hnsw_engine.HnswStore(hnsw_engine.read_ann(self.path, len(base), base.shape[1]), base, None, (),
                                           BREADTHS[0])

    def bytes_per_row(self) -> float:
        return self.path.stat().st_size / len(self.base)

    def search(self, q: np.ndarray, ef: int, kept: np.ndarray | None) -> np.ndarray:
        selection = None if kept is None else Selection(count=int(kept.sum()), total=len(kept), mask=kept)
        return self.store.inner_product(q, K, selection, ef_search=ef)[1][0]

    def add(self, rows: np.ndarray) -> None:
        graph = faiss_engine.faiss.read_index(str(self.path))
        with faiss_engine.omp_threads(2):
            graph.add(hnsw_engine.graph_rows(rows, HNSWConfig(), graph.d))

    def close(self) -> None:
        for path in self.directory.iterdir():
            path.unlink()
        self.directory.rmdir()


class HnswlibGraph:
    name = "hnswlib (M 16, float32)"

    def build(self, base: np.ndarray) -> None:
        import hnswlib

        self.base = base
        self.index = hnswlib.Index(space="ip", dim=base.shape[1])
        self.index.init_index(max_elements=len(base), M=PEER_SETTINGS["m"],
                              ef_construction=PEER_SETTINGS["ef_construction"])
        self.index.set_num_threads(2)
        self.index.add_items(base, np.arange(len(base)))
        self.index.set_num_threads(1)

    def bytes_per_row(self) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            self.index.save_index(f"{tmp}/graph")
            return os.path.getsize(f"{tmp}/graph") / len(self.base)

    def search(self, q: np.ndarray, ef: int, kept: np.ndarray | None) -> np.ndarray:
        self.index.set_ef(ef)
        admitted = None if kept is None else (lambda label: bool(kept[label]))
        depth = min(ef, len(self.base) if kept is None else int(kept.sum()))  # it refuses to return fewer than asked
        return rescore(q, self.base, self.index.knn_query(q, k=depth, filter=admitted)[0].astype(np.int64), K)[1][0]

    def add(self, rows: np.ndarray) -> None:
        first = self.index.get_current_count()
        self.index.resize_index(first + len(rows))
        self.index.set_num_threads(2)
        self.index.add_items(rows, np.arange(first, first + len(rows)))

    def close(self) -> None:
        pass


class UsearchGraph:
    name = "usearch (M 16, float16)"

    def build(self, base: np.ndarray) -> None:
        from usearch.index import Index

        self.base = base
        self.index = Index(ndim=base.shape[1], metric="ip", dtype="f16", connectivity=PEER_SETTINGS["m"],
                           expansion_add=PEER_SETTINGS["ef_construction"])
        self.index.add(np.arange(len(base)), base, threads=2)

    def bytes_per_row(self) -> float:
        return self.index.memory_usage / len(self.base)

    def search(self, q: np.ndarray, ef: int, kept: np.ndarray | None) -> np.ndarray:
        width = ef if kept is None else min(int(np.ceil(ef / kept.mean())), MAX_FETCHED)
        self.index.expansion_search = width
        keys = self.index.search(q[0], width, threads=1).keys.astype(np.int64)
        if kept is not None:
            keys = keys[kept[keys]]
        return rescore(q, self.base, keys[None], K)[1][0]

    def add(self, rows: np.ndarray) -> None:
        first = len(self.index)
        self.index.add(np.arange(first, first + len(rows)), rows, threads=2)

    def close(self) -> None:
        pass


GRAPHS = {"faiss": FaissGraph, "hnswlib": HnswlibGraph, "usearch": UsearchGraph}


def measure_graph(graph, base: np.ndarray, added: np.ndarray, groups, masks, exact) -> dict:
    faiss_engine.faiss.omp_set_num_threads(2)
    started = time.perf_counter()
    graph.build(base)
    row = {"engine": graph.name, "build_s": round(time.perf_counter() - started, 1),
           "bytes_per_row": round(graph.bytes_per_row())}
    faiss_engine.faiss.omp_set_num_threads(1)
    try:
        for kept_name, kept in masks.items():
            for ef in BREADTHS:
                row[f"{kept_name} ef {ef}"] = _measure(lambda q: graph.search(q, ef, kept), groups, exact[kept_name])
        started = time.perf_counter()
        graph.add(added)
        row["add_s"] = round(time.perf_counter() - started, 2)
    finally:
        graph.close()
    return row


def run(index_dir: Path, query_specs: list[str], rows: int, added: int, engines: list[str], seed: int = 0) -> dict:
    index = load_index(index_dir)
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(index.count, min(rows + added, index.count), replace=False))
    sample = np.asarray(index.values[picked], np.float32)
    base, added_rows = sample[:rows], sample[rows:]
    encoder = encoder_for_index(index, device="cpu")
    groups = {name: np.asarray(encoder.encode(texts, "query").values, np.float32)
              for name, texts in (read_queries(spec) for spec in query_specs)}
    masks = {name: None if share == 1.0 else rng.random(len(base)) < share for name, share in KEPT.items()}
    exact = {}
    for kept_name, kept in masks.items():
        rows_kept = np.arange(len(base)) if kept is None else np.flatnonzero(kept)
        exact[kept_name] = {name: rows_kept[exact_top(xq, base[rows_kept], np.full(len(xq), -1), K)]
                            for name, xq in groups.items()}
    result = {"index": str(index_dir), "rows": len(base), "added": len(added_rows), "dim": int(base.shape[1]),
              "queries": {name: len(xq) for name, xq in groups.items()}, "graphs": []}
    for name in engines:
        result["graphs"].append(measure_graph(GRAPHS[name](), base, added_rows, groups, masks, exact))
    return result


def markdown(result: dict) -> str:
    names = list(result["queries"])
    header = ["engine", "build s", "bytes/row", f"add {result['added']:,} s"]
    columns = [f"{kept} ef {ef}" for kept in KEPT for ef in BREADTHS]
    lines = ["| " + " | ".join(header + columns) + " |", "|" + "---|" * (len(header) + len(columns))]
    for row in result["graphs"]:
        cells = [" / ".join(f"{row[c][n]:.3f}" for n in names) + f", {row[c]['p50_ms']} ms" for c in columns]
        lines.append("| " + " | ".join([row["engine"], str(row["build_s"]), str(row["bytes_per_row"]),
                                        str(row["add_s"]), *cells]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--added", type=int, default=20_000)
    parser.add_argument("--peers", nargs="*", default=["hnswlib", "usearch"], choices=["hnswlib", "usearch"])
    parser.add_argument("--out", type=Path, default=Path("graphs.json"))
    args = parser.parse_args(argv)
    result = run(args.index, args.queries, args.rows, args.added, ["faiss", *args.peers])
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
