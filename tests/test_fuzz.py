"""Property-based bad input (hypothesis) for the encoders and the HTTP API.

Encoders (FakeEncoder and a real tiny random BERT): any unicode - control characters, empty,
whitespace, very long - encodes without error to finite vectors of the right shape, and a text's
vector does not depend on what else is in its batch.

HTTP API (live loopback server): bodies drawn from two families with a known answer - valid ones
(arbitrary unicode queries, every option over its whole range) must be 200 with well-formed hits,
definitely-invalid ones (empty/whitespace text, out-of-range or NaN/inf or wrongly typed k, θ,
candidates, λ, unknown fields, invalid UTF-8) must be the documented 422/413 JSON error - and the
server keeps serving after each. (tests/test_api_schema.py runs schemathesis over the OpenAPI schema.)
"""

import json
import math
import string

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.bench.servers.start import LiveServer

from support.fake_encoder import FakeEncoder

MAX_K, MAX_TEXTS = 50, 8
# Blank, as the schemas count it: whatever Python, Rust or ECMAScript calls whitespace. Python's
# str.isspace() covers the first two (and \x1c-\x1f, which Unicode's White_Space lacks); ECMAScript adds the BOM.
UNICODE_SPACES = "".join(c for c in map(chr, range(0x110000)) if c.isspace()) + "\ufeff"
SEARCH_FIELDS = {"query", "queries", "k", "first_stage", "candidates", "theta", "rerank", "lambda", "return_text",
                 "explain"}
HTTP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# any text at all, with control characters and unusual planes well represented
any_text = st.one_of(
    st.text(max_size=200),
    st.text(st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "So"]), max_size=50),
    st.text(alphabet=UNICODE_SPACES, max_size=20),
    st.builds(lambda word, n: (word + " ") * n, st.text(min_size=1, max_size=12), st.integers(100, 3000)),
)


def assert_encoded_well(encoder, texts, role):
    items = encoder.tokenize(texts, role)
    encoded = encoder.encode_tokenized(items, role)
    spec = encoder.spec
    assert encoded.values.shape == (len(texts), spec.dim) and np.isfinite(encoded.values).all()
    if spec.gated_dim:
        assert encoded.gates.shape == (len(texts), spec.gated_dim)
    assert all(item.length <= spec.max_length(role) for item in items)
    return encoded


# -- encoders ---------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(texts=st.lists(any_text, min_size=1, max_size=6), role=st.sampled_from(["query", "passage"]),
       kind=st.sampled_from(["dhr", "aggretriever", "cls", "dlr", "fusion"]))
def test_fake_encoder_takes_any_unicode(texts, role, kind):
    encoder = FakeEncoder(kind)
    batch = assert_encoded_well(encoder, texts, role)
    alone = assert_encoded_well(encoder, texts[-1:], role)
    np.testing.assert_array_equal(batch.values[-1:], alone.values)


@pytest.fixture(scope="module")
def tiny_encoder(tiny_bert_dir):
    from densehybrid.encoder.loading import load_encoder

    return load_encoder(str(tiny_bert_dir), kind="dhr", device="cpu", max_query_length=32, max_passage_length=64)


@pytest.mark.slow  # forty generated batches through a BERT
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(any_text, min_size=1, max_size=4), role=st.sampled_from(["query", "passage"]))
def test_real_tiny_model_takes_any_unicode(tiny_encoder, texts, role):
    batch = assert_encoded_well(tiny_encoder, texts, role)
    alone = assert_encoded_well(tiny_encoder, texts[:1], role)
    np.testing.assert_allclose(batch.values[:1], alone.values, atol=1e-4, rtol=1e-4)  # padding changes nothing
    np.testing.assert_array_equal(batch.gates[:1], alone.gates)


def test_real_tiny_model_truncates_a_megabyte(tiny_encoder):
    text = "retrieval " * 100_000  # 1 MB
    [item] = tiny_encoder.tokenize([text], "passage")
    assert item.truncated and item.length == 64
    assert_encoded_well(tiny_encoder, [text, "", "\x00\x01\x7f", " \u3000 "], "passage")


# -- the HTTP API -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(toy_index):
    index = load_index(toy_index("dhr", count=40))
    app = create_app(ServiceSettings(max_k=MAX_K, max_request_texts=MAX_TEXTS, max_wait_ms=1),
                     encoder=FakeEncoder("dhr"), index=index)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield server, client


def assert_error(response, statuses):
    assert response.status_code in statuses, (response.status_code, response.text[:500])
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] and body["error"]["message"]


def assert_still_serving(server, client):
    r = client.post("/search", json={"query": "dense retrieval", "k": 3})
    assert r.status_code == 200 and len(r.json()["results"]) == 3
    assert server.app.state.runtime.batcher.alive


with_a_word = st.builds(lambda a, w, b: a + w + b, any_text, st.text(string.ascii_letters, min_size=1, max_size=8),
                        any_text)
finite = st.floats(allow_nan=False, allow_infinity=False)
valid_search = st.fixed_dictionaries(
    {"query": with_a_word},
    optional={"k": st.integers(1, MAX_K), "first_stage": st.sampled_from(["ip", "approx_gip"]),
              "candidates": st.integers(1, 10000), "theta": st.floats(0, 1e6), "rerank": st.booleans(),
              "lambda": st.floats(0, 1e4), "return_text": st.booleans(), "explain": st.booleans()})


@HTTP
@given(body=valid_search, batch=st.booleans())
def test_valid_search_bodies_are_answered(live, body, batch):
    server, client = live
    if batch:
        body = {**{k: v for k, v in body.items() if k != "query"}, "queries": [body["query"], "second query"]}
    r = client.post("/search", json=body)
    assert r.status_code == 200, r.text[:500]
    answer = r.json()
    lists = answer["results"] if batch else [answer["results"]]
    for hits in lists:
        assert len(hits) <= body.get("k", 10)
        scores = [h["score"] for h in hits]
        assert all(math.isfinite(s) for s in scores) and scores == sorted(scores, reverse=True)


no_number = st.text(alphabet="xyz!?", max_size=4)  # pydantic's lax mode would parse "5" or "1e5"
not_an_int = st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not float(x).is_integer()),
                       no_number,
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                       st.none())
bad_float = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf]), st.floats(max_value=-1e-9),
                      st.floats(min_value=1e6 + 1, allow_infinity=False), no_number, st.lists(finite, max_size=2))
INVALID_SEARCH = {
    "empty or blank query": st.builds(lambda q: {"query": q}, st.text(alphabet=UNICODE_SPACES, max_size=10)),
    "k out of range": st.builds(lambda k: {"query": "x", "k": k}, st.one_of(st.integers(max_value=0),
                                                                            st.integers(min_value=MAX_K + 1))),
    "k not an integer": st.builds(lambda k: {"query": "x", "k": k}, not_an_int),
    "candidates out of range": st.builds(lambda c: {"query": "x", "candidates": c},
                                         st.one_of(st.integers(max_value=0), st.integers(min_value=10001))),
    "theta bad": st.builds(lambda t: {"query": "x", "theta": t}, bad_float),
    "lambda bad": st.builds(lambda t: {"query": "x", "lambda": t},
                            st.one_of(bad_float, st.floats(min_value=1e4 + 1e-3, allow_infinity=False))),
    "first stage unknown": st.builds(lambda f: {"query": "x", "first_stage": f},
                                     st.text(max_size=12).filter(lambda f: f not in ("ip", "approx_gip"))),
    "query of a wrong type": st.builds(lambda q: {"query": q}, st.one_of(st.integers(), st.lists(st.text(), max_size=2),
                                                                         st.none(), st.booleans(), finite)),
    "unknown field": st.builds(lambda name, v: {"query": "x", name: v},
                               st.text(min_size=1, max_size=12).filter(lambda n: n not in SEARCH_FIELDS),
                               st.one_of(st.integers(), st.text(max_size=5), st.none())),
    "query and queries": st.just({"query": "x", "queries": ["y"]}),
}


@HTTP
@given(case=st.sampled_from(sorted(INVALID_SEARCH)), data=st.data())
def test_invalid_search_bodies_are_422_and_the_server_keeps_serving(live, case, data):
    server, client = live
    body = data.draw(INVALID_SEARCH[case], label=case)
    r = client.post("/search", content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    assert_error(r, {422})
    assert_still_serving(server, client)


@HTTP
@given(texts=st.lists(any_text, min_size=1, max_size=MAX_TEXTS), role=st.sampled_from(["query", "passage"]))
def test_encode_answers_every_text_list_with_vectors_or_422(live, texts, role):
    server, client = live
    r = client.post("/encode", json={"texts": texts, "role": role})
    if any(all(c in UNICODE_SPACES for c in t) for t in texts):  # empty or blank: nothing to encode
        assert_error(r, {422})
    else:
        assert r.status_code == 200, r.text[:500]
        answer = r.json()
        assert len(answer["vectors"]) == len(texts) and len(answer["truncated"]) == len(texts)
        assert all(math.isfinite(x) for row in answer["vectors"] for x in row)
    assert_still_serving(server, client)


@HTTP
@given(prefix=st.binary(max_size=20), suffix=st.binary(max_size=20), at=st.integers(0, 30))
def test_invalid_utf8_bodies_are_422(live, prefix, suffix, at):
    server, client = live
    raw = json.dumps({"query": "dense retrieval", "k": 3}).encode()
    at = min(at, len(raw))
    body = raw[:at] + prefix + b"\xff\xc0" + suffix + raw[at:]  # 0xff and 0xc0 never occur in UTF-8
    r = client.post("/search", content=body, headers={"content-type": "application/json"})
    assert_error(r, {422})
    assert_still_serving(server, client)


# -- sizes at the default limits (1 MiB body, 64 texts) ---------------------------------------------
def test_megabyte_texts_and_ten_thousand_item_batches(toy_index):
    index = load_index(toy_index("dhr", count=20))
    settings_ = ServiceSettings()
    with LiveServer(create_app(settings_, encoder=FakeEncoder("dhr"), index=index)) as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        megabyte = "retrieval " * 100_000  # 1_000_000 bytes: under the 1 MiB body limit with its JSON around it
        r = client.post("/encode", json={"texts": [megabyte]})
        assert r.status_code == 200 and r.json()["truncated"] == [True]
        assert client.post("/search", json={"query": megabyte}).status_code == 200
        assert_error(client.post("/search", json={"query": megabyte + "x" * 50_000}), {413})
        assert_error(client.post("/search", json={"queries": ["q"] * 10_000}), {413})
        assert_error(client.post("/encode", json={"texts": ["t"] * 10_000}), {413})
        assert_error(client.post("/encode", json={"texts": [megabyte[:150_000]] * 8}), {413})  # 1.2 MB in all
        assert_still_serving(server, client)
