"""Filtered search: /search p50 at several selectivities against the unfiltered p50, and the search stage alone.

An index of seeded random rows in the HashEncoder's ``dhr`` layout (search cost depends on sizes, not
on the values) with one integer payload field, ``rank``, a permutation of the rows, so that
``{"field": "rank", "range": {"lt": s·N}}`` keeps exactly the share ``s``. A live loopback server (in
a thread of this process) answers one client in a closed loop; each request's server-side
``search_ms`` is reported too, and the same searches in process on the Faiss and torch (CPU) engines.
Selectivities take turns request by request; ratios are filtered / unfiltered from one run.

    python -m densehybrid.bench.parts.filters [--rows 10000] [--requests 100]
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from densehybrid.bench.config import PRESETS
from densehybrid.bench.timing import percentile, ratio, round_robin
from densehybrid.index.search.params import SearchParams

SELECTIVITIES = (1.0, 0.1, 0.01, 0.001)
WARMUP_ROUNDS = 2  # dropped: they warm the caches, and each filter's mask
QUERIES = ("dense sparse hybrid retrieval", "passage query vector index", "lexical semantic gate model",
           "search rank token weight", "neural network language corpus", "document answer question fast exact")


def build(root: Path, encoder, rows: int) -> Path:
    from densehybrid.encoder.base import Encoded
    from densehybrid.index.building.build import build_from_arrays
    from densehybrid.index.storage.documents import Document
    from densehybrid.index.storage.payload import Payload

    spec = encoder.spec
    rng = np.random.default_rng(5)
    values = rng.random((rows, spec.dim), dtype=np.float32)
    gates = rng.integers(0, 40, (rows, spec.gated_dim), dtype=np.uint8) if spec.gated_dim else None
    rank = rng.permutation(rows)
    payload = Payload.from_rows({"rank": "integer"}, [{"rank": int(r)} for r in rank])
    docs = [Document(f"D{i}", "", f"passage {i}") for i in range(rows)]
    return build_from_arrays(root / "index", spec, Encoded(values, gates), docs, payload=payload)


def filter_for(share: float | None, rows: int) -> dict | None:
    return None if share is None else {"field": "rank", "range": {"lt": int(round(share * rows))}}


def over_http(url: str, rows: int, requests: int) -> dict:
    """p50 of the whole request and of its search stage (first stage + rerank), per selectivity."""
    with httpx.Client(base_url=url, timeout=60) as client:
        def call(share, i):
            body = {"query": QUERIES[i % len(QUERIES)], "k": 10}
            if share is not None:
                body["filter"] = filter_for(share, rows)
            started = time.perf_counter()
            answer = client.post("/search", json=body)
            answer.raise_for_status()
            total = (time.perf_counter() - started) * 1000
            timing = answer.json()["timing"]
            return total, timing["search_ms"] + timing["rerank_ms"]

        samples = round_robin({share: functools.partial(call, share) for share in (None, *SELECTIVITIES)}, requests,
                              warmup=WARMUP_ROUNDS)
    return {"unfiltered" if share is None else share:
            {"p50_ms": percentile([t for t, _ in got], 50), "search_p50_ms": percentile([s for _, s in got], 50)}
            for share, got in samples.items()}


def in_process(index, encoder, rows: int, repeats: int) -> dict:
    """p50 of ``Searcher.search`` per engine and selectivity (one query at a time, as a lone request)."""
    from densehybrid.index.search import filters
    from densehybrid.index.search.searcher import Searcher

    queries = [encoder.encode([q], "query") for q in QUERIES]
    nodes = {share: None if share is None else filters.parse(filter_for(share, rows), index.field_types)
             for share in (None, *SELECTIVITIES)}
    out = {}
    for engine in ("faiss", "torch"):
        searcher = Searcher(index, engine=engine)

        def call(share, i):
            started = time.perf_counter()
            searcher.search(queries[i % len(queries)], SearchParams(k=10, filter=nodes[share]))
            return (time.perf_counter() - started) * 1000

        samples = round_robin({share: functools.partial(call, share) for share in nodes}, repeats, warmup=WARMUP_ROUNDS)
        out[engine] = {"unfiltered" if share is None else share: percentile(got, 50) for share, got in samples.items()}
    return out


def with_ratios(table: dict, key: str | None = None) -> dict:
    base = table["unfiltered"] if key is None else table["unfiltered"][key]
    return {share: {"p50_ms": round(v if key is None else v[key], 3),
                    "vs_unfiltered": ratio(v if key is None else v[key], base)} for share, v in table.items()}


def run(rows: int, requests: int) -> dict:
    from densehybrid.bench.servers.hash_encoder import HashEncoder
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    encoder = HashEncoder("dhr")
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = build(Path(tmp), encoder, rows)
        settings = ServiceSettings(log_level="WARNING")
        with LiveServer(create_app(settings, encoder=HashEncoder("dhr"), index=load_index(index_dir))) as live:
            http = over_http(live.url, rows, requests)
        local = in_process(load_index(index_dir), encoder, rows, requests)
    return {"rows": rows, "requests": requests, "kind": "dhr", "dim": encoder.spec.dim,
            "http_request": with_ratios(http, "p50_ms"), "http_search_stage": with_ratios(http, "search_p50_ms"),
            "in_process": {engine: with_ratios(table) for engine, table in local.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=PRESETS["default"].service_docs,
                        help="index rows (default: the service benchmark's)")
    parser.add_argument("--requests", type=int, default=100, help="requests per selectivity")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.rows, args.requests), indent=2))


if __name__ == "__main__":
    main()
