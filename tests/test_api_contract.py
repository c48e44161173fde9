"""The HTTP contract around routing and limits: 405 with ``Allow`` before any body check, the
OpenAPI document stating the running server's limits, and inputs the schema allows being accepted."""

import httpx
import pytest

from support.fake_encoder import FakeEncoder
from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.servers.toy_index import build_toy_index
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

LIMITS = dict(max_k=37, max_candidates=321, max_request_texts=5, max_write_documents=3, max_document_chars=777)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    index_dir = build_toy_index(FakeEncoder("dlr"), tmp_path_factory.mktemp("contract-index"), count=20)
    settings = ServiceSettings(index=index_dir, **LIMITS)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dlr"), index=load_index(index_dir))) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client


@pytest.mark.parametrize(("path", "allow"), [("/health", "GET"), ("/ready", "GET"), ("/info", "GET"),
                                             ("/metrics", "GET"), ("/v1/models", "GET"),
                                             ("/documents/D1", "DELETE, GET")])
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_an_undeclared_method_is_405_with_allow_whatever_the_body(live, path, allow, method):
    # no Content-Type: the 415 check must not answer before routing does
    response = live.request(method, path, content=b"not json")
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow
    error = response.json()["error"]
    assert "method_not_allowed" in (error["type"], error.get("code")), error  # OpenAI's routes: in `code`


def test_allow_lists_every_route_sharing_a_path(live):
    # the search page (GET) and TEI's generic embed (POST) both live at /
    response = live.options("/")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"
    declared = live.get("/openapi.json").json()["paths"]["/"]
    assert set(declared) == {"get", "post"}


def test_a_declared_method_still_checks_the_content_type(live):
    assert live.get("/search").headers["allow"] == "POST"
    response = live.post("/search", content=b'{"query": "x"}', headers={"content-type": "text/plain"})
    assert response.status_code == 415


def _body_schema(spec: dict, path: str) -> dict:
    ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_openapi_states_the_running_servers_limits(live):
    spec = live.get("/openapi.json").json()
    search = _body_schema(spec, "/search")["properties"]
    assert search["k"]["maximum"] == LIMITS["max_k"] and search["k"]["minimum"] == 1
    assert search["candidates"]["maximum"] == LIMITS["max_candidates"]
    assert search["queries"]["maxItems"] == LIMITS["max_request_texts"]
    assert (search["theta"]["minimum"], search["theta"]["maximum"]) == (0, 1e6)
    assert _body_schema(spec, "/encode")["properties"]["texts"]["maxItems"] == LIMITS["max_request_texts"]
    documents = _body_schema(spec, "/documents")["properties"]["documents"]
    assert documents["maxItems"] == LIMITS["max_write_documents"]
    new_document = spec["components"]["schemas"]["NewDocument"]["properties"]
    assert new_document["text"]["maxLength"] == new_document["title"]["maxLength"] == LIMITS["max_document_chars"]
    for path in ("/search", "/encode", "/documents"):
        assert {"413", "422", "429", "503"} <= set(spec["paths"][path]["post"]["responses"]), path


def test_a_batch_over_the_declared_limit_is_413_and_at_the_limit_is_200(live):
    at_limit = live.post("/encode", json={"texts": ["a"] * LIMITS["max_request_texts"]})
    over = live.post("/encode", json={"texts": ["a"] * (LIMITS["max_request_texts"] + 1)})
    assert (at_limit.status_code, over.status_code) == (200, 413)


def test_lone_surrogates_are_accepted_as_replacement_characters(live):
    # a JSON string may escape a lone surrogate; the schema's strings allow it
    body = b'{"documents": [{"id": "s\\ud800", "text": "lone \\udfff surrogate"}]}'
    written = live.post("/documents", content=body, headers={"content-type": "application/json"})
    assert written.status_code == 200, written.text
    assert written.json()["ids"] == ["s\ufffd"]
    stored = live.get("/documents/s\ufffd").json()
    assert stored["text"] == "lone \ufffd surrogate"
    found = live.post("/search", content=b'{"query": "\\ud83d alone"}', headers={"content-type": "application/json"})
    assert found.status_code == 200, found.text


def test_an_id_given_twice_in_one_write_keeps_its_last_document(live):
    written = live.post("/documents", json={"documents": [{"id": "twice", "text": "first"},
                                                          {"id": "other", "text": "other"},
                                                          {"id": "twice", "text": "second"}]})
    assert written.status_code == 200, written.text
    assert written.json()["ids"] == ["twice", "other"]
    assert live.get("/documents/twice").json()["text"] == "second"
