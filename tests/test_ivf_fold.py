"""Folds into an IVF index keep the trained lists: dropped rows leave them, kept rows are renumbered in
place, written rows join the lists of their nearest centres; once the rows have doubled, the lists are
trained anew."""

import faiss
import numpy as np

from densehybrid.encoder.base import Encoded
from densehybrid.index.building.ivf import MAX_GROWTH
from densehybrid.index.engines.ivf_engine import ANN_FILE, IVFConfig, IvfStore
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index, verify_index
from densehybrid.index.writes.compaction import fold
from densehybrid.index.writes.delta import Delta, delete, upsert
from test_hnsw import brute_topk, clustered, make_index

SMALL = IVFConfig(nlist=16, nprobe=4, train_size=2000)


def _fold(base, path, n_written, deleted, seed):
    values = clustered(n_written, base.spec.dim, seed)
    delta = upsert(Delta(), base, [Document(f"new{seed}-{i}", "", f"new {i}") for i in range(n_written)], values, None)
    for doc_id in deleted:
        delta = delete(delta, base, doc_id)
    return load_index(fold(base, delta, path, applied_seq=1))


def _centres(index) -> np.ndarray:
    return faiss.rev_swig_ptr(faiss.downcast_index(index.ann.quantizer).get_xb(), index.ann.nlist * index.ann.d).copy()


def _list_of_each_row(index) -> np.ndarray:
    """(count,) the list holding each row; every row in exactly one list (the ids are the rows)."""
    lists = index.ann.invlists
    ids = [faiss.rev_swig_ptr(lists.get_ids(n), lists.list_size(n)).copy() for n in range(index.ann.nlist)]
    rows = np.concatenate(ids)
    np.testing.assert_array_equal(np.sort(rows), np.arange(index.count))
    where = np.empty(index.count, np.int64)
    where[rows] = np.repeat(np.arange(index.ann.nlist), [len(i) for i in ids])
    return where


def test_a_fold_renumbers_the_lists_and_adds_the_written_rows_as_a_fresh_build_would(tmp_path):
    base = make_index(tmp_path, n=600, ann=SMALL)
    deleted = [f"doc{i}" for i in range(0, 600, 20)]  # 30 rows
    folded = _fold(base, tmp_path / "gen", 40, deleted, seed=21)
    assert folded.count == 610 and folded.ann.ntotal == 610
    assert folded.manifest["first_stage"] == base.manifest["first_stage"]  # trained on the base, kept
    np.testing.assert_array_equal(_centres(folded), _centres(base))
    verify_index(folded.path)
    # the base's trained centres and codes, filled in one go with the folded rows: the same lists
    fresh = faiss.read_index(str(base.path / ANN_FILE))
    fresh.reset()
    fresh.add_with_ids(np.asarray(folded.values, np.float32), np.arange(folded.count))
    kept = np.array([int(d[3:]) for d in folded.doc_ids[:570]])
    np.testing.assert_array_equal(_list_of_each_row(folded)[:570], _list_of_each_row(base)[kept])
    xq = clustered(8, base.spec.dim, seed=13)
    fresh_store = IvfStore(fresh, folded.values, None, folded.doc_ids, SMALL.nprobe)
    np.testing.assert_array_equal(folded.vector_store().inner_product(xq, 10)[1], fresh_store.inner_product(xq, 10)[1])
    every = Searcher(folded).search(Encoded(xq, None), SearchParams(k=10, nprobe=SMALL.nlist))
    np.testing.assert_array_equal(np.array(every.rows), brute_topk(xq, np.asarray(folded.values, np.float32), 10)[1])
    assert not set(deleted) & {i for ids in every.ids for i in ids}


def test_the_lists_are_trained_anew_once_the_rows_have_doubled(tmp_path):
    base = make_index(tmp_path, n=300, ann=SMALL)
    grown = _fold(base, tmp_path / "gen", int(300 * MAX_GROWTH) + 1 - 300, [], seed=22)
    assert grown.manifest["first_stage"]["trained_rows"] == grown.count == 601
    assert not np.array_equal(_centres(grown), _centres(base))
    xq = clustered(8, base.spec.dim, seed=14)
    every = Searcher(grown).search(Encoded(xq, None), SearchParams(k=10, nprobe=SMALL.nlist))
    np.testing.assert_array_equal(np.array(every.rows), brute_topk(xq, np.asarray(grown.values, np.float32), 10)[1])
