"""Past the real rows: a pqscan first stage's single-query latency on a corpus tiled from an index's own rows.

    python -m densehybrid.bench.scale.tiled INDEX SCRATCH --queries NAME=FILE[:N] [--queries ...]
        [--copies 1 2 4] [--threads 1 2] [--spread 0.2] [--passes 3] [--out tiled.json]

The package corpus stops at 827k rows, and the growth table's two models (an exponent, or a fixed part plus a
part per row) part ways past it. Each ``--copies C`` builds, in SCRATCH, a corpus of C copies of INDEX's stored
rows: the first as stored, every other copy of a row moved by Gaussian noise of ``--spread`` times the row's norm
and scaled back to that norm, so that it is a near neighbour of the row (about 1 / sqrt(1 + spread²) of its
squared norm as their inner product), not a duplicate. Their codes are built as an index build builds them (the
index's ``m``, training size and seed) and searched with the index's margin and rescore as a server searches
them: ``scan_threads`` shards, one query at a time, depth 10, the thread counts taking turns query by query.
Recall@10 is against the exact top 10 of the tiled rows, per query group.

A tiled corpus is denser near each row than a real one of its size: every row has C - 1 near copies, so more
rows lie within a query's margin. It measures how the scan and the rescoring grow, not a recall to state. A
query with more rows within its margin than a search rescores is scanned exactly, here by numpy over the tiled
rows (a served index has Faiss's flat scan of its vectors file for that): it weighs on the mean, not the p50.
SCRATCH receives the tiled rows (C × the index's float16 rows); nothing is written into INDEX.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from densehybrid.bench.scale.real import encoded_queries
from densehybrid.bench.timing import ratio, round_robin, summarize
from densehybrid.index.building import calibration
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.building.pqscan import build_pqscan
from densehybrid.index.engines.pqscan_engine import PQScanConfig, PQScanStore, code_scan
from densehybrid.index.search.recall import recall_at_k
from densehybrid.index.search.widening import as_float32
from densehybrid.index.served.loading import load_index
from densehybrid.service.blas import one_thread_for_pooled_blas

log = logging.getLogger(__name__)

K = 10
CHUNK_ROWS = 65_536


def tiled_rows(values: np.ndarray, copies: int, spread: float, path: Path, seed: int = 0) -> np.ndarray:
    """(copies × N, dim) float16 at ``path`` (a .npy, memory-mapped): ``values`` as they are, then each further
    copy's rows moved by noise of ``spread`` × their norm and scaled back to it."""
    n, dim = values.shape
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(copies * n, dim))
    rng = np.random.default_rng(seed)
    for copy in range(copies):
        for start in range(0, n, CHUNK_ROWS):
            rows = as_float32(np.asarray(values[start:start + CHUNK_ROWS]))
            if copy:
                norms = np.linalg.norm(rows, axis=1, keepdims=True)
                moved = rows + rng.standard_normal(rows.shape, dtype=np.float32) * (spread * norms / math.sqrt(dim))
                rows = moved * (norms / np.maximum(np.linalg.norm(moved, axis=1, keepdims=True), 1e-12))
            out[copy * n + start:copy * n + start + len(rows)] = rows
    out.flush()
    return out


def measured(stores: dict[str, PQScanStore], groups: dict[str, np.ndarray], exact: np.ndarray,
             passes: int) -> dict:
    """Per store the latency of a lone query (every group's queries ``passes`` times, the stores taking turns),
    and the first store's recall@10 per group."""
    xq = np.concatenate(list(groups.values()))
    order = np.random.default_rng(0).permutation(len(xq))  # the groups interleaved

    def timed(store):
        def call(i: int) -> float:
            started = time.perf_counter()
            store.inner_product(xq[order[i % len(xq)]][None], K)
            return (time.perf_counter() - started) * 1000.0
        return call

    samples = round_robin({t: timed(store) for t, store in stores.items()}, passes * len(xq), warmup=5)
    first = next(iter(stores.values()))
    found = recall_at_k(np.concatenate([first.inner_product(q[None], K)[1] for q in xq]), exact)
    recall, start = {}, 0
    for name, group in groups.items():
        recall[name] = round(float(found[start:start + len(group)].mean()), 4)
        start += len(group)
    return {"latency_ms": {t: summarize(s).to_dict() for t, s in samples.items()}, "recall_at_10": recall}


def exponents(sizes: list[dict], threads: list[int]) -> dict:
    """Per thread count, the slope of log p50 against log rows between each size and the first."""
    base = sizes[0]
    return {str(t): [round(math.log(s["latency_ms"][str(t)]["p50"] / base["latency_ms"][str(t)]["p50"])
                           / math.log(s["rows"] / base["rows"]), 3) for s in sizes[1:]] for t in threads}


def run(index_dir: Path, scratch: Path, query_specs: list[str], copies: list[int], threads: list[int],
        spread: float, passes: int) -> dict:
    index = load_index(index_dir)
    first_stage = index.manifest["first_stage"]
    if first_stage.get("type") != "pqscan":
        raise SystemExit(f"{index_dir}: a pqscan first stage is needed, this index has {first_stage.get('type')}")
    config = PQScanConfig(**{name: first_stage[name] for name in ("m", "rescore", "margin", "train_size", "seed")})
    groups = encoded_queries(encoder_for_index(index, device="cpu"), query_specs)
    xq = np.concatenate(list(groups.values()))
    one_thread_for_pooled_blas()  # as a server runs its searches side by side
    scratch.mkdir(parents=True, exist_ok=True)
    result = {"index": str(index_dir), "index_rows": index.count, "dim": int(index.values.shape[1]),
              "first_stage": {"m": config.m, "margin": config.margin, "rescore": config.rescore},
              "spread": spread, "queries": {name: len(g) for name, g in groups.items()}, "k": K,
              "cores": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(), "sizes": []}
    for count in copies:
        started = time.perf_counter()
        values = tiled_rows(index.values, count, spread, scratch / f"tiled-{count}.npy")
        codes, _ = build_pqscan(values, replace(config, trained_rows=0))
        built_s = time.perf_counter() - started
        exact = calibration.exact_top(xq, values, np.full(len(xq), -1))
        stores = {str(t): PQScanStore(code_scan(codes, t), values, None, (), config.rescore, config.margin)
                  for t in threads}
        size = {"copies": count, "rows": len(values), "build_s": round(built_s, 1),
                **measured(stores, groups, exact, passes)}
        p50 = {t: size["latency_ms"][t]["p50"] for t in size["latency_ms"]}
        size["ratios_p50"] = {t: ratio(p50[t], p50[str(threads[0])]) for t in list(p50)[1:]}
        log.info("%d rows: p50 %s ms, recall %s", len(values), p50, size["recall_at_10"])
        result["sizes"].append(size)
        del stores, codes, values
        (scratch / f"tiled-{count}.npy").unlink()
    result["p50_exponents"] = exponents(result["sizes"], threads)
    result["load_after"] = os.getloadavg()
    return result


def markdown(result: dict) -> str:
    threads = list(result["sizes"][0]["latency_ms"])
    groups = list(result["queries"])
    lines = ["| rows | " + " | ".join(f"p50 ms, {t} thread(s)" for t in threads) + " | "
             + " | ".join(f"recall@10 {g}" for g in groups) + " |", "|---|" + "---|" * (len(threads) + len(groups))]
    for size in result["sizes"]:
        lines.append(f"| {size['rows']:,} | " + " | ".join(f"{size['latency_ms'][t]['p50']:.3f}" for t in threads)
                     + " | " + " | ".join(f"{size['recall_at_10'][g]:.4f}" for g in groups) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("scratch", type=Path, help="a folder for the tiled rows (copies x the index's rows)")
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="scan threads; the first is the base")
    parser.add_argument("--spread", type=float, default=0.2, help="the noise moving each further copy, x its norm")
    parser.add_argument("--passes", type=int, default=3, help="times every query is searched per store")
    parser.add_argument("--out", type=Path, default=Path("tiled.json"))
    args = parser.parse_args(argv)
    if min(args.copies) < 1 or args.spread < 0 or args.passes < 1:
        parser.error("--copies must be >= 1, --spread >= 0 and --passes >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.index, args.scratch, args.queries, args.copies, args.threads, args.spread, args.passes)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    print("p50 growth exponents against the first size:", result["p50_exponents"])


if __name__ == "__main__":
    main()
