"""Normalised fusion of the lexical and dense parts (index/fusion.py) and its use by the searcher."""

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded
from densehybrid.index import fusion, gip
from densehybrid.index.searcher import Searcher, SearchError
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
        fusion.fuse(lexical, dense, "rrf")
    with pytest.raises(ValueError, match="dense weight"):
        fusion.fuse(lexical, dense, "zscore", dense_weight=1.5)


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
    got = Searcher(index).search(queries, k=40, candidates=index.count, method="zscore")
    lexical, dense = exhaustive_parts(index, queries)
    want_scores, want_rows = numpy_zscore_topk(lexical, dense, 40)
    np.testing.assert_array_equal(np.array(got.rows), want_rows)
    np.testing.assert_allclose(np.array(got.scores), want_scores, rtol=1e-4, atol=1e-4)


def test_searcher_ranking_ignores_lambda_and_the_lexical_scale_under_normalised_fusion(tmp_path):
    index = make_index(tmp_path, "fusion", lam=1.0)
    queries = queries_for(index, 5)
    searcher = Searcher(index)
    base = searcher.search(queries, k=30, candidates=index.count, method="zscore")
    with_lambda = searcher.search(queries, k=30, candidates=index.count, method="zscore", lam=40.0)
    louder = queries.values.copy()
    louder[:, :index.spec.gated_dim] *= 9.0
    louder_lexical = searcher.search(Encoded(louder, queries.gates), k=30, candidates=index.count, method="zscore")
    assert with_lambda.rows == base.rows and louder_lexical.rows == base.rows
    np.testing.assert_allclose(with_lambda.scores, base.scores, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["lexical", "dense"])
def test_one_part_methods_rank_by_that_part_alone(tmp_path, method):
    index = make_index(tmp_path, "fusion", lam=2.0)
    queries = queries_for(index, 4)
    got = Searcher(index).search(queries, k=25, candidates=index.count, method=method)
    lexical, dense = exhaustive_parts(index, queries)
    part = lexical if method == "lexical" else dense
    order = np.lexsort((np.arange(part.shape[1])[None, :].repeat(part.shape[0], 0), -part), axis=-1)[:, :25]
    np.testing.assert_array_equal(np.array(got.rows), order)


def test_method_defaults_follow_the_index_and_a_request_lambda(tmp_path):
    index = make_index(tmp_path, "fusion", lam=2.0)
    searcher = Searcher(index)
    assert index.fusion_method == "lambda"  # recorded by build_from_arrays' default
    assert searcher.fusion_method(None, None) == "lambda"
    index.manifest["fusion"] = {"method": "zscore", "dense_weight": 0.5}
    assert searcher.fusion_method(None, None) == "zscore"
    assert searcher.fusion_method(None, 5.0) == "lambda"  # a per-request λ keeps its raw-sum meaning
    assert searcher.fusion_method("minmax", 5.0) == "minmax"
    with pytest.raises(SearchError, match="unknown fusion method"):
        searcher.search(queries_for(index, 1), method="rrf")
    with pytest.raises(SearchError, match="dense weight"):
        searcher.search(queries_for(index, 1), method="zscore", dense_weight=-0.1)


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
    from densehybrid.index.build import read_corpus
    from densehybrid.index.files import load_index
    from test_build import write_corpus

    corpus = write_corpus(tmp_path / "corpus.jsonl", 30)
    docs = list(read_corpus(corpus))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": docs[i].text}) + "\n" for i in range(4)))
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tp{i}\t1\n" for i in range(4)))
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--model", "fake:fusion", "--corpus", str(corpus),
                                "--out", str(tmp_path / "ix"), "--no-progress", "--fusion", "minmax"])
    assert built.exit_code == 0, built.output
    assert load_index(tmp_path / "ix").manifest["fusion"] == {"method": "minmax", "dense_weight": 0.5}
    common = ["eval", "--index", str(tmp_path / "ix"), "--queries", str(tmp_path / "queries.jsonl"),
              "--qrels", str(tmp_path / "qrels.tsv")]
    table = runner.invoke(app, common)
    assert table.exit_code == 0, table.output
    lines = [line for line in table.output.splitlines() if "alone" in line or "fusion (" in line]
    assert len(lines) == 3 and "lexical part alone" in lines[0] and "dense part alone" in lines[1]
    assert "fusion (minmax)" in lines[2]
    with_lambda = runner.invoke(app, common + ["--lambda", "3"])
    assert "fusion (lambda, λ = 3)" in with_lambda.output
    refused = runner.invoke(app, common + ["--fusion", "rrf"])
    assert refused.exit_code == 2 and "one of" in refused.output


def test_live_server_search_picks_the_fusion_method_per_request(toy_index):
    import httpx

    from support.fake_encoder import FakeEncoder
    from densehybrid.bench.servers import LiveServer
    from densehybrid.index.files import load_index
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
            want = searcher.search(encoder.encode([query], "query"), k=8, lam=body.get("lambda"), method=method)
            assert [h["id"] for h in r.json()["results"]] == want.ids[0]
            assert [h["score"] for h in r.json()["results"]] == want.scores[0]
        refused = client.post("/search", json={"query": query, "fusion": "rrf"})
        assert refused.status_code == 422 and set(refused.json()["error"]) == {"type", "message"}
        assert client.post("/search", json={"query": query}).status_code == 200  # still serving
