"""Security of the HTTP edge (docs/http-api.md): no request-supplied paths, CORS off unless configured, body
limits enforced before parsing, the API key protecting what it should and never leaking.

Already in tests/test_service_api.py, not repeated: 401 on every guarded route for a missing/wrong key,
/health, /ready, /metrics open, 413 for a body sent in full over the limit.
"""

import json
import logging
import re
import select
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.bench.servers.start import LiveServer

from support.fake_encoder import FakeEncoder

KEY = "k3y-that-must-never-leak-0123456789"
LIMIT = 4096
PATH_LIKE_NAME = re.compile(r"path|file|dir|folder|url|uri|model|index|location|dest|source|config|load|save",
                            re.IGNORECASE)

# fields the client protocols name (OpenAI's and Cohere's `model`, TEI's `source_sentence` and
# `truncation_direction`): a model name is only compared with the served model's id, a sentence is text,
# the direction the literal "Right"; the test below sends a path as model
CLIENT_PROTOCOL_NAMES = {"model", "source_sentence", "truncation_direction"}


@pytest.fixture(scope="module")
def index(toy_index):
    return load_index(toy_index("dhr", count=20))


@pytest.fixture(scope="module")
def server(index):
    settings = ServiceSettings(max_body_bytes=LIMIT, api_key=KEY)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=index)) as live:
        yield live


AUTH = {"Authorization": f"Bearer {KEY}"}


# -- no endpoint reads or writes a path it was given -------------------------------------------
def _request_fields(schema: dict) -> list[tuple[str, str, dict]]:
    """(operation, field name, field schema) of every parameter and request-body property."""
    components = schema["components"]["schemas"]

    def resolve(node):
        return components[node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node

    fields = []
    for route, methods in schema["paths"].items():
        for method, op in methods.items():
            where = f"{method.upper()} {route}"
            fields += [(where, p["name"], p.get("schema", {})) for p in op.get("parameters", [])]
            for media in op.get("requestBody", {}).get("content", {}).values():
                body = resolve(media["schema"])
                for variant in [body, *body.get("oneOf", []), *body.get("anyOf", [])]:
                    fields += [(where, name, prop) for name, prop in resolve(variant).get("properties", {}).items()]
    return fields


def test_no_route_takes_a_path_or_url(server):
    schema = httpx.get(server.url + "/openapi.json", headers=AUTH).json()
    # the one path parameter is a document id, looked up in the index, never opened
    assert [route for route in schema["paths"] if "{" in route] == ["/documents/{doc_id}"]
    fields = _request_fields(schema)
    assert {name for _, name, _ in fields} >= {"query", "queries", "texts", "id", "k"}  # the scan sees the bodies
    suspicious = [(op, name) for op, name, prop in fields
                  if (PATH_LIKE_NAME.search(name) and name not in CLIENT_PROTOCOL_NAMES)
                  or prop.get("format") in ("path", "uri", "file", "binary")]
    assert suspicious == []
    # and what a route could be tricked into: unknown fields are refused, ids are looked up, never opened
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        for body in ({"query": "x", "index": "/etc"}, {"query": "x", "model": "/etc/passwd"},
                     {"texts": ["x"], "path": "/tmp/out"}):
            route = "/encode" if "texts" in body else "/search"
            assert c.post(route, json=body).status_code == 422
        for route, body in (("/v1/embeddings", {"input": "x"}), ("/v2/rerank", {"query": "x", "documents": ["y"]})):
            r = c.post(route, json={**body, "model": "/etc/passwd"})  # a name compared, never loaded
            assert r.status_code == 404 and "fake-dhr" in r.json()["error"]["message"]
        r = c.post("/explain", json={"query": "x", "id": "../../../../etc/passwd"})
        assert r.status_code == 404 and "root:" not in r.text
        r = c.get("/documents/..%2F..%2F..%2Fetc%2Fpasswd")
        assert r.status_code == 404 and "root:" not in r.text


# -- CORS ---------------------------------------------------------------------------------------
def preflight(url: str, origin: str, headers: dict | None = None) -> httpx.Response:
    return httpx.options(url + "/search", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                   "Access-Control-Request-Headers": "authorization,content-type",
                                                   **(headers or {})})


def test_cors_is_off_by_default(server):
    r = preflight(server.url, "https://evil.example")
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    r = httpx.post(server.url + "/search", json={"query": "x"}, headers={**AUTH, "Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_cors_allows_exactly_the_configured_origins_even_with_an_api_key(index):
    settings = ServiceSettings(cors_origins=["https://app.example"], api_key=KEY)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=index)) as live:
        ok = preflight(live.url, "https://app.example")  # browsers send preflights without credentials
        assert ok.status_code == 200, ok.text
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        r = httpx.post(live.url + "/search", json={"query": "x"}, headers={**AUTH, "Origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        other = preflight(live.url, "https://evil.example")
        assert other.status_code >= 400 and "access-control-allow-origin" not in other.headers
        assert httpx.post(live.url + "/search", json={"query": "x"},  # a preflight does not open the route itself
                          headers={"Origin": "https://app.example"}).status_code == 401


# -- body limits before parsing -------------------------------------------------------------------
def raw_exchange(url: str, head: bytes, body_chunks, timeout_s: float = 10.0) -> tuple[bytes, int]:
    """Send ``head`` then chunks until the server answers; returns (response head, body bytes sent)."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    sent = 0
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(head)
        deadline = time.monotonic() + timeout_s
        for chunk in body_chunks:
            if select.select([sock], [], [], 0)[0] or time.monotonic() > deadline:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        answer = b""
        while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
            if not select.select([sock], [], [], 0.5)[0]:
                continue
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return answer, sent


def request_head(url: str, extra: str) -> bytes:
    netloc = urlsplit(url).netloc
    return (f"POST /encode HTTP/1.1\r\nHost: {netloc}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


def test_huge_content_length_is_refused_before_any_body_is_read(server):
    started = time.monotonic()
    answer, _ = raw_exchange(server.url, request_head(server.url, "Content-Length: 1000000000\r\n"), [])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert time.monotonic() - started < 5  # answered from the header alone, not after a read timeout


def test_chunked_body_is_cut_off_at_the_limit_not_read_to_the_end(server):
    chunk = 8192
    piece = b"%x\r\n" % chunk + b"a" * chunk + b"\r\n"
    endless = (b'5\r\n{"tex\r\n' if i == 0 else piece for i in range(100_000))  # ~800 MB if read to the end
    answer, sent = raw_exchange(server.url, request_head(server.url, "Transfer-Encoding: chunked\r\n"), endless)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 32_000_000  # ~800 MB offered; what got through is the limit plus loopback socket buffers
    assert httpx.post(server.url + "/encode", json={"texts": ["still serving"]}, headers=AUTH).status_code == 200


def test_body_limit_applies_to_unauthenticated_requests_too(server):
    answer, _ = raw_exchange(server.url, request_head(server.url, "Content-Length: 1000000000\r\n")
                             .replace(KEY.encode(), b"wrong"), [])
    assert answer.startswith((b"HTTP/1.1 401", b"HTTP/1.1 413")), answer[:200]


# -- the API key ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/health/", "//search", "/HEALTH", "/health/../info", "/metrics/../info",
                                  "/docs", "/redoc", "/docs/oauth2-redirect", "/openapi.json"])
def test_no_path_spelling_slips_past_the_key(server, path):
    r = httpx.get(server.url + path, headers={"Authorization": "Bearer wrong"})
    assert r.status_code in (401, 404), (path, r.status_code)
    r = httpx.post(server.url + path, json={"query": "x", "texts": ["x"]})
    assert r.status_code in (401, 404, 405), (path, r.status_code)
    assert "results" not in r.text and "vectors" not in r.text


def test_the_key_never_appears_in_answers_or_logs(index, caplog):
    settings = ServiceSettings(api_key=KEY)
    with caplog.at_level(logging.DEBUG), \
            LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=index)) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        answers = [c.get("/info", headers=AUTH).text, c.get("/metrics").text, c.get("/ready").text,
                   c.get("/openapi.json", headers=AUTH).text, c.post("/search", json={"query": KEY}).text,
                   c.get("/info", headers={"Authorization": f"Bearer {KEY}x"}).text]
        c.post("/search", json={"query": "x"}, headers=AUTH)
    assert not [a for a in answers if KEY in a]
    assert KEY not in caplog.text and KEY not in json.dumps(settings.redacted())
    assert "effective settings" in caplog.text  # the settings were logged, with the key hidden
