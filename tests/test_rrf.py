"""Reciprocal-rank fusion (``rrf``), each hit's part scores, and queries whose lexical part is empty."""

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded
from densehybrid.index.search import fusion
from densehybrid.index.search.searcher import Searcher, SearchError
from densehybrid.index.search.params import SearchParams
from test_search import make_index, queries_for

ALL_METHODS = fusion.FUSION_METHODS


def python_ranks(row, valid):
    """Competition ranks of one row in plain Python: 1 + how many valid cells score strictly more."""
    kept = [s for s, v in zip(row, valid) if v]
    return [1 + sum(other > s for other in kept) if v else 0 for s, v in zip(row, valid)]


def test_part_ranks_share_the_best_rank_among_equal_scores_and_skip_padding():
    scores = np.array([[0.5, 2.0, 2.0, -1.0, 7.0], [3.0, 3.0, 3.0, 3.0, 9.0]])
    valid = np.array([[True, True, True, True, False], [True, True, True, True, True]])
    assert fusion.part_ranks(scores, valid).tolist() == [[3, 1, 1, 4, 0], [2, 2, 2, 2, 1]]
    rng = np.random.default_rng(4)
    scores = rng.integers(0, 6, (5, 40)).astype(np.float64)  # many ties
    valid = rng.random((5, 40)) < 0.8
    got = fusion.part_ranks(scores, valid)
    for row, v, ranks in zip(scores, valid, got):
        assert ranks.tolist() == python_ranks(row, v)


def test_rrf_equals_a_hand_computation():
    # three candidates; lexical order c > a > b, dense order a > b > c; k = 60
    lexical = np.array([[2.0, 1.0, 5.0]])
    dense = np.array([[0.9, 0.4, 0.1]])
    got = fusion.fuse(lexical, dense, "rrf")
    want = [1 / 62 + 1 / 61, 1 / 63 + 1 / 62, 1 / 61 + 1 / 63]
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
    np.testing.assert_allclose(fusion.fuse(lexical, dense, "rrf", rrf_k=0)[0], [1 / 2 + 1, 1 / 3 + 1 / 2, 1 + 1 / 3],
                               rtol=1e-6)


@pytest.mark.parametrize("rrf_k", [60, 1, 0, 1000])
def test_rrf_equals_python_over_random_parts_with_padding(rrf_k):
    rng = np.random.default_rng(rrf_k)
    lexical = np.round(rng.gamma(2.0, 3.0, (6, 30)), 1)  # rounded: ties
    dense = rng.normal(0, 1, (6, 30))
    valid = rng.random((6, 30)) < 0.85
    got = fusion.fuse(lexical, dense, "rrf", rrf_k=rrf_k, valid=valid)
    for q in range(6):
        lex_ranks, dense_ranks = python_ranks(lexical[q], valid[q]), python_ranks(dense[q], valid[q])
        for j in range(30):
            if valid[q, j]:
                assert got[q, j] == pytest.approx(1 / (rrf_k + lex_ranks[j]) + 1 / (rrf_k + dense_ranks[j]), rel=1e-6)
            else:
                assert got[q, j] == -np.inf


def test_rrf_is_unchanged_by_any_increasing_map_of_a_part():
    rng = np.random.default_rng(8)
    lexical, dense = rng.gamma(2.0, 4.0, (5, 50)), rng.normal(0.4, 0.1, (5, 50))
    base = fusion.fuse(lexical, dense, "rrf")
    np.testing.assert_array_equal(fusion.fuse(np.log1p(lexical) * 30, np.exp(dense), "rrf"), base)


def test_bad_rrf_k_is_refused():
    lexical = dense = np.ones((1, 3))
    with pytest.raises(ValueError, match="rrf k"):
        fusion.fuse(lexical, dense, "rrf", rrf_k=-1)
    with pytest.raises(ValueError, match="rrf k"):
        fusion.fuse(lexical, dense, "rrf", rrf_k=float("nan"))


def exhaustive_parts(index, queries, lam):
    """float64 (lexical, λ·dense) scores of every row: numpy, independent of the engines."""
    g = index.spec.gated_dim
    q, p = queries.values.astype(np.float64), np.asarray(index.values, dtype=np.float64)
    match = queries.gates[:, None, :] == np.asarray(index.gates)[None, :, :]
    lexical = np.einsum("qd,nd,qnd->qn", q[:, :g], p[:, :g], match)
    dense = lam * (q[:, g:] @ p[:, g:].T)
    return lexical, dense


@pytest.mark.parametrize("kind", ["fusion", "dhr"])
@pytest.mark.parametrize("rrf_k", [None, 5])
def test_searcher_rrf_over_every_row_equals_numpy(tmp_path, kind, rrf_k):
    index = make_index(tmp_path, kind, lam=3.0)
    queries = queries_for(index, 5)
    got = Searcher(index).search(queries, SearchParams(k=30, candidates=index.count, method="rrf", rrf_k=rrf_k))
    lexical, dense = exhaustive_parts(index, queries, 3.0)
    k_rrf = 60 if rrf_k is None else rrf_k
    lex_rank = 1 + (lexical[:, None, :] > lexical[:, :, None]).sum(axis=2)
    dense_rank = 1 + (dense[:, None, :] > dense[:, :, None]).sum(axis=2)
    fused = 1 / (k_rrf + lex_rank) + 1 / (k_rrf + dense_rank)
    rows = np.arange(index.count)[None, :].repeat(len(fused), 0)
    order = np.lexsort((rows, -fused.astype(np.float32)), axis=-1)[:, :30]
    np.testing.assert_array_equal(np.array(got.rows), order)
    np.testing.assert_allclose(np.array(got.scores), np.take_along_axis(fused, order, 1), rtol=1e-6)
    # each hit's part scores are the exact ones of its row
    np.testing.assert_allclose(got.lexical_scores, np.take_along_axis(lexical, order, 1), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(got.dense_scores, np.take_along_axis(dense, order, 1), rtol=2e-3, atol=2e-3)


def test_the_index_records_the_default_rrf_k_and_a_request_overrides_it(tmp_path):
    index = make_index(tmp_path, "fusion", lam=2.0)
    queries = queries_for(index, 3)
    searcher = Searcher(index)
    assert index.rrf_k == 60
    default = searcher.search(queries, SearchParams(k=20, method="rrf"))
    assert default.scores == searcher.search(queries, SearchParams(k=20, method="rrf", rrf_k=60)).scores
    index.manifest["fusion"] = {**index.manifest.get("fusion", {}), "rrf_k": 2}
    assert searcher.search(queries, SearchParams(k=20, method="rrf")).scores == \
        searcher.search(queries, SearchParams(k=20, method="rrf", rrf_k=2)).scores != default.scores
    with pytest.raises(SearchError, match="rrf_k"):
        searcher.search(queries, SearchParams(k=5, method="rrf", rrf_k=-3))


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_returns_the_exact_part_scores_of_each_hit(tmp_path, method):
    index = make_index(tmp_path, "dhr", lam=0.5)
    queries = queries_for(index, 3)
    lexical, dense = exhaustive_parts(index, queries, 0.5)
    for rerank in (True, False):
        got = Searcher(index).search(queries, SearchParams(k=12, method=method, rerank=rerank))
        rows = np.array(got.rows)
        np.testing.assert_allclose(got.lexical_scores, np.take_along_axis(lexical, rows, 1), rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(got.dense_scores, np.take_along_axis(dense, rows, 1), rtol=2e-3, atol=2e-3)
        if method == "lambda" and rerank:  # the raw sum is the two parts added
            np.testing.assert_allclose(got.scores, np.add(got.lexical_scores, got.dense_scores), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["cls", "dlr", "aggretriever"])
def test_kinds_without_two_parts_report_no_part_scores(tmp_path, kind):
    index = make_index(tmp_path, kind)
    got = Searcher(index).search(queries_for(index, 2), SearchParams(k=5))
    assert got.lexical_scores is None and got.dense_scores is None and len(got.ids[0]) == 5


# -- a query whose lexical part is empty ---------------------------------------------

def without_lexical(queries, gated_dim):
    values = queries.values.copy()
    values[:, :gated_dim] = 0.0
    return Encoded(values, queries.gates)


@pytest.mark.parametrize("engine", ["faiss", "torch"])
@pytest.mark.parametrize("method", ["rrf", "zscore", "minmax", "adaptive", "lambda"])
def test_an_empty_lexical_part_still_returns_the_dense_results(tmp_path, engine, method):
    index = make_index(tmp_path, "fusion", lam=2.0)
    queries = without_lexical(queries_for(index, 4), index.spec.gated_dim)
    searcher = Searcher(index, engine=engine)
    dense_alone = searcher.search(queries, SearchParams(k=15, method="dense"))
    for candidates in (index.count, 40):
        got = searcher.search(queries, SearchParams(k=15, method=method, candidates=candidates))
        assert got.rows == dense_alone.rows
        assert np.isfinite(got.scores).all() and np.isfinite(got.dense_scores).all()
        assert not np.any(got.lexical_scores)  # exactly 0: no term to match


def test_an_empty_lexical_part_with_few_candidates_and_pages(tmp_path):
    index = make_index(tmp_path, "dhr", n=200, lam=1.0)
    queries = without_lexical(queries_for(index, 2), index.spec.gated_dim)
    searcher = Searcher(index)
    for method in fusion.PER_QUERY_METHODS:
        first, second = (searcher.search(queries,
                                         SearchParams(k=10, offset=o, candidates=30, method=method)) for o in (0, 10))
        want = searcher.search(queries, SearchParams(k=20, candidates=30, method="dense"))
        assert [a + b for a, b in zip(first.rows, second.rows)] == want.rows, method


@pytest.fixture(scope="module")
def real_fusion_index(tmp_path_factory, splade_tiny_dir, minilm_dir):
    """A real ``fusion`` index (SPLADE-tiny ⊕ λ·MiniLM) of a few sentences, and its encoder."""
    from densehybrid.encoder.loading import load_encoder
    from densehybrid.index.building.build import build_from_arrays, encode_passages
    from densehybrid.index.storage.documents import Document
    from densehybrid.index.served.loading import load_index
    from test_index_models import PASSAGES

    encoder = load_encoder("splade-tiny", kind="fusion", dense_model="minilm", lam=20.0)
    docs = [Document(doc_id, "", text) for doc_id, text in PASSAGES.items()]
    out = build_from_arrays(tmp_path_factory.mktemp("real") / "ix", encoder.spec,
                            encode_passages(encoder, [d.text for d in docs], 8), docs, lam=20.0)
    return load_index(out), encoder


# SPLADE-tiny expands [CLS], [SEP] and [UNK] into vocabulary terms, so no text we tried (stop words,
# punctuation, Thai, Cuneiform) gives an all-zero lexical vector: these queries have a weak, near-empty
# lexical part, and the test then also zeroes it exactly, on top of the model's real dense part.
NEAR_EMPTY_QUERIES = ["the of and a", "!!! ??? ...", "ไม่มีคำ ภาษาไทย", "𒀀𒀁𒀂"]


def test_real_model_queries_without_useful_terms_return_dense_results_for_every_method(real_fusion_index):
    index, encoder = real_fusion_index
    searcher = Searcher(index)
    encoded = encoder.encode(NEAR_EMPTY_QUERIES, "query")
    for method in ALL_METHODS:
        got = searcher.search(encoded, SearchParams(k=5, method=method))
        assert all(len(ids) == 5 for ids in got.ids), method
        assert np.isfinite(got.scores).all() and np.isfinite(got.lexical_scores).all(), method
    emptied = without_lexical(encoded, index.spec.gated_dim)
    dense_alone = searcher.search(emptied, SearchParams(k=5, method="dense"))
    for method in fusion.PER_QUERY_METHODS:
        got = searcher.search(emptied, SearchParams(k=5, method=method))
        assert got.rows == dense_alone.rows and np.isfinite(got.scores).all(), method
    assert searcher.search(encoder.encode(["what causes ocean tides"], "query"),
                           SearchParams(k=1, method="rrf")).ids == [["tides"]]

