"""Cost caps and metrics: /explain and return_text limits, duration buckets, batch vs request timings,
and the refusal to serve keyless on a non-loopback address."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.servers.toy_index import build_toy_index
from densehybrid.index.search.explain import explain
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.metrics import DURATION_BUCKETS, duration_buckets
from densehybrid.service.serve import settings_from
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder
from support.metrics import read_metrics, sample_total

LIMITS = dict(max_explain_hits=6, max_explain_terms=2, max_return_text_bytes=1024, request_timeout_s=45.0)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    encoder = FakeEncoder("dhr")
    index_dir = build_toy_index(encoder, tmp_path_factory.mktemp("limits"))
    index = load_index(index_dir)
    settings = ServiceSettings(index=index_dir, log_json=False, **LIMITS)
    with LiveServer(create_app(settings, encoder=encoder, index=index)) as server:
        yield server.url, encoder, index, index_dir.parent / "corpus.jsonl"


def post(url: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(url + route, json=body, timeout=30)


# ------------------------------------------------------------------ /explain
def test_explanations_list_the_largest_terms_up_to_the_limit(served):
    url, encoder, index, _ = served
    answer = post(url, "/search", {"query": "dense retrieval of passages", "k": 6, "explain": True})
    assert answer.status_code == 200
    query = encoder.encode(["dense retrieval of passages"], "query")
    for hit in answer.json()["results"]:
        full = explain(query, index, index.row_of(hit["id"]), lam=index.lam, vocab_size=encoder.spec.vocab_size or 0)
        listed = [t["token_id"] for t in hit["explanation"]["terms"]]
        assert listed == [t.token_id for t in full.terms][:2]
        assert hit["explanation"]["lexical"] == pytest.approx(float(full.lexical), rel=1e-5)  # sums are untouched


@pytest.mark.parametrize("body", [{"query": "q", "k": 7}, {"queries": ["a", "b"], "k": 4}])
def test_hits_past_the_explain_limit_are_served_without_explanations(served, body):
    # queries x k over max_explain_hits (6) is a valid request (JSON Schema cannot bound a product): the
    # answer is whole, the first 6 hits in answer order are explained and it says so
    url, encoder, index, _ = served
    answer = post(url, "/search", {**body, "explain": True})
    assert answer.status_code == 200, answer.text
    plain = post(url, "/search", {**body, "explain": False}).json()
    nested = [answer.json()["results"]] if "query" in body else answer.json()["results"]
    assert [[(h["id"], h["score"]) for h in hits] for hits in nested] == [
        [(h["id"], h["score"]) for h in hits] for hits in ([plain["results"]] if "query" in body else plain["results"])]
    texts = [body["query"]] if "query" in body else body["queries"]
    in_order = [(text, hit) for text, hits in zip(texts, nested) for hit in hits]
    assert len(in_order) == 8 if "queries" in body else len(in_order) == 7
    for text, hit in in_order[:6]:
        full = explain(encoder.encode([text], "query"), index, index.row_of(hit["id"]), lam=index.lam,
                       vocab_size=encoder.spec.vocab_size or 0)
        assert hit["explanation"]["total"] == pytest.approx(float(full.total), rel=1e-5)
    assert all("explanation" not in hit for _, hit in in_order[6:])
    assert answer.json()["explained"] == {"hits": 6, "unexplained": len(in_order) - 6, "max_explain_hits": 6}
    assert "explained" not in plain


def test_an_answer_under_the_explain_limit_says_every_hit_is_explained(served):
    answer = post(served[0], "/search", {"queries": ["a", "b"], "k": 3, "explain": True}).json()
    assert answer["explained"] == {"hits": 6, "unexplained": 0, "max_explain_hits": 6}
    assert all("explanation" in hit for hits in answer["results"] for hit in hits)


def test_explain_route_lists_at_most_the_limit(served):
    answer = post(served[0], "/explain", {"query": "dense retrieval passage topic", "id": "D3"})
    assert answer.status_code == 200 and len(answer.json()["terms"]) <= 2


# --------------------------------------------------------------- return_text
def _text_bytes(corpus, ids: list[str]) -> int:
    docs = {d["_id"]: d for d in map(json.loads, corpus.read_text().splitlines())}
    return sum(len(docs[i]["title"].encode()) + len(docs[i]["text"].encode()) for i in ids)


def test_returned_text_over_the_limit_is_413(served):
    url, _, _, corpus = served
    ids = [h["id"] for h in post(url, "/search", {"query": "retrieval", "k": 60}).json()["results"]]
    assert _text_bytes(corpus, ids) > 1024  # precondition: the full answer would pass the cap
    answer = post(url, "/search", {"query": "retrieval", "k": 60, "return_text": True})
    assert answer.status_code == 413
    assert answer.json()["error"]["type"] == "payload_too_large" and "limit of 1024 bytes" in answer.json()["error"]["message"]


def test_returned_text_under_the_limit_is_served(served):
    url, _, _, corpus = served
    hits = post(url, "/search", {"query": "retrieval", "k": 5, "return_text": True}).json()["results"]
    assert _text_bytes(corpus, [h["id"] for h in hits]) <= 1024
    docs = {d["_id"]: d for d in map(json.loads, corpus.read_text().splitlines())}
    assert all(h["text"] == docs[h["id"]]["text"] for h in hits)


def test_info_states_the_limits(served):
    limits = httpx.get(served[0] + "/info", timeout=10).json()["limits"]
    assert {k: limits[k] for k in ("max_explain_hits", "max_explain_terms", "max_return_text_bytes")} == {
        k: LIMITS[k] for k in ("max_explain_hits", "max_explain_terms", "max_return_text_bytes")}


# ------------------------------------------------------------------ metrics
@pytest.mark.parametrize("timeout_s", [0.5, 7.0, 10.0, 30.0, 45.0, 1000.0])
def test_duration_buckets_cover_the_timeout_and_resolve_milliseconds(timeout_s):
    buckets = duration_buckets(timeout_s)
    assert list(buckets) == sorted(set(buckets))
    assert buckets[-1] >= timeout_s and buckets[:len(DURATION_BUCKETS)] == DURATION_BUCKETS
    assert buckets[-2] < timeout_s or buckets == DURATION_BUCKETS  # no bucket wasted far past it


def test_live_histograms_end_at_the_configured_timeout(served):
    bounds = {s.labels["le"] for s in read_metrics(served[0])["densehybrid_request_duration_seconds"].samples
              if s.name.endswith("_bucket")}
    assert "45.0" in bounds and "60.0" not in bounds


def test_a_coalesced_search_is_one_batch_observation_and_one_request_observation_each(served):
    url = served[0]
    before = read_metrics(url)
    bodies = [{"query": f"retrieval {i}", "k": 3} for i in range(12)] + [{"queries": ["a", "b", "c"], "k": 3}]
    with ThreadPoolExecutor(8) as pool:
        assert {r.status_code for r in pool.map(lambda b: post(url, "/search", b), bodies)} == {200}
    after = read_metrics(url)

    def delta(sample: str) -> float:
        return sample_total(after, sample) - sample_total(before, sample)

    requests = delta("densehybrid_first_stage_duration_seconds_count")
    batches = delta("densehybrid_search_batch_first_stage_seconds_count")
    assert requests == len(bodies)
    assert batches == delta("densehybrid_search_batch_queries_count")
    assert 1 <= batches <= len(bodies)
    assert delta("densehybrid_search_batch_queries_sum") == 15  # every query once
    assert delta("densehybrid_search_batch_rerank_seconds_count") == batches


# ------------------------------------------------------- keyless service refused
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "search.example.org"])
def test_keyless_service_on_a_reachable_address_is_refused(host):
    with pytest.raises(ValidationError, match="DENSEHYBRID_ALLOW_OPEN=true"):
        ServiceSettings(host=host)
    assert ServiceSettings(host=host, api_key="k").api_key is not None
    assert ServiceSettings(host=host, allow_open=True).api_key is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_keyless_service_on_loopback_is_allowed(host):
    assert ServiceSettings(host=host).api_key is None


def test_allow_open_comes_from_the_environment_or_the_flag(monkeypatch):
    monkeypatch.setenv("DENSEHYBRID_HOST", "0.0.0.0")
    with pytest.raises(ValidationError):
        settings_from({})
    assert settings_from({"allow_open": True}).allow_open
    monkeypatch.setenv("DENSEHYBRID_ALLOW_OPEN", "true")
    assert settings_from({}).allow_open


def test_serve_refuses_before_loading_anything(monkeypatch):
    from densehybrid.cli.main import app

    monkeypatch.delenv("DENSEHYBRID_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--model", "no-such-model"])
    assert result.exit_code == 2 and "DENSEHYBRID_API_KEY" in result.output


def test_serve_refuses_a_keyless_public_host_from_the_environment(monkeypatch):
    """What the image sets (DENSEHYBRID_HOST=0.0.0.0): serve refuses without a key, offline settings do not."""
    from densehybrid.cli.main import app
    from densehybrid.service.settings import OfflineSettings

    monkeypatch.setenv("DENSEHYBRID_HOST", "0.0.0.0")
    monkeypatch.delenv("DENSEHYBRID_API_KEY", raising=False)
    monkeypatch.delenv("DENSEHYBRID_ALLOW_OPEN", raising=False)
    result = CliRunner().invoke(app, ["serve", "--model", "no-such-model"])
    assert result.exit_code == 2 and "no API key set while listening on 0.0.0.0" in result.output
    offline = OfflineSettings()
    assert offline.host == "0.0.0.0" and offline.api_key is None



def test_demo_refuses_a_keyless_public_host_before_indexing(monkeypatch, tmp_path):
    from densehybrid.cli.main import app

    monkeypatch.delenv("DENSEHYBRID_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["demo", "--host", "0.0.0.0", "--dir", str(tmp_path / "demo")])
    assert result.exit_code == 2 and "DENSEHYBRID_ALLOW_OPEN" in result.output
    assert not (tmp_path / "demo").exists()
