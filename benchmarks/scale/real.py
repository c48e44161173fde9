"""Approximate first stages on a real corpus: recall@10 against the exact scan, per query group, and latency.

    python -m densehybrid.bench.scale.real INDEX --queries NAME=FILE[:N] [--queries ...] [--ann hnsw pqscan]
        [--peers hnswlib usearch] [--out real.json] [--plot real.png]

INDEX is a built or imported index of the corpus with the exact flat first stage; its own encoder encodes
each group's queries (a BEIR queries.jsonl, the first N of it). For each group the exact top 10 over the
stored rows is the reference. Then, for each ``--ann`` choice, its first stage is written over the same
rows with the defaults ``index build`` uses (timed), and each breadth of the build's calibration grid is
measured as a served search runs (the same store, candidates rescored exactly): recall@10 and the share of
queries with the exact top 10 entire, per group, and single-query first-stage p50/p99 over all of them.
The calibration the build would do (sentences cut from sampled passages) runs too, so the breadth it
would choose and the recall it would state sit beside what each group gets at that breadth.

Peers (``--peers``, when installed): maintained graph libraries built over the same rows with two
threads and searched with one, their candidates rescored by the same exact code.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale import real_report
from densehybrid.bench.timing import summarize
from densehybrid.index.building import calibrate, calibration, calibration_queries
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.engines import faiss_engine
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.engines.pqscan_engine import PQScanConfig
from densehybrid.index.jsonl import read_jsonl
from densehybrid.index.search.params import BREADTH
from densehybrid.index.served.loading import load_index
from densehybrid.index.served.stated_recall import recall_at

log = logging.getLogger(__name__)

K = calibration.K
CHOICES = {"hnsw": HNSWConfig(), "pqscan": PQScanConfig()}
PEER_GRID = (16, 32, 64, 128, 256, 512, 1024, 2048)
FIXED_RESCORE = (50, 100, 200, 300, 500, 1000)


def read_queries(spec: str) -> tuple[str, list[str]]:
    """``NAME=FILE[:N]`` -> (NAME, the first N query texts of FILE, a BEIR queries.jsonl)."""
    name, _, path = spec.partition("=")
    path, _, count = path.partition(":")
    texts = [str(row["text"]) for row in read_jsonl(path, required=("text",), what="a query line with text")]
    return name, texts[:int(count)] if count else texts


def encoded_queries(encoder, query_specs: list[str]) -> dict[str, np.ndarray]:
    """Each ``NAME=FILE[:N]`` set's queries (:func:`read_queries`) encoded by ``encoder`` -> NAME: (N, dim) float32."""
    sets = {}
    for spec in query_specs:
        name, texts = read_queries(spec)
        sets[name] = np.asarray(encoder.encode(texts, "query").values, np.float32)
    return sets


def _plain(breadth) -> int | float:
    """A breadth as JSON writes it: an ef stays whole, a margin keeps its fraction."""
    number = float(breadth)
    return int(number) if number.is_integer() else number


def sweep(search, groups: dict[str, np.ndarray], exact: dict[str, np.ndarray], breadths) -> list[dict]:
    """``search(query (1, dim), breadth) -> rows`` at each breadth: per group recall and exact share, and the
    single-query latency over every group's queries."""
    points = []
    for breadth in breadths:
        point, samples = {"breadth": _plain(breadth)}, []
        for name, xq in groups.items():
            search(xq[:1], breadth)
            found = []
            for q in xq:
                started = time.perf_counter()
                found.append(search(q[None], breadth))
                samples.append((time.perf_counter() - started) * 1000.0)
            recalls = calibration.recall_at_k(np.array(found), exact[name])
            point[name] = {"recall_at_10": round(float(recalls.mean()), 4),
                           "exact_top10": round(float((recalls == 1.0).mean()), 4)}
        timing = summarize(samples)
        points.append(point | {"p50_ms": round(timing.p50, 3), "p99_ms": round(timing.p99, 3),
                               "mean_ms": round(timing.mean, 3)})
        log.info("breadth %g: %s, p50 %.2f ms", breadth,
                 ", ".join(f"{n} {point[n]['recall_at_10']:.3f}" for n in groups), timing.p50)
    return points


def our_choice(name: str, values: np.ndarray, index_dir: Path, encoder, groups, exact) -> dict:
    """One ``--ann`` choice written over ``values`` as a build writes it, calibrated as a build does, swept."""
    with tempfile.TemporaryDirectory(prefix=f"densehybrid-real-{name}-") as tmp:
        staged = Path(tmp)
        for shared in ("docs.sqlite", "vectors.faiss"):  # the texts to cut queries from, the rows the exact scan reads
            (staged / shared).symlink_to((index_dir / shared).resolve())
        queries = calibration_queries.queries_for(encoder, staged, values)
        started = time.perf_counter()
        with faiss_engine.omp_threads(os.cpu_count() or 1):  # built as a build builds it: every core
            calibrated = calibrate.write_calibrated(values, staged, CHOICES[name], queries, calibration.DEFAULT_TARGET)
        built_s = time.perf_counter() - started - calibrated["calibration"]["seconds"]
        store = calibrate.store_of(staged, calibrated, values)
        knob = BREADTH[name]
        files = {p.name: p.stat().st_size for p in staged.iterdir() if p.is_file() and not p.is_symlink()}

        def search(q, breadth):
            return store.inner_product(q, K, **{knob: breadth})[1][0]

        points = sweep(search, groups, exact, calibrate.grid(calibrated, len(values)))
        fixed = None
        if name == "pqscan":  # the margin against a fixed number of candidates rescored, at equal mean latency
            def fixed_search(q, rescored):
                return store.inner_product(q, K, margin=0.0, rescore=rescored)[1][0]

            fixed = sweep(fixed_search, groups, exact, FIXED_RESCORE)
    return {"choice": name, "knob": knob, "build_s": round(built_s, 1), "fixed_rescore_sweep": fixed,
            "calibration_s": calibrated["calibration"]["seconds"], "files": files,
            "calibrated": {"breadth": calibrated[knob], "reached": calibrated["calibration"]["reached"],
                           "stated_recall": recall_at(calibrated["calibration"]["curve"], calibrated[knob])},
            "sweep": points}


def peer(name: str, values: np.ndarray, groups, exact) -> dict:
    """A maintained graph library (``bench.peers.graphs``) over ``values``, swept as our choices are."""
    from densehybrid.bench.peers.graphs import GRAPHS  # imported here: it reads its queries through this module

    graph = GRAPHS[name]()
    started = time.perf_counter()
    graph.build(np.asarray(values, dtype=np.float32))
    built_s = time.perf_counter() - started
    try:
        points = sweep(lambda q, breadth: graph.search(q, breadth, None), groups, exact, PEER_GRID)
    finally:
        graph.close()
    return {"choice": name, "knob": "ef", "build_s": round(built_s, 1), "settings": graph.name, "sweep": points}


def flat(values: np.ndarray, groups) -> dict:
    """The exact scan itself, batch 1 (Faiss over the stored float16 rows, as the flat first stage serves them)."""
    index = faiss_engine.faiss.IndexFlatIP(values.shape[1])
    for s in range(0, len(values), 65_536):
        index.add(np.asarray(values[s:s + 65_536], dtype=np.float32))
    samples = []
    for xq in groups.values():
        for q in xq:
            started = time.perf_counter()
            index.search(q[None], K)
            samples.append((time.perf_counter() - started) * 1000.0)
    timing = summarize(samples)
    return {"choice": "flat", "p50_ms": round(timing.p50, 3), "p99_ms": round(timing.p99, 3)}


def run(index_dir: Path, query_specs: list[str], choices: list[str], peers: list[str], threads: int = 1) -> dict:
    faiss_engine.faiss.omp_set_num_threads(threads)
    index = load_index(index_dir)
    encoder = encoder_for_index(index, device="cpu")
    values = index.values
    groups = encoded_queries(encoder, query_specs)
    exact = {name: calibration.exact_top(xq, values, np.full(len(xq), -1)) for name, xq in groups.items()}
    result = {"index": str(index_dir), "rows": index.count, "dim": int(values.shape[1]), "model": index.spec.model_id,
              "queries": {name: len(xq) for name, xq in groups.items()}, "threads": threads, "k": K,
              "flat": flat(values, groups), "choices": [], "peers": []}
    for name in choices:
        result["choices"].append(our_choice(name, values, index_dir, encoder, groups, exact))
    faiss_engine.faiss.omp_set_num_threads(threads)
    for name in peers:
        result["peers"].append(peer(name, values, groups, exact))
    result["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--ann", nargs="*", default=list(CHOICES), choices=list(CHOICES))
    parser.add_argument("--peers", nargs="*", default=[])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("real.json"))
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.index, args.queries, args.ann, args.peers, args.threads)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(real_report.markdown(result))
    print(real_report.equal_latency_markdown(result))
    if args.plot:
        real_report.plot(result, args.plot)


if __name__ == "__main__":
    main()
