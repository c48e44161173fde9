"""Milvus as the vector store, against embedded Milvus Lite (the ``[milvus]`` extra) and a real Milvus server
(``milvus_target``: each test that exports runs on both).

Lite answers one query in 100+ ms, so the indexes here are small (80 rows).
"""

import shutil

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.bench.servers.start import LiveServer, free_port
from densehybrid.cli.main import app
from densehybrid.index import errors
from densehybrid.index.search import gip
from densehybrid.index.served import milvus, milvus_export
from densehybrid.index.engines.milvus_engine import rerank_fetched
from densehybrid.index.errors import IndexLoadError, IndexMismatchError
from densehybrid.index.storage.compatibility import check_compatible
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher, SearchError
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.index.search.params import SearchParams

from support.milvus_lite import stop_lite_servers  # noqa: F401 - a module fixture, used by being imported
from support.fake_encoder import FakeEncoder
from support.waiting import wait_until

pytestmark = pytest.mark.slow  # Milvus Lite: a store process per database file

QUERIES = ["dense retrieval of passages", "gated product", "neural doc12", "lexical"]


@pytest.fixture(scope="module")
def toy(milvus_target, toy_index):
    """A local dhr index (gated) and its export (Milvus Lite or the server)."""
    index = load_index(toy_index("dhr"))
    uri = milvus_target.uri("lite")
    milvus_export.export_index(index, uri, "toy", batch_size=32)
    return index, uri


@pytest.fixture(scope="module")
def collection(toy):
    index, uri = toy
    return milvus.open_collection(uri, "toy")


def test_rerank_of_fetched_rows_equals_rerank_over_the_whole_index():
    rng = np.random.default_rng(7)
    values = rng.normal(size=(50, 12)).astype(np.float16)
    gates = rng.integers(0, 3, size=(50, 4)).astype(np.uint8)
    xq = rng.normal(size=(3, 12)).astype(np.float32)
    gq = rng.integers(0, 3, size=(3, 4)).astype(np.uint8)
    rows = np.stack([rng.permutation(50)[:20] for _ in range(3)]).astype(np.int64)
    rows[1, -3:] = -1  # fewer candidates than asked for
    fetched = np.unique(rows[rows >= 0])[::-1].copy()  # any order
    want = gip.rerank(xq, gq, values, gates, rows, 7)
    got = rerank_fetched(xq, gq, rows, 7, fetched, values[fetched], gates[fetched])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_collection_search_equals_the_local_index(toy, collection):
    index, _ = toy
    queries = FakeEncoder("dhr").encode(QUERIES, "query")
    for candidates, rerank in ((80, True), (20, True), (30, False)):
        local = Searcher(index).search(queries, SearchParams(k=10, candidates=candidates, rerank=rerank))
        remote = Searcher(collection).search(queries, SearchParams(k=10, candidates=candidates, rerank=rerank))
        assert remote.ids == local.ids and remote.rows == local.rows
        np.testing.assert_allclose(np.array(remote.scores), np.array(local.scores), rtol=1e-5, atol=1e-5)


def test_collection_search_with_normalised_fusion_equals_the_local_index(toy, collection):
    index, _ = toy
    queries = FakeEncoder("dhr").encode(QUERIES, "query")
    assert collection.fusion_method == index.fusion_method and collection.dense_weight == index.dense_weight
    for method, weight in (("zscore", None), ("minmax", 0.3), ("adaptive", None), ("dense", None), ("lexical", None)):
        local = Searcher(index).search(queries, SearchParams(k=10, candidates=40, method=method, dense_weight=weight))
        remote = Searcher(collection).search(queries,
                                             SearchParams(k=10, candidates=40, method=method, dense_weight=weight))
        assert remote.ids == local.ids and remote.rows == local.rows
        np.testing.assert_allclose(np.array(remote.scores), np.array(local.scores), rtol=1e-5, atol=1e-5)
    with pytest.raises(SearchError, match="torch search engine needs a local index"):
        Searcher(collection, engine="torch")


def test_collection_carries_manifest_texts_and_rows(toy, collection):
    index, _ = toy
    assert collection.manifest == index.manifest and collection.count == index.count and collection.lam == index.lam
    check_compatible(collection.spec, FakeEncoder("dhr").spec)
    with pytest.raises(IndexMismatchError, match="kind"):
        check_compatible(collection.spec, FakeEncoder("cls").spec)
    ids = [index.doc_ids[5], "no-such-id", index.doc_ids[70]]
    assert collection.docs.get_many(ids) == index.docs.get_many(ids)
    assert collection.row_of(index.doc_ids[70]) == 70 and collection.row_of("no-such-id") is None
    np.testing.assert_array_equal(collection.values[70], index.values[70])
    np.testing.assert_array_equal(collection.gates[70], index.gates[70])
    with pytest.raises(SearchError, match="approx_gip"):
        Searcher(collection).search(FakeEncoder("dhr").encode(["x"], "query"), SearchParams(first_stage="approx_gip"))


def test_collection_implements_the_served_index_and_its_store_the_vector_store(collection):
    from densehybrid.index.writes.live import LiveIndex
    from densehybrid.index.search.served import ServedIndex, StoredIndex
    from densehybrid.index.search.vector_store import VectorStore
    from test_served import assert_implements

    assert_implements(collection, StoredIndex)
    assert_implements(collection.vector_store("cpu"), VectorStore)
    live = LiveIndex(collection, Searcher)
    assert_implements(live, ServedIndex)
    assert live.remote and not live.writable and live.healthy()
    switch = _Switchable(collection.store.client)
    collection.store.client, switch.down = switch, True
    try:
        assert not collection.healthy() and not live.healthy()
    finally:
        collection.store.client = switch._client


class _FailingUpserts:
    """A client whose row upserts fail after ``ok`` calls: an export killed part way."""

    def __init__(self, client, ok: int):
        self._client, self.ok = client, ok

    def __getattr__(self, name):
        return getattr(self._client, name)

    def upsert(self, collection, data):
        if collection.endswith(milvus_export.META_SUFFIX) is False:
            if self.ok == 0:
                raise ConnectionError("killed")
            self.ok -= 1
        return self._client.upsert(collection, data)


def test_export_resumes_after_a_failure_and_reruns_add_no_rows(toy, milvus_target):
    index, _ = toy
    uri = milvus_target.uri("resume")
    client = milvus.connect(uri)
    with pytest.raises(errors.MilvusUnavailableError, match="killed"):
        milvus_export.export_index(index, uri, "part", batch_size=25, client=_FailingUpserts(client, ok=2))
    with pytest.raises(IndexLoadError, match="unfinished"):
        milvus.open_collection(uri, "part", client=client)
    resumed = milvus_export.export_index(index, uri, "part", batch_size=25, client=client)
    assert (resumed.resumed_from, resumed.rows, resumed.batches) == (50, 80, 2)
    again = milvus_export.export_index(index, uri, "part", batch_size=25, client=client)
    assert again.batches == 0
    opened = milvus.open_collection(uri, "part", client=client)
    assert client.get_collection_stats("part")["row_count"] == index.count
    assert opened.store.ids_of(range(80)) == index.doc_ids


def test_a_collection_that_disagrees_with_its_manifest_is_refused(toy, milvus_target, toy_index):
    index, _ = toy
    uri = milvus_target.uri("bad")
    client = milvus.connect(uri)
    milvus_export.export_index(index, uri, "lost", client=client)
    client.delete("lost", ids=[3])
    with pytest.raises(IndexLoadError, match="holds 79 rows, the manifest says 80"):
        milvus.open_collection(uri, "lost", client=client)
    other = load_index(toy_index("cls"))
    milvus_export.export_index(other, uri, "dims", client=client)
    record = milvus_export.read_meta(client, uri, "dims")
    record["manifest"] = index.manifest  # a dhr manifest (dim 896) over a cls collection
    milvus_export.write_meta(client, uri, "dims", record)
    with pytest.raises(IndexLoadError, match="vector field of dim"):
        milvus.open_collection(uri, "dims", client=client)
    with pytest.raises(IndexLoadError, match="no such densehybrid collection"):
        milvus.open_collection(uri, "absent", client=client)
    with pytest.raises(Exception, match="holds another index"):
        milvus_export.export_index(index, uri, "dims", client=client)


def test_cli_export_search_and_eval_need_only_the_collection(tmp_path, fake_models, toy_index, milvus_target):
    index_dir = shutil.copytree(toy_index("fusion"), tmp_path / "fusion")  # a copy: this test deletes it
    index = load_index(index_dir)
    uri = milvus_target.uri("cli")
    runner = CliRunner()
    exported = runner.invoke(app, ["index", "export", "--index", str(index_dir), "--milvus-uri", uri,
                                   "--collection", "docs", "--batch-size", "30"])
    assert exported.exit_code == 0, exported.output
    assert "80 rows" in exported.output
    doc = index.docs.get(index.doc_ids[12])
    (tmp_path / "queries.jsonl").write_text(f'{{"_id": "q1", "text": "{doc.text}"}}\n')
    (tmp_path / "qrels.tsv").write_text(f"q1\t{doc.id}\t1\n")
    local = runner.invoke(app, ["eval", "--index", str(index_dir), "--queries", str(tmp_path / "queries.jsonl"),
                                "--qrels", str(tmp_path / "qrels.tsv"), "--json"])
    index.docs.close()
    shutil.rmtree(index_dir)  # the collection alone must be enough
    found = runner.invoke(app, ["search", "--milvus-uri", uri, "--collection", "docs", doc.text, "-k", "3"])
    assert found.exit_code == 0, found.output
    assert doc.id in found.output
    remote = runner.invoke(app, ["eval", "--milvus-uri", uri, "--collection", "docs", "--queries",
                                 str(tmp_path / "queries.jsonl"), "--qrels", str(tmp_path / "qrels.tsv"), "--json"])
    assert remote.exit_code == 0, remote.output
    assert remote.output.strip().splitlines()[-1] == local.output.strip().splitlines()[-1]
    both = runner.invoke(app, ["search", "--index", str(index_dir), "--milvus-uri", uri, "--collection", "docs", "x"])
    assert both.exit_code != 0


def test_serve_exits_2_when_milvus_is_unreachable(root_logging_restored):
    uri = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["serve", "--milvus-uri", uri, "--collection", "docs", "--milvus-timeout-s", "2"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert f"cannot reach Milvus at {uri}" in said and "server unavailable" in said


class _Switchable:
    """A Milvus client that can be cut off and restored: the network between service and Milvus."""

    def __init__(self, client):
        self._client, self.down = client, False

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            if self.down:
                raise ConnectionError("Milvus went away")
            return attribute(*args, **kwargs)
        return call


def test_service_on_a_collection_reports_a_lost_milvus_and_recovers(toy, collection):
    index, _ = toy
    switch = _Switchable(collection.store.client)
    collection.store.client = switch
    settings = ServiceSettings(max_wait_ms=5, store_check_s=0.05)
    body = {"query": QUERIES[0], "k": 5, "candidates": 40, "return_text": True}
    try:
        with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=collection)) as live, \
                httpx.Client(base_url=live.url, timeout=30) as c:
            served = c.post("/search", json=body)
            assert served.status_code == 200, served.text
            local = Searcher(index).search(FakeEncoder("dhr").encode([QUERIES[0]], "query"),
                                           SearchParams(k=5, candidates=40))
            assert [h["id"] for h in served.json()["results"]] == local.ids[0]
            assert served.json()["results"][0]["text"] == index.docs.get(local.ids[0][0]).text
            write = c.post("/documents", json={"documents": [{"id": "new-1", "text": "a new passage"}]})
            assert write.status_code == 403 and write.json()["error"]["type"] == "writes_disabled"
            assert "Milvus collection" in write.json()["error"]["message"]
            assert c.delete(f"/documents/{index.doc_ids[0]}").status_code == 403
            switch.down = True
            lost = c.post("/search", json=body)
            assert lost.status_code == 503 and lost.headers["Retry-After"] == "1"
            assert lost.json()["error"]["type"] == "store_unavailable"
            ready = c.get("/ready")
            assert ready.status_code == 503 and ready.json()["ready"] is False
            switch.down = False
            # re-checked every store_check_s; bounded by the clock, not a count
            wait_until(lambda: c.get("/ready").status_code == 200, timeout=15, what="/ready again")
            assert c.get("/ready").json()["ready"] is True, c.get("/ready").text
            assert c.post("/search", json=body).status_code == 200
    finally:
        collection.store.client = switch._client
