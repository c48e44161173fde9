"""The torch first stage and rerank (the GPU path) against numpy, Faiss and the CPU GIP.

On this CPU machine the same code runs on the CPU (float32), split over several "devices" and
small chunks so that the merge of per-device and per-chunk top-k lists is exercised. The
``gpu`` tests run it on CUDA (float16 and float32 storage) against the CPU answers.
"""

import numpy as np
import pytest
import torch

from densehybrid.index.search import gip
from densehybrid.index.engines.torch_engine import TorchFlatIndex, search_devices
from densehybrid.index.search.search_device import resolve_search_device
from densehybrid.index.search.searcher import Searcher, SearchError
from densehybrid.index.search.params import SearchParams
from test_gip import numpy_gip, random_rows
from test_search import make_index, queries_for


def distinct_rows(n, dim, seed):
    """Continuous random values: no two scores tie, so top-k ids are unique."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, dim), dtype=np.float32)


def numpy_topk_ids(xq, xb, k):
    scores = xq.astype(np.float64) @ xb.astype(np.float64).T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k], np.sort(scores, axis=1)[:, ::-1][:, :k]


@pytest.mark.parametrize("k", [10, 1000, 10_000])
@pytest.mark.parametrize("devices,chunk_rows", [(["cpu"], 1 << 20), (["cpu", "cpu", "cpu"], 777)])
def test_exact_first_stage_equals_numpy(k, devices, chunk_rows):
    xb, xq = distinct_rows(12_000, 16, seed=1), distinct_rows(3, 16, seed=2)
    index = TorchFlatIndex(xb, None, devices, chunk_rows=chunk_rows)
    assert sum(len(chunks) for chunks in index.shards) == (1 if chunk_rows > 12_000 else 3 * -(-4000 // chunk_rows))
    scores, rows = index.search(xq, k)
    want_rows, want_scores = numpy_topk_ids(xq, xb, k)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-4)
    exact = xq.astype(np.float64) @ xb.astype(np.float64).T  # the rows returned really score that high
    np.testing.assert_allclose(np.take_along_axis(exact, rows, 1), want_scores, rtol=1e-5, atol=1e-4)
    assert all(len(set(r)) == k for r in rows)
    if k <= 1000:  # deep in the list float32 and float64 may order near-equal scores differently
        np.testing.assert_array_equal(rows, want_rows)


def test_k_above_the_row_count_returns_every_row():
    xb, xq = distinct_rows(50, 8, seed=3), distinct_rows(2, 8, seed=4)
    scores, rows = TorchFlatIndex(xb, None, ["cpu", "cpu"], chunk_rows=7).search(xq, 10_000)
    assert rows.shape == (2, 50) and sorted(rows[0]) == list(range(50))


def test_ties_are_ordered_by_row():
    xb = np.ones((40, 4), dtype=np.float32)
    _, rows = TorchFlatIndex(xb, None, ["cpu", "cpu"], chunk_rows=9).search(np.ones((1, 4), np.float32), 40)
    assert rows[0].tolist() == list(range(40))


@pytest.mark.parametrize("gated", [0, 24])
@pytest.mark.parametrize("devices", [["cpu"], ["cpu", "cpu"]])  # one device: only the top k + 1 leave it
def test_rerank_equals_the_cpu_gip(gated, devices):
    values, gates = random_rows(500, gated + 8, gated, seed=5, dtype=np.float16)
    xq, gq = random_rows(4, gated + 8, gated, seed=6, dtype=np.float32)
    rows = np.random.default_rng(7).choice(500, (4, 120), replace=True).astype(np.int64)
    rows[1, 100:] = -1  # padding from a short first stage
    index = TorchFlatIndex(values, gates, devices, chunk_rows=64)
    got_scores, got_rows = index.rerank(xq, gq, rows, 30)
    want_scores, want_rows = gip.rerank(xq, gq, values, gates, rows, 30)
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)
    reference = numpy_gip(xq, gq, values, gates)
    for q in range(4):
        ok = got_rows[q] >= 0
        np.testing.assert_allclose(got_scores[q][ok], reference[q, got_rows[q][ok]], rtol=1e-5, atol=1e-5)
    assert (got_rows[1] >= 0).sum() == 30


@pytest.mark.parametrize("devices", [["cpu"], ["cpu", "cpu"]])
def test_rerank_keeps_the_lowest_rows_of_a_run_tied_at_the_cut(devices):
    values = np.ones((300, 6), dtype=np.float16)
    values[:40] = 2.0  # 40 rows beat the rest; the other 260 tie
    candidates = np.array([[299, 7, 250, 3, 120, 45, 44, 298, 60, 41, -1, 200]], dtype=np.int64)
    scores, rows = TorchFlatIndex(values, None, devices).rerank(np.ones((1, 6), np.float32), None, candidates, 5)
    assert rows.tolist() == [[3, 7, 41, 44, 45]]  # the two that score 12, then the lowest of those tied at 6
    assert scores.tolist() == [[12.0, 12.0, 6.0, 6.0, 6.0]]
    _, few = TorchFlatIndex(values, None, devices).rerank(np.ones((1, 6), np.float32), None, candidates[:, 9:], 5)
    assert few.tolist() == [[41, 200, -1]]  # fewer candidates than k: the padding stays last, as -1


@pytest.mark.parametrize("kind", ["cls", "dhr", "fusion"])
def test_torch_engine_gives_the_faiss_searchers_answers(tmp_path, kind):
    index = make_index(tmp_path, kind, n=400)
    queries = queries_for(index, 5)
    faiss_found = Searcher(index).search(queries, SearchParams(k=10, candidates=200, lam=2.0))
    torch_found = Searcher(index, engine="torch").search(queries, SearchParams(k=10, candidates=200, lam=2.0))
    assert torch_found.rows == faiss_found.rows
    np.testing.assert_allclose(torch_found.scores, faiss_found.scores, rtol=1e-3, atol=1e-3)


def test_two_stage_with_k1_n_equals_exhaustive_on_the_torch_engine(tmp_path):
    index = make_index(tmp_path, "dhr", n=300)
    queries = queries_for(index, 3)
    found = Searcher(index, engine="torch").search(queries, SearchParams(k=20, candidates=300, lam=1.0))
    exhaustive = gip.exhaustive(queries.values, queries.gates, index.values, index.gates)
    want_scores, want_rows = gip.sort_by_score(exhaustive, np.tile(np.arange(300), (3, 1)), 20)
    assert found.rows == want_rows.tolist()
    np.testing.assert_allclose(found.scores, want_scores, rtol=1e-5, atol=1e-5)


def test_search_device_auto_is_the_cpu_without_cuda(tmp_path, monkeypatch):
    index = make_index(tmp_path, "cls", n=30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_search_device(None, index) == "cpu" and resolve_search_device("auto", index) == "cpu"
    assert resolve_search_device("cpu", index) == "cpu"
    with pytest.raises(SearchError, match="torch sees no CUDA device"):
        resolve_search_device("cuda", index)
    with pytest.raises(SearchError, match="unknown search device"):
        resolve_search_device("tpu", index)


def test_search_device_with_cuda_visible(tmp_path, monkeypatch):
    """CUDA torch and faiss-cpu: the GPU search needs no Faiss GPU build."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    exact = make_index(tmp_path, "cls", n=300)
    assert resolve_search_device("auto", exact) == "cuda" and resolve_search_device("cuda:1", exact) == "cuda:1"
    with pytest.raises(SearchError, match="only 2 CUDA devices"):
        resolve_search_device("cuda:2", exact)
    assert search_devices("cuda") == ["cuda:0", "cuda:1"] and search_devices("cuda:1") == ["cuda:1"]


# -- on a CUDA machine (skipped here; their CPU twins are the tests above) ---------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("k", [10, 1000, 10_000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gpu_first_stage_returns_the_cpu_ids(k, dtype):
    xb, xq = distinct_rows(50_000, 64, seed=8), distinct_rows(4, 64, seed=9)
    cpu_scores, cpu_rows = TorchFlatIndex(xb, None, ["cpu"]).search(xq, k)
    gpu_scores, gpu_rows = TorchFlatIndex(xb, None, search_devices("cuda"), dtype=dtype, chunk_rows=20_000).search(xq, k)
    # fp16 storage rounds values (rel. 2^-11); ids may swap only where scores are that close
    tolerance = 5e-2 if dtype == torch.float16 else 1e-3
    np.testing.assert_allclose(gpu_scores, cpu_scores, atol=tolerance)
    overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(cpu_rows, gpu_rows)])
    assert overlap >= (0.99 if dtype == torch.float16 else 1.0)


@pytest.mark.gpu
def test_gpu_searcher_matches_the_cpu_searcher(tmp_path):
    index = make_index(tmp_path, "fusion", n=2000)
    queries = queries_for(index, 8)
    cpu = Searcher(index).search(queries, SearchParams(k=10, candidates=100))
    gpu = Searcher(index, device="cuda").search(queries, SearchParams(k=10, candidates=100))
    assert gpu.rows == cpu.rows  # the rerank is exact on both; only the candidate sets could differ


def test_serve_with_a_cuda_search_device_on_a_cpu_machine_stops_with_one_sentence(tmp_path):
    from densehybrid.service.startup import StartupError, load_components
    from densehybrid.service.settings import ServiceSettings

    index = make_index(tmp_path, "cls", n=30)
    with pytest.raises(StartupError, match="search device 'cuda' requested but torch sees no CUDA device"):
        load_components(ServiceSettings(index=index.path, search_device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_rows", [1 << 20, 70_000])
def test_gpu_graphed_first_stage_equals_the_eager_one(monkeypatch, chunk_rows):
    from densehybrid.index.engines import torch_graphs

    monkeypatch.setattr(torch_graphs, "MAX_GRAPHS", 2)
    index = TorchFlatIndex(distinct_rows(200_000, 64, seed=10), None, search_devices("cuda")[:1], dtype=torch.float16,
                           chunk_rows=chunk_rows)
    graphed = index.graphed[0]
    for k in (11, 1000, 11, 50):  # a shape seen before replays its graph; a third shape evicts the oldest
        for seed in (1, 2):  # a replay reads the new query, not the captured one
            xq = distinct_rows(1, 64, seed=seed + k)
            replayed = index.search(xq, k)
            monkeypatch.setattr(graphed, "enabled", False)
            eager = index.search(xq, k)
            monkeypatch.setattr(graphed, "enabled", True)
            np.testing.assert_array_equal(replayed[0], eager[0])
            above = eager[0] > eager[0][:, -1:]  # which rows of a float16 tie at the cut are kept may differ
            np.testing.assert_array_equal(replayed[1][above], eager[1][above])
    choices = graphed.choices()
    assert list(choices) == [11, 50]
    for k, choice in choices.items():  # every split that fits was timed, and the fastest kept
        assert set(choice["timed_ms"]) == set(graphed._splits(k))
        assert choice["parts"] == min(choice["timed_ms"], key=choice["timed_ms"].get)
    assert graphed.fits(1, 10) and not graphed.fits(2, 10)  # batches run op by op
