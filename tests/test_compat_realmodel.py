"""The compatible APIs with the real offline models, through the real clients."""

import cohere
import httpx
import numpy as np
import openai
import pytest
import torch

from densehybrid.bench.servers.start import LiveServer
from densehybrid.encoder.loading import load_encoder
from densehybrid.encoder.representations import densify
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

pytestmark = pytest.mark.realmodel

TEXTS = ["faiss flat index latency", "how bread is baked in a stone oven"]
DOCS = ["bread recipes and stone ovens", "the faiss library builds a flat inner product index",
        "weather in the mountains"]


@pytest.fixture(scope="module")
def splade(splade_tiny_dir):
    encoder = load_encoder("splade-tiny")
    with LiveServer(create_app(ServiceSettings(max_wait_ms=1), encoder=encoder)) as live:
        yield live, load_encoder("splade-tiny")


def test_openai_sdk_embeddings_equal_the_in_process_model(splade):
    live, reference = splade
    got = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0).embeddings.create(
        model="splade-tiny", input=TEXTS, extra_body={"input_type": "passage"})
    np.testing.assert_array_equal(np.array([d.embedding for d in got.data], np.float32),
                                  reference.encode(TEXTS, "passage").values)


def test_embed_sparse_is_the_real_lexical_vector(splade):
    live, reference = splade
    r = httpx.post(f"{live.url}/embed_sparse", json={"inputs": TEXTS}, timeout=60)
    assert r.status_code == 200
    encoded = reference.encode(TEXTS, "query")
    vocab = reference.spec.vocab_size
    for entries, values, gates, text in zip(r.json(), encoded.values, encoded.gates, TEXTS):
        lexical = torch.zeros(vocab)
        lexical[[e["index"] for e in entries]] = torch.tensor([e["value"] for e in entries])
        dlr_values, dlr_gates = densify(lexical[None], reference.spec.dlr_dim)  # densified here, as docs/concepts.md defines it
        np.testing.assert_allclose(dlr_values[0].numpy(), values, rtol=1e-5, atol=1e-6)
        assert np.array_equal(dlr_gates[0].numpy()[values > 0], gates[values > 0])
        heaviest = {reference.term(e["index"]) for e in sorted(entries, key=lambda e: -e["value"])[:8]}
        assert heaviest & set(text.split()), (text, heaviest)


def test_cohere_rerank_orders_by_the_models_gip(splade):
    live, reference = splade
    got = cohere.ClientV2(api_key="unused", base_url=live.url).rerank(
        model="splade-tiny", query="faiss flat index", documents=DOCS)
    q, p = reference.encode(["faiss flat index"], "query"), reference.encode(DOCS, "passage")
    want = ((p.values * (p.gates == q.gates[0])) @ q.values[0]).astype(np.float64)  # dlr: all dims gated
    assert [r.index for r in got.results] == list(np.argsort(-want, kind="stable")) and got.results[0].index == 1
    np.testing.assert_allclose([r.relevance_score for r in got.results], np.sort(want)[::-1], rtol=1e-4, atol=1e-5)


def test_dense_only_model_has_no_sparse_route_but_embeds(minilm_dir):
    reference = load_encoder("minilm")
    with LiveServer(create_app(ServiceSettings(max_wait_ms=1), encoder=load_encoder("minilm"))) as live:
        r = httpx.post(f"{live.url}/embed_sparse", json={"inputs": "x"}, timeout=60)
        assert r.status_code == 422 and "dense-only" in r.json()["error"]["message"]
        got = httpx.post(f"{live.url}/embed", json={"inputs": TEXTS, "normalize": False}, timeout=60).json()
        np.testing.assert_allclose(got, reference.encode(TEXTS, "query").values, rtol=1e-5, atol=1e-6)
