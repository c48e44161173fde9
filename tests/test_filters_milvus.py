"""Filtered search in a Milvus collection (Milvus Lite and the server): the filter becomes a Milvus expression
over the exported scalar fields, and the hits equal brute force over the filtered rows at selectivities from
0.01 % to 100 %."""

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded
from densehybrid.index.search import filters
from densehybrid.index.served import milvus, milvus_export
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.params import SearchParams
from test_filters import N, SELECTIVITIES, brute_force, synthetic_index
from test_gip import random_rows

from support.milvus_lite import stop_lite_servers  # noqa: F401 - a module fixture, used by being imported

pytestmark = pytest.mark.slow  # Milvus Lite: a store process, and a 20 000-row export


@pytest.fixture(scope="module")
def exported(tmp_path_factory, milvus_target):
    root = tmp_path_factory.mktemp("milvus-filters")
    index, values, gates, rank = synthetic_index(root, "dhr")
    uri = milvus_target.uri()
    milvus_export.export_index(index, uri, "filtered", batch_size=5000)
    return index, milvus.open_collection(uri, "filtered"), values, gates, rank


def test_collection_filtered_search_equals_brute_force(exported):
    index, collection, values, gates, rank = exported
    assert collection.field_types == {"rank": "integer", "tags": "keyword_list"}
    xq, gq = random_rows(2, index.spec.dim, index.spec.gated_dim, seed=5, dtype=np.float32)
    remote = Searcher(collection)
    for share in SELECTIVITIES:
        cut = int(share * N)
        kept = np.flatnonzero(rank < cut)
        flt = filters.parse({"field": "rank", "range": {"lt": cut}}, collection.field_types)
        for rerank in (False, True):
            found = remote.search(Encoded(xq, gq), SearchParams(k=10, candidates=100, rerank=rerank, filter=flt))
            assert found.rows == brute_force(xq, gq, values, gates, kept, 10, 100, rerank), (share, rerank)
            assert found.selectivity == pytest.approx(share)


def test_collection_keyword_list_filters_and_fields_equal_the_local_index(exported):
    index, collection, values, gates, rank = exported
    xq, gq = random_rows(2, index.spec.dim, index.spec.gated_dim, seed=6, dtype=np.float32)
    for raw in ({"field": "tags", "eq": "a"}, {"not": {"field": "tags", "in": ["a", "b"]}},
                {"and": [{"field": "tags", "exists": True}, {"field": "rank", "range": {"gte": 100.5, "lt": 9000}}]},
                {"or": [{"field": "tags", "eq": "zzz"}, {"field": "rank", "eq": 17}]},
                {"field": "tags", "eq": "nothing"},
                # integers beyond int64 (JSON has no limit): equal no row, and bound every row or none
                {"field": "rank", "in": [-2**70, 17, 2**64]}, {"field": "rank", "eq": 2**70},
                {"field": "rank", "range": {"lt": 2**70, "gte": 10}}, {"not": {"field": "rank", "range": {"lt": -2**70}}}):
        flt = filters.parse(raw, index.field_types)
        local = Searcher(index).search(Encoded(xq, gq), SearchParams(k=10, candidates=200, filter=flt))
        remote = Searcher(collection).search(Encoded(xq, gq), SearchParams(k=10, candidates=200, filter=flt))
        assert remote.rows == local.rows, raw
        assert remote.selectivity == pytest.approx(local.selectivity)
    rows = [0, 5, 17, 19_999]
    assert collection.field_values(rows, ["rank", "tags"]) == index.field_values(rows, ["rank", "tags"])


def test_a_row_limited_collection_search_is_brute_force_over_the_first_rows(exported):
    """The warm-up's bounded search (``row_limit``) in Milvus: an expression over the primary key ``row``,
    alone and with a filter; and the warm-up itself through a collection-backed runtime."""
    index, collection, values, gates, rank = exported
    xq, gq = random_rows(2, index.spec.dim, index.spec.gated_dim, seed=7, dtype=np.float32)
    remote = Searcher(collection)
    first = np.arange(N) < 700
    flt = filters.parse({"field": "rank", "range": {"lt": N // 2}}, collection.field_types)
    for node, kept in ((None, np.flatnonzero(first)), (flt, np.flatnonzero(first & (rank < N // 2)))):
        for rerank in (False, True):
            params = SearchParams(k=10, candidates=100, rerank=rerank, filter=node, row_limit=700)
            assert remote.search(Encoded(xq, gq), params).rows == brute_force(xq, gq, values, gates, kept, 10, 100,
                                                                              rerank), (node, rerank)


def test_the_warm_up_searches_a_collection_within_its_first_rows(exported):
    from densehybrid.service import startup
    from densehybrid.service.settings import ServiceSettings
    from support.fake_encoder import FakeEncoder
    from support.runtime import warmed_up

    index, collection, *_ = exported
    encoder = FakeEncoder("dhr", dlr_dim=24, dense_dim=8, vocab_size=6000)  # the collection's dims
    rt = startup.build_runtime(ServiceSettings(), encoder, collection)
    params = startup.warm_up_params(rt.index)
    assert params.row_limit == startup.WARMUP_ROWS < N
    warmed_up(rt)
