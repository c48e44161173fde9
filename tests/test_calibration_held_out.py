"""The calibration's first stage is built without the rows its queries were cut from, measured in groups (from
the corpus, from another domain), completed, recorded in the manifest, and marked stale by folds that move on."""

from __future__ import annotations

import datetime

import faiss
import numpy as np
import pytest

from densehybrid.bench.servers.hash_encoder import HashEncoder
from densehybrid.bench.servers.toy_index import write_toy_corpus
from densehybrid.index.building import calibrate, calibration, held_out, other_domain
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.building.calibration_queries import CalibrationQueries, Group
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.engines.pqscan_engine import PQScanConfig
from densehybrid.index.served.loading import load_index
from densehybrid.index.storage.vectors import VECTORS, write_vectors
from densehybrid.index.writes.compaction import fold
from densehybrid.index.writes.delta import Delta

from densehybrid.bench.scale.calibration_noise import moved

from test_hnsw import clustered

CONFIGS = {"hnsw": HNSWConfig(m=16, ef_construction=64, ef_search=32, train_size=2000),
           "pqscan": PQScanConfig(rescore=20, margin=0.05, train_size=2000)}


def brute_top(xq: np.ndarray, xb: np.ndarray, k: int = 10) -> np.ndarray:
    return np.argsort(-(xq @ xb.T), axis=1, kind="stable")[:, :k]


def _structure_rows(kind: str, store) -> np.ndarray:
    """The rows a held-out store's graph or codes hold."""
    if kind == "hnsw":
        return np.asarray(store.node_rows)[:store.hnsw.ntotal]
    return np.asarray(store.code_rows)[:store.scan.ntotal]


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_held_out_rows_are_out_of_the_structure_while_measured_and_in_it_afterwards(tmp_path, kind):
    xb = clustered(3000, 32, seed=3, unit=True)
    held = np.sort(np.random.default_rng(0).choice(len(xb), 50, replace=False))
    built = held_out.build(xb, tmp_path, CONFIGS[kind], held)
    inside = _structure_rows(kind, built.store)
    assert len(inside) == len(xb) - len(held) and not np.isin(held, inside).any()
    knob = {"hnsw": "ef_search", "pqscan": "margin"}[kind]
    wide = {"hnsw": 512, "pqscan": 1.0}[kind]
    _, found = built.store.inner_product(xb[held], 10, **{knob: wide})
    assert not np.isin(found, held).any()  # no search reaches a held-out row

    record = built.finish()
    store = calibrate.store_of(tmp_path, record, xb)
    _, found = store.inner_product(xb[held], 1, **{knob: wide})
    np.testing.assert_array_equal(found[:, 0], held)  # each held-out row is found again, first for itself
    if kind == "hnsw":  # the graph's last nodes are the held-out rows
        np.testing.assert_array_equal(np.load(tmp_path / record["node_rows"])[-len(held):], held)
    if kind == "pqscan":  # code i is row i again, as a build of every row encodes it
        codes = faiss.read_index(str(tmp_path / pqscan_engine.ANN_FILE))
        stored = faiss.vector_to_array(codes.codes).reshape(codes.ntotal, codes.code_size)
        np.testing.assert_array_equal(stored, codes.pq.compute_codes(xb))


def test_a_graph_whose_nodes_are_all_rows_is_searched_without_a_selector():
    xb = clustered(500, 16, seed=5)
    order = np.random.default_rng(1).permutation(len(xb))
    index = faiss.IndexFlatIP(16)
    store = hnsw_engine.HnswStore(index, xb, None, (), 32, node_rows=order)
    assert store._returned_nodes(None) is None


def _staged(tmp_path, xb) -> None:
    write_vectors(tmp_path / VECTORS, [xb], count=len(xb), dim=xb.shape[1], dtype="float32")


def test_the_manifest_records_groups_rows_measured_and_when(tmp_path):
    xb = clustered(2000, 32, seed=4, unit=True)
    _staged(tmp_path, xb)
    rows = np.arange(0, 2000, 40)
    other = clustered(30, 32, seed=9, centers=5, unit=True)
    queries = CalibrationQueries((Group("in_domain", xb[rows], rows, "cut"), Group("other_domain", other,
                                                                                   np.full(30, -1), "far")))
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    record = calibrate.write_calibrated(xb, tmp_path, CONFIGS["pqscan"], queries, 0.9)
    entry = record["calibration"]
    assert entry["groups"] == [{"name": "in_domain", "source": "cut", "queries": 50},
                               {"name": "other_domain", "source": "far", "queries": 30}]
    assert entry["queries"] == 80 and entry["held_out_rows"] == 50 and entry["measured_rows"] == 2000
    assert entry["stale"] is False and datetime.datetime.fromisoformat(entry["measured_at"]) >= before
    assert entry["measured_at"].endswith("+00:00")
    for point in entry["curve"]:  # the point states the lower group's recall
        groups = point["groups"]
        assert point["recall_at_10"] == min(g["recall_at_10"] for g in groups.values())
        assert point["exact_top10"] == min(g["exact_top10"] for g in groups.values())
    config = PQScanConfig.from_dict(record)
    assert pqscan_engine.read_pqscan(tmp_path / pqscan_engine.ANN_FILE, 2000, 32, config).ntotal == 2000


def test_the_other_domain_sentences_are_pythons_own_docstrings():
    texts = other_domain.stdlib_sentences(50, seed=3)
    assert len(texts) == 50 == len(set(texts)) and texts == other_domain.stdlib_sentences(50, seed=3)
    assert all(4 <= len(t.split()) <= 30 for t in texts)
    assert other_domain.docstring_sentence("Return the sum of the values. More text.\n\nBody.") == \
        "Return the sum of the values."
    assert other_domain.docstring_sentence("Too short.") is None


def _built(tmp_path, count: int = 200):
    corpus = write_toy_corpus(tmp_path / "corpus.jsonl", count)
    return load_index(build_index(HashEncoder("cls"), corpus, tmp_path / "index",
                                  BuildOptions(progress=False, batch_size=32, ann=PQScanConfig(train_size=500),
                                               target_recall=0.9)))


def test_a_fold_that_changes_few_rows_keeps_the_calibration_and_one_that_changes_many_marks_it_stale(tmp_path):
    base = _built(tmp_path)
    entry = base.manifest["first_stage"]["calibration"]
    assert entry["measured_rows"] == 200 and entry["stale"] is False
    assert [g["name"] for g in entry["groups"]] == ["in_domain", "other_domain"]

    few = load_index(fold(base, Delta(hidden=frozenset({0, 1})), tmp_path / "few", applied_seq=1))
    kept = few.manifest["first_stage"]["calibration"]
    assert kept["stale"] is False and kept["rows_changed"] == 2 and kept["curve"] == entry["curve"]

    many = load_index(fold(few, Delta(hidden=frozenset(range(30))), tmp_path / "many", applied_seq=2))
    stale = many.manifest["first_stage"]["calibration"]
    assert stale["stale"] is True and stale["measured_rows"] == 200 and stale["rows_changed"] == 32
    assert stale["curve"] == entry["curve"]  # the figure is still stated, from the curve measured


def test_a_fold_that_retrains_or_rebuilds_marks_the_calibration_stale():
    entry = {"measured_rows": 1000, "stale": False, "curve": []}
    assert calibration.after_fold(entry, 1, 0, rebuilt=True)["stale"] is True
    assert calibration.after_fold(entry, 60, 40, rebuilt=False)["stale"] is False  # a tenth exactly
    assert calibration.after_fold(entry, 61, 40, rebuilt=False)["stale"] is True
    assert calibration.after_fold({"curve": []}, 1, 0, rebuilt=False)["stale"] is True  # rows measured unknown


def test_moving_queries_keeps_their_norms_and_takes_them_farther_the_more_noise():
    xq, xb = clustered(50, 32, seed=8) * 3.0, clustered(400, 32, seed=9)
    near, far = moved(xq, 0.5, xb), moved(xq, 1.5, xb)
    np.testing.assert_allclose(np.linalg.norm(far, axis=1), np.linalg.norm(xq, axis=1), rtol=1e-5)
    cosine = lambda a: np.einsum("ij,ij->i", a, xq) / np.linalg.norm(a, axis=1) / np.linalg.norm(xq, axis=1)
    assert (cosine(far) < cosine(near)).all() and (cosine(near) < 1).all()
    np.testing.assert_array_equal(moved(xq, 0.0, xb), xq)
    np.testing.assert_array_equal(moved(xq, 1.0, xb), moved(xq, 1.0, xb))
