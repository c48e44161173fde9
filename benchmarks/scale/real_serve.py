"""A real corpus's index served over HTTP: ``/search`` latency from one client, and recall@10 of what the
server answered against the exact top 10 over the same stored rows.

    python -m densehybrid.bench.scale.real_serve INDEX --queries NAME=FILE[:N] [--queries ...]
        [--serve-args "--precision int8"] [--out serve.json]

The index is served by ``densehybrid serve`` in a fresh process with its defaults (``--serve-args`` adds
flags). Each query is asked once for its vector (``/encode``, alone, as ``/search`` encodes a lone request:
int8 activations are quantized per batch, so a vector encoded in another batch is another vector) and once
with ``/search`` (k 10); the exact top 10 of each vector over the stored rows is computed after the server
stops. It prints and writes the ready time, the client's ``/search`` p50/p95/p99, the server's own timing
per stage, recall@10 per query group and the first stage the answers name.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale.real import read_queries
from densehybrid.bench.servers.start import serve_command, start_server, stop_process
from densehybrid.bench.timing import summarize
from densehybrid.index.building.calibration import exact_top
from densehybrid.index.served.loading import load_index

K = 10
STAGES = ("queue_ms", "encode_ms", "search_ms", "rerank_ms", "total_ms")
WARM_UP = 5


def _asked(client, groups: dict[str, list[str]]) -> tuple[dict, dict, list[float], dict]:
    """(vectors per group, answered ids per group, client ms per request, server ms per stage)."""
    for text in next(iter(groups.values()))[:WARM_UP]:
        client.post("/search", json={"query": text, "k": K}).raise_for_status()
    vectors, answered, client_ms = {}, {}, []
    server_ms: dict[str, list[float]] = {stage: [] for stage in STAGES}
    first_stage = None
    for name, texts in groups.items():
        vectors[name] = np.asarray([client.post("/encode", json={"texts": [t]}).json()["vectors"][0] for t in texts],
                                   np.float32)
        answered[name] = []
        for text in texts:
            started = time.perf_counter()
            response = client.post("/search", json={"query": text, "k": K})
            response.raise_for_status()
            client_ms.append((time.perf_counter() - started) * 1000.0)
            body = response.json()
            answered[name].append({hit["id"] for hit in body["results"]})
            for stage in STAGES:
                server_ms[stage].append(body["timing"].get(stage, 0.0))
            first_stage = body["index"]["first_stage"]
    return vectors, answered, client_ms, {"server_ms": server_ms, "first_stage": first_stage}


def run(index_dir: Path, query_specs: list[str], serve_args: list[str] = (), ready_timeout_s: float = 600.0) -> dict:
    import httpx

    groups = dict(read_queries(spec) for spec in query_specs)
    started = time.perf_counter()
    proc, url = start_server(serve_command("--index", str(index_dir), *serve_args), ready_timeout_s=ready_timeout_s,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ready_s = time.perf_counter() - started
        with httpx.Client(base_url=url, timeout=120) as client:
            vectors, answered, client_ms, served = _asked(client, groups)
    finally:
        stop_process(proc)
    index = load_index(index_dir)
    ids = np.asarray([str(d) for d in index.doc_ids], dtype=object)
    recall = {}
    for name, xq in vectors.items():
        exact = exact_top(xq, index.values, np.full(len(xq), -1), K)
        recall[name] = round(float(np.mean([len(set(ids[rows]) & got) / K
                                            for rows, got in zip(exact, answered[name])])), 4)
    return {"index": str(index_dir), "rows": index.count, "serve_args": list(serve_args), "ready_s": round(ready_s, 2),
            "queries": {name: len(texts) for name, texts in groups.items()}, "recall_at_10": recall,
            "search_ms": summarize(client_ms).to_dict(),
            "server_ms": {stage: summarize(v).to_dict() for stage, v in served["server_ms"].items()},
            "first_stage": served["first_stage"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--serve-args", default="", help="more flags for densehybrid serve, as one string")
    parser.add_argument("--out", type=Path, default=Path("real-serve.json"))
    args = parser.parse_args(argv)
    result = run(args.index, args.queries, shlex.split(args.serve_args))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("ready_s", "recall_at_10", "first_stage")}))
    print(f"/search over HTTP, one client: p50 {result['search_ms']['p50']:.2f} ms, p99 {result['search_ms']['p99']:.2f} ms; "
          f"server first stage p50 {result['server_ms']['search_ms']['p50']:.2f} ms")


if __name__ == "__main__":
    main()
