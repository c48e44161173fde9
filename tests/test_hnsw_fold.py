"""Folds into an HNSW index add the written rows to the existing graph: dropped rows stay as dead nodes
that no search returns, and the graph is built anew once too many are dead or a row is too long."""

from dataclasses import replace

import faiss
import numpy as np
import pytest

from densehybrid.encoder.base import Encoded
from densehybrid.index.building.ann import MAX_DEAD_FRACTION
from densehybrid.index.engines import hnsw_engine
from densehybrid.index.errors import IndexLoadError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index, verify_index
from densehybrid.index.writes.compaction import fold
from densehybrid.index.writes.delta import Delta, delete, upsert
from test_hnsw import SMALL, brute_topk, clustered, make_index, recall


def _trained_ranges(index) -> np.ndarray:
    return faiss.vector_to_array(faiss.downcast_index(index.storage).sq.trained)


def _written(n: int, seed: int, base) -> tuple[list[Document], np.ndarray]:
    """``n`` new documents; for a graph linked by L2 over augmented rows, no longer than the base's longest (the
    graph can take them)."""
    values = clustered(n, base.spec.dim, seed)
    config = hnsw_engine.HNSWConfig.from_dict(base.manifest["first_stage"])
    if config.metric == hnsw_engine.L2_AUGMENTED:
        values *= min(1.0, 0.95 * np.sqrt(config.max_norm2) / np.linalg.norm(values, axis=1).max())
    return [Document(f"new{seed}-{i}", "", f"new text {i}") for i in range(n)], values


def _fold(base, path, written, deleted, seq):
    docs, values = written
    delta = upsert(Delta(), base, docs, values, None)
    for doc_id in deleted:
        delta = delete(delta, base, doc_id)
    return load_index(fold(base, delta, path, applied_seq=seq))


def _exhaustive_check(index, xq):
    """With a walk as wide as the graph, the final top-10 is the brute-force top-10 of the live rows."""
    got = Searcher(index).search(Encoded(xq, None), SearchParams(k=10, ef_search=int(index.ann.ntotal)))
    want = brute_topk(xq, np.asarray(index.values, np.float32), 10)[1]
    assert recall(np.array(got.rows), want) == 1.0


def test_a_fold_adds_rows_to_the_graph_and_searches_never_return_its_dead_nodes(tmp_path):
    base = make_index(tmp_path, n=600)
    deleted = [f"doc{i}" for i in range(0, 600, 20)]  # 30 rows, 5% of the graph
    folded = _fold(base, tmp_path / "gen", _written(40, 21, base), deleted, seq=1)
    record = folded.manifest["first_stage"]
    assert folded.count == 610 and folded.ann.ntotal == 640 and record["nodes"] == 640
    assert int(np.sum(folded.ann_rows < 0)) == 30 and record["node_rows"] == hnsw_engine.NODE_ROWS
    np.testing.assert_array_equal(_trained_ranges(folded.ann), _trained_ranges(base.ann))  # the base's graph
    verify_index(folded.path)
    xq = clustered(8, base.spec.dim, seed=13)
    _exhaustive_check(folded, xq)
    found = Searcher(folded).search(Encoded(xq, None), SearchParams(k=10))
    assert not set(deleted) & {i for ids in found.ids for i in ids}
    assert {f"new21-{i}" for i in range(40)} <= set(folded.doc_ids)


def test_a_filtered_walk_over_dead_nodes_returns_only_live_kept_rows(tmp_path, monkeypatch):
    base = make_index(tmp_path, n=600)
    folded = _fold(base, tmp_path / "gen", _written(20, 22, base), [f"doc{i}" for i in range(1, 600, 7)], seq=1)
    monkeypatch.setattr(hnsw_engine, "EXACT_KEPT_ROWS", 0)  # walk the graph even for this small filter
    store = folded.vector_store()
    mask = np.random.default_rng(3).random(folded.count) < 0.5
    xq = clustered(10, base.spec.dim, seed=14)
    _, rows = store.inner_product(xq, 10, Selection(int(mask.sum()), folded.count, mask=mask), ef_search=10_000)
    assert (rows >= 0).all() and mask[rows].all()
    assert recall(rows, brute_topk(xq, np.asarray(folded.values, np.float32), 10, np.flatnonzero(mask))[1]) == 1.0


@pytest.mark.parametrize("metric", [hnsw_engine.INNER_PRODUCT, hnsw_engine.L2_AUGMENTED])
def test_the_graph_is_built_anew_past_the_dead_share_and_an_augmented_one_for_a_longer_row(tmp_path, metric):
    base = make_index(tmp_path, n=600, ann=replace(SMALL, metric=metric))
    assert base.manifest["first_stage"]["metric"] == metric
    once = _fold(base, tmp_path / "gen", _written(10, 23, base), [f"doc{i}" for i in range(0, 600, 10)], seq=1)
    assert once.ann_rows is not None and np.mean(once.ann_rows < 0) < MAX_DEAD_FRACTION
    many = [f"doc{i}" for i in range(1, 600, 10)] + [f"doc{i}" for i in range(2, 600, 10)]
    twice = _fold(once, tmp_path / "gen", _written(10, 24, once), many, seq=2)  # 180 of 620 nodes dead
    assert twice.ann_rows is None and twice.ann.ntotal == twice.count == 440
    assert "node_rows" not in twice.manifest["first_stage"]
    docs, values = _written(5, 25, twice)
    values[0] *= 3.0  # longer than every base row: an augmented dim would be wrong for it
    folded = _fold(twice, tmp_path / "gen", (docs, values), [], seq=3)
    assert folded.ann.ntotal == folded.count == 445
    rebuilt = not np.array_equal(_trained_ranges(folded.ann), _trained_ranges(twice.ann))
    assert rebuilt == (metric == hnsw_engine.L2_AUGMENTED)  # an inner-product graph just takes the row
    _exhaustive_check(folded, clustered(6, base.spec.dim, seed=15))


def test_verify_refuses_a_node_map_that_loses_a_row(tmp_path):
    base = make_index(tmp_path, n=300)
    folded = _fold(base, tmp_path / "gen", _written(5, 26, base), ["doc3"], seq=1)
    nodes = np.array(folded.ann_rows)
    nodes[nodes == 7] = -1
    with pytest.raises(IndexLoadError, match="live nodes are not the index's 304 rows"):
        hnsw_engine.check_node_rows(folded.path / hnsw_engine.NODE_ROWS, nodes, folded.count)
