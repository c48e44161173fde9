"""Filtered search in the approximate first stages, against numpy brute force over the rows a filter keeps.

The hard filters are those keeping the rows least like the query ("everything but what I have seen"):
the kept rows' best scores then lie far down an unfiltered ranking. The engines' exact-scan limits are
lowered so that these small seeded corpora take the approximate paths a corpus of millions takes.
"""

import faiss
import numpy as np
import pytest

from densehybrid.index.building.ann import build_hnsw
from densehybrid.index.building.pqscan import build_pqscan
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.engines.hnsw_engine import HNSWConfig, HnswStore
from densehybrid.index.engines.pqscan_engine import PQScanConfig, PQScanStore, fast_scan
from densehybrid.index.search.filters import Selection
from test_hnsw import brute_topk, clustered

N, DIM, K = 20_000, 64, 10


@pytest.fixture(autouse=True)
def approximate_paths(monkeypatch):
    """Filters keeping a few hundred rows or more take the approximate path (as tens of thousands do at scale)."""
    monkeypatch.setattr(hnsw_engine, "EXACT_KEPT_ROWS", 200)


@pytest.fixture(scope="module")
def xb():
    return clustered(N, DIM, seed=20, latent=16, unit=True).astype(np.float16)


@pytest.fixture(scope="module")
def xq():
    return clustered(30, DIM, seed=21, latent=16, unit=True)


@pytest.fixture(scope="module")
def pq_codes(xb):
    return build_pqscan(xb, PQScanConfig(rescore=50, margin=0.2, train_size=4000))


def pqscan(xb, built) -> PQScanStore:
    codes, config = built
    return PQScanStore(fast_scan(codes), xb, None, (), config.rescore, config.margin)


@pytest.fixture(scope="module")
def stores(xb, pq_codes):
    hnsw = HNSWConfig(m=16, ef_construction=64, ef_search=64, train_size=4000)
    return {"pqscan": pqscan(xb, pq_codes),
            "hnsw": HnswStore(build_hnsw(xb, hnsw)[0], xb, None, (), hnsw.ef_search)}


def least_like(q: np.ndarray, xb: np.ndarray, fraction: float) -> np.ndarray:
    """(N,) bool: the ``fraction`` of the rows whose exact scores with ``q`` are lowest."""
    scores = np.asarray(xb, np.float32) @ q
    mask = np.zeros(len(xb), bool)
    mask[np.argsort(scores)[:int(len(xb) * fraction)]] = True
    return mask


def selection(mask: np.ndarray) -> Selection:
    return Selection(int(mask.sum()), len(mask), mask=mask)


def recall_kept(found: np.ndarray, q: np.ndarray, xb: np.ndarray, mask: np.ndarray) -> float:
    """Share of the exact top K of the kept rows found; a found row counts when its exact score reaches
    the K-th (tied scores alike)."""
    want_scores, _ = brute_topk(q[None], xb, K, np.flatnonzero(mask))
    assert mask[found[found >= 0]].all()
    got = np.asarray(xb[found[found >= 0]], np.float64) @ q.astype(np.float64)
    return min(K, int((got >= want_scores[0, -1] - 1e-6).sum())) / min(K, int(mask.sum()))


def filtered_recall(store, xq, xb, fraction: float) -> np.ndarray:
    """Per query, recall@K of a search whose filter keeps the ``fraction`` of rows least like it."""
    out = []
    for q in xq:
        mask = least_like(q, xb, fraction)
        out.append(recall_kept(store.inner_product(q[None], K, selection(mask))[1][0], q, xb, mask))
    return np.array(out)


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_pqscan_finds_the_top10_of_the_rows_least_like_the_query(stores, xq, xb, fraction):
    assert filtered_recall(stores["pqscan"], xq, xb, fraction).mean() >= 0.95


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5, 0.8])
def test_a_walk_that_misses_the_rows_least_like_the_query_is_caught_and_they_are_scanned_exactly(
        stores, xq, xb, fraction):
    # the walk leads to rows the filter drops: a filter keeping a query's nearest rows less than the rest,
    # or an answer short of rows or beaten by a sampled kept row, is answered by an exact scan of its rows
    assert filtered_recall(stores["hnsw"], xq, xb, fraction).min() == 1.0


def test_a_random_filter_keeps_about_its_share_of_every_query_s_neighbours(stores, xq):
    for fraction in (0.05, 0.2, 0.5, 0.8):
        mask = np.random.default_rng(23).random(N) < fraction
        assert not stores["hnsw"]._aside(xq, selection(mask)).any()


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9])
def test_pqscan_treats_the_kept_rows_as_an_unfiltered_search_of_them_alone(xb, xq, pq_codes, fraction):
    codes, config = pq_codes
    for q in xq[:10]:
        mask = least_like(q, xb, fraction)
        kept = np.flatnonzero(mask)
        alone = faiss.IndexPQ(DIM, codes.pq.M, codes.pq.nbits, faiss.METRIC_INNER_PRODUCT)
        alone.pq, alone.is_trained = codes.pq, True  # the same codebooks, the kept rows' codes in row order
        alone.add_sa_codes(faiss.vector_to_array(codes.codes).reshape(N, -1)[kept])
        want_scores, want = pqscan(xb[kept], (alone, config)).inner_product(q[None], K)
        scores, found = pqscan(xb, pq_codes).inner_product(q[None], K, selection(mask))
        np.testing.assert_array_equal(found[0], kept[want[0]])
        np.testing.assert_array_equal(scores, want_scores)


def test_pqscan_with_a_filter_keeping_every_row_is_the_unfiltered_search(stores, xq, xb):
    everything = np.ones(N, bool)
    for depth in (10, 100):
        unfiltered = stores["pqscan"].inner_product(xq, depth)
        filtered = stores["pqscan"].inner_product(xq, depth, selection(everything))
        np.testing.assert_array_equal(filtered[1], unfiltered[1])
        np.testing.assert_array_equal(filtered[0], unfiltered[0])


@pytest.mark.parametrize("engine", ["pqscan", "hnsw"])
def test_an_answer_is_never_shorter_than_k_while_k_kept_rows_exist(monkeypatch, stores, xq, xb, engine):
    monkeypatch.setattr(hnsw_engine, "EXACT_KEPT_ROWS", 0)
    monkeypatch.setattr(hnsw_engine, "EXACT_KEPT_FRACTION", 0.0)  # even 12 kept rows take the approximate path
    for q in xq[:10]:
        for fraction in (12 / N, 0.01, 0.3):
            mask = least_like(q, xb, fraction)
            _, found = stores[engine].inner_product(q[None], K, selection(mask))
            assert (found >= 0).all() and mask[found].all() and len(set(found[0])) == K


@pytest.mark.parametrize("engine", ["pqscan", "hnsw"])
@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5, 0.8])
def test_random_filters_keep_the_recall_of_an_unfiltered_search(stores, xq, xb, engine, fraction):
    mask = np.random.default_rng(22).random(N) < fraction
    found = stores[engine].inner_product(xq, K, selection(mask))[1]
    assert np.mean([recall_kept(f, q, xb, mask) for f, q in zip(found, xq)]) >= 0.95


def test_without_a_margin_a_search_rescores_its_rescore_rows_filtered_or_not(monkeypatch, stores, xq, xb):
    counted = []
    original = pqscan_engine.rescore_kept
    monkeypatch.setattr(pqscan_engine, "rescore_kept",
                        lambda q, v, r, k: (counted.append((r >= 0).sum(1).tolist()), original(q, v, r, k))[1])
    mask = least_like(xq[0], xb, 0.5)
    want = []
    for chosen in (None, selection(mask)):
        stores["pqscan"].inner_product(xq[:1], K, chosen, margin=0.0, rescore=30)
        # every kept row whose code score reaches the 30th best kept one: a run tied across the cut, whole
        codes = np.sort(stores["pqscan"].scan.search(xq[:1], N)[0][0])[::-1]
        codes = codes if chosen is None else np.sort(_kept_code_scores(stores["pqscan"], xq[0], mask))[::-1]
        want.append([int((codes >= codes[29]).sum())])
    assert counted == want and min(want)[0] >= 30  # no exact-score floor, no wider scan, no exact scan


def _kept_code_scores(store, q, mask):
    """The code scores of the rows ``mask`` keeps, read from an unfiltered scan of every row."""
    scores, rows = store.scan.search(q[None], N)
    return scores[0][(rows[0] >= 0)][mask[rows[0][rows[0] >= 0]]]
