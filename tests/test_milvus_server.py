"""What only a real Milvus server shows: the server frozen, restarted or releasing the collection under a
serving replica, and an export cut short by the server going down.

The run's server (``milvus_server``) is stopped, killed and started again here; each test leaves it running.
"""

import json
import signal
import time

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.bench.servers.start import LiveServer
from densehybrid.cli.main import app
from densehybrid.index.errors import MilvusUnavailableError
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served import milvus, milvus_export
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder
from support.waiting import wait_until

pytestmark = pytest.mark.milvus_server

QUERIES = ["dense retrieval of passages", "gated product", "neural doc12", "lexical"]
BODY = {"query": QUERIES[0], "k": 5, "candidates": 40, "return_text": True}


@pytest.fixture(scope="module")
def served(milvus_server, toy_index):
    """The toy dhr index and its collection on the emptied server."""
    milvus_server.ensure_running()
    milvus_server.drop_all()
    index = load_index(toy_index("dhr"))
    milvus_export.export_index(index, milvus_server.uri, "served", batch_size=32)
    return index


@pytest.fixture
def server(milvus_server):
    """The server, running again after the test whatever the test did to it."""
    yield milvus_server
    if milvus_server.running:
        milvus_server.proc.send_signal(signal.SIGCONT)
    milvus_server.ensure_running()


def _search(c: httpx.Client) -> tuple[int, dict]:
    answer = c.post("/search", json=BODY)
    return answer.status_code, answer.json()


def _rows(uri: str, collection: str) -> int:
    client = milvus.connect(uri)
    return int(client.query(collection, filter="", output_fields=["count(*)"])[0]["count(*)"])


def test_a_stopped_server_makes_the_replica_unready_and_it_recovers_with_nothing_lost(served, server):
    collection = milvus.open_collection(server.uri, "served")
    settings = ServiceSettings(max_wait_ms=5, store_check_s=0.2)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=collection)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as c:
        status, before = _search(c)
        assert status == 200, before
        local = Searcher(served).search(FakeEncoder("dhr").encode([QUERIES[0]], "query"), SearchParams(k=5, candidates=40))
        assert [h["id"] for h in before["results"]] == local.ids[0]
        server.stop()  # SIGTERM, as an orchestrator stops it
        wait_until(lambda: c.get("/ready").status_code == 503, timeout=10, what="/ready 503 with the server down")
        assert c.get("/ready").json() == {"ready": False, "status": "vector store unreachable"}
        began = time.monotonic()
        lost = c.post("/search", json=BODY)
        assert lost.status_code == 503 and lost.headers["Retry-After"] == "1", lost.text
        assert lost.json()["error"]["type"] == "store_unavailable" and time.monotonic() - began < 5
        server.start()
        # ready again without a restart of the replica, and only once searches succeed: the restarted server
        # answers before it has loaded the collection again, and fails searches until it has
        wait_until(lambda: c.get("/ready").status_code == 200, timeout=120, interval=0.05, what="/ready again")
        for _ in range(5):
            status, after = _search(c)
            assert status == 200, after
            assert after["results"] == before["results"]
    assert _rows(server.uri, "served") == served.count


def test_a_frozen_server_fails_a_search_within_the_call_timeout(served, server):
    """A server that stops answering (frozen, or its packets dropped) without closing the connection: each call
    is bounded by ``milvus_timeout_s``, so the request gets its 503 and the search thread is not held."""
    collection = milvus.open_collection(server.uri, "served", timeout_s=2)
    settings = ServiceSettings(max_wait_ms=5, store_check_s=30, milvus_timeout_s=2)  # no check in between
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=collection)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as c:
        assert _search(c)[0] == 200
        server.proc.send_signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            status, lost = _search(c)
            took = time.monotonic() - began
            assert status == 503 and lost["error"]["type"] == "store_unavailable", lost
            assert "timeout" in lost["error"]["message"].lower() or "deadline" in lost["error"]["message"].lower(), lost
            assert took < settings.request_timeout_s / 3, took
            assert c.get("/ready").status_code == 503
        finally:
            server.proc.send_signal(signal.SIGCONT)
    # thawed, it catches up (its reads wait for its clock), and the same collection answers as before
    wait_until(collection.healthy, timeout=60, interval=0.1, what="the thawed server answers")
    queries = FakeEncoder("dhr").encode(QUERIES, "query")
    assert Searcher(collection).search(queries, SearchParams(k=5)).ids == Searcher(served).search(queries, SearchParams(k=5)).ids


def test_a_released_collection_is_loaded_again_by_the_replica(served, server):
    collection = milvus.open_collection(server.uri, "served")
    settings = ServiceSettings(max_wait_ms=5, store_check_s=0.2)
    operator = milvus.connect(server.uri)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=collection)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as c:
        status, before = _search(c)
        assert status == 200
        operator.release_collection("served")
        wait_until(lambda: _search(c)[0] == 200 and c.get("/ready").status_code == 200, timeout=60, interval=0.1,
                   what="searches again after the release")
        assert _search(c)[1]["results"] == before["results"]
    assert operator.get_load_state("served")["state"].name == "Loaded"


class _DiesBeforeProgress:
    """A client whose server is killed (SIGKILL) just before the ``nth`` progress record of the export: that
    batch's rows are in, the record that says so is not."""

    def __init__(self, client, server, nth: int):
        self._client, self.server, self.nth = client, server, nth

    def __getattr__(self, name):
        return getattr(self._client, name)

    def upsert(self, collection, data, **kwargs):
        if collection.endswith(milvus_export.META_SUFFIX) and json.loads(data[0]["json"])["exported"]:
            self.nth -= 1
            if self.nth == 0:
                self.server.kill()
        return self._client.upsert(collection, data, **kwargs)


def test_an_export_cut_short_by_the_server_going_down_resumes_once_it_is_back(served, server, toy_index):
    index_dir = toy_index("dhr")
    client = milvus.connect(server.uri)
    with pytest.raises(MilvusUnavailableError, match=f"Milvus at {server.uri}: upsert failed"):
        milvus_export.export_index(served, server.uri, "resumed", batch_size=16,
                                   client=_DiesBeforeProgress(client, server, nth=3))
    runner = CliRunner()
    down = runner.invoke(app, ["index", "export", "--index", str(index_dir), "--milvus-uri", server.uri,
                               "--collection", "resumed", "--batch-size", "16", "--no-progress"])
    assert down.exit_code != 0 and f"cannot reach Milvus at {server.uri}" in " ".join(down.output.split())
    server.start()
    resumed = runner.invoke(app, ["index", "export", "--index", str(index_dir), "--milvus-uri", server.uri,
                                  "--collection", "resumed", "--batch-size", "16", "--no-progress"])
    assert resumed.exit_code == 0, resumed.output
    # two batches recorded; the third's rows were in but not recorded: written again, not twice
    assert "80 rows (resumed at row 32)" in " ".join(resumed.output.split())
    assert _rows(server.uri, "resumed") == served.count
    collection = milvus.open_collection(server.uri, "resumed")
    assert collection.store.ids_of(range(served.count)) == served.doc_ids
    queries = FakeEncoder("dhr").encode(QUERIES, "query")
    got, want = (Searcher(i).search(queries, SearchParams(k=10, candidates=80)) for i in (collection, served))
    assert got.ids == want.ids
    np.testing.assert_allclose(np.array(got.scores), np.array(want.scores), rtol=1e-5, atol=1e-5)
