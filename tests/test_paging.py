"""Pagination (``offset``): pages are slices of one order (score descending, then row ascending), the same
on every engine, also where many rows tie; and the first stage fetches at least ``offset + k`` rows."""

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.index.building import build
from densehybrid.index.search import fusion, gip
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index
from densehybrid.index.writes.live import LiveIndex
from densehybrid.index.search.searcher import TIE_PROBE, Searcher, SearchError
from densehybrid.index.search.params import SearchParams
from test_gip import numpy_gip

GATED, DENSE = 24, 8


def dyadic(rng, shape, low=-4, high=5):
    """Multiples of 1/8: every product and sum below is exact in float16/float32, so copies tie exactly."""
    return (rng.integers(low, high, shape) / 8).astype(np.float32)


def tied_rows(kind, n, distinct, seed):
    """``n`` rows that are copies of ``distinct`` vectors, in shuffled order: runs of exactly equal scores."""
    rng = np.random.default_rng(seed)
    gated = GATED if kind in ("dhr", "fusion", "dlr") else 0
    dim = gated + DENSE if kind != "cls" else DENSE
    originals = dyadic(rng, (distinct, dim))
    originals[:, :gated] = np.abs(originals[:, :gated])  # lexical weights are not negative
    original_gates = rng.integers(0, 3, (distinct, gated), dtype=np.uint8) if gated else None
    copy_of = rng.permutation(np.arange(n) % distinct)
    gates = None if original_gates is None else original_gates[copy_of]
    return originals[copy_of], gates, dim, gated


def tied_index(tmp_path, kind="fusion", n=120, distinct=6, seed=0, lam=1.0, name=None):
    values, gates, dim, gated = tied_rows(kind, n, distinct, seed)
    spec = EncoderSpec(kind=kind, dim=dim, gated_dim=gated, lam=lam, vocab_size=30522, dlr_dim=gated or None,
                       model_id="random", weights_hash="r")
    docs = [Document(f"doc{i}", "", f"text {i}") for i in range(n)]
    out = build.build_from_arrays(tmp_path / (name or f"tied-{kind}-{seed}"), spec, Encoded(values, gates), docs,
                                  lam=lam)
    return load_index(out)


def tied_queries(index, q=3, seed=7):
    rng = np.random.default_rng(seed)
    values = dyadic(rng, (q, index.spec.dim))
    values[:, :index.spec.gated_dim] = np.abs(values[:, :index.spec.gated_dim])
    gates = rng.integers(0, 3, (q, index.spec.gated_dim), dtype=np.uint8) if index.spec.gated_dim else None
    return Encoded(values, gates)


def canonical(scores):
    """Rows of each query by score descending, then row ascending (numpy, over every row)."""
    rows = np.arange(scores.shape[1])[None, :].repeat(scores.shape[0], 0)
    return np.lexsort((rows, -scores), axis=-1)


def exact_scores(index, queries, lam=1.0):
    xq = queries.values.astype(np.float64).copy()
    xq[:, index.spec.gated_dim:] *= lam
    return numpy_gip(xq, queries.gates, index.values, index.gates)


def pages_agree(search, **params):
    """page(0, 20) == page(0, 10) + page(10, 10), field by field; returns the whole page."""
    whole = search(k=20, offset=0, **params)
    first, second = search(k=10, offset=0, **params), search(k=10, offset=10, **params)
    for field in ("ids", "rows", "scores", "lexical_scores", "dense_scores"):
        got_whole = getattr(whole, field)
        if got_whole is None:
            assert getattr(first, field) is None and getattr(second, field) is None
            continue
        assert [a + b for a, b in zip(getattr(first, field), getattr(second, field))] == got_whole, field
    return whole


def test_the_tied_index_has_long_runs_of_equal_scores(tmp_path):
    index = tied_index(tmp_path)
    scores = exact_scores(index, tied_queries(index))
    top = np.sort(scores, axis=1)[:, ::-1]
    assert ((top[:, :20] == top[:, :1]).sum(axis=1) >= 15).all()  # the first page lies inside one run


@pytest.mark.parametrize("engine", ["faiss", "torch"])
@pytest.mark.parametrize("kind,params", [
    ("cls", {}),  # no rerank: the first stage is the ranking
    ("fusion", {"rerank": False, "lam": 1.0}),
    ("fusion", {"method": "lambda"}),
    ("fusion", {"method": "lambda", "candidates": 20}),
    ("dhr", {"method": "dense"}),
    ("dlr", {}),
])
def test_pages_are_slices_of_the_score_then_row_order_on_every_engine(tmp_path, engine, kind, params):
    index = tied_index(tmp_path, kind)
    queries = tied_queries(index)
    searcher = Searcher(index, engine=engine)
    whole = pages_agree(lambda **p: searcher.search(queries, SearchParams(**p)), **params)
    if "candidates" in params:
        return  # fewer candidates than rows: the pages agree, but they are not the exhaustive order
    if params.get("rerank") is False or kind == "cls":
        scores = queries.values.astype(np.float64) @ index.values.astype(np.float64).T  # the first stage's
    elif params.get("method") == "dense":
        _, dense_only = fusion.split_query(queries.values, GATED)
        scores = exact_scores(index, Encoded(dense_only, queries.gates))
    else:
        scores = exact_scores(index, queries)
    np.testing.assert_array_equal(np.array(whole.rows), canonical(scores)[:, :20])
    # a page past the first ones, and one past the last row
    deep = searcher.search(queries, SearchParams(k=15, offset=100, **params))
    np.testing.assert_array_equal(np.array(deep.rows), canonical(scores)[:, 100:115])
    assert searcher.search(queries, SearchParams(k=10, offset=index.count, **params)).ids == [[], [], []]


@pytest.mark.parametrize("engine", ["faiss", "torch"])
@pytest.mark.parametrize("method", ["rrf", "zscore", "minmax", "adaptive"])
def test_fused_pages_agree_and_tie_by_row(tmp_path, engine, method):
    index = tied_index(tmp_path, "fusion", lam=2.0)
    queries = tied_queries(index)
    searcher = Searcher(index, engine=engine)
    for candidates in (index.count, 20):
        whole = pages_agree(lambda **p: searcher.search(queries,
                                                        SearchParams(**p)), method=method, candidates=candidates)
        for scores, rows in zip(whole.scores, whole.rows):
            pairs = list(zip(scores, rows))
            assert pairs == sorted(pairs, key=lambda sr: (-sr[0], sr[1]))  # equal scores: lower row first
            assert len(set(scores)) < len(scores)  # copies tie, so the tie order is what is tested
    # every engine: the same pages
    faiss_page = Searcher(index).search(queries, SearchParams(k=10, offset=10, method=method))
    assert searcher.search(queries, SearchParams(k=10, offset=10, method=method)).rows == faiss_page.rows


def test_the_first_stage_fetches_at_least_offset_plus_k(tmp_path):
    index = tied_index(tmp_path, "fusion", n=300, distinct=300, seed=3)
    queries = tied_queries(index)
    searcher = Searcher(index)
    calls = []
    inner_product = searcher.store.inner_product
    searcher.store.inner_product = lambda xq, depth: calls.append(depth) or inner_product(xq, depth)
    got = searcher.search(queries, SearchParams(k=10, offset=90, candidates=5, method="lambda"))
    assert all(len(rows) == 10 for rows in got.rows) and min(calls) >= 100
    for method in fusion.PER_QUERY_METHODS:
        calls.clear()
        got = searcher.search(queries, SearchParams(k=10, offset=190, candidates=5, method=method))
        assert all(len(rows) == 10 for rows in got.rows) and min(calls) >= 200, method
    # with all rows as candidates, a deep page is the exhaustive order's slice
    got = searcher.search(queries, SearchParams(k=10, offset=250, candidates=index.count, method="lambda"))
    np.testing.assert_array_equal(np.array(got.rows), canonical(exact_scores(index, queries))[:, 250:260])
    with pytest.raises(SearchError, match="offset"):
        searcher.search(queries, SearchParams(k=10, offset=-1))


def test_a_tie_run_across_the_cut_is_read_whole(tmp_path):
    # the engine is asked TIE_PROBE rows past the cut; when the run at the cut lasts through them, the whole
    # run is read and the lowest rows of it are kept, whatever the engine's own choice within the run
    index = tied_index(tmp_path, "cls", n=200, distinct=4)
    queries = tied_queries(index, q=2)
    searcher = Searcher(index, engine="torch")
    depths = []
    inner_product = searcher.store.inner_product

    def shuffled_ties(xq, depth):
        depths.append(depth)
        scores, rows = inner_product(xq, index.count)
        rng = np.random.default_rng(len(depths))
        keep = []  # a top list that keeps a random part of the run at the cut, as an engine may
        for q in range(len(xq)):
            order = np.lexsort((rng.random(index.count), -scores[q]))[:depth]
            keep.append(order)
        keep = np.array(keep)
        picked = np.take_along_axis(rows, keep, 1)
        return gip.sort_by_score(np.take_along_axis(scores, keep, 1), picked, depth)

    searcher.store.inner_product = shuffled_ties
    got = searcher.search(queries, SearchParams(k=10))
    scores = queries.values.astype(np.float64) @ index.values.astype(np.float64).T
    np.testing.assert_array_equal(np.array(got.rows), canonical(scores)[:, :10])
    assert depths == [10 + TIE_PROBE, index.count]  # the probe found a long tie at the cut and read on


def test_live_writes_page_with_base_rows_before_equal_added_rows(tmp_path):
    index = tied_index(tmp_path, "fusion", name="base")
    live = LiveIndex.open(tmp_path / "base", Searcher, log_dir=tmp_path / "wal")
    values, gates = np.array(index.values[:10], dtype=np.float32), np.array(index.gates[:10])
    added = [Document(f"new{i}", "", f"copy of doc{i}") for i in range(10)]
    live.upsert(added, values, gates)  # copies of base rows: each ties with its original
    live.delete("doc3")
    queries = tied_queries(index)
    for params in ({"method": "lambda"}, {"rerank": False}, {"method": "rrf"}):
        whole = pages_agree(lambda **p: live.search(queries, SearchParams(**p)), **params)
        for scores, rows, ids in zip(whole.scores, whole.rows, whole.ids):
            pairs = list(zip(scores, rows))
            assert pairs == sorted(pairs, key=lambda sr: (-sr[0], sr[1]))
            assert "doc3" not in ids
        # page after page reaches every live document once
        deep = [live.search(queries, SearchParams(k=10, offset=o, **params)) for o in range(0, live.count + 10, 10)]
        live_ids = {f"doc{i}" for i in range(index.count) if i != 3} | {doc.id for doc in added}
        for q in range(len(queries)):
            every = sum((page.ids[q] for page in deep), [])
            assert len(every) == len(live_ids) and set(every) == live_ids, params


@pytest.mark.slow  # Milvus Lite: a store process per database file; and the server
def test_milvus_pages_equal_the_local_index(tmp_path, milvus_target):
    from densehybrid.index.served import milvus, milvus_export

    index = tied_index(tmp_path, "fusion")
    uri = milvus_target.uri()
    milvus_export.export_index(index, uri, "tied", batch_size=32)
    try:
        collection = milvus.open_collection(uri, "tied")
        queries = tied_queries(index)
        remote, local = Searcher(collection), Searcher(index)
        for params in ({"method": "lambda"}, {"method": "rrf"}, {"method": "zscore"}, {"rerank": False, "lam": 1.0}):
            whole = pages_agree(lambda **p: remote.search(queries, SearchParams(**p)), **params)
            want = local.search(queries, SearchParams(k=20, **params))
            assert whole.rows == want.rows and whole.lexical_scores == want.lexical_scores, params
    finally:
        from milvus_lite.server_manager import server_manager_instance

        server_manager_instance.release_all()
