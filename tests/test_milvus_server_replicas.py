"""``serve --milvus-uri`` for real: a SPLADE-tiny index of stdlib docstrings exported to the Milvus server,
equal to the local index on its judged queries, then two ``densehybrid serve`` processes (replicas) sharing the
collection, through the server stopping and coming back."""

import subprocess
import sys
import threading

import httpx
import pytest

from densehybrid.bench.peers import milvus_parity
from densehybrid.bench.servers.start import free_port, stop_process, wait_for_process_ready
from densehybrid.cli.stdlib_eval_set import write_set
from densehybrid.encoder.loading import load_encoder
from densehybrid.index import evaluate
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served import milvus_export
from densehybrid.index.served.loading import load_index

from support.waiting import wait_until

pytestmark = [pytest.mark.milvus_server, pytest.mark.realmodel]

COLLECTION = "stdlib"


@pytest.fixture(scope="module")
def judged(tmp_path_factory, splade_tiny_dir, milvus_server):
    """150 stdlib passages and 40 judged queries, a SPLADE-tiny (dlr, gated) index of them, and the emptied server."""
    root = tmp_path_factory.mktemp("milvus-judged")
    assert write_set(root, 150, 40, seed=3) == (150, 40)
    index_dir = build_index(load_encoder("splade-tiny"), root / "corpus.jsonl", root / "index", BuildOptions(progress=False))
    milvus_server.ensure_running()
    milvus_server.drop_all()
    milvus_export.export_index(load_index(index_dir), milvus_server.uri, COLLECTION)
    return root, index_dir


def test_the_collection_answers_the_judged_queries_as_the_local_index(judged, milvus_server):
    root, index_dir = judged
    found = milvus_parity.parity(str(index_dir), str(root / "queries.jsonl"), str(root / "qrels.tsv"),
                                 milvus_server.uri, "parity", candidates=150)  # exports it again, timed
    assert (found["queries"], found["rows"], found["kind"]) == (40, 150, "dlr")
    assert found["top10_equal_fraction"] == 1.0 and found["ndcg@10_difference"] == 0.0, found
    assert found["milvus_ndcg@10"] > 0.5, found  # the set is answerable: a broken search would score near 0


def _serve(uri: str, log) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # torch, to compare ids with the in-process torch encoder (ONNX Runtime agrees to 1e-5: tests/test_onnx_backend.py)
    proc = subprocess.Popen([sys.executable, "-m", "densehybrid", "serve", "--milvus-uri", uri, "--collection",
                             COLLECTION, "--port", str(port), "--backend", "torch", "--device", "cpu",
                             "--store-check-s", "0.2", "--log-plain"], stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _top10(url: str, queries: list[str]) -> list[list[str]]:
    answer = httpx.post(url + "/search", json={"queries": queries, "k": 10, "candidates": 150}, timeout=60)
    assert answer.status_code == 200, answer.text
    return [[hit["id"] for hit in hits] for hits in answer.json()["results"]]


def test_two_serve_replicas_share_the_collection_through_a_server_restart(judged, milvus_server, tmp_path):
    root, index_dir = judged
    _, texts, _ = evaluate.read_judged(root / "queries.jsonl", root / "qrels.tsv")
    queries = texts[:12]
    want = Searcher(load_index(index_dir)).search(load_encoder("splade-tiny").encode(queries, "query"),
                                                  SearchParams(k=10, candidates=150)).ids
    with open(tmp_path / "replicas.log", "wb") as log:
        replicas = [_serve(milvus_server.uri, log) for _ in range(2)]
        try:
            for proc, url in replicas:
                wait_for_process_ready(url, proc, timeout_s=300)
            urls = [url for _, url in replicas]
            assert all(httpx.get(u + "/info").json()["index"]["documents"] == 150 for u in urls)
            assert [_top10(u, queries) for u in urls] == [want, want]
            # both at once, a few rounds each: one collection, one answer
            answers, threads = [], [threading.Thread(target=lambda u=u: answers.extend(_top10(u, queries) for _ in range(3)))
                                    for u in urls]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            assert answers == [want] * 6

            milvus_server.stop()
            for u in urls:
                wait_until(lambda u=u: httpx.get(u + "/ready").status_code == 503, timeout=15, what=f"{u}/ready 503")
                lost = httpx.post(u + "/search", json={"query": queries[0], "k": 10}, timeout=30)
                assert lost.status_code == 503 and lost.json()["error"]["type"] == "store_unavailable", lost.text
            milvus_server.start()
            for u in urls:
                wait_until(lambda u=u: httpx.get(u + "/ready").status_code == 200, timeout=120, interval=0.1,
                           what=f"{u}/ready again")
            assert [_top10(u, queries) for u in urls] == [want, want]  # nothing lost, no replica restarted
            assert all(proc.poll() is None for proc, _ in replicas)
        finally:
            for proc, _ in replicas:
                stop_process(proc)
