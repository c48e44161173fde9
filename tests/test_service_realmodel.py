"""End to end with a real offline model: ``--index`` alone loads the model its manifest names."""

import httpx
import numpy as np
import pytest

from densehybrid.encoder.loading import load_encoder
from densehybrid.index.search.searcher import Searcher
from densehybrid.service.app import create_app
from densehybrid.service.startup import load_components
from densehybrid.service.settings import ServiceSettings
from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.servers.toy_index import build_toy_index
from densehybrid.index.search.params import SearchParams

pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def splade_index(splade_tiny_dir, tmp_path_factory):
    return build_toy_index(load_encoder("splade-tiny"), tmp_path_factory.mktemp("real-index"), count=40)


def test_index_alone_serves_the_real_model_and_matches_in_process(splade_index):
    # torch, to compare bit for bit with the in-process torch encoder (ONNX Runtime, the CPU default,
    # agrees to 1e-5: tests/test_onnx_backend.py)
    settings = ServiceSettings(index=splade_index, backend="torch")
    encoder, index = load_components(settings)
    assert encoder.spec.model_id == "splade-tiny" and encoder.spec.kind == "dlr"
    reference_encoder, searcher = load_encoder("splade-tiny"), Searcher(index)
    queries = ["gated inner product", "faiss flat index latency"]
    with LiveServer(create_app(settings, encoder=encoder, index=index)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as c:
        for query in queries:
            body = c.post("/search", json={"query": query, "k": 5}).json()
            expected = searcher.search(reference_encoder.encode([query], "query"), SearchParams(k=5))
            assert [h["id"] for h in body["results"]] == expected.ids[0]
            assert [h["score"] for h in body["results"]] == expected.scores[0]
        encoded = c.post("/encode", json={"texts": queries, "role": "passage"}).json()
        expected = reference_encoder.encode(queries, "passage")
        np.testing.assert_array_equal(np.asarray(encoded["vectors"], np.float32), expected.values)
        np.testing.assert_array_equal(np.asarray(encoded["gates"], np.uint8), expected.gates)
        top = body["results"][0]  # of the last query
        explained = c.post("/explain", json={"query": queries[-1], "id": top["id"]}).json()
        assert any(t["term"] in {"faiss", "flat", "index", "latency"} for t in explained["terms"]), explained
        assert abs(explained["total"] - top["score"]) <= 1e-3 * abs(top["score"])
        assert c.get("/docs").status_code == 200
