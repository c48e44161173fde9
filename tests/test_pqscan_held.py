"""A pqscan search deeper than the rows its margin must hold: the first ``held`` rows as at that depth, the rest the
best of the depth's best codes rescored, and no exact scan for a rerank's thousand candidates."""

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded
from densehybrid.index.building.pqscan import build_pqscan
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.engines.pqscan_engine import PQScanConfig, PQScanStore, code_scan
from densehybrid.index.search.filters.rows import Selection
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from test_hnsw import brute_topk, clustered, make_index

N, DIM = 4000, 32


@pytest.fixture(scope="module")
def xb():
    return clustered(N, DIM, seed=50, unit=True).astype(np.float16)


@pytest.fixture(scope="module")
def store(xb):
    codes = build_pqscan(xb, PQScanConfig(train_size=N))[0]
    return PQScanStore(code_scan(codes), xb, None, (), 50, 0.1)


@pytest.fixture(scope="module")
def xq():
    return clustered(15, DIM, seed=51, unit=True)


def spy_on_exact_scans(monkeypatch) -> list:
    calls, exact = [], pqscan_engine.kept_exactly
    monkeypatch.setattr(pqscan_engine, "kept_exactly", lambda *args: calls.append(1) or exact(*args))
    return calls


def test_the_held_rows_are_at_least_those_of_a_search_that_deep_and_the_rest_the_best_codes_rescored(store, xb, xq):
    for q in xq:
        shallow_scores, _ = store.inner_product(q[None], 10)
        scores, rows = store.inner_product(q[None], 600, held=10)
        assert (scores[0, :10] >= shallow_scores[0] - 1e-6).all()  # its candidates hold the shallow search's
        assert (rows >= 0).all() and len(set(rows[0].tolist())) == 600
        exact = xb[rows[0]].astype(np.float32) @ q
        np.testing.assert_allclose(scores[0], exact, rtol=1e-5, atol=1e-5)  # exact scores, descending
        assert (np.diff(scores[0]) <= 0).all()


def test_a_filtered_deep_search_holds_the_kept_rows_that_a_search_that_deep_finds(store, xq, monkeypatch):
    monkeypatch.setattr(hnsw_engine, "EXACT_KEPT_ROWS", 0)  # this few rows would be scanned exactly
    exact_scans = spy_on_exact_scans(monkeypatch)
    kept = np.random.default_rng(52).random(N) < 0.3
    selection = Selection(int(kept.sum()), N, mask=kept)
    for q in xq:
        shallow_scores, _ = store.inner_product(q[None], 10, selection)
        scores, rows = store.inner_product(q[None], 600, selection, held=10)
        assert kept[rows[0]].all() and len(set(rows[0].tolist())) == 600
        assert (scores[0, :10] >= shallow_scores[0] - 1e-6).all()
    assert exact_scans == []


def test_held_none_or_the_whole_depth_is_the_search_as_before(store, xq):
    for q in xq[:5]:
        want = store.inner_product(q[None], 40)
        for held in (None, 40, 400):
            got = store.inner_product(q[None], 40, held=held)
            np.testing.assert_array_equal(got[1], want[1])


def test_a_deep_search_holding_few_rows_rescores_candidates_instead_of_scanning_every_row(store, xq, monkeypatch):
    exact_scans = spy_on_exact_scans(monkeypatch)
    monkeypatch.setattr(pqscan_engine, "MAX_RESCORE", 2500)  # fewer than the rows within 0.1 of the 2,000th best
    scores, rows = store.inner_product(xq, 2000, held=10)
    assert exact_scans == [] and (rows >= 0).all()
    store.inner_product(xq, 2000)  # the margin held at the 2,000th row: too many rows within it, an exact scan
    assert exact_scans


def test_a_reranking_search_holds_its_page_and_finds_the_exact_pipeline_s_hits(tmp_path, monkeypatch):
    index = make_index(tmp_path, kind="dhr", n=3000, ann=PQScanConfig(rescore=50, margin=0.1, train_size=3000))
    searcher = Searcher(index)
    held, inner_product = [], searcher.store.inner_product
    monkeypatch.setattr(searcher.store, "inner_product",
                        lambda *args, **kw: held.append(kw.get("held")) or inner_product(*args, **kw))
    exact = Searcher(index)
    exact.store = index.exact_store()
    values = clustered(10, 32, seed=12)
    gates = (np.random.default_rng(12).random((10, 16)) < 0.3).astype(np.uint8)
    params = SearchParams(k=10, candidates=300)
    got = searcher.search(Encoded(values, gates), params).rows
    want = exact.search(Encoded(values, gates), params).rows
    assert held == [10]  # the page, not the 300 candidates
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, want)])
    assert overlap >= 0.9, overlap


def test_a_page_of_a_ranked_search_holds_its_hits_and_not_the_rows_probing_its_cut(tmp_path, monkeypatch):
    index = make_index(tmp_path, n=2000, ann=PQScanConfig(rescore=50, margin=2.0, train_size=2000))
    searcher = Searcher(index)
    calls, inner_product = [], searcher.store.inner_product
    monkeypatch.setattr(searcher.store, "inner_product",
                        lambda xq, depth, **kw: calls.append((depth, kw.get("held"))) or inner_product(xq, depth, **kw))
    xq = clustered(3, 16, seed=13)
    got = searcher.search(Encoded(xq, None), SearchParams(k=10, offset=20)).rows
    assert calls and all(held == 30 and depth > 30 for depth, held in calls)
    truth = brute_topk(xq, np.asarray(index.values), 30)[1][:, 20:]
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth)]) >= 0.9


def test_an_approximate_gip_first_stage_on_a_pqscan_index_is_not_handed_the_held_rows(tmp_path):
    index = make_index(tmp_path, kind="dhr", n=1000, ann=PQScanConfig(rescore=50, margin=0.5, train_size=1000))
    values = clustered(3, 32, seed=14)
    gates = (np.random.default_rng(14).random((3, 16)) < 0.3).astype(np.uint8)
    params = SearchParams(k=10, candidates=200, first_stage="approx_gip")
    got = Searcher(index).search(Encoded(values, gates), params)
    assert [len(rows) for rows in got.rows] == [10, 10, 10]
