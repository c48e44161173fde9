"""The index classes and vector stores declare their protocols and implement every member, and the
local engines agree on the normalised-fusion rerank."""

import inspect

import numpy as np
import pytest

from densehybrid.index.search import gip
from densehybrid.index.storage.documents import Document
from densehybrid.index.engines.faiss_engine import FaissStore
from densehybrid.index.engines.torch_engine import TorchStore
from densehybrid.index.writes.live import LiveIndex
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.served import ServedIndex, StoredIndex
from densehybrid.index.search.vector_store import VectorStore
from densehybrid.index.writes.wal import WriteAheadLog
from densehybrid.index.search.params import SearchParams
from test_search import make_index, queries_for


def protocol_members(protocol) -> set[str]:
    names = set()
    for base in protocol.__mro__:
        if getattr(base, "_is_protocol", False) and base.__module__ != "typing":
            names |= {n for n in [*vars(base), *getattr(base, "__annotations__", {})] if not n.startswith("_")}
    return names


def assert_implements(obj, protocol) -> None:
    """``obj`` passes ``isinstance`` and defines every member itself: an inherited protocol stub
    (which returns None) would pass ``isinstance`` but is no implementation."""
    assert isinstance(obj, protocol), f"{type(obj).__name__} is not a {protocol.__name__}"
    protocols = [b for b in protocol.__mro__ if getattr(b, "_is_protocol", False)]
    for name in sorted(protocol_members(protocol)):
        if name in vars(obj):
            continue
        stubs = [vars(b)[name] for b in protocols if name in vars(b)]
        found = inspect.getattr_static(obj, name, None)
        assert found is not None and not any(found is stub for stub in stubs), \
            f"{type(obj).__name__}.{name} is only the {protocol.__name__} stub"


def test_the_local_index_classes_and_stores_implement_their_protocols(tmp_path):
    base = make_index(tmp_path, "dhr", n=40)
    stored: StoredIndex = base
    assert_implements(stored, StoredIndex)
    live: ServedIndex = LiveIndex(base, Searcher)
    assert_implements(live, ServedIndex)
    for store in (base.vector_store("cpu"), base.vector_store("cpu", engine="torch")):
        assert_implements(store, VectorStore)
    assert type(base.vector_store("cpu")) is FaissStore
    assert type(base.vector_store("cpu", engine="torch")) is TorchStore


def test_the_conformance_check_catches_a_missing_member(tmp_path):
    class NoIds(FaissStore):
        ids_of = VectorStore.ids_of  # the protocol's stub: isinstance still passes

    base = make_index(tmp_path, "cls", n=10)
    with pytest.raises(AssertionError, match="ids_of is only the VectorStore stub"):
        assert_implements(NoIds(base.faiss, base.values, base.gates, base.doc_ids), VectorStore)


def test_live_index_answers_for_its_writes_and_delegates_the_rest(tmp_path):
    base = make_index(tmp_path, "dhr", n=30)
    read_only = LiveIndex(base, Searcher)
    assert not read_only.writable and not read_only.remote and read_only.healthy()
    live = LiveIndex(base, Searcher, WriteAheadLog.open(tmp_path / "wal"))
    assert live.writable and live.name == base.name and live.fusion_method == base.fusion_method
    values, gates = np.ones((1, base.spec.dim), np.float32), np.zeros((1, base.spec.gated_dim), np.uint8)
    live.upsert([Document("new", "", "a passage written later")], values, gates)
    live.delete("doc3")
    assert live.count == 30 and live.contains("new") and not live.contains("doc3")
    assert live.ids_of([2, 30]) == ["doc2", "new"] and live.row_of("new") == 30
    assert live.get_many(["doc3", "new"]) == [None, Document("new", "", "a passage written later")]
    live.close()


def numpy_fused(xq, gq, values, gates, rows, method, weight):
    """Independent brute force: part scores in float64 over ``rows`` (Q, K), normalised per query, mixed."""
    g = gates.shape[1]
    v = values.astype(np.float64)[rows]
    x = xq.astype(np.float64)[:, None, :]
    lexical = (x[..., :g] * v[..., :g] * (gates[rows] == gq[:, None, :])).sum(-1)
    dense = (x[..., g:] * v[..., g:]).sum(-1)

    def normalise(s):
        if method == "zscore":
            return (s - s.mean(1, keepdims=True)) / s.std(1, keepdims=True)
        return (s - s.min(1, keepdims=True)) / (s.max(1, keepdims=True) - s.min(1, keepdims=True))
    return (1 - weight) * normalise(lexical) + weight * normalise(dense)


def top(fused, rows, k):
    order = np.argsort(-fused, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(fused, order, 1), np.take_along_axis(rows, order, 1)


@pytest.mark.parametrize("method", ["zscore", "minmax"])
@pytest.mark.parametrize("kind", ["dhr", "fusion"])
def test_normalised_fusion_on_the_torch_engine_equals_faiss_and_numpy(tmp_path, kind, method):
    n, k, weight = 300, 15, 0.3
    index = make_index(tmp_path, kind, n=n, lam=2.0)
    queries = queries_for(index, 4)
    xq = gip.scale_queries(queries.values, index.spec.gated_dim, index.lam)
    every_row = np.tile(np.arange(n), (4, 1))
    want_scores, want_rows = top(numpy_fused(xq, queries.gates, index.values, index.gates, every_row, method, weight),
                                 every_row, k)
    params = {"k": k, "method": method, "dense_weight": weight}
    faiss_all = Searcher(index).search(queries, SearchParams(candidates=n, **params))
    torch_all = Searcher(index, engine="torch").search(queries, SearchParams(candidates=n, **params))
    for found in (faiss_all, torch_all):  # K1 = N: both engines normalise over every row
        assert found.rows == want_rows.tolist()
        np.testing.assert_allclose(found.scores, want_scores, rtol=1e-4, atol=1e-4)
    # K1 < N: the torch engine's candidates are each part's top rows of its float16 copy, united
    depth = 60
    g = index.spec.gated_dim
    v = index.values.astype(np.float64)
    lexical_ip = xq[:, :g].astype(np.float64) @ v[:, :g].T
    dense_ip = xq[:, g:].astype(np.float64) @ v[:, g:].T
    torch_some = Searcher(index, engine="torch").search(queries, SearchParams(candidates=depth, **params))
    for i, (a, b) in enumerate(zip(lexical_ip, dense_ip)):
        union = np.array(sorted(set(np.argsort(-a, kind="stable")[:depth]) | set(np.argsort(-b, kind="stable")[:depth])))
        assert len(union) > depth  # the parts disagree, so the union is larger than either
        fused = numpy_fused(xq[i:i + 1], queries.gates[i:i + 1], index.values, index.gates, union[None], method, weight)
        want_scores, want_rows = top(fused, union[None], k)
        assert torch_some.rows[i] == want_rows[0].tolist()
        np.testing.assert_allclose(torch_some.scores[i], want_scores[0], rtol=1e-4, atol=1e-4)


def test_torch_part_scores_equal_the_faiss_stores_over_two_devices_and_small_chunks(tmp_path):
    index = make_index(tmp_path, "dhr", n=200)
    queries = queries_for(index, 3)
    xq = gip.scale_queries(queries.values, index.spec.gated_dim, 1.5)
    rows = np.random.default_rng(4).choice(200, (3, 50)).astype(np.int64)
    rows[2, 40:] = -1
    faiss_parts = index.vector_store("cpu").part_scores(xq, queries.gates, rows)
    torch = TorchStore(index.values, index.gates, index.doc_ids, ["cpu", "cpu"], chunk_rows=17)
    torch_parts = torch.part_scores(xq, queries.gates, rows)
    valid = rows >= 0
    for got, want in zip(torch_parts, faiss_parts):
        np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["zscore", "minmax"])
def test_gpu_normalised_fusion_matches_the_cpu(tmp_path, method):
    index = make_index(tmp_path, "fusion", n=2000)
    queries = queries_for(index, 8)
    params = {"k": 10, "candidates": index.count, "method": method}  # K1 = N: the same candidates on both
    cpu = Searcher(index).search(queries, SearchParams(**params))
    gpu = Searcher(index, device="cuda", float16=False).search(queries, SearchParams(**params))
    assert gpu.rows == cpu.rows
    np.testing.assert_allclose(gpu.scores, cpu.scores, rtol=1e-4, atol=1e-4)
