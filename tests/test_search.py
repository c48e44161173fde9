"""Searcher: first stage vs numpy brute force, two-stage vs exhaustive GIP, λ, explain, errors."""

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.index.building import build
from densehybrid.index.storage.documents import Document
from densehybrid.index.engines import faiss_engine
from densehybrid.index.errors import IndexMismatchError
from densehybrid.index.search.explain import explain
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher, SearchError
from densehybrid.index.search.params import SearchParams
from test_gip import numpy_gip, numpy_topk, random_rows

from support.fake_encoder import FakeEncoder
from support.waiting import wait_until


def make_index(tmp_path, kind, n=300, *, gated=24, dense=8, lam=1.0, seed=0):
    dim = gated + dense if kind != "cls" else dense
    gated = gated if kind in ("dhr", "fusion", "dlr") else 0
    spec = EncoderSpec(kind=kind, dim=dim, gated_dim=gated, lam=lam, vocab_size=30522, dlr_dim=gated or None,
                       model_id="random", weights_hash="r")
    values, gates = random_rows(n, dim, gated, seed=seed, dtype=np.float32)
    docs = [Document(f"doc{i}", "", f"text {i}") for i in range(n)]
    out = build.build_from_arrays(tmp_path / f"{kind}-{seed}", spec, Encoded(values, gates), docs, lam=lam)
    return load_index(out)


def queries_for(index, q=4, seed=99):
    values, gates = random_rows(q, index.spec.dim, index.spec.gated_dim, seed=seed, dtype=np.float32)
    return Encoded(values, gates)


@pytest.mark.parametrize("kind", ["cls", "aggretriever", "fusion"])
@pytest.mark.parametrize("batch", [1, 5, 400])  # 400 x 32 dims: above the BLAS threshold
def test_first_stage_ip_equals_numpy_brute_force(tmp_path, kind, batch):
    index = make_index(tmp_path, kind)
    queries = queries_for(index, batch)
    got = Searcher(index).search(queries, SearchParams(k=20, rerank=False, lam=1.0))
    # the first stage scores the one stored copy of the rows (float16), as the rerank does
    brute = queries.values.astype(np.float64) @ np.asarray(index.values, np.float64).T
    want_scores, want_rows = numpy_topk(brute, 20)
    np.testing.assert_allclose(np.array(got.scores), want_scores, rtol=1e-5, atol=1e-5)
    for i in range(batch):
        for g, w, s in zip(got.rows[i], want_rows[i], want_scores[i]):
            assert g == w or abs(brute[i, g] - s) < 1e-5  # equal ids, or a tie
    assert got.ids[0] == [f"doc{r}" for r in got.rows[0]]
    assert set(got.timing) == {"search_ms", "rerank_ms"} and got.timing["rerank_ms"] == 0.0


@pytest.mark.parametrize("kind,lam", [("fusion", 3.0), ("dhr", 0.5), ("dlr", 1.0)])
def test_two_stage_with_all_candidates_equals_exhaustive_gip(tmp_path, kind, lam):
    index = make_index(tmp_path, kind, lam=lam)
    queries = queries_for(index, 6)
    searcher = Searcher(index)
    got = searcher.search(queries, SearchParams(k=300, candidates=300))
    xq = searcher.scale(queries.values, None)
    want_scores, want_rows = numpy_topk(numpy_gip(xq, queries.gates, index.values, index.gates), 300)
    np.testing.assert_array_equal(np.array(got.rows), want_rows)
    np.testing.assert_allclose(np.array(got.scores), want_scores, rtol=1e-5, atol=1e-5)
    assert got.timing["rerank_ms"] > 0.0


def test_lambda_scales_only_the_query_dense_part(tmp_path):
    index = make_index(tmp_path, "fusion", lam=2.0)
    queries = queries_for(index, 3)
    searcher = Searcher(index)
    for lam in (None, 0.0, 7.5):
        xq = queries.values.copy()
        xq[:, index.spec.gated_dim:] *= 2.0 if lam is None else lam
        want_scores, want_rows = numpy_topk(numpy_gip(xq, queries.gates, index.values, index.gates), 10)
        got = searcher.search(queries, SearchParams(k=10, candidates=300, lam=lam))
        np.testing.assert_array_equal(np.array(got.rows), want_rows)
        np.testing.assert_allclose(np.array(got.scores), want_scores, rtol=1e-5, atol=1e-5)


def test_approx_gip_first_stage_with_low_theta_equals_exhaustive(tmp_path):
    index = make_index(tmp_path, "fusion", lam=1.5)
    queries = queries_for(index, 3)
    searcher = Searcher(index)
    exact = searcher.search(queries, SearchParams(k=10, candidates=300))
    approx = searcher.search(queries,
                             SearchParams(k=10, first_stage="approx_gip", theta=-1.0, candidates=10, rerank=False))
    assert approx.rows == exact.rows
    np.testing.assert_allclose(approx.scores, exact.scores, rtol=1e-5, atol=1e-5)


def test_search_is_deterministic_and_batch_equals_single(tmp_path):
    index = make_index(tmp_path, "fusion")
    queries = queries_for(index, 4)
    searcher = Searcher(index)
    batch = searcher.search(queries, SearchParams(k=15, candidates=50))
    assert searcher.search(queries, SearchParams(k=15, candidates=50)).rows == batch.rows
    for i in range(4):
        single = searcher.search(queries[i:i + 1], SearchParams(k=15, candidates=50))
        assert single.rows[0] == batch.rows[i]
        np.testing.assert_allclose(single.scores[0], batch.scores[i], rtol=1e-6)


def test_k_larger_than_index_returns_every_row(tmp_path):
    index = make_index(tmp_path, "fusion", n=12)
    got = Searcher(index).search(queries_for(index, 2), SearchParams(k=50, candidates=100))
    assert [sorted(r) for r in got.rows] == [list(range(12))] * 2


@pytest.mark.parametrize("kwargs,error", [
    ({"k": 0}, SearchError), ({"first_stage": "bm25"}, SearchError), ({"candidates": 10_001}, SearchError),
    ({"candidates": 0}, SearchError), ({"lam": float("nan")}, SearchError),
])
def test_bad_requests_are_refused(tmp_path, kwargs, error):
    index = make_index(tmp_path, "fusion", n=20)
    with pytest.raises(error):
        Searcher(index).search(queries_for(index, 1), SearchParams(**kwargs))


def test_query_of_another_layout_is_refused(tmp_path):
    index = make_index(tmp_path, "fusion", n=20)
    with pytest.raises(IndexMismatchError, match="dim"):
        Searcher(index).search(Encoded(np.zeros((1, 5), np.float32), np.zeros((1, 3), np.uint8)))
    with pytest.raises(IndexMismatchError, match="gates"):
        Searcher(index).search(Encoded(np.zeros((1, index.spec.dim), np.float32)))


def test_explain_splits_the_search_score(tmp_path):
    encoder = FakeEncoder("fusion")
    texts = ["alpha beta gamma", "beta delta", "gamma gamma epsilon alpha", "zeta"]
    encoded = encoder.encode(texts, "passage")
    docs = [Document(f"d{i}", "", t) for i, t in enumerate(texts)]
    index = load_index(build.build_from_arrays(tmp_path / "ix", encoder.spec, encoded, docs, lam=4.0))
    query = encoder.encode(["alpha gamma"], "query")
    result = Searcher(index).search(query, SearchParams(k=4))
    for row, score in zip(result.rows[0], result.scores[0]):
        e = explain(query, index, row, lam=4.0, vocab_size=encoder.vocab_size)
        assert e.total == pytest.approx(score, rel=1e-5, abs=1e-5)
        g = encoder.spec.gated_dim
        q, p = query.values[0].astype(np.float64), index.values[row].astype(np.float64)
        assert e.semantic == pytest.approx(4.0 * q[g:] @ p[g:], rel=1e-6)
        assert e.lexical == pytest.approx(numpy_gip(q[None, :g], query.gates, p[None, :g], index.gates[row:row + 1])[0, 0])
    best = explain(query, index, 2, lam=4.0, vocab_size=encoder.vocab_size)
    assert {encoder.term(t.token_id) for t in best.terms} == {"alpha", "gamma"}
    assert [t.contribution for t in best.terms] == sorted((t.contribution for t in best.terms), reverse=True)
    assert explain(query, index, 3, lam=4.0, vocab_size=encoder.vocab_size).terms == []


def test_single_thread_setting_stays_in_the_calling_thread():
    import threading

    import faiss

    before = faiss.omp_get_max_threads()
    seen = []

    def other():
        with faiss_engine.omp_threads(before + 1):
            seen.append(faiss.omp_get_max_threads())
            seen.append(main_view.wait(5))

    main_view = threading.Event()
    worker = threading.Thread(target=other)
    worker.start()
    wait_until(lambda: seen, what="the worker set its own thread count")
    assert faiss.omp_get_max_threads() == before  # the worker's setting did not leak here
    main_view.set()
    worker.join(5)
    assert seen == [before + 1, True] and faiss.omp_get_max_threads() == before


@pytest.mark.parametrize("run,scans", [(6, 1), (40, 2)])  # a run through the cut that ends within the probe, one past it
def test_a_ranked_first_stage_keeps_the_lowest_rows_of_a_run_tied_at_the_cut(tmp_path, monkeypatch, run, scans):
    rng = np.random.default_rng(run)
    values = np.zeros((500, 4), dtype=np.float32)
    values[:, 0] = rng.uniform(0.0, 1.0, 500)  # distinct scores below the run
    tied = np.sort(rng.choice(np.arange(5, 500), run, replace=False))
    values[tied, 0] = 5.0
    values[:5, 0] = 10.0  # five rows above the run
    spec = EncoderSpec(kind="cls", dim=4, gated_dim=0, lam=1.0, vocab_size=30522, model_id="random", weights_hash="r")
    docs = [Document(f"doc{i}", "", f"text {i}") for i in range(500)]
    index = load_index(build.build_from_arrays(tmp_path / "tied", spec, Encoded(values, None), docs))
    searcher = Searcher(index)
    calls = []
    first_stage = searcher._first_stage
    monkeypatch.setattr(searcher, "_first_stage", lambda *a, **kw: calls.append(a[3]) or first_stage(*a, **kw))
    found = searcher.search(Encoded(np.array([[1.0, 0, 0, 0]], np.float32), None), SearchParams(k=8, rerank=False))
    assert found.rows == [[0, 1, 2, 3, 4, *tied[:3].tolist()]]
    assert len(calls) == scans  # a short run is read whole by the first scan
