"""The HNSW first stage: candidates from the graph, exact scores from the rows, against numpy brute force."""

import json

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.index.building import build
from densehybrid.index.building.ann import build_hnsw, write_ann
from densehybrid.index.engines.hnsw_engine import ANN_FILE, EXACT_KEPT_ROWS, HNSWConfig, HnswStore
from densehybrid.index.errors import IndexLoadError, SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index

SMALL = HNSWConfig(m=16, ef_construction=64, ef_search=128, train_size=2000)


def clustered(n: int, dim: int, seed: int, centers: int = 24, latent: int = 8, unit: bool = False) -> np.ndarray:
    """Rows around a few centres in a space of ``latent`` dims mapped into ``dim``, plus a little noise: as
    embeddings cluster by topic and span few directions (uniform noise in every dim is HNSW's worst case);
    ``unit``: L2-normalised, as cosine models' vectors are."""
    rng = np.random.default_rng(seed)
    basis = np.random.default_rng(0).standard_normal((latent, dim)) / np.sqrt(latent)
    middle = np.random.default_rng(1).standard_normal((centers, latent)) * 2
    z = middle[rng.integers(0, centers, n)] + rng.standard_normal((n, latent))
    x = z @ basis + 0.1 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x).astype(np.float32)


def brute_topk(xq: np.ndarray, xb: np.ndarray, k: int, rows: np.ndarray | None = None):
    """Exact top-k by float64 inner product over ``rows`` (all rows by default): (scores, rows)."""
    rows = np.arange(len(xb)) if rows is None else rows
    scores = xq.astype(np.float64) @ xb[rows].astype(np.float64).T
    order = np.lexsort((np.broadcast_to(rows, scores.shape), -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), rows[order]


def recall(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want)]))


@pytest.fixture(scope="module")
def store():
    xb = clustered(3000, 32, seed=0).astype(np.float16)
    return HnswStore(build_hnsw(xb, SMALL)[0], xb, None, [f"d{i}" for i in range(len(xb))], SMALL.ef_search)


def test_graph_candidates_carry_exact_scores_and_find_the_exhaustive_top10(store):
    xq = clustered(40, 32, seed=1)
    scores, rows = store.inner_product(xq, 10)
    exact = xq.astype(np.float64) @ store.values.astype(np.float64).T
    np.testing.assert_allclose(scores, np.take_along_axis(exact, rows, 1), rtol=1e-4, atol=1e-3)
    assert (np.diff(scores, axis=1) <= 0).all()
    assert recall(rows, brute_topk(xq, store.values, 10)[1]) >= 0.95


@pytest.mark.parametrize("metric", ["inner_product", "l2_augmented"])
@pytest.mark.parametrize("unit", [True, False])
def test_a_wider_walk_finds_at_least_as_much(metric, unit):
    from dataclasses import replace

    xb = clustered(3000, 32, seed=0, unit=unit).astype(np.float16)
    graph = HnswStore(build_hnsw(xb, replace(SMALL, metric=metric))[0], xb, None, [], SMALL.ef_search)
    xq = clustered(40, 32, seed=2)
    want = brute_topk(xq, xb, 10)[1]
    narrow = recall(graph.inner_product(xq, 10, ef_search=10)[1], want)
    wide = recall(graph.inner_product(xq, 10, ef_search=len(xb))[1], want)
    assert wide >= narrow
    # A walk as wide as the graph reaches every row of a graph linked by L2 over augmented rows. An inner-product
    # graph may leave some rows of small norm unreached: on these synthetic rows (norms 3 to 29) it found 0.985;
    # on real DLR-768 rows (norms 3 to 13) it found far more than the augmented graph at every breadth.
    assert wide >= (0.99 if unit or metric == "l2_augmented" else 0.95)


@pytest.mark.parametrize("ef_search", [0, 10_001])
def test_an_out_of_range_breadth_is_a_search_error(store, ef_search):
    with pytest.raises(SearchError, match="ef_search"):
        store.inner_product(clustered(1, 32, seed=3), 10, ef_search=ef_search)


@pytest.mark.parametrize("fraction", [0.6, 0.2, 0.01])
def test_filtered_search_keeps_only_the_kept_rows_and_finds_their_top10(fraction):
    # big enough that 20% is above the exact-scan limit: the graph answers it, 1% is scanned exactly
    n = EXACT_KEPT_ROWS * 3
    xb = clustered(n, 16, seed=4, unit=True).astype(np.float16)
    hnsw, _ = build_hnsw(xb, SMALL)
    big = HnswStore(hnsw, xb, None, [str(i) for i in range(n)], SMALL.ef_search)
    mask = np.random.default_rng(5).random(n) < fraction
    kept = np.flatnonzero(mask)
    xq = clustered(20, 16, seed=6)
    scores, rows = big.inner_product(xq, 10, Selection(len(kept), n, mask=mask))
    assert mask[rows].all()
    want_scores, want_rows = brute_topk(xq, xb, 10, kept)
    if fraction < 0.05:  # scanned exactly: the brute-force answer itself (up to float32 rounding)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-3)
    assert recall(rows, want_rows) >= 0.95


def make_index(tmp_path, kind="cls", n=600, ann=SMALL, seed=7):
    gated = 16 if kind == "dhr" else 0
    dim = gated + 16
    spec = EncoderSpec(kind=kind, dim=dim, gated_dim=gated, lam=1.0, vocab_size=30522, dlr_dim=gated or None,
                       model_id="random", weights_hash="r")
    values = clustered(n, dim, seed)
    gates = (np.random.default_rng(seed).random((n, gated)) < 0.3).astype(np.uint8) if gated else None
    docs = [Document(f"doc{i}", "", f"text {i}") for i in range(n)]
    out = build.build_from_arrays(tmp_path / f"{kind}-{seed}", spec, Encoded(values, gates), docs, ann=ann)
    return load_index(out)


def test_an_hnsw_index_records_its_graph_and_searches_it(tmp_path):
    index = make_index(tmp_path)
    recorded = index.manifest["first_stage"]
    assert recorded == {"type": "hnsw", "file": ANN_FILE, **SMALL.__dict__}
    assert recorded["metric"] == "inner_product" and index.ann.metric_type == faiss.METRIC_INNER_PRODUCT
    assert ANN_FILE in index.manifest["files"] and index.first_stage_kind == "hnsw"
    searcher = Searcher(index)
    assert searcher.first_stage == "hnsw"
    xq = clustered(8, 16, seed=8)
    got = searcher.search(Encoded(xq, None), SearchParams(k=10, ef_search=len(index.doc_ids)))
    want = brute_topk(xq, np.asarray(index.values), 10)[1]
    assert recall(np.array(got.rows), want) == 1.0


def test_gated_kinds_rerank_the_graph_candidates_exactly(tmp_path):
    index = make_index(tmp_path, "dhr")
    rng = np.random.default_rng(9)
    queries = Encoded(clustered(4, 32, seed=10), (rng.random((4, 16)) < 0.3).astype(np.uint8))
    hnsw = Searcher(index).search(queries, SearchParams(k=10, candidates=600, ef_search=600))
    flat = Searcher(index, engine="torch").search(queries, SearchParams(k=10, candidates=600))
    assert hnsw.ids == flat.ids
    np.testing.assert_allclose(hnsw.scores, flat.scores, rtol=1e-4, atol=1e-3)


def test_a_truncated_graph_file_fails_the_load_naming_it(tmp_path):
    index = make_index(tmp_path)
    path = index.path / ANN_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(IndexLoadError, match=ANN_FILE):
        load_index(index.path, checksums=False)


def test_a_graph_of_other_rows_fails_the_load(tmp_path):
    index = make_index(tmp_path)
    write_ann(clustered(50, 16, seed=11), index.path, SMALL)
    manifest = json.loads((index.path / "manifest.json").read_text())
    manifest["files"][ANN_FILE]["bytes"] = (index.path / ANN_FILE).stat().st_size
    (index.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexLoadError, match="holds 50 vectors"):
        load_index(index.path, checksums=False)


def test_the_cli_refuses_the_retired_pq_flag(tmp_path):
    from densehybrid.cli.main import app

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "x"}) + "\n")
    result = CliRunner().invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                                      "--model", "fake:cls", "--ann", "hnsw", "--pq", "4"])
    assert result.exit_code != 0 and "--pq" in result.output and not (tmp_path / "i").exists()


def test_the_hnsw_store_implements_the_vector_store_protocol(store):
    from densehybrid.index.search.vector_store import VectorStore
    from test_served import assert_implements

    assert_implements(store, VectorStore)


def test_a_fold_rebuilds_the_graph_over_the_rows_it_keeps(tmp_path):
    from densehybrid.index.writes.compaction import fold
    from densehybrid.index.writes.delta import Delta

    base = make_index(tmp_path, n=300)
    hidden = frozenset(range(0, 300, 3))
    folded = load_index(fold(base, Delta(hidden=hidden), tmp_path / "gen", applied_seq=1))
    assert folded.count == 200 and folded.first_stage_kind == "hnsw" and folded.ann.ntotal == 200
    assert {k: v for k, v in folded.manifest["first_stage"].items() if k != "max_norm2"} == \
        {k: v for k, v in base.manifest["first_stage"].items() if k != "max_norm2"}
    xq = clustered(6, 16, seed=13)
    got = Searcher(folded).search(Encoded(xq, None), SearchParams(k=10, ef_search=200))
    assert recall(np.array(got.rows), brute_topk(xq, np.asarray(folded.values), 10)[1]) == 1.0


def test_the_graph_is_padded_for_simd_and_the_graphs_written_before_still_search(tmp_path):
    from densehybrid.index.engines.hnsw_engine import L2_AUGMENTED, graph_rows, graph_width, read_ann

    index = make_index(tmp_path, n=300, kind="dhr")  # 32 dims: no padding
    assert index.ann.d == graph_width(32) == 32 and graph_width(17) == 32 and graph_width(16, L2_AUGMENTED) == 32
    index = make_index(tmp_path)
    xb = np.asarray(index.values, np.float32)
    old_record = {k: v for k, v in index.manifest["first_stage"].items() if k != "metric"}  # as written before
    config = HNSWConfig.from_dict({**old_record, "max_norm2": float((xb ** 2).sum(1).max())})
    assert config.metric == L2_AUGMENTED
    xq = clustered(8, 16, seed=8)
    for width in (17, 32):  # an augmented graph before the padding, and after it
        old = faiss.IndexHNSWSQ(width, faiss.ScalarQuantizer.QT_8bit, config.m, faiss.METRIC_L2)
        old.train(graph_rows(xb, config, width))
        old.add(graph_rows(xb, config, width))
        faiss.write_index(old, str(tmp_path / "old.faiss"))
        store = HnswStore(read_ann(tmp_path / "old.faiss", len(xb), 16), index.values, None, index.doc_ids, len(xb))
        np.testing.assert_array_equal(store.inner_product(xq, 10)[1], brute_topk(xq, xb, 10)[1])
    with pytest.raises(ValueError, match="expected 600 of 16"):  # an inner-product graph has no added dim
        unaugmented = faiss.IndexHNSWFlat(17, 8, faiss.METRIC_INNER_PRODUCT)
        unaugmented.add(np.zeros((600, 17), np.float32))
        faiss.write_index(unaugmented, str(tmp_path / "odd.faiss"))
        read_ann(tmp_path / "odd.faiss", 600, 16)
