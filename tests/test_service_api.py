"""The HTTP API (docs/http-api.md) on a live loopback server, driven with httpx, FakeEncoder + a small real index."""

import concurrent.futures
import math

import httpx
import numpy as np
import pytest

from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher
from densehybrid.service.app import create_app
from densehybrid.service.responses import EncodeResponse, SearchResponse
from densehybrid.service.settings import ServiceSettings
from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.search.params import SearchParams

from support.fake_encoder import FakeEncoder
from support.metrics import read_metrics, rejected, sample_total
from support.waiting import wait_until

QUERIES = ["dense retrieval latency", "gated inner product of term weights", "bm25 baseline passage ranking"]


@pytest.fixture(scope="module")
def index_dir(toy_index):
    return toy_index("dhr", count=80)


@pytest.fixture(scope="module")
def server(index_dir):
    settings = ServiceSettings(max_k=50, max_request_texts=8, max_body_bytes=4096, max_wait_ms=5)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index_dir))) as live:
        yield live


@pytest.fixture(scope="module")
def reference(index_dir):
    """The in-process encoder and searcher the server must agree with."""
    return FakeEncoder("dhr"), Searcher(load_index(index_dir))


def assert_error(response, status, error_type=None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"} and body["error"]["message"]
    if error_type:
        assert body["error"]["type"] == error_type
    assert response.headers["x-request-id"]


def assert_serving(client):
    r = client.post("/search", json={"query": "dense retrieval", "k": 3})
    assert r.status_code == 200 and len(r.json()["results"]) == 3


# -- answers equal the in-process encoder + searcher ---------------------------
@pytest.mark.parametrize("params", [
    {},
    {"k": 20, "first_stage": "approx_gip", "theta": 0.2, "candidates": 40},
    {"k": 5, "rerank": False},
    {"k": 7, "lambda": 3.5, "candidates": 10},
])
def test_search_equals_in_process_search(client, reference, params):
    encoder, searcher = reference
    for query in QUERIES:
        r = client.post("/search", json={"query": query, **params})
        assert r.status_code == 200, r.text
        body = r.json()
        k = params.get("k", 10)
        expected = searcher.search(encoder.encode([query], "query"), SearchParams(k=k,
                                   first_stage=params.get("first_stage", "ip"),
                                   candidates=max(k, params.get("candidates", 1000)), theta=params.get("theta", 0.1),
                                   rerank=params.get("rerank", True), lam=params.get("lambda")))
        assert [h["id"] for h in body["results"]] == expected.ids[0]
        assert [h["score"] for h in body["results"]] == expected.scores[0]
        assert [h["rank"] for h in body["results"]] == list(range(1, k + 1))
        assert body["index"] == {"name": "index", "documents": 80, "kind": "dhr",
                                 "first_stage": {"type": "flat", "recall_at_10": 1.0}}


def test_integral_numbers_are_integers(client):
    r = client.post("/search", json={"query": "dense retrieval", "k": 4.0, "candidates": 20.0})
    assert r.status_code == 200 and len(r.json()["results"]) == 4


def test_batch_of_queries_gives_one_list_per_query(client, reference):
    encoder, searcher = reference
    r = client.post("/search", json={"queries": QUERIES, "k": 4})
    assert r.status_code == 200
    expected = searcher.search(encoder.encode(QUERIES, "query"), SearchParams(k=4))
    assert [[h["id"] for h in hits] for hits in r.json()["results"]] == expected.ids


def test_return_text_and_explain(client, index_dir):
    index = load_index(index_dir)
    r = client.post("/search", json={"query": QUERIES[1], "k": 3, "return_text": True, "explain": True})
    assert r.status_code == 200
    for hit in r.json()["results"]:
        doc = index.docs.get(hit["id"])
        assert (hit["title"], hit["text"]) == (doc.title, doc.text)
        explanation = hit["explanation"]
        assert math.isclose(explanation["total"], hit["score"], rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(explanation["lexical"] + explanation["semantic"], explanation["total"], rel_tol=1e-9)
        words = set(doc.text.split())
        assert explanation["terms"] and all(t["term"] in words for t in explanation["terms"])
    # /search skips response_model validation for speed: the body must still match its schema
    assert r.headers["content-type"] == "application/json"
    SearchResponse.model_validate_json(r.content, strict=True)


def test_explain_route_splits_the_score(client, reference):
    encoder, searcher = reference
    query = QUERIES[0]
    top = searcher.search(encoder.encode([query], "query"), SearchParams(k=1))
    r = client.post("/explain", json={"query": query, "id": top.ids[0][0]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == top.ids[0][0]
    assert math.isclose(body["total"], top.scores[0][0], rel_tol=1e-4)
    contributions = [t["contribution"] for t in body["terms"]]
    assert contributions == sorted(contributions, reverse=True)
    assert math.isclose(sum(contributions), body["lexical"], rel_tol=1e-9)
    assert set(body["timing"]) == {"queue_ms", "encode_ms", "explain_ms", "total_ms"}


@pytest.mark.parametrize("role", ["query", "passage"])
def test_encode_equals_in_process_encoder(client, role):
    texts = ["Dense Hybrid representations", "lexical matching with gates", "x " * 500]
    r = client.post("/encode", json={"texts": texts, "role": role})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = FakeEncoder("dhr").encode(texts, role)
    np.testing.assert_array_equal(np.asarray(body["vectors"], dtype=np.float32), expected.values)
    np.testing.assert_array_equal(np.asarray(body["gates"], dtype=np.uint8), expected.gates)
    assert (body["dim"], body["gated_dim"], body["kind"], body["role"]) == (896, 768, "dhr", role)
    assert body["truncated"] == [False, False, True]
    assert set(body["timing"]) == {"queue_ms", "tokenize_ms", "encode_ms", "total_ms"}
    assert set(parse_server_timing(r.headers["server-timing"])) == {"queue", "tokenize", "encode", "total", "serialize"}
    # /encode skips response_model validation for speed: the body must still match its schema
    assert r.headers["content-type"] == "application/json"
    EncodeResponse.model_validate_json(r.content, strict=True)


# -- timing, headers, info, metrics -------------------------------------------------
def parse_server_timing(header):
    stages = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        key, _, value = params.partition("=")
        assert key == "dur"
        stages[name] = float(value)
    return stages


def test_timing_body_and_server_timing_header_agree(client):
    r = client.post("/search", json={"query": "query latency"})
    timing = r.json()["timing"]
    assert set(timing) == {"queue_ms", "encode_ms", "search_ms", "rerank_ms", "total_ms"}
    assert all(v >= 0 for v in timing.values()) and timing["total_ms"] >= timing["encode_ms"]
    stages = parse_server_timing(r.headers["server-timing"])
    # the header also carries the serialization of the body it cannot be part of
    assert stages.pop("serialize") >= 0
    assert stages == {name.removesuffix("_ms"): value for name, value in timing.items()}
    for response in (client.get("/info"), client.post("/search", json={"query": ""})):
        assert set(parse_server_timing(response.headers["server-timing"])) == {"total"}


def test_request_id_is_echoed_or_made(client):
    assert client.get("/health", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    made = {client.get("/health").headers["x-request-id"] for _ in range(3)}
    assert len(made) == 3
    assert client.get("/health", headers={"X-Request-ID": "bad id\twith spaces"}).headers["x-request-id"] != "bad id"


def test_health_ready_info(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"ready": True, "status": "ready"}
    info = client.get("/info").json()
    assert info["model"]["kind"] == "dhr" and info["model"]["dim"] == 896 and info["model"]["skip_mlm"] is False
    assert info["model"]["max_query_length"] == 32 and "truncated" in info["model"]["truncation"]
    assert info["index"]["documents"] == 80 and info["limits"]["max_k"] == 50


METRIC_FAMILIES = {
    "densehybrid_requests": "counter", "densehybrid_request_duration_seconds": "histogram",
    "densehybrid_encode_duration_seconds": "histogram", "densehybrid_first_stage_duration_seconds": "histogram",
    "densehybrid_rerank_duration_seconds": "histogram", "densehybrid_queue_wait_seconds": "histogram",
    "densehybrid_queue_depth": "gauge", "densehybrid_batch_size": "histogram",
    "densehybrid_batch_tokens": "histogram", "densehybrid_rejected": "counter",
    "densehybrid_index_documents": "gauge", "densehybrid_index_dims": "gauge",
    "densehybrid_model_info": "gauge",  # an Info metric is exported as a gauge named *_info
}


def test_metrics_expose_every_family(client):
    client.post("/search", json={"query": "faiss flat index", "first_stage": "approx_gip"})
    client.post("/search", json={"query": "faiss flat index", "k": 0})
    families = read_metrics(client)
    for name, kind in METRIC_FAMILIES.items():
        assert name in families and families[name].type == kind, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("densehybrid_index_documents", ())] == 80
    assert samples[("densehybrid_index_dims", ())] == 896
    assert samples[("densehybrid_requests_total", (("route", "/search"), ("status", "422")))] >= 1
    assert samples[("densehybrid_first_stage_duration_seconds_count", (("first_stage", "approx_gip"),))] >= 1
    info = families["densehybrid_model_info"].samples[0]
    assert info.value == 1
    assert info.labels == {"kind": "dhr", "model_id": "fake-dhr", "device": "cpu", "skip_mlm": "false", "backend": "torch",
                           "precision": "fp32", "index_precision": "fp32"}


# -- errors (docs/http-api.md): status, JSON body, and the next request still works ----------
@pytest.mark.parametrize("body", [
    {"query": ""}, {"query": "   \n\t"}, {"query": "\u0085\u00a0\u3000\ufeff\x1c"}, {"query": "x", "k": 0}, {"query": "x", "k": -3}, {"query": "x", "k": 51},
    {"query": "x", "first_stage": "hnsw"}, {"query": "x", "candidates": 0}, {"query": "x", "theta": -1},
    {"query": "x", "theta": "NaN"}, {"query": "x", "lambda": "Infinity"}, {"query": "x", "k": "ten"},
    {"query": "x", "queries": ["y"]}, {}, {"queries": []}, {"query": "x", "unknown_field": 1},
    {"query": ["not", "a", "string"]}, {"query": "x", "k": 1e30}, {"query": "x", "k": 2.5}, {"query": "x", "k": "5"},
    {"query": "x", "k": True}, {"query": "x", "lambda": True}, {"query": "x", "lambda": -0.5},
    {"query": "x", "rerank": "true"}, {"query": "x", "explain": 1}, {"query": None, "queries": ["y"]},
])
def test_invalid_search_fields_are_422(client, body):
    assert_error(client.post("/search", json=body), 422, "invalid_request")
    assert_serving(client)


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\x00", b'{"query": "\xff"}', b"[1, 2]", b"null"])
def test_malformed_bodies_are_422(client, raw):
    r = client.post("/search", content=raw, headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_request")
    assert_serving(client)


def test_oversized_body_and_batches_are_413(client):
    assert_error(client.post("/encode", json={"texts": ["word " * 2000]}), 413, "payload_too_large")
    chunks = (b'{"texts": ["' + b"a" * 1000 + b'"' for _ in range(8))  # streamed: no Content-Length
    assert_error(client.post("/encode", content=chunks, headers={"content-type": "application/json"}), 413)
    assert_error(client.post("/search", json={"queries": ["q"] * 9}), 413, "payload_too_large")
    assert_error(client.post("/encode", json={"texts": ["t"] * 9}), 413, "payload_too_large")
    assert_serving(client)


def test_unknown_document_and_route_are_404(client):
    assert_error(client.post("/explain", json={"query": "x", "id": "no-such-doc"}), 404, "not_found")
    assert_error(client.get("/no/such/route"), 404, "not_found")
    assert_error(client.get("/search"), 405)
    assert_serving(client)


def test_concurrent_encodes_share_forwards_and_get_their_own_vectors(index_dir):
    encoder = FakeEncoder("dhr", delay_s=0.03)
    settings = ServiceSettings(max_batch_size=16, max_wait_ms=5)
    texts = [f"concurrent client {i} asks about " + " ".join(f"w{j}" for j in range(i % 5)) for i in range(32)]
    with LiveServer(create_app(settings, encoder=encoder, index=load_index(index_dir))) as live:
        forwards_before = len(encoder.batch_sizes)

        def one(text):
            with httpx.Client(base_url=live.url, timeout=30) as c:
                return c.post("/encode", json={"texts": [text]}).json()

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(one, texts))
        with httpx.Client(base_url=live.url) as c:
            families = read_metrics(c)
    forwards = len(encoder.batch_sizes) - forwards_before
    assert forwards < len(texts)
    batch_count = sample_total(families, "densehybrid_batch_size_count")
    batch_sum = sample_total(families, "densehybrid_batch_size_sum")
    assert batch_count == forwards_before + forwards and batch_sum == forwards_before + len(texts)
    alone = FakeEncoder("dhr")
    for text, answer in zip(texts, answers):
        np.testing.assert_array_equal(np.asarray(answer["vectors"], np.float32), alone.encode([text], "query").values)


def test_full_queue_is_429_with_retry_after_and_recovers():
    encoder = FakeEncoder("cls", delay_s=0.3)
    settings = ServiceSettings(queue_size=2, max_batch_size=1, retry_after_s=2, warmup=False)
    with LiveServer(create_app(settings, encoder=encoder)) as live:
        def one(i):
            with httpx.Client(base_url=live.url, timeout=30) as c:
                return c.post("/encode", json={"texts": [f"text {i}"]})

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(one, range(8)))
        refused = [r for r in responses if r.status_code == 429]
        # at least the two the queue holds are accepted (a third when the worker already took one off the
        # queue; under load the whole burst can arrive before it does)
        assert refused and len(refused) <= 8 - 2
        for r in refused:
            assert_error(r, 429, "overloaded")
            assert r.headers["retry-after"] == "2"
        assert all(r.status_code in (200, 429) for r in responses)
        with httpx.Client(base_url=live.url, timeout=30) as c:
            assert c.post("/encode", json={"texts": ["after the burst"]}).status_code == 200
            assert rejected(c)["queue_full"] == len(refused)
            assert live.app.state.runtime.batcher.depth == 0


def test_failed_forward_is_500_for_its_batch_only():
    encoder = FakeEncoder("dhr")
    encoder.fail_when = lambda items: any(encoder.term(t) == "boom" for i in items for t in i.ids["hash"])
    with LiveServer(create_app(ServiceSettings(), encoder=encoder)) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        assert_error(c.post("/encode", json={"texts": ["this will go boom"]}), 500, "encoder_error")
        ok = c.post("/encode", json={"texts": ["this works"]})
        assert ok.status_code == 200
        np.testing.assert_array_equal(np.asarray(ok.json()["vectors"], np.float32),
                                      FakeEncoder("dhr").encode(["this works"], "query").values)
        assert live.app.state.runtime.batcher.alive


def test_encode_only_server_answers_503_for_search():
    with LiveServer(create_app(ServiceSettings(), encoder=FakeEncoder("cls"))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        assert_error(c.post("/search", json={"query": "x"}), 503, "no_index")
        assert_error(c.post("/explain", json={"query": "x", "id": "D1"}), 503, "no_index")
        assert c.get("/info").json()["index"] is None
        assert c.post("/encode", json={"texts": ["still encodes"]}).status_code == 200


def test_not_ready_until_warm_up_is_done(index_dir):
    encoder = FakeEncoder("dhr", delay_s=1.0)  # the warm-up forward takes a second
    app = create_app(ServiceSettings(), encoder=encoder, index=load_index(index_dir))
    with LiveServer(app, wait_ready=False) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get("/health").status_code == 200
        r = c.get("/ready")
        assert r.status_code == 503 and r.json()["ready"] is False
        assert_error(c.post("/search", json={"query": "x"}), 503, "not_ready")
        assert_error(c.post("/encode", json={"texts": ["x"]}), 503, "not_ready")


def test_api_key_guards_all_but_health_ready_metrics(index_dir):
    settings = ServiceSettings(api_key="s3cret-key")
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index_dir))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        for path in ("/health", "/ready", "/metrics"):
            assert c.get(path).status_code == 200, path
        for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"},
                    {"Authorization": "Basic s3cret-key"}, {"Authorization": "Bearer s3cret-key-and-more"}):
            assert_error(c.get("/info", headers=bad), 401, "unauthorized")
            assert_error(c.post("/search", json={"query": "x"}, headers=bad), 401, "unauthorized")
            assert_error(c.post("/encode", json={"texts": ["x"]}, headers=bad), 401)
            assert_error(c.post("/explain", json={"query": "x", "id": "D1"}, headers=bad), 401)
            assert_error(c.get("/docs", headers=bad), 401)
            assert_error(c.get("/openapi.json", headers=bad), 401)
        good = {"Authorization": "Bearer s3cret-key"}
        assert c.get("/info", headers=good).status_code == 200
        assert c.post("/search", json={"query": "x"}, headers=good).status_code == 200
        assert c.get("/openapi.json", headers=good).status_code == 200


def test_access_log_is_one_json_line_with_id_route_status_and_stage_times(client, caplog):
    import json
    import logging

    from densehybrid.service.logging import ACCESS_LOGGER, JsonFormatter

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    client.post("/search", json={"query": "passage ranking"}, headers={"X-Request-ID": "log-me-1"})
    # the line is written just after the response is sent
    records = wait_until(lambda: [r for r in caplog.records if r.name == ACCESS_LOGGER
                                  and r.fields["request_id"] == "log-me-1"], timeout=5, what="the access log line")
    assert len(records) == 1
    line = json.loads(JsonFormatter().format(records[0]))
    assert (line["route"], line["status"], line["method"]) == ("/search", 200, "POST")
    assert set(line["timing"]) == {"queue_ms", "encode_ms", "search_ms", "rerank_ms", "total_ms", "serialize_ms"}
    assert line["duration_ms"] >= line["timing"]["total_ms"]
