"""Bad requests get a plain sentence saying what to send instead (415 for the media type, 422 otherwise)."""

import json

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder


@pytest.fixture(scope="module")
def server(toy_index):
    index_dir = toy_index("dhr", count=20)
    app = create_app(ServiceSettings(warmup=False), encoder=FakeEncoder("dhr"), index=load_index(index_dir))
    with LiveServer(app) as live:
        yield live.url


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert set(body) == {"type", "message"}
    return body["message"]


@pytest.mark.parametrize("query", ["", "   ", "\u3000\t"])
def test_blank_query_says_to_send_text_not_a_regex(server, query):
    message = _error(httpx.post(server + "/search", json={"query": query}), 422)
    assert message.startswith("query: is ") and "non-whitespace character" in message
    assert "pattern" not in message and "[^" not in message


def test_blank_text_in_a_batch_names_its_position(server):
    message = _error(httpx.post(server + "/encode", json={"texts": ["fine", " "]}), 422)
    assert message.startswith("texts.1: is blank")


@pytest.mark.parametrize("body", [b'{"query": "gated', b"{'query': 'x'}", b'{"query": "a",}'])
def test_malformed_json_says_where_and_what_to_send(server, body):
    with pytest.raises(json.JSONDecodeError) as decoding:
        json.loads(body)
    response = httpx.post(server + "/search", content=body, headers={"Content-Type": "application/json"})
    message = _error(response, 422)
    assert message.startswith(f"the body is not valid JSON at character {decoding.value.pos}: send one JSON object")
    assert '{"query": ' in message and "JSON decode error" not in message


def test_empty_body_says_what_to_send(server):
    message = _error(httpx.post(server + "/search", headers={"Content-Type": "application/json"}), 422)
    assert message.startswith("the body is empty: send one JSON object")


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/x-www-form-urlencoded"},
                                     {"Content-Type": "text/plain"}])
def test_missing_or_wrong_content_type_is_415_with_the_header_to_send(server, headers):
    response = httpx.post(server + "/search", content=b'{"query": "gated inner product"}', headers=headers)
    message = _error(response, 415)
    assert "Content-Type: application/json" in message


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON", "application/vnd.api+json"])
def test_json_content_types_are_accepted(server, content_type):
    response = httpx.post(server + "/search", content=b'{"query": "gated inner product", "k": 3}',
                          headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 3


def test_server_stays_up_after_bad_requests(server):
    httpx.post(server + "/search", content=b"{", headers={"Content-Type": "application/json"})
    assert httpx.get(server + "/health").status_code == 200


def test_info_says_which_lambda_search_applies(server):
    info = httpx.get(server + "/info").json()
    assert info["search_lambda"] == info["index"]["lam"]
    schema = httpx.get(server + "/openapi.json").json()["components"]["schemas"]
    assert "the index's" in schema["Info"]["properties"]["search_lambda"]["description"]
    role = schema["EncodeRequest"]["properties"]["role"]
    assert role["default"] == "query" and "'query' (the default)" in role["description"]
