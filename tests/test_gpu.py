"""The GPU path end to end, against the CPU float32 reference (``-m gpu``; skipped without CUDA).

fp16 tolerance: encoder outputs under CUDA fp16 autocast are compared with CPU float32 at
``atol = 5e-2`` on values of order 1 (fp16 has an 11-bit mantissa; the errors of a few layers
add up to ~1e-3 relative); gates may differ only where two vocabulary entries of a DLR fold are
that close; rankings are compared as top-10 ids on the real model. The CPU twins of each test are
in test_device_search.py, test_encoders.py and test_service_*.py.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from densehybrid.encoder.base import KINDS
from densehybrid.encoder.loading import load_encoder
from densehybrid.index.search.params import SearchParams

pytestmark = pytest.mark.gpu

TEXTS = ["what is a dense retriever", "gated inner products keep lexical matches exact while dense vectors "
         "carry the meaning of a passage across paraphrases and synonyms"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_on_cuda_matches_the_cpu_reference(tiny_bert_dir, kind):
    options = {"dense_model": str(tiny_bert_dir)} if kind == "fusion" else {}
    cpu = load_encoder(str(tiny_bert_dir), kind=kind, device="cpu", **options)
    gpu = load_encoder(str(tiny_bert_dir), kind=kind, device="cuda", **options)
    for role in ("query", "passage"):
        a, b = cpu.encode(TEXTS, role), gpu.encode(TEXTS, role)
        assert b.values.dtype == np.float32 and b.values.shape == a.values.shape
        np.testing.assert_allclose(b.values, a.values, atol=5e-2)
        if a.gates is not None:
            assert np.mean(a.gates == b.gates) >= 0.99


def test_real_model_top10_on_cuda_equals_cpu(splade_tiny_dir, tmp_path):
    from densehybrid.index.building.build import BuildOptions, build_index
    from densehybrid.index.served.loading import load_index
    from densehybrid.index.search.searcher import Searcher

    corpus = tmp_path / "corpus.jsonl"
    import json

    words = "retrieval dense lexical vector index query passage ranking gate model search token".split()
    rng = np.random.default_rng(0)
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": " ".join(rng.choice(words, 12))}) + "\n"
                              for i in range(300)))
    index = load_index(build_index(load_encoder(str(splade_tiny_dir), kind="dlr", device="cpu"), corpus,
                                   tmp_path / "ix", BuildOptions(progress=False)))
    queries = ["dense retrieval model", "lexical token gate", "ranking passages for a query"]
    cpu_found = Searcher(index).search(load_encoder(str(splade_tiny_dir), kind="dlr", device="cpu").encode(queries, "query"),
                                       SearchParams(k=10))
    gpu_encoder = load_encoder(str(splade_tiny_dir), kind="dlr", device="cuda")
    gpu_found = Searcher(index, device="cuda").search(gpu_encoder.encode(queries, "query"), SearchParams(k=10))
    for a, b in zip(cpu_found.ids, gpu_found.ids):
        assert len(set(a) & set(b)) >= 9  # fp16 may swap one near-tied passage at the cut


def test_search_end_to_end_on_cuda(tmp_path):
    from support.fake_encoder import FakeEncoder
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.bench.servers.toy_index import build_toy_index
    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    index = load_index(build_toy_index(FakeEncoder("dhr"), tmp_path))
    app = create_app(ServiceSettings(search_device="cuda"), encoder=FakeEncoder("dhr"), index=index)
    with LiveServer(app) as live:
        assert app.state.runtime.index.search_device == "cuda"
        cpu_app = create_app(ServiceSettings(search_device="cpu"), encoder=FakeEncoder("dhr"), index=index)
        with LiveServer(cpu_app) as cpu_live:
            for query in ("dense retrieval", "gated inner product", "faiss flat index"):
                on_gpu = httpx.post(live.url + "/search", json={"query": query, "k": 10}).json()
                on_cpu = httpx.post(cpu_live.url + "/search", json={"query": query, "k": 10}).json()
                assert [h["id"] for h in on_gpu["results"]] == [h["id"] for h in on_cpu["results"]]


def test_bench_on_cuda_completes(tmp_path):
    import json

    from densehybrid.bench.cli import config_from, run_and_report

    out = tmp_path / "bench.json"
    # torch only: ONNX Runtime on CUDA needs onnxruntime-gpu, which the gpu extra installs but a run may lack
    run_and_report(config_from("quick", device="cuda", only=["memory", "search", "encoder"], backends=["torch"]), out)
    results = json.loads(out.read_text())
    assert results["search"]["torch"]["device"] == "cuda" and results["search"]["torch"]["dtype"] == "float16"
    assert results["search"]["torch"]["fraction_of_bandwidth"] > 0
