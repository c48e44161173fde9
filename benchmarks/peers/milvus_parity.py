"""Milvus vs the local index on judged queries: same top-10? same nDCG@10? how fast?

    python -m densehybrid.bench.peers.milvus_parity --index DIR --queries Q.jsonl --qrels QRELS \\
        --milvus-uri /tmp/parity.db [--collection parity] [--candidates 1000]

Exports the index (timed: rows/s), encodes the judged queries once, searches both stores
with the same query vectors, and prints one JSON object: the fraction of queries whose
top-10 ids are equal, nDCG@10 of each, and per-store search time per query.
"""

from __future__ import annotations

import argparse
import json
import time

from densehybrid.index.building import commands

from densehybrid.index import evaluate

from densehybrid.index.served import milvus, milvus_export
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.params import SearchParams


def parity(index_dir: str, queries_path: str, qrels_path: str, uri: str, collection: str, candidates: int) -> dict:
    index = load_index(index_dir)
    start = time.perf_counter()
    report = milvus_export.export_index(index, uri, collection)
    export_s = time.perf_counter() - start
    remote = milvus.open_collection(uri, collection)
    encoder = commands.encoder_for_index(index)
    qids, texts, qrels = evaluate.read_judged(queries_path, qrels_path)
    encoded = encoder.encode(texts, "query")
    out = {"queries": len(qids), "rows": index.count, "kind": index.spec.kind, "candidates": candidates,
           "export_rows_per_s": round(report.rows / export_s, 1) if report.batches else None}
    found = {}
    for name, store in (("local", index), ("milvus", remote)):
        searcher = Searcher(store)
        start = time.perf_counter()
        found[name] = searcher.search(encoded, SearchParams(k=1000, candidates=candidates))
        out[f"{name}_ms_per_query"] = round((time.perf_counter() - start) * 1000 / len(qids), 2)
        run = evaluate.to_run(qids, found[name].ids, found[name].scores)
        out[f"{name}_ndcg@10"] = round(evaluate.evaluate(run, qrels)["nDCG@10"], 5)
    same = sum(a[:10] == b[:10] for a, b in zip(found["local"].ids, found["milvus"].ids))
    out["top10_equal_fraction"] = same / len(qids)
    out["ndcg@10_difference"] = round(abs(out["local_ndcg@10"] - out["milvus_ndcg@10"]), 5)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--qrels", required=True)
    parser.add_argument("--milvus-uri", required=True)
    parser.add_argument("--collection", default="parity")
    parser.add_argument("--candidates", type=int, default=1000)
    args = parser.parse_args()
    print(json.dumps(parity(args.index, args.queries, args.qrels, args.milvus_uri, args.collection, args.candidates)))


if __name__ == "__main__":
    main()
