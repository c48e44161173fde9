"""An IVF index exported to Milvus (Lite and the server) becomes a collection with Milvus's IVF index
(IVF_SQ8 for 8-bit codes, IVF_FLAT for float16 ones, the same nlist in its params), searched with ``nprobe``.

Milvus Lite (3.2) trains lists of its own whatever ``nlist`` says (2,000 rows went to 128 lists with
nlist 8, 120 rows to 120), and does not report an index's params: there ``nlist`` is checked in the
arguments the export passes, and the exact search scans at least as many lists as Lite has. The server
reports the ``nlist`` it was given and keeps that many lists: scanning all 8 is exact there."""

import json

import numpy as np
import pytest

from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.engines.ivf_engine import IVFConfig
from densehybrid.index.engines.milvus_engine import vector_index
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served import milvus, milvus_export
from densehybrid.index.served.loading import load_index

from support.milvus_lite import stop_lite_servers  # noqa: F401 - a module fixture, used by being imported
from support.fake_encoder import FakeEncoder

pytestmark = pytest.mark.slow  # Milvus Lite: a store process per database file

ANN = IVFConfig(nlist=8, nprobe=2, encoding="fp16")
QUERIES = ["graph search", "vector 17", "disk memory recall"]


@pytest.fixture(scope="module", params=["fp16", "sq8"])
def exported(request, tmp_path_factory, milvus_target):
    root = tmp_path_factory.mktemp(f"ivf-milvus-{request.param}")
    corpus = root / "corpus.jsonl"
    words = ["graph", "vector", "search", "disk", "memory", "recall"]
    corpus.write_text("".join(json.dumps({"_id": f"D{i}", "text": f"{words[i % 6]} {words[i * 5 % 6]} {i}"}) + "\n"
                              for i in range(120)))
    directory = build_index(FakeEncoder("cls"), corpus, root / "ivf", BuildOptions(progress=False, ann=IVFConfig(nlist=8, nprobe=2, encoding=request.param),
                                                                               target_recall=None))
    uri = milvus_target.uri(f"ivf_{request.param}")
    milvus_export.export_index(load_index(directory), uri, f"ivf_{request.param}", batch_size=64)
    return load_index(directory), milvus.open_collection(uri, f"ivf_{request.param}")


def test_the_collection_index_is_milvus_ivf_of_the_codes(exported, milvus_target):
    local, collection = exported
    described = collection.store.client.describe_index(collection.store.collection, "vector")
    assert (described["index_type"], described["metric_type"]) == (vector_index(local.manifest["first_stage"])["index_type"], "IP")
    assert collection.store.first_stage == "ivf" and collection.store.nprobe == 2
    if milvus_target.kind == "server":  # Milvus Lite reports no index params
        assert int(described["nlist"]) == local.manifest["first_stage"]["nlist"] == 8


def test_milvus_ivf_params_follow_the_codes():
    assert vector_index(ANN.to_dict()) == {"index_type": "IVF_FLAT", "metric_type": "IP", "params": {"nlist": 8}}
    assert vector_index(IVFConfig(nlist=64).to_dict()) == {"index_type": "IVF_SQ8", "metric_type": "IP",
                                                           "params": {"nlist": 64}}


def test_scanning_every_list_gives_the_local_exact_top10(exported, milvus_target):
    local, collection = exported
    queries = FakeEncoder("cls").encode(QUERIES, "query")
    want = Searcher(local, engine="torch").search(queries, SearchParams(k=10))
    every_list = 8 if milvus_target.kind == "server" else 128  # the server keeps nlist lists; Lite up to 120 here
    got = Searcher(collection).search(queries, SearchParams(k=10, nprobe=every_list))
    assert got.ids == want.ids
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-3, atol=1e-3)
