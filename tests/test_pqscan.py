"""The pqscan first stage: 4-bit product codes of every row scanned, candidates rescored exactly from the rows."""

import json

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.cli.main import app
from densehybrid.encoder.base import Encoded
from densehybrid.index.building.pqscan import build_pqscan, fold_pqscan, write_pqscan
from densehybrid.index.engines.hnsw_engine import EXACT_KEPT_ROWS
from densehybrid.index.engines import pqscan_engine
from densehybrid.index.engines.pqscan_engine import (ANN_FILE, PQScanConfig, PQScanStore, fast_scan, read_pqscan,
                                                     sub_quantizers, within_margin)
from densehybrid.index.errors import IndexLoadError, SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index, verify_index
from test_hnsw import brute_topk, clustered, make_index, recall
from test_import_pyserini import write_pyserini

SMALL = PQScanConfig(rescore=50, margin=0.0, train_size=2000)


def _store(xb: np.ndarray, config: PQScanConfig = SMALL) -> PQScanStore:
    codes, built = build_pqscan(xb, config)
    return PQScanStore(fast_scan(codes), xb, None, [f"d{i}" for i in range(len(xb))], built.rescore,
                       built.margin)


@pytest.fixture(scope="module")
def rows():
    return clustered(3000, 32, seed=0).astype(np.float16)


def test_codes_a_row_are_a_quarter_of_its_dims():
    assert [sub_quantizers(d) for d in (384, 768, 896, 32, 6)] == [96, 192, 224, 8, 2]


def test_rescoring_every_row_finds_the_exhaustive_top10_with_exact_scores(rows):
    xq = clustered(40, 32, seed=1)
    scores, found = _store(rows).inner_product(xq, 10, rescore=len(rows))
    want_scores, want_rows = brute_topk(xq, rows, 10)
    np.testing.assert_array_equal(found, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-3)  # rescored from the rows


def test_the_margin_rescores_the_rows_within_it_and_at_least_the_floor():
    scores = np.array([[9.0, 8.0, 7.5, 7.4, 5.0, 4.9, 1.0], [3.0, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4]], np.float32)
    rows = np.array([[10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, -1, 25, 26]])
    kept = within_margin(scores, rows, depth=2, margin=np.array([0.6, 0.35]), least=1)
    # query 0: the 2nd best is 8.0, so 7.5 and 7.4 are within 0.6 of it; query 1: 2.9 - 0.35 = 2.55 keeps four
    # scores, one of them a missing row
    assert kept.tolist() == [[10, 11, 12, 13, -1, -1, -1], [20, 21, 22, 23, -1, -1, -1]]
    floor = within_margin(scores, rows, depth=2, margin=np.zeros(2), least=5)
    assert floor.tolist() == [[10, 11, 12, 13, 14, -1, -1], [20, 21, 22, 23, -1, -1, -1]]


def test_a_wider_margin_finds_at_least_as_much_and_a_far_query_gets_more_candidates(rows):
    store = _store(rows, PQScanConfig(rescore=10, margin=0.0, train_size=2000))
    xq = clustered(40, 32, seed=2)
    want = brute_topk(xq, rows, 10)[1]
    found = [recall(store.inner_product(xq, 10, margin=m)[1], want) for m in (0.0, 0.05, 0.2, 1.0)]
    assert found == sorted(found) and found[-1] > found[0]
    rescored = []
    original = pqscan_engine.rescore_kept
    try:  # count the rows each query rescores
        pqscan_engine.rescore_kept = lambda q, v, r, k: (rescored.append((r >= 0).sum(1)), original(q, v, r, k))[1]
        store.inner_product(np.stack([xq[0], xq[0] * 3]), 10, margin=0.1)
    finally:
        pqscan_engine.rescore_kept = original
    assert rescored[0][1] >= rescored[0][0]  # the same direction, three times the norm: a margin three times wider


def test_more_candidates_rescored_find_at_least_as_much_and_the_default_is_the_stores(rows):
    store = _store(rows)
    xq = clustered(40, 32, seed=2)
    want = brute_topk(xq, rows, 10)[1]
    few = recall(store.inner_product(xq, 10, rescore=10)[1], want)
    default = store.inner_product(xq, 10)[1]
    np.testing.assert_array_equal(default, store.inner_product(xq, 10, rescore=SMALL.rescore)[1])
    wide = recall(store.inner_product(xq, 10, rescore=1000)[1], want)
    assert few <= recall(default, want) <= wide and wide > 0.95


@pytest.mark.parametrize("rescore", [0, 10_001])
def test_an_out_of_range_rescore_is_a_search_error(rows, rescore):
    with pytest.raises(SearchError, match="rescore"):
        _store(rows).inner_product(clustered(1, 32, seed=3), 10, rescore=rescore)


@pytest.mark.parametrize("fraction", [0.5, 0.2])
def test_filtered_search_keeps_only_the_kept_rows_and_finds_their_top10(fraction):
    xb = clustered(EXACT_KEPT_ROWS * 2, 64, seed=4).astype(np.float16)
    store = _store(xb, PQScanConfig(rescore=500, margin=0.0, train_size=2000))
    keep = np.random.default_rng(5).random(len(xb)) < fraction
    xq = clustered(20, 64, seed=6)
    _, found = store.inner_product(xq, 10, Selection(int(keep.sum()), len(xb), mask=keep))
    assert (found >= 0).all() and keep[found].all()
    unfiltered = recall(store.inner_product(xq, 10)[1], brute_topk(xq, xb, 10)[1])
    # as many kept candidates rescored as without a filter: about the same share of the exact top 10
    assert recall(found, brute_topk(xq, xb, 10, rows=np.flatnonzero(keep))[1]) >= unfiltered - 0.05 > 0.8


def test_a_pqscan_index_records_its_codes_and_searches_them(tmp_path):
    index = make_index(tmp_path, ann=SMALL)
    recorded = index.manifest["first_stage"]
    assert recorded == {"type": "pqscan", "file": ANN_FILE, "nbits": 4, **{**SMALL.__dict__, "m": 4, "trained_rows": 600}}
    assert searcher_default(index) == (SMALL.rescore, SMALL.margin)
    assert ANN_FILE in verify_index(index.path)["files"] and index.first_stage_kind == "pqscan"
    searcher = Searcher(index)
    assert searcher.first_stage == "pqscan" and isinstance(searcher.store, PQScanStore)
    assert searcher.store.values is index.values  # the one copy, memory-mapped
    xq = clustered(8, 16, seed=8)
    got = searcher.search(Encoded(xq, None), SearchParams(k=10, rescore=len(index.doc_ids)))
    np.testing.assert_array_equal(np.array(got.rows), brute_topk(xq, np.asarray(index.values), 10)[1])


def searcher_default(index) -> tuple[int, float]:
    store = Searcher(index).store
    return store.rescore, store.margin


def test_gated_kinds_rerank_the_pqscan_candidates_exactly(tmp_path):
    index = make_index(tmp_path, "dhr", ann=SMALL)
    rng = np.random.default_rng(9)
    queries = Encoded(clustered(4, 32, seed=10), (rng.random((4, 16)) < 0.3).astype(np.uint8))
    scanned = Searcher(index).search(queries, SearchParams(k=10, candidates=600, rescore=600))
    flat = Searcher(index, engine="torch").search(queries, SearchParams(k=10, candidates=600))
    assert scanned.ids == flat.ids
    np.testing.assert_allclose(scanned.scores, flat.scores, rtol=1e-4, atol=1e-3)


def test_codes_of_other_rows_fail_the_load(tmp_path):
    index = make_index(tmp_path, ann=SMALL)
    write_pqscan(clustered(50, 16, seed=11), index.path, SMALL)
    manifest = json.loads((index.path / "manifest.json").read_text())
    manifest["files"][ANN_FILE]["bytes"] = (index.path / ANN_FILE).stat().st_size
    (index.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexLoadError, match=f"{ANN_FILE}.*holds 50 rows"):
        load_index(index.path, checksums=False)
    faiss.write_index(faiss.IndexFlatIP(16), str(index.path / ANN_FILE))
    with pytest.raises(ValueError, match="expected product codes"):
        read_pqscan(index.path / ANN_FILE, 600, 16, PQScanConfig(m=4))


def test_a_fold_copies_the_kept_codes_and_encodes_only_the_written_rows(tmp_path):
    base, folded = tmp_path / "base", tmp_path / "folded"
    base.mkdir(), folded.mkdir()
    xb = clustered(1000, 16, seed=12)
    config = PQScanConfig.from_dict(write_pqscan(xb, base, SMALL))
    keep = np.flatnonzero(np.arange(1000) % 3 != 0)  # a third of the rows dropped
    added = clustered(200, 16, seed=13)
    values = np.concatenate([xb[keep], added])
    record = fold_pqscan(values, folded, base, keep, len(keep), config)
    assert record == config.to_dict()  # the codebooks stay: not trained anew
    before = faiss.read_index(str(base / ANN_FILE))
    after = faiss.read_index(str(folded / ANN_FILE))
    codes = lambda index: faiss.vector_to_array(index.codes).reshape(index.ntotal, index.code_size)
    np.testing.assert_array_equal(codes(after)[:len(keep)], codes(before)[keep])
    np.testing.assert_array_equal(codes(after)[len(keep):], before.sa_encode(added))
    grown = fold_pqscan(np.concatenate([values, clustered(2000, 16, seed=14)]), folded, base, keep, len(keep), config)
    assert grown["trained_rows"] == len(values) + 2000  # more than twice the rows: trained anew


def test_cli_import_takes_pqscan_and_calibrates_its_margin(tmp_path, fake_models):
    xb = write_pyserini(tmp_path / "pyserini", count=3000)
    result = CliRunner().invoke(app, ["index", "import", str(tmp_path / "pyserini"), "--model", "fake:cls",
                                      "--out", str(tmp_path / "ix"), "--ann", "pqscan", "--target-recall", "0.9"])
    assert result.exit_code == 0, result.output
    index = load_index(tmp_path / "ix")
    recorded = index.manifest["first_stage"]
    calibration = recorded["calibration"]
    assert recorded["type"] == "pqscan" and index.ann.ntotal == len(xb)
    assert calibration["knob"] == "margin" and calibration["target_recall"] == 0.9
    # no texts: a sample of the stored rows, held out, and the other-domain sentences the encoder encodes
    assert [g["name"] for g in calibration["groups"]] == ["rows", "other_domain"]
    assert calibration["groups"][0]["source"].endswith("stored rows, held out (no texts or query file: a rough guide)")
    assert calibration["held_out_rows"] == 200 and calibration["measured_rows"] == len(xb)
    curve = calibration["curve"]
    # each point states the lowest group's recall
    assert all(p["recall_at_10"] == min(g["recall_at_10"] for g in p["groups"].values()) for p in curve)
    recalls = [p["recall_at_10"] for p in curve]
    # a wider margin rescores more candidates (rows of tied code scores at the floor's edge may differ)
    assert all(b >= a - 0.002 for a, b in zip(recalls, recalls[1:])) and recalls[-1] > recalls[0] + 0.05
    chosen = next(p for p in curve if p["breadth"] == recorded["margin"])
    reaching = [p for p in curve if p["exact_top10"] >= 0.9]
    assert calibration["reached"] == bool(reaching)
    if reaching:  # the narrowest margin at which 0.9 of every group's queries found their whole top 10
        assert chosen["breadth"] == min(p["breadth"] for p in reaching)
    else:  # else the best recall measured
        assert chosen["recall_at_10"] == max(recalls)


def test_a_margin_given_is_kept_and_measured(tmp_path, fake_models):
    write_pyserini(tmp_path / "pyserini", count=500)
    result = CliRunner().invoke(app, ["index", "import", str(tmp_path / "pyserini"), "--model", "fake:cls",
                                      "--out", str(tmp_path / "ix"), "--ann", "pqscan", "--pqscan-margin", "0.07",
                                      "--rescore", "77"])
    assert result.exit_code == 0, result.output
    recorded = load_index(tmp_path / "ix").manifest["first_stage"]
    assert recorded["margin"] == 0.07 and recorded["rescore"] == 77
    assert recorded["calibration"]["target_recall"] is None
    assert recorded["calibration"]["reached"] is None and len(recorded["calibration"]["curve"]) > 3
