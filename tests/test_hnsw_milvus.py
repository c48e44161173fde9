"""An HNSW index exported to Milvus (Lite and the server) becomes a collection with Milvus's HNSW index
(same M and efConstruction, read back from the server), searched with ``ef``; FLAT stays FLAT."""

import json

import numpy as np
import pytest

from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.engines.milvus_engine import vector_index
from densehybrid.index.served import milvus, milvus_export
from densehybrid.index.served.loading import load_index

from support.milvus_lite import stop_lite_servers  # noqa: F401 - a module fixture, used by being imported
from support.fake_encoder import FakeEncoder

pytestmark = pytest.mark.slow  # Milvus Lite: a store process per database file

ANN = HNSWConfig(m=12, ef_construction=40, ef_search=24, train_size=120)
QUERIES = ["graph search", "vector 17", "disk memory recall"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, milvus_target):
    root = tmp_path_factory.mktemp("hnsw-milvus")
    corpus = root / "corpus.jsonl"
    words = ["graph", "vector", "search", "disk", "memory", "recall"]
    corpus.write_text("".join(json.dumps({"_id": f"D{i}", "text": f"{words[i % 6]} {words[i * 5 % 6]} {i}"}) + "\n"
                              for i in range(120)))
    out = {}
    for kind in ("hnsw", "flat"):
        directory = build_index(FakeEncoder("cls"), corpus, root / kind,
                                BuildOptions(progress=False, ann=ANN if kind == "hnsw" else None))
        uri = milvus_target.uri(kind)
        milvus_export.export_index(load_index(directory), uri, kind, batch_size=64)
        out[kind] = (load_index(directory), milvus.open_collection(uri, kind), uri)
    return out


def test_the_collection_index_follows_the_local_first_stage(exported, milvus_target):
    for kind, index_type in (("hnsw", "HNSW"), ("flat", "FLAT")):
        _, collection, uri = exported[kind]
        described = collection.store.client.describe_index(kind, "vector")
        assert described["index_type"] == index_type and described["metric_type"] == "IP"
        assert collection.store.first_stage == kind
    if milvus_target.kind == "server":  # Milvus Lite reports no index params
        described = exported["hnsw"][1].store.client.describe_index("hnsw", "vector")
        assert (int(described["M"]), int(described["efConstruction"])) == (ANN.m, ANN.ef_construction) == (12, 40)


def test_milvus_hnsw_params_are_the_graphs():
    assert vector_index(ANN.to_dict()) == {"index_type": "HNSW", "metric_type": "IP",
                                                  "params": {"M": 12, "efConstruction": 40}}
    assert vector_index({"type": "flat_ip"}) == {"index_type": "FLAT", "metric_type": "IP"}


def test_a_wide_ef_gives_the_local_exact_top10(exported):
    local, collection, _ = exported["hnsw"]
    queries = FakeEncoder("cls").encode(QUERIES, "query")
    want = Searcher(local, engine="torch").search(queries, SearchParams(k=10))
    got = Searcher(collection).search(queries, SearchParams(k=10, ef_search=120))
    assert got.ids == want.ids
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-3, atol=1e-3)
