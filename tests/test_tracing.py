"""OpenTelemetry tracing: the spans a served request sends to a real OTLP/HTTP receiver, and nothing when off."""

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.service.startup import StartupError, build_runtime
from densehybrid.service.tracing import traces_url

from support.fake_encoder import FakeEncoder
from support.otlp_receiver import OtlpReceiver

SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
STATUS_ERROR = 2
STAGES = ["tokenize", "queue", "encode", "first_stage", "rerank", "serialize"]
ROUNDING_MS = 0.01  # the response's times are rounded to 1 µs, span times truncated to 1 ns


@pytest.fixture(scope="module")
def index_dir(toy_index):
    return toy_index("dhr", count=40)


def traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def children(spans, parent):
    return {s.name: s for s in spans if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id}


def test_a_search_sends_its_request_and_stage_spans_to_an_otlp_receiver(index_dir):
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    unsampled_trace = secrets.token_hex(16)
    index = load_index(index_dir)
    with OtlpReceiver() as receiver:
        settings = ServiceSettings(warmup=False, otlp_endpoint=receiver.url, otlp_service_name="search-under-test")
        with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=index)) as live, \
                httpx.Client(base_url=live.url, timeout=30) as client:
            searched = client.post("/search", json={"query": "lexical semantic query", "k": 3, "candidates": 12},
                                   headers={"traceparent": traceparent(caller_trace, caller_span)})
            encoded = client.post("/encode", json={"texts": ["a passage", "another one"], "role": "passage"})
            refused = client.post("/search", json={"query": "q", "k": 0})
            unsampled = client.post("/search", json={"query": "not traced"},
                                    headers={"traceparent": traceparent(unsampled_trace, caller_span, sampled=False)})
            malformed = client.post("/search", json={"query": "malformed"}, headers={"traceparent": "00-zz-01"})
        # the server has stopped: its exporter sent what was queued before it returned
        spans = receiver.received()
        posts = receiver.requests
    assert [r.status_code for r in (searched, encoded, unsampled, malformed)] == [200] * 4
    assert refused.status_code == 422
    assert posts and all(p["path"] == "/v1/traces" and p["content_type"] == "application/x-protobuf" for p in posts)

    # the request span continues the caller's trace, as a child of the caller's span
    (request,) = [s for s in spans if s.name == "POST /search" and s.trace_id == caller_trace]
    assert request.parent_span_id == caller_span and request.kind == SERVER_KIND
    assert request.resource["service.name"] == "search-under-test"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["http.route"] == "/search"
    assert request.attributes["densehybrid.request_id"] == searched.headers["x-request-id"]
    assert request.attributes["densehybrid.k"] == 3 and request.attributes["densehybrid.hits"] == 3
    assert request.attributes["densehybrid.index"] == index.name

    stages = children(spans, request)
    assert sorted(stages) == sorted(STAGES)
    assert {s.trace_id for s in spans if s.trace_id == caller_trace} == {caller_trace}
    assert len([s for s in spans if s.trace_id == caller_trace]) == 1 + len(STAGES)
    # one after the other, inside the request span (ns truncation: 1 µs of slack)
    ordered = [stages[name] for name in STAGES]
    assert request.start_ns - 1000 <= ordered[0].start_ns and ordered[-1].end_ns <= request.end_ns + 1000
    for before, after in zip(ordered, ordered[1:]):
        assert before.end_ns <= after.start_ns + 1000, (before.name, after.name)
    # their durations are the times the response reports
    timing = searched.json()["timing"]
    assert timing["rerank_ms"] > 0
    for name, field in [("queue", "queue_ms"), ("encode", "encode_ms"), ("first_stage", "search_ms"),
                        ("rerank", "rerank_ms")]:
        assert stages[name].duration_ms == pytest.approx(timing[field], abs=ROUNDING_MS), name
    assert request.duration_ms >= timing["total_ms"] - ROUNDING_MS
    assert all(s.duration_ms >= 0 for s in ordered)
    first = stages["first_stage"].attributes
    assert (first["densehybrid.k"], first["densehybrid.candidates"], first["densehybrid.first_stage"]) == (3, 12, "ip")
    assert first["densehybrid.index"] == index.name and first["densehybrid.search.group_queries"] == 1
    assert stages["encode"].attributes["densehybrid.batch.texts"] == 1
    assert stages["tokenize"].attributes["densehybrid.texts"] == 1

    # a request without traceparent starts its own trace
    (encode_span,) = [s for s in spans if s.name == "POST /encode"]
    assert encode_span.parent_span_id == "" and encode_span.trace_id != caller_trace
    encode_stages = children(spans, encode_span)
    assert sorted(encode_stages) == ["encode", "queue", "serialize", "tokenize"]
    assert encode_stages["encode"].attributes["densehybrid.role"] == "passage"
    assert encode_stages["encode"].duration_ms == pytest.approx(encoded.json()["timing"]["encode_ms"], abs=ROUNDING_MS)

    # a refused request is traced, without stages; a caller that does not sample is not traced here either
    (refused_span,) = [s for s in spans if s.name == "POST /search" and s.attributes["http.response.status_code"] == 422]
    assert children(spans, refused_span) == {}
    assert not [s for s in spans if s.trace_id == unsampled_trace]
    # a traceparent that does not parse is ignored: the request starts its own trace
    (malformed_span,) = [s for s in spans if s.attributes.get("densehybrid.request_id") == malformed.headers["x-request-id"]]
    assert malformed_span.parent_span_id == "" and sorted(children(spans, malformed_span)) == sorted(STAGES)


@pytest.mark.slow  # the exporter retries the dead collector until its timeout before the server stops
def test_a_collector_that_is_down_fails_no_request_and_does_not_hold_the_server(index_dir):
    with OtlpReceiver() as gone:  # a free port, closed again: nothing listens there
        endpoint = gone.url
    settings = ServiceSettings(warmup=False, otlp_endpoint=endpoint)
    live = LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index_dir)))
    with live, httpx.Client(base_url=live.url, timeout=30) as client:
        statuses = [client.post("/search", json={"query": f"query {i}", "k": 2}).status_code for i in range(5)]
    assert statuses == [200] * 5
    assert not live._thread.is_alive(), "the server stopped (its exporter gave up on the collector)"


def test_a_batch_of_concurrent_searches_gives_each_request_its_own_encode_span(index_dir):
    """The worker encodes concurrent requests in one forward: each trace shows it, with the batch's size."""
    import concurrent.futures

    with OtlpReceiver() as receiver:
        settings = ServiceSettings(warmup=False, otlp_endpoint=receiver.url)
        encoder = FakeEncoder("dhr", delay_s=0.05)  # forwards slow enough for requests to queue behind them
        with LiveServer(create_app(settings, encoder=encoder, index=load_index(index_dir))) as live:
            def one(i):
                with httpx.Client(base_url=live.url, timeout=30) as client:
                    answer = client.post("/search", json={"query": f"query {i}", "k": 2})
                    return answer.headers["x-request-id"], answer.json()["timing"]

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                timings = dict(pool.map(one, range(8)))
        spans = receiver.received()
    requests = [s for s in spans if s.name == "POST /search"]
    assert len(requests) == 8 and len({s.trace_id for s in requests}) == 8
    encodes = [children(spans, r)["encode"] for r in requests]
    batch_sizes = [e.attributes["densehybrid.batch.texts"] for e in encodes]
    assert max(encoder.batch_sizes) > 1 and sorted(batch_sizes) == sorted(
        size for size in encoder.batch_sizes for _ in range(size))
    # each request's encode span is the forward its response reports, shared with the rest of its batch
    for request, encode in zip(requests, encodes):
        timing = timings[request.attributes["densehybrid.request_id"]]
        assert encode.duration_ms == pytest.approx(timing["encode_ms"], abs=ROUNDING_MS)


def test_without_an_endpoint_no_opentelemetry_sdk_is_loaded_or_built(index_dir):
    script = f"""
import json
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from fastapi.testclient import TestClient
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from support.fake_encoder import FakeEncoder

app = create_app(ServiceSettings(warmup=False), encoder=FakeEncoder("dhr"), index=load_index({str(index_dir)!r}))
with TestClient(app) as client:
    status = client.post("/search", json={{"query": "q", "k": 2}},
                         headers={{"traceparent": "00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}}).status_code
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))
print(json.dumps({{"status": status, "tracing": app.state.runtime.tracing is not None, "loaded": loaded}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DENSEHYBRID_", "OTEL_"))}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"status": 200, "tracing": False, "loaded": []}


def test_an_endpoint_without_the_sdk_installed_stops_start_up_with_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # import fails as if not installed
    settings = ServiceSettings(warmup=False, otlp_endpoint="http://127.0.0.1:4318")
    with pytest.raises(StartupError, match=r"densehybrid\[otel\]"):
        build_runtime(settings, FakeEncoder("cls"))


@pytest.mark.parametrize("endpoint", ["localhost:4318", "grpc://collector:4317", "http://", "not a url"])
def test_an_endpoint_that_is_not_an_http_url_is_refused(endpoint):
    with pytest.raises(ValidationError, match="otlp_endpoint"):
        ServiceSettings(otlp_endpoint=endpoint)


def test_the_endpoint_comes_from_the_environment_and_an_empty_one_means_off(monkeypatch):
    monkeypatch.setenv("DENSEHYBRID_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("DENSEHYBRID_OTLP_SERVICE_NAME", "retrieval")
    settings = ServiceSettings()
    assert (settings.otlp_endpoint, settings.otlp_service_name) == ("http://collector:4318", "retrieval")
    monkeypatch.setenv("DENSEHYBRID_OTLP_ENDPOINT", "")
    assert ServiceSettings().otlp_endpoint is None


@pytest.mark.parametrize("endpoint, url", [
    ("http://collector:4318", "http://collector:4318/v1/traces"),
    ("http://collector:4318/", "http://collector:4318/v1/traces"),
    ("https://otel.example.com/custom/traces", "https://otel.example.com/custom/traces"),
])
def test_a_bare_collector_url_gets_the_traces_path(endpoint, url):
    assert traces_url(endpoint) == url
