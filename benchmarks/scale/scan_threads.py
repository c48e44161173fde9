"""One query's pqscan code scan spread over threads: latency alone, and throughput under concurrent clients.

    python -m densehybrid.bench.scale.scan_threads INDEX --queries NAME=FILE[:N] [--queries ...]
        [--threads 1 2] [--top-list] [--clients 1 8 32] [--rounds 5] [--seconds 5] [--out scan-threads.json]

INDEX is a built or imported index with a ``pqscan`` first stage; its own encoder encodes each group's
queries (a BEIR queries.jsonl, the first N of it), as ``bench.scale.real`` does. For each ``--threads`` value
the first stage is opened as a server opens it (``scan_threads`` shards, the decision to spread a query or
not taken per search) and measured as a served search runs it (``inner_product`` of one query, depth 10,
candidates rescored exactly). ``--top-list`` adds, for each thread count, the same store with its code sample
taken away, so that a lone query keeps a top list as long as the rows within its margin could be instead of
one range search (``index.engines.pqscan_sample``), as every query did before the sample:

- latency: every query searched alone, one at a time, the stores taking turns query by query
  (``timing.round_robin``) so a shared machine's drift hits them alike; p50/p95/p99 per store;
- throughput: ``C`` client threads, each searching one query after another for ``--seconds``, for each
  ``--clients`` count; the stores take turns round by round, and the median of ``--rounds`` rounds is
  reported (queries/s).

numpy's BLAS runs on one thread a product throughout, as a server holds it (``service.blas``).

Ratios (each store against the first: one thread) come from the same run. The answers of every store are
checked to be those of the first (the same rows and scores). Nothing is written into INDEX.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale.real import encoded_queries
from densehybrid.bench.timing import ratio, round_robin, summarize
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.engines.pqscan_shards import available_cores, default_scan_threads
from densehybrid.index.served.loading import load_index
from densehybrid.service.blas import one_thread_for_pooled_blas

log = logging.getLogger(__name__)

K = 10


def stores_of(index, threads: list[int], top_list: bool = False) -> dict[str, object]:
    """Label -> the served pqscan store of ``index``: "T" with T scan threads and, with ``top_list``, "T, top
    list" with them and no code sample (every query scanned for a top list)."""
    if index.manifest["first_stage"].get("type") != "pqscan":
        raise SystemExit(f"{index.path}: a pqscan first stage is needed, this index has "
                         f"{index.manifest['first_stage'].get('type')}")
    stores = {str(t): index.vector_store("cpu", scan_threads=t) for t in threads}
    for t in threads if top_list else ():
        stores[f"{t}, top list"] = store = index.vector_store("cpu", scan_threads=t)
        store.scan.sample = None
    return stores


def same_answers(stores: dict[str, object], xq: np.ndarray) -> bool:
    """Whether every store answers every query (alone) as the first does: rows and scores."""
    first, *others = stores.values()
    for q in xq:
        want = first.inner_product(q[None], K)
        for store in others:
            got = store.inner_product(q[None], K)
            if not (np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])):
                return False
    return True


def latency(stores: dict[str, object], xq: np.ndarray, warmup: int = 5) -> dict[str, dict]:
    """Per store, the single-query first-stage latency over every query (ms), the stores taking turns."""

    def timed(store):
        def call(i: int) -> float:
            started = time.perf_counter()
            store.inner_product(xq[i % len(xq)][None], K)
            return (time.perf_counter() - started) * 1000.0
        return call

    samples = round_robin({t: timed(store) for t, store in stores.items()}, len(xq), warmup=warmup)
    return {t: summarize(s).to_dict() for t, s in samples.items()}


def throughput(store, xq: np.ndarray, clients: int, seconds: float) -> float:
    """Queries/s of ``clients`` threads, each searching one query after another for ``seconds``."""
    done = [0] * clients
    start = threading.Barrier(clients + 1)
    deadline: list[float] = []

    def client(c: int) -> None:
        start.wait()
        i, n = c, 0
        while time.perf_counter() < deadline[0]:
            store.inner_product(xq[i % len(xq)][None], K)
            i, n = i + clients, n + 1
        done[c] = n

    workers = [threading.Thread(target=client, args=(c,), name=f"bench-client-{c}") for c in range(clients)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    deadline.append(began + seconds)
    start.wait()
    for worker in workers:
        worker.join()
    return sum(done) / (time.perf_counter() - began)


def throughputs(stores: dict[str, object], xq: np.ndarray, clients: list[int], rounds: int,
                seconds: float) -> dict[str, dict]:
    """Per store and client count: the median queries/s of ``rounds`` rounds, the stores taking turns."""
    out = {t: {} for t in stores}
    for c in clients:
        runs = round_robin({t: (lambda i, s=store: throughput(s, xq, c, seconds)) for t, store in stores.items()},
                           rounds, warmup=0)
        for t, qps in runs.items():
            out[t][c] = {"median_qps": round(float(np.median(qps)), 1), "rounds_qps": [round(q, 1) for q in qps]}
        log.info("%d clients: %s", c, ", ".join(f"{t}: {out[t][c]['median_qps']:.0f} q/s" for t in stores))
    return out


def run(index_dir: Path, query_specs: list[str], threads: list[int], clients: list[int], rounds: int,
        seconds: float, top_list: bool = False) -> dict:
    index = load_index(index_dir)
    encoder = encoder_for_index(index, device="cpu")
    groups = encoded_queries(encoder, query_specs)
    xq = np.concatenate(list(groups.values()))
    xq = xq[np.random.default_rng(0).permutation(len(xq))]  # the groups interleaved
    stores = stores_of(index, threads, top_list)
    one_thread_for_pooled_blas()  # as a server runs its searches side by side
    load_before = os.getloadavg()
    result = {"index": str(index_dir), "rows": index.count, "dim": int(index.values.shape[1]),
              "model": index.spec.model_id, "queries": {name: len(g) for name, g in groups.items()}, "k": K,
              "first_stage": {k: v for k, v in index.manifest["first_stage"].items() if k != "calibration"},
              "machine": {"cores": available_cores(), "cpu_count": os.cpu_count(), "processor": platform.processor(),
                          "default_scan_threads": default_scan_threads(index.count)},
              "same_answers": same_answers(stores, xq)}
    result["latency_ms"] = latency(stores, xq)
    result["throughput"] = throughputs(stores, xq, clients, rounds, seconds)
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    base, *others = stores
    result["ratios"] = {
        t: {"p50": ratio(result["latency_ms"][t]["p50"], result["latency_ms"][base]["p50"]),
                 "p95": ratio(result["latency_ms"][t]["p95"], result["latency_ms"][base]["p95"]),
                 **{f"qps_{c}_clients": ratio(result["throughput"][t][c]["median_qps"],
                                              result["throughput"][base][c]["median_qps"]) for c in clients}}
        for t in others}
    return result


def markdown(result: dict) -> str:
    threads = list(result["latency_ms"])
    clients = list(next(iter(result["throughput"].values())))
    lines = ["| scan threads | p50 ms | p95 ms | " + " | ".join(f"q/s, {c} clients" for c in clients) + " |",
             "|---|---|---|" + "---|" * len(clients)]
    for t in threads:
        timing, qps = result["latency_ms"][t], result["throughput"][t]
        lines.append(f"| {t} | {timing['p50']:.3f} | {timing['p95']:.3f} | "
                     + " | ".join(f"{qps[c]['median_qps']:.0f}" for c in clients) + " |")
    for t, r in result["ratios"].items():
        lines.append(f"| {t} / {threads[0]} | {r['p50']} | {r['p95']} | "
                     + " | ".join(str(r[f'qps_{c}_clients']) for c in clients) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="scan threads; the first is the base")
    parser.add_argument("--top-list", action="store_true",
                        help="also measure each thread count without the code sample (a top list for every query)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds per thread and client count")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one throughput round")
    parser.add_argument("--out", type=Path, default=Path("scan-threads.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.index, args.queries, args.threads, args.clients, args.rounds, args.seconds, args.top_list)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    if not result["same_answers"]:
        raise SystemExit("the stores answered differently")


if __name__ == "__main__":
    main()
