"""Client-compatible APIs on a live loopback server, driven by the real client libraries:
the openai SDK and LangChain's OpenAIEmbeddings, huggingface_hub's InferenceClient, the cohere SDK."""

import base64
import math

import cohere
import httpx
import numpy as np
import openai
import pytest
import torch
from huggingface_hub import InferenceClient
from langchain_openai import OpenAIEmbeddings

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder

MODEL = "fake-dhr"
TEXTS = ["dense retrieval latency", "gated inner product of term weights", "bm25 baseline passage ranking"]
DOCS = ["gated inner product scores lexical terms", "a recipe for bread", "dense retrieval with term weights",
        "latency of dense retrieval"]
QUERY = "dense retrieval term weights"
LIMIT = 8


@pytest.fixture(scope="module")
def server(toy_index):
    index_dir = toy_index("dhr", count=20, lam=0.5)
    settings = ServiceSettings(max_request_texts=LIMIT, max_wait_ms=1)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr", lam=0.5), index=load_index(index_dir))) as live:
        yield live


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def encode(client, texts, role="query"):
    r = client.post("/encode", json={"texts": texts, "role": role})
    assert r.status_code == 200, r.text
    return r.json()


def expected_scores(client, query, docs, lam):
    """GIP computed here from /encode's rows: gated dims count where the gates agree, dense part times lambda."""
    q, p = encode(client, [query]), encode(client, docs, "passage")
    gated = q["gated_dim"]
    qv, pv = np.array(q["vectors"][0], np.float64), np.array(p["vectors"], np.float64)
    agree = np.array(p["gates"]) == np.array(q["gates"][0])
    return (pv[:, :gated] * agree) @ qv[:gated] + lam * (pv[:, gated:] @ qv[gated:])


# -- OpenAI --------------------------------------------------------------------
@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_openai_sdk_embeddings_equal_encode(client, oai, encoding_format):
    kwargs = {} if encoding_format is None else {"encoding_format": encoding_format}
    got = oai.embeddings.create(model=MODEL, input=TEXTS, **kwargs)
    want = encode(client, TEXTS)["vectors"]
    if encoding_format == "base64":  # asked explicitly, the SDK hands the base64 text over undecoded
        for d in got.data:
            d.embedding = np.frombuffer(base64.b64decode(d.embedding), "<f4")
    assert [d.index for d in got.data] == [0, 1, 2] and got.model == MODEL
    np.testing.assert_array_equal(np.array([d.embedding for d in got.data], np.float32), np.array(want, np.float32))
    tokens = sum(item.length for item in FakeEncoder("dhr").tokenize(TEXTS, "query"))
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens


def test_openai_base64_is_little_endian_float32(client):
    r = client.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS[0], "encoding_format": "base64"})
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), np.array(encode(client, TEXTS[:1])["vectors"][0], "<f4"))


def test_openai_input_type_passage_uses_the_passage_side(client, oai):
    got = oai.embeddings.create(model=MODEL, input=TEXTS[0], extra_body={"input_type": "passage"})
    np.testing.assert_array_equal(np.array(got.data[0].embedding, np.float32),
                                  np.array(encode(client, TEXTS[:1], "passage")["vectors"][0], np.float32))


def test_openai_models(oai):
    assert [m.id for m in oai.models.list()] == [MODEL]


def test_openai_errors(client, oai):
    with pytest.raises(openai.NotFoundError) as unknown:
        oai.embeddings.create(model="text-embedding-3-small", input="x")
    assert MODEL in unknown.value.message
    with pytest.raises(openai.UnprocessableEntityError) as ids:
        oai.embeddings.create(model=MODEL, input=[[101, 2054, 102]])
    assert "check_embedding_ctx_length=False" in ids.value.message
    r = client.post("/v1/embeddings", json={"model": MODEL, "input": [1, 2, 3]})
    assert r.status_code == 422 and set(r.json()["error"]) == {"message", "type", "code"}
    r = client.post("/v1/embeddings", json={"model": MODEL, "input": ["x"] * (LIMIT + 1)})
    assert r.status_code == 413 and str(LIMIT) in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"
    for bad in ({"model": MODEL, "input": ""}, {"model": MODEL, "input": []}, {"input": "x"},
                {"model": MODEL, "input": "x", "encoding_format": "int8"}, {"model": MODEL, "input": "x", "dimensions": 3}):
        r = client.post("/v1/embeddings", json=bad)
        assert r.status_code == 422, bad
        assert set(r.json()["error"]) == {"message", "type", "code"} and r.json()["error"]["message"]
    assert client.get("/health").status_code == 200


def test_langchain_openai_embeddings(server, client):
    lc = OpenAIEmbeddings(model=MODEL, base_url=f"{server.url}/v1", api_key="unused",
                          check_embedding_ctx_length=False, max_retries=0)
    np.testing.assert_allclose(lc.embed_documents(TEXTS), encode(client, TEXTS)["vectors"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lc.embed_query(TEXTS[0]), encode(client, TEXTS[:1])["vectors"][0], rtol=1e-6, atol=1e-7)


# -- text-embeddings-inference ---------------------------------------------------
def normalized(rows):
    rows = np.array(rows, np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_tei_embed_and_timing_headers(client):
    r = client.post("/embed", json={"inputs": TEXTS})
    assert r.status_code == 200
    np.testing.assert_allclose(r.json(), normalized(encode(client, TEXTS)["vectors"]), rtol=1e-5, atol=1e-6)
    for header in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert float(r.headers[header]) >= 0
    raw = client.post("/embed", json={"inputs": TEXTS[0], "normalize": False}).json()
    np.testing.assert_array_equal(np.array(raw, np.float32), np.array(encode(client, TEXTS[:1])["vectors"], np.float32))


def test_tei_truncate(client):
    long_text = " ".join(f"word{i}" for i in range(100))
    r = client.post("/embed", json={"inputs": [TEXTS[0], long_text], "truncate": False})
    message = r.json()["error"]["message"]
    assert r.status_code == 413 and "input 1 has 102 tokens" in message and "limit of 32 tokens" in message
    for truncate in ({"truncate": True}, {}):  # left out: the server's --auto-truncate, on by default as in TEI
        r = client.post("/embed", json={"inputs": long_text, "normalize": False, **truncate})
        assert r.status_code == 200
        np.testing.assert_array_equal(np.array(r.json(), np.float32),
                                      np.array(encode(client, [long_text])["vectors"], np.float32))
    left = client.post("/embed", json={"inputs": long_text, "normalize": False, "truncation_direction": "Left"})
    kept = " ".join(long_text.split()[-30:])  # the last 30 words, between [CLS] and [SEP]
    np.testing.assert_array_equal(np.array(left.json(), np.float32), np.array(encode(client, [kept])["vectors"], np.float32))
    assert client.post("/embed", json={"inputs": ["x"] * (LIMIT + 1)}).status_code == 413
    assert client.post("/embed", json={"inputs": "x", "truncation_direction": "middle"}).status_code == 422


def test_tei_embed_sparse_is_the_lexical_vector_behind_the_dlr(client):
    """Densifying the returned vocabulary vector (docs/concepts.md) gives /encode's gated values and gates."""
    from densehybrid.encoder.representations import densify

    r = client.post("/embed_sparse", json={"inputs": TEXTS, "input_type": "passage"})
    assert r.status_code == 200 and float(r.headers["x-inference-time"]) >= 0
    want = encode(client, TEXTS, "passage")
    gated = want["gated_dim"]
    for entries, row, gates in zip(r.json(), want["vectors"], want["gates"]):
        assert entries and all(e["value"] > 0 for e in entries)
        assert [e["index"] for e in entries] == sorted({e["index"] for e in entries})
        lexical = torch.zeros(30522)
        lexical[[e["index"] for e in entries]] = torch.tensor([e["value"] for e in entries])
        values, dlr_gates = densify(lexical[None], gated)
        np.testing.assert_allclose(values[0].numpy(), row[:gated], rtol=1e-6)
        assert dlr_gates[0].tolist() == gates
    assert client.post("/embed_sparse", json={"inputs": ["x"] * (LIMIT + 1)}).status_code == 413


def test_tei_rerank_uses_the_gated_inner_product(client):
    want = expected_scores(client, QUERY, DOCS, lam=0.5)  # the index's lambda
    raw = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True, "return_text": True}).json()
    assert [h["index"] for h in raw] == list(np.argsort(-want, kind="stable"))
    for hit in raw:
        assert math.isclose(hit["score"], want[hit["index"]], rel_tol=1e-5, abs_tol=1e-5)
        assert hit["text"] == DOCS[hit["index"]]
    squashed = client.post("/rerank", json={"query": QUERY, "texts": DOCS}).json()
    assert [h["index"] for h in squashed] == [h["index"] for h in raw] and "text" not in squashed[0]
    for hit in squashed:
        assert math.isclose(hit["score"], 1 / (1 + math.exp(-want[hit["index"]])), rel_tol=1e-5)
    assert client.post("/rerank", json={"query": QUERY, "texts": ["x"] * (LIMIT + 1)}).status_code == 413
    assert client.post("/rerank", json={"query": " ", "texts": DOCS}).status_code == 422


def test_tei_info_has_model_id(client):
    info = client.get("/info").json()
    assert info["model_id"] == MODEL and info["max_client_batch_size"] == LIMIT
    assert info["model"]["kind"] == "dhr"


def test_huggingface_hub_inference_client(server, client):
    hub = InferenceClient(model=server.url)
    got = hub.feature_extraction(TEXTS[0])
    np.testing.assert_allclose(np.asarray(got).reshape(1, -1), normalized(encode(client, TEXTS[:1])["vectors"]),
                               rtol=1e-5, atol=1e-6)
    got = hub.feature_extraction(TEXTS[1], normalize=False)
    np.testing.assert_allclose(np.asarray(got).reshape(1, -1), encode(client, TEXTS[1:2])["vectors"], rtol=1e-6)
    similarities = hub.sentence_similarity(QUERY, other_sentences=DOCS)
    np.testing.assert_allclose(similarities, expected_scores(client, QUERY, DOCS, lam=0.5), rtol=1e-5, atol=1e-5)


def test_huggingface_hub_truncation_options(server, client):
    from huggingface_hub.errors import HfHubHTTPError

    hub = InferenceClient(model=server.url)
    long_text = " ".join(f"word{i}" for i in range(100))
    got = hub.feature_extraction(long_text, normalize=False, truncate=True, truncation_direction="left")
    left = client.post("/encode", json={"texts": [long_text], "truncation_direction": "left"}).json()["vectors"]
    np.testing.assert_allclose(np.asarray(got).reshape(1, -1), left, rtol=1e-6)
    with pytest.raises(HfHubHTTPError) as refused:
        hub.feature_extraction(long_text, truncate=False)
    assert refused.value.response.status_code == 413


def test_tei_generic_route_accepts_parameters(client):
    r = client.post("/", json={"inputs": TEXTS, "parameters": {"normalize": False}})
    assert r.status_code == 200
    np.testing.assert_array_equal(np.array(r.json(), np.float32), np.array(encode(client, TEXTS)["vectors"], np.float32))
    r = client.post("/", json={"inputs": TEXTS, "parameters": {"top_k": 3}})
    assert r.status_code == 422 and "top_k" in r.json()["error"]["message"]


# -- Cohere --------------------------------------------------------------------
def test_cohere_v2_rerank(server, client):
    co = cohere.ClientV2(api_key="unused", base_url=server.url)
    got = co.rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=2)
    want = expected_scores(client, QUERY, DOCS, lam=0.5)
    assert [r.index for r in got.results] == list(np.argsort(-want, kind="stable")[:2])
    for result in got.results:
        assert math.isclose(result.relevance_score, want[result.index], rel_tol=1e-5, abs_tol=1e-5)
    with pytest.raises(cohere.errors.NotFoundError):
        co.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS)


def test_cohere_v1_rerank_returns_documents(server, client):
    co = cohere.Client(api_key="unused", base_url=server.url)
    got = co.rerank(model=MODEL, query=QUERY, documents=DOCS, return_documents=True)
    assert sorted(r.index for r in got.results) == list(range(len(DOCS)))
    assert all(r.document.text == DOCS[r.index] for r in got.results)
    scores = [r.relevance_score for r in got.results]
    assert scores == sorted(scores, reverse=True)
    r = client.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": ["x"] * (LIMIT + 1)})
    assert r.status_code == 413 and str(LIMIT) in r.json()["error"]["message"]


def test_embed_sparse_refuses_dense_only_models():
    with LiveServer(create_app(ServiceSettings(max_wait_ms=1), encoder=FakeEncoder("cls"))) as live:
        r = httpx.post(f"{live.url}/embed_sparse", json={"inputs": "x"})
        assert r.status_code == 422 and "dense-only" in r.json()["error"]["message"]
        assert httpx.post(f"{live.url}/embed", json={"inputs": "x"}).status_code == 200


# -- the API key guards the compatible routes too -----------------------------------
def test_api_key_guards_compatible_routes():
    settings = ServiceSettings(api_key="s3cret", max_wait_ms=1)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"))) as live:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="wrong", max_retries=0).embeddings.create(model=MODEL, input="x")
        ok = openai.OpenAI(base_url=f"{live.url}/v1", api_key="s3cret", max_retries=0)
        assert len(ok.embeddings.create(model=MODEL, input="x").data) == 1
        with httpx.Client(base_url=live.url) as c:
            for path, body in (("/embed", {"inputs": "x"}), ("/rerank", {"query": "x", "texts": ["y"]}),
                               ("/", {"inputs": "x"}), ("/embed_sparse", {"inputs": "x"}), ("/v2/rerank", {"query": "x", "documents": ["y"]})):
                assert c.post(path, json=body).status_code == 401, path
        with pytest.raises(cohere.errors.UnauthorizedError):
            cohere.ClientV2(api_key="wrong", base_url=live.url).rerank(model=MODEL, query="x", documents=["y"])
