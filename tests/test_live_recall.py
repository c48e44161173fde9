"""The recall users get, measured on live traffic: the sampler off the request path (bounded, counted, never
fatal), the first stage's recall against a brute force, /info and /metrics after real searches, and /recall."""

import json
import os
import threading
import time

import httpx
import numpy as np
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.encoder.base import Encoded
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.engines.pqscan_engine import PQScanConfig
from densehybrid.index.search.filters import Eq
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.live_recall import NICENESS, LiveRecall, sampled
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder

COUNT = 2000
WORDS = [f"w{i}" for i in range(60)]
QUERIES = [" ".join(WORDS[(7 * i + 3 * j) % len(WORDS)] for j in range(3)) for i in range(60)]


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- the sampler alone -------------------------------------------------------------
def _queries(n: int) -> Encoded:
    return Encoded(np.arange(n, dtype=np.float32)[:, None])


def test_every_query_is_measured_at_rate_one_and_split_by_filter():
    live = LiveRecall(lambda queries, params: np.array([0.5 if params.filter else 1.0]), rate=1.0, window=100)
    live.start()
    try:
        live.offer(_queries(3), SearchParams())
        live.offer(_queries(2), SearchParams(filter=Eq("lang", "en")))
        _wait_for(lambda: live.measured == 5)
        summary = live.summary()
        assert summary["count"] == 5 and summary["recall_at_10"] == pytest.approx(0.8)
        assert summary["unfiltered"] == {"recall_at_10": 1.0, "count": 3}
        assert summary["filtered"] == {"recall_at_10": 0.5, "count": 2}
        assert live.mean(False) == 1.0 and live.mean(True) == 0.5
    finally:
        live.close()


def test_the_window_keeps_the_latest_samples_only():
    live = LiveRecall(lambda q, p: np.array([float(q.values[0, 0] >= 5)]), rate=1.0, window=5)
    live.start()
    try:
        for i in range(10):
            live.offer(Encoded(np.array([[float(i)]], np.float32)), SearchParams())
            _wait_for(lambda: live.measured == i + 1)
        assert live.summary()["recall_at_10"] == 1.0 and live.summary()["count"] == 5
    finally:
        live.close()


def test_a_full_queue_drops_samples_and_counts_them_without_blocking_the_caller():
    release = threading.Event()
    outcomes = []

    def slow(queries, params):
        release.wait(10)
        return np.ones(len(queries))

    live = LiveRecall(slow, rate=1.0, queue_size=2)
    live.report_to(lambda filtered, recall: None, outcomes.append)
    live.start()
    try:
        started = time.perf_counter()
        for _ in range(10):
            live.offer(_queries(1), SearchParams())
        assert time.perf_counter() - started < 1.0  # never waited for the measuring thread
        # one is being measured, two wait in the queue: the other seven were dropped
        _wait_for(lambda: live.dropped >= 7)
        assert live.dropped in (7, 8) and outcomes.count("dropped") == live.dropped
        release.set()
        _wait_for(lambda: live.measured + live.dropped == 10)
    finally:
        release.set()
        live.close()


def test_a_sample_that_fails_is_counted_and_the_thread_goes_on():
    calls = []

    def flaky(queries, params):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("disk went away")
        return np.array([0.9])

    live = LiveRecall(flaky, rate=1.0)
    live.start()
    try:
        live.offer(_queries(1), SearchParams())
        live.offer(_queries(1), SearchParams())
        _wait_for(lambda: live.measured == 1)
        assert live.failed == 1 and live.summary()["recall_at_10"] == 0.9
    finally:
        live.close()


def test_rate_zero_measures_nothing_and_starts_no_thread():
    live = LiveRecall(lambda q, p: pytest.fail("measured"), rate=0.0)
    live.start()
    live.offer(_queries(100), SearchParams())
    assert live.summary()["count"] == 0 and live.summary()["recall_at_10"] is None and live.dropped == 0
    live.close()


def test_a_rate_draws_about_that_share_of_queries():
    live = LiveRecall(lambda q, p: np.ones(len(q)), rate=0.1, queue_size=10_000, window=10_000, seed=3)
    live.start()
    try:
        for _ in range(50):
            live.offer(_queries(100), SearchParams())
        _wait_for(lambda: live._queue.empty())
        time.sleep(0.1)
        assert 400 <= live.measured <= 600  # 5000 queries at 0.1: 500 expected, 4 sd is about 85
    finally:
        live.close()


@pytest.mark.parametrize("params, kept", [(SearchParams(), True), (SearchParams(first_stage="approx_gip"), False),
                                          (SearchParams(row_limit=100), False)])
def test_only_real_ip_searches_are_sampled(params, kept):
    assert sampled(params) == kept


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_a_rate_outside_zero_to_one_is_refused(rate):
    with pytest.raises(ValueError, match="sample rate"):
        LiveRecall(lambda q, p: np.ones(1), rate=rate)


# -- the measure: the first stage against a brute force ------------------------------------
def _corpus(path):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(COUNT):
            words = " ".join(WORDS[(i * j + i // 7) % len(WORDS)] for j in range(1, 5))
            f.write(json.dumps({"_id": f"D{i}", "text": f"{words} {i}",
                                "metadata": {"lang": "en" if i % 3 else "de"}}) + "\n")
    return path


@pytest.fixture(scope="module")
def pqscan_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("live-recall")
    ann = PQScanConfig(rescore=10, margin=0.0, train_size=COUNT)
    return build_index(FakeEncoder("cls"), _corpus(root / "corpus.jsonl"), root / "pqscan",
                       BuildOptions(progress=False, ann=ann, target_recall=0.95, fields={"lang": "keyword"}))


def _brute_recall(xq, values, found, keep=None):
    scores = xq @ np.asarray(values, np.float32).T
    if keep is not None:
        scores[:, ~keep] = -np.inf
    exact = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    return np.array([len(set(f) & set(e)) / 10 for f, e in zip(found, exact)])


def test_the_first_stage_recall_is_the_share_of_a_brute_force_top_10_it_finds(pqscan_dir):
    index = load_index(pqscan_dir)
    searcher = Searcher(index)
    queries = FakeEncoder("cls").encode(QUERIES, "query")
    for params, keep in [(SearchParams(margin=0.0), None), (SearchParams(margin=0.05), None),
                         (SearchParams(margin=0.0, filter=Eq("lang", "de")), index.select(Eq("lang", "de")).mask)]:
        found = [r[:10] for r in searcher.search(queries, params.but(k=10)).rows]
        want = _brute_recall(queries.values, index.values, found, keep)
        np.testing.assert_allclose(searcher.first_stage_recall(queries, params), want)
    wide = searcher.first_stage_recall(queries, SearchParams(margin=10.0))
    narrow = searcher.first_stage_recall(queries, SearchParams(margin=0.0))
    assert wide.mean() == 1.0 and narrow.mean() < 1.0  # every row rescored: exact; the 10 best codes: not


# -- served: live recall of real searches against an offline comparison of the same answers ---------------------
@pytest.fixture(scope="module")
def client(pqscan_dir):
    settings = ServiceSettings(index=pqscan_dir, max_wait_ms=1, writes=False, recall_sample_rate=1.0,
                               recall_sample_queue=1000, api_key="sekret")
    with LiveServer(create_app(settings, encoder=FakeEncoder("cls"), index=load_index(pqscan_dir))) as live, \
            httpx.Client(base_url=live.url, timeout=30, headers={"Authorization": "Bearer sekret"}) as http:
        yield http


def test_live_recall_in_info_and_metrics_equals_an_offline_comparison_of_the_answers(client, pqscan_dir):
    before = client.get("/info").json()["index"]["first_stage"]["live_recall"]["count"]
    answers = [client.post("/search", json={"query": q, "k": 10, "margin": 0}).json()["results"] for q in QUERIES]
    vectors = np.array(client.post("/encode", json={"texts": QUERIES, "role": "query"}).json()["vectors"], np.float32)
    rows = load_index(pqscan_dir).rows_of
    found = [rows([hit["id"] for hit in hits]) for hits in answers]
    offline = _brute_recall(vectors, load_index(pqscan_dir).values, found)
    _wait_for(lambda: client.get("/info").json()["index"]["first_stage"]["live_recall"]["count"] >= before + len(QUERIES))
    live = client.get("/info").json()["index"]["first_stage"]["live_recall"]
    assert before == 0 and live["count"] == len(QUERIES) and live["dropped"] == live["failed"] == 0
    assert live["unfiltered"]["recall_at_10"] == pytest.approx(offline.mean(), abs=1e-4)
    assert offline.mean() < 1.0  # a first stage that loses rows: the comparison can tell
    metrics = client.get("/metrics").text
    assert f"densehybrid_first_stage_recall_count{{filtered=\"false\",first_stage=\"pqscan\",index=" in metrics
    assert 'densehybrid_first_stage_recall_samples_total{outcome="measured"}' in metrics
    assert "densehybrid_first_stage_recall_target 0.95" in metrics


def test_a_filtered_search_is_measured_over_the_rows_it_keeps(client):
    before = client.get("/info").json()["index"]["first_stage"]["live_recall"]["filtered"]["count"]
    for q in QUERIES[:10]:
        answer = client.post("/search", json={"query": q, "k": 10, "filter": {"field": "lang", "eq": "de"}}).json()
        assert "index" in answer, answer
        assert answer["index"]["first_stage"]["recall_at_10"] is None  # the build measured no filtered search
        assert "filtered" in answer["index"]["first_stage"]["recall_note"]
    _wait_for(lambda: client.get("/info").json()["index"]["first_stage"]["live_recall"]["filtered"]["count"]
              >= before + 10)


def test_recall_on_demand_on_texts_and_on_sampled_rows(client):
    narrow = client.post("/recall", json={"queries": QUERIES[:20], "margin": 0}).json()
    wide = client.post("/recall", json={"queries": QUERIES[:20], "margin": 10}).json()
    assert narrow["queries"] == 20 and len(narrow["per_query"]) == 20 and narrow["recall_at_10"] < 1.0
    assert wide["recall_at_10"] == wide["exact_top10"] == 1.0 and wide["first_stage"]["margin"] == 10
    rows = client.post("/recall", json={"sample": 50, "filter": {"field": "lang", "eq": "en"}}).json()
    assert rows["queries"] == 50 and "sampled rows" in rows["source"] and 0 < rows["recall_at_10"] <= 1
    asked = client.post("/recall", json={"queries": QUERIES[:5], "recall": 0.9}).json()["first_stage"]
    assert "reached" in asked


@pytest.mark.parametrize("body", [{}, {"queries": ["a"], "sample": 3}, {"sample": 0}, {"sample": 10_001},
                                  {"queries": []}, {"queries": ["a"], "nprobe": 0}])
def test_a_malformed_recall_request_is_refused(client, body):
    assert client.post("/recall", json=body).status_code == 422


def test_recall_on_demand_needs_the_api_key(client):
    assert httpx.post(client.base_url.join("/recall"), json={"sample": 5}).status_code == 401


def test_the_sampling_thread_runs_at_the_lowest_priority():
    seen = []

    def measure(queries, params):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return np.ones(1)

    live = LiveRecall(measure, rate=1.0)
    live.start()
    try:
        live.offer(_queries(1), SearchParams())
        _wait_for(lambda: live.measured == 1)
        assert seen == [NICENESS]
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < NICENESS  # the caller's is its own
    finally:
        live.close()
