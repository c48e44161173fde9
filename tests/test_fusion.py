"""Normalised fusion of the lexical and dense parts (index/search/fusion.py) and its use by the searcher."""

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded
from densehybrid.index.search import fusion, gip
from densehybrid.index.search.mix import resolve_method
from densehybrid.index.search.searcher import Searcher, SearchError
from densehybrid.index.search.params import SearchParams
from test_search import make_index, queries_for


def seeded_parts(q=7, k=50, seed=3):
    rng = np.random.default_rng(seed)
    lexical = rng.gamma(2.0, 4.0, (q, k)) * rng.uniform(0.5, 20.0, (q, 1))
    dense = rng.normal(0.4, 0.1, (q, k))
    return lexical, dense


def ranking(scores):
    return np.lexsort((np.arange(scores.shape[1])[None, :].repeat(scores.shape[0], 0), -scores), axis=-1)


@pytest.mark.parametrize("method", ["zscore", "minmax"])
def test_normalise_equals_a_numpy_rederivation(method):
    lexical, _ = seeded_parts()
    got = fusion.normalise(lexical, method)
    for row, out in zip(lexical, got):
        if method == "zscore":
            want = (row - row.mean()) / row.std()
        else:
            want = (row - row.min()) / (row.max() - row.min())
        np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


def test_normalise_ignores_padding_and_flat_rows():
    scores = np.array([[3.0, 1.0, 2.0, 99.0], [5.0, 5.0, 5.0, 5.0]])
    valid = np.array([[True, True, True, False], [True, True, True, True]])
    got = fusion.normalise(scores, "zscore", valid)
    np.testing.assert_allclose(got[0, :3], (np.array([3.0, 1.0, 2.0]) - 2.0) / np.std([3.0, 1.0, 2.0]))
    assert got[0, 3] == 0.0 and not got[1].any()
    fused = fusion.fuse(scores, scores, "minmax", valid=valid)
    assert fused[0, 3] == -np.inf and np.isfinite(fused[0, :3]).all()


@pytest.mark.parametrize("method", ["zscore", "minmax"])
@pytest.mark.parametrize("lexical_factor,dense_factor", [(37.0, 1.0), (1.0, 0.02), (250.0, 8.0)])
def test_ranking_is_unchanged_when_a_part_is_multiplied_by_a_constant(method, lexical_factor, dense_factor):
    lexical, dense = seeded_parts()
    base = fusion.fuse(lexical, dense, method)
    scaled = fusion.fuse(lexical * lexical_factor, dense * dense_factor, method)
    np.testing.assert_array_equal(ranking(base), ranking(scaled))
    np.testing.assert_allclose(scaled, base, rtol=1e-5, atol=1e-5)
    # the raw λ sum is not scale invariant: the same change reorders it
    raw = fusion.fuse(lexical, dense, "lambda", lam=20.0)
    raw_scaled = fusion.fuse(lexical * lexical_factor, dense * dense_factor, "lambda", lam=20.0)
    assert (ranking(raw) != ranking(raw_scaled)).any()


def test_zscore_equals_the_raw_sum_with_a_per_query_lambda_of_the_spread_ratio():
    # the property that explains the method: z-score fusion at w = 0.5 ranks as lexical + λ_q·dense
    # with λ_q = σ(lexical) / σ(dense) over the query's candidates
    lexical, dense = seeded_parts()
    fused = fusion.fuse(lexical, dense, "zscore", dense_weight=0.5)
    per_query_lambda = lexical.std(axis=1) / dense.std(axis=1)
    raw = lexical + per_query_lambda[:, None] * dense
    np.testing.assert_array_equal(ranking(fused), ranking(raw))


def test_unknown_method_and_weight_out_of_range_are_refused():
    lexical, dense = seeded_parts()
    with pytest.raises(ValueError, match="unknown fusion method"):
        fusion.fuse(lexical, dense, "borda")
    with pytest.raises(ValueError, match="dense weight"):
        fusion.fuse(lexical, dense, "zscore", dense_weight=1.5)


def slow_head_confidence(row, top, depth):
    """One query, plain Python: (best - top-th best) / (best - depth-th best) over the valid scores."""
    ranked = sorted(row, reverse=True)
    if len(ranked) < 2:
        return 0.0
    best, at_top, at_depth = ranked[0], ranked[min(top, len(ranked)) - 1], ranked[min(depth, len(ranked)) - 1]
    return 0.0 if best == at_depth else (best - at_top) / (best - at_depth)


def test_head_confidence_and_adaptive_weight_equal_a_python_rederivation():
    lexical, dense = seeded_parts(q=9, k=150)
    valid = np.ones(lexical.shape, dtype=bool)
    valid[2, 60:] = False  # fewer candidates than the head depth
    valid[3, 5:] = False   # fewer than the top
    valid[4, 1:] = False   # a single candidate: no head to judge
    dense[5] = 0.7         # a flat part: no confidence, the other part decides
    for top, depth in ((10, 100), (3, 40)):
        got_lex = fusion.head_confidence(lexical, valid, top=top, depth=depth)
        got_dense = fusion.head_confidence(dense, valid, top=top, depth=depth)
        for i in range(len(lexical)):
            want_lex = slow_head_confidence(lexical[i][valid[i]], top, depth)
            want_dense = slow_head_confidence(dense[i][valid[i]], top, depth)
            assert got_lex[i] == pytest.approx(want_lex, abs=1e-12)
            assert got_dense[i] == pytest.approx(want_dense, abs=1e-12)
    weight = fusion.adaptive_weight(lexical, dense, valid, prior=0.3)
    c_lex, c_dense = fusion.head_confidence(lexical, valid), fusion.head_confidence(dense, valid)
    for i in range(len(lexical)):
        both = 0.3 * c_dense[i] + 0.7 * c_lex[i]
        assert weight[i] == pytest.approx(0.3 if both == 0 else 0.3 * c_dense[i] / both)
    assert weight[4] == 0.3 and weight[5] == 0.0 and ((weight > 0) & (weight < 1)).sum() >= 6


def test_adaptive_is_zscore_with_the_per_query_weight_and_ignores_scale_and_shift():
    lexical, dense = seeded_parts()
    weight = fusion.adaptive_weight(lexical, dense)
    z = lambda s: (s - s.mean(axis=1, keepdims=True)) / s.std(axis=1, keepdims=True)  # noqa: E731
    want = (1 - weight[:, None]) * z(lexical) + weight[:, None] * z(dense)
    got = fusion.fuse(lexical, dense, "adaptive")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    moved = fusion.fuse(lexical * 41.0 + 3.0, dense * 0.05 - 1.0, "adaptive")
    np.testing.assert_array_equal(ranking(moved), ranking(got))
    assert not np.allclose(weight, 0.5)  # the weight does move per query


def test_union_rows_equals_python_sets():
    rng = np.random.default_rng(5)
    a = rng.integers(0, 40, (6, 15))
    b = rng.integers(0, 40, (6, 9))
    a[1, 10:] = -1
    b[2, :] = -1
    got = fusion.union_rows(a, b)
    assert got.shape == (6, 24)
    for i in range(6):
        want = sorted((set(a[i]) | set(b[i])) - {-1})
        assert got[i, :len(want)].tolist() == want and (got[i, len(want):] == -1).all()


def exhaustive_parts(index, queries):
    lexical_q, dense_q = fusion.split_query(queries.values, index.spec.gated_dim)
    lexical = gip.exhaustive(lexical_q, queries.gates, index.values, index.gates).astype(np.float64)
    dense = gip.exhaustive(dense_q, queries.gates, index.values, index.gates).astype(np.float64)
    return lexical, dense


def numpy_zscore_topk(lexical, dense, k, weight=0.5):
    z = lambda s: (s - s.mean(axis=1, keepdims=True)) / s.std(axis=1, keepdims=True)  # noqa: E731
    fused = (1 - weight) * z(lexical) + weight * z(dense)
    order = np.lexsort((np.arange(fused.shape[1])[None, :].repeat(fused.shape[0], 0), -fused), axis=-1)[:, :k]
    return np.take_along_axis(fused, order, 1), order


@pytest.mark.parametrize("kind", ["fusion", "dhr"])
def test_searcher_zscore_with_all_candidates_equals_numpy_over_every_row(tmp_path, kind):
    index = make_index(tmp_path, kind, lam=3.0)
    queries = queries_for(index, 5)
    got = Searcher(index).search(queries, SearchParams(k=40, candidates=index.count, method="zscore"))
    lexical, dense = exhaustive_parts(index, queries)
    want_scores, want_rows = numpy_zscore_topk(lexical, dense, 40)
    np.testing.assert_array_equal(np.array(got.rows), want_rows)
    np.testing.assert_allclose(np.array(got.scores), want_scores, rtol=1e-4, atol=1e-4)


def test_searcher_adaptive_with_all_candidates_equals_numpy_over_every_row(tmp_path):
    index = make_index(tmp_path, "fusion", lam=3.0)
    queries = queries_for(index, 5)
    got = Searcher(index).search(queries, SearchParams(k=40, candidates=index.count, method="adaptive"))
    lexical, dense = exhaustive_parts(index, queries)
    c = [[slow_head_confidence(part[i], 10, 100) for part in (lexical, dense)] for i in range(len(lexical))]
    weight = np.array([cd / (cl + cd) for cl, cd in c])
    z = lambda s: (s - s.mean(axis=1, keepdims=True)) / s.std(axis=1, keepdims=True)  # noqa: E731
    fused = (1 - weight[:, None]) * z(lexical) + weight[:, None] * z(dense)
    order = np.lexsort((np.arange(fused.shape[1])[None, :].repeat(fused.shape[0], 0), -fused), axis=-1)[:, :40]
    np.testing.assert_array_equal(np.array(got.rows), order)
    np.testing.assert_allclose(np.array(got.scores), np.take_along_axis(fused, order, 1), rtol=1e-4, atol=1e-4)


def recall(found_rows, relevant):
    return np.mean([len(set(f) & r) / len(r) for f, r in zip(found_rows, relevant)])


@pytest.mark.parametrize("method", ["zscore", "adaptive"])
def test_fused_candidates_contain_each_parts_candidates_so_recall_is_at_least_the_better_parts(tmp_path, method):
    # a dense part on a larger scale than the lexical one (λ = 8): the λ sum's top K1 is mostly the
    # dense part's, so taking the candidates from it would lose lexical finds
    index = make_index(tmp_path, "fusion", n=600, lam=8.0)
    queries = queries_for(index, 12)
    searcher, depth = Searcher(index), 40
    lexical, dense = exhaustive_parts(index, queries)
    relevant = [set(np.argsort(-(z_l + z_d))[:5]) for z_l, z_d in zip(lexical / lexical.std(1, keepdims=True),
                                                                        dense / dense.std(1, keepdims=True))]
    parts = {m: searcher.search(queries,
                                SearchParams(k=depth, candidates=depth, method=m)).rows for m in ("lexical", "dense")}
    raw_sum = searcher.search(queries, SearchParams(k=depth, candidates=depth, method="lambda")).rows
    mixed = []  # the candidate rows the fusion scores, as the store is asked for them
    part_scores = searcher.store.part_scores
    searcher.store.part_scores = lambda xq, gq, rows: mixed.append(rows.copy()) or part_scores(xq, gq, rows)
    searcher.search(queries, SearchParams(k=10, candidates=depth, method=method))
    fused = [[r for r in rows if r >= 0] for rows in mixed[0]]
    for i in range(len(fused)):
        assert set(parts["lexical"][i]) | set(parts["dense"][i]) == set(fused[i])
    best_part = max(recall(parts["lexical"], relevant), recall(parts["dense"], relevant))
    assert recall(fused, relevant) >= best_part
    assert recall(fused, relevant) > recall(raw_sum, relevant)  # what one λ-sum first stage would miss


def test_searcher_ranking_ignores_lambda_and_the_lexical_scale_under_normalised_fusion(tmp_path):
    index = make_index(tmp_path, "fusion", lam=1.0)
    queries = queries_for(index, 5)
    searcher = Searcher(index)
    base = searcher.search(queries, SearchParams(k=30, candidates=index.count, method="zscore"))
    with_lambda = searcher.search(queries, SearchParams(k=30, candidates=index.count, method="zscore", lam=40.0))
    louder = queries.values.copy()
    louder[:, :index.spec.gated_dim] *= 9.0
    louder_lexical = searcher.search(Encoded(louder, queries.gates),
                                     SearchParams(k=30, candidates=index.count, method="zscore"))
    assert with_lambda.rows == base.rows and louder_lexical.rows == base.rows
    np.testing.assert_allclose(with_lambda.scores, base.scores, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["lexical", "dense"])
def test_one_part_methods_rank_by_that_part_alone(tmp_path, method):
    index = make_index(tmp_path, "fusion", lam=2.0)
    queries = queries_for(index, 4)
    got = Searcher(index).search(queries, SearchParams(k=25, candidates=index.count, method=method))
    lexical, dense = exhaustive_parts(index, queries)
    part = lexical if method == "lexical" else dense
    order = np.lexsort((np.arange(part.shape[1])[None, :].repeat(part.shape[0], 0), -part), axis=-1)[:, :25]
    np.testing.assert_array_equal(np.array(got.rows), order)


def test_method_defaults_follow_the_index_and_a_request_lambda(tmp_path):
    index = make_index(tmp_path, "fusion", lam=2.0)
    searcher = Searcher(index)
    assert index.fusion_method == "lambda"  # recorded by build_from_arrays' default
    assert resolve_method(index, None, None) == "lambda"
    index.manifest["fusion"] = {"method": "zscore", "dense_weight": 0.5}
    assert resolve_method(index, None, None) == "zscore"
    assert resolve_method(index, None, 5.0) == "lambda"  # a per-request λ keeps its raw-sum meaning
    assert resolve_method(index, "minmax", 5.0) == "minmax"
    with pytest.raises(SearchError, match="unknown fusion method"):
        searcher.search(queries_for(index, 1), SearchParams(method="borda"))
    with pytest.raises(SearchError, match="dense weight"):
        searcher.search(queries_for(index, 1), SearchParams(method="zscore", dense_weight=-0.1))


def spread_ratio(lexical, dense):
    """Median over queries of σ(lexical)/σ(dense): the λ that z-score fusion applies per query."""
    return float(np.median(lexical.std(axis=1) / dense.std(axis=1)))


def test_the_implied_weight_on_one_half_equals_the_other_half(tmp_path):
    index = make_index(tmp_path, "fusion", n=600, lam=1.0)
    queries = queries_for(index, 40)
    lexical, dense = exhaustive_parts(index, queries)
    even, odd = slice(0, None, 2), slice(1, None, 2)
    by_corpus = spread_ratio(lexical[:, even], dense[:, even]), spread_ratio(lexical[:, odd], dense[:, odd])
    by_queries = spread_ratio(lexical[even], dense[even]), spread_ratio(lexical[odd], dense[odd])
    for a, b in (by_corpus, by_queries):
        assert abs(a - b) / max(a, b) < 0.15, (a, b)


def test_cli_build_records_the_method_and_eval_prints_each_part_beside_the_fusion(tmp_path, fake_models):
    import json

    from typer.testing import CliRunner

    from densehybrid.cli.main import app
    from densehybrid.index.building.build import read_corpus
    from densehybrid.index.served.loading import load_index
    from test_build import write_corpus

    corpus = write_corpus(tmp_path / "corpus.jsonl", 30)
    docs = list(read_corpus(corpus))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": docs[i].text}) + "\n" for i in range(4)))
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tp{i}\t1\n" for i in range(4)))
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--model", "fake:fusion", "--corpus", str(corpus),
                                "--out", str(tmp_path / "ix"), "--no-progress", "--fusion", "minmax"])
    assert built.exit_code == 0, built.output
    assert load_index(tmp_path / "ix").manifest["fusion"] == {"method": "minmax", "dense_weight": 0.5, "rrf_k": 60}
    common = ["eval", "--index", str(tmp_path / "ix"), "--queries", str(tmp_path / "queries.jsonl"),
              "--qrels", str(tmp_path / "qrels.tsv")]
    table = runner.invoke(app, common)
    assert table.exit_code == 0, table.output
    lines = [line for line in table.output.splitlines() if "alone" in line or "fusion (" in line]
    assert len(lines) == 3 and "lexical part alone" in lines[0] and "dense part alone" in lines[1]
    assert "fusion (minmax)" in lines[2]
    with_lambda = runner.invoke(app, common + ["--lambda", "3"])
    assert "fusion (lambda, λ = 3)" in with_lambda.output
    refused = runner.invoke(app, common + ["--fusion", "borda"])
    assert refused.exit_code == 2 and "one of" in refused.output


def test_cli_eval_compare_fusion_prints_every_method_and_equals_the_single_runs(tmp_path, fake_models):
    import json

    from typer.testing import CliRunner

    from densehybrid.cli.main import app
    from densehybrid.index.building.build import read_corpus
    from densehybrid.index.building.commands import COMPARED_METHODS
    from test_build import write_corpus

    corpus = write_corpus(tmp_path / "corpus.jsonl", 40)
    docs = list(read_corpus(corpus))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": docs[i].text[:30]}) + "\n"
                                                    for i in range(8)))
    (tmp_path / "qrels.tsv").write_text("".join(f"q{i}\tp{i}\t1\n" for i in range(8)))
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--model", "fake:fusion", "--corpus", str(corpus),
                                "--out", str(tmp_path / "ix"), "--no-progress"])
    assert built.exit_code == 0, built.output
    common = ["eval", "--index", str(tmp_path / "ix"), "--queries", str(tmp_path / "queries.jsonl"),
              "--qrels", str(tmp_path / "qrels.tsv"), "--candidates", "10"]
    compared = runner.invoke(app, common + ["--compare-fusion", "--json"])
    assert compared.exit_code == 0, compared.output
    table = json.loads(compared.output.strip().splitlines()[-1])
    assert list(table) == list(COMPARED_METHODS)
    for method in COMPARED_METHODS:
        alone = runner.invoke(app, common + ["--fusion", method, "--json"])
        assert json.loads(alone.output.strip().splitlines()[-1]) == table[method], method
    printed = runner.invoke(app, common + ["--compare-fusion"])
    assert all(method in printed.output for method in COMPARED_METHODS)
    refused = runner.invoke(app, common + ["--compare-fusion", "--bm25"])
    assert refused.exit_code == 2 and "--compare-fusion" in refused.output


def test_live_server_search_picks_the_fusion_method_per_request(toy_index):
    import httpx

    from support.fake_encoder import FakeEncoder
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    index_dir = toy_index("fusion", count=60)
    encoder, searcher = FakeEncoder("fusion"), Searcher(load_index(index_dir))
    query = "gated inner product of term weights"
    app = create_app(ServiceSettings(max_wait_ms=5), encoder=FakeEncoder("fusion"), index=load_index(index_dir))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        for body, method in [({"fusion": "zscore"}, "zscore"), ({"fusion": "dense", "lambda": 4.0}, "dense"),
                             ({"lambda": 4.0}, None), ({}, None)]:
            r = client.post("/search", json={"query": query, "k": 8, **body})
            assert r.status_code == 200, r.text
            want = searcher.search(encoder.encode([query], "query"),
                                   SearchParams(k=8, lam=body.get("lambda"), method=method))
            assert [h["id"] for h in r.json()["results"]] == want.ids[0]
            assert [h["score"] for h in r.json()["results"]] == want.scores[0]
        refused = client.post("/search", json={"query": query, "fusion": "borda"})
        assert refused.status_code == 422 and set(refused.json()["error"]) == {"type", "message"}
        assert client.post("/search", json={"query": query}).status_code == 200  # still serving
