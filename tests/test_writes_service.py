"""POST/GET/DELETE /documents on a live loopback server: read your writes, errors, keys, metrics."""

import errno
import os
import shutil

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.servers.toy_index import build_toy_index
from densehybrid.index.writes import wal
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder
from support.metrics import scrape
from support.waiting import wait_until

NEW = {"id": "new-1", "title": "zebra", "text": "quokka platypus wombat numbat"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_toy_index(FakeEncoder("dhr"), tmp_path_factory.mktemp("writes-index"), count=40)


@pytest.fixture
def index_dir(built, tmp_path):
    copy = tmp_path / "index"
    shutil.copytree(built, copy)
    return copy


def serve(index_dir, **settings):
    settings = ServiceSettings(index=index_dir, max_wait_ms=1, **settings)
    return LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index_dir)))


def search_ids(client, query, k=5, headers=None):
    response = client.post("/search", json={"query": query, "k": k}, headers=headers)
    assert response.status_code == 200, response.text
    return [hit["id"] for hit in response.json()["results"]]


def assert_error(response, status, error_type):
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == error_type


def test_read_your_writes_replace_and_delete(index_dir):
    with serve(index_dir, compact_after_changes=3) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        before = client.get("/info").json()["index"]["documents"]
        response = client.post("/documents", json={"documents": [NEW]})
        assert response.status_code == 200, response.text
        assert response.json()["documents"] == before + 1
        assert search_ids(client, NEW["text"])[0] == "new-1"
        top = client.post("/search", json={"query": NEW["text"], "k": 1}).json()["results"][0]
        explained = client.post("/explain", json={"query": NEW["text"], "id": "new-1"})
        assert explained.status_code == 200, explained.text
        assert abs(explained.json()["total"] - top["score"]) < 1e-3 * max(1.0, abs(top["score"]))
        assert client.get("/documents/new-1").json()["text"] == NEW["text"]

        replaced = {"id": "D3", "title": "", "text": "aardvark pangolin okapi"}
        assert client.post("/documents", json={"documents": [replaced]}).status_code == 200
        assert search_ids(client, "aardvark pangolin okapi")[0] == "D3"
        assert client.get("/documents/D3").json()["text"] == replaced["text"]

        assert client.delete("/documents/new-1").status_code == 200
        assert "new-1" not in search_ids(client, NEW["text"], k=40)
        assert_error(client.get("/documents/new-1"), 404, "not_found")
        assert_error(client.delete("/documents/new-1"), 404, "not_found")
        assert client.get("/info").json()["index"]["documents"] == before

        # the third change started a background compaction; it folds the log into a new generation
        runtime = live.app.state.runtime
        runtime.compactor.stop()
        assert load_index(index_dir).manifest["writes"]["applied_seq"] == 3
        assert scrape(client, "densehybrid_last_compaction_timestamp_seconds") > 0
        assert scrape(client, "densehybrid_pending_changes") == 0
        assert search_ids(client, "aardvark pangolin okapi")[0] == "D3"


def test_bad_writes_are_refused_with_the_limit(index_dir):
    with serve(index_dir, max_write_documents=2, max_document_chars=50) as live, \
            httpx.Client(base_url=live.url, timeout=30) as client:
        many = [{**NEW, "id": f"x{i}"} for i in range(3)]
        response = client.post("/documents", json={"documents": many})
        assert_error(response, 413, "payload_too_large")
        assert "2" in response.json()["error"]["message"]
        response = client.post("/documents", json={"documents": [{**NEW, "text": "w " * 40}]})
        assert_error(response, 413, "payload_too_large")
        assert "50" in response.json()["error"]["message"]
        assert_error(client.post("/documents", json={"documents": [{"id": "e", "text": "  "}]}), 422, "invalid_request")
        assert_error(client.post("/documents", json={"documents": []}), 422, "invalid_request")
        assert scrape(client, "densehybrid_pending_changes") == 0
        assert client.get("/health").status_code == 200


def test_full_disk_is_507_and_nothing_is_applied(index_dir, monkeypatch):
    with serve(index_dir) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        assert client.post("/documents", json={"documents": [NEW]}).status_code == 200
        log_bytes = scrape(client, "densehybrid_write_log_bytes")
        assert log_bytes > 0
        real_fsync = os.fsync

        def full(fd):
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_fsync(fd)

        monkeypatch.setattr(os, "fsync", full)
        other = {**NEW, "id": "new-2"}
        assert_error(client.post("/documents", json={"documents": [other]}), 507, "insufficient_storage")
        assert_error(client.delete("/documents/D1"), 507, "insufficient_storage")
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert_error(client.get("/documents/new-2"), 404, "not_found")
        assert client.get("/documents/D1").status_code == 200
        assert scrape(client, "densehybrid_write_log_bytes") == log_bytes
        assert client.post("/documents", json={"documents": [other]}).status_code == 200
    assert [c.seq for c in wal.iter_changes(index_dir.with_name("index.wal"))] == [1, 2]


def test_writes_need_a_key_whenever_one_is_set(index_dir):
    with serve(index_dir, api_key="read-key") as live, httpx.Client(base_url=live.url, timeout=30) as client:
        read = {"Authorization": "Bearer read-key"}
        assert_error(client.post("/documents", json={"documents": [NEW]}), 401, "unauthorized")
        assert client.post("/documents", json={"documents": [NEW]}, headers=read).status_code == 200
    with serve(index_dir, write_api_key="write-key") as live, httpx.Client(base_url=live.url, timeout=30) as client:
        assert search_ids(client, "anything")  # searches stay public
        assert client.get("/documents/new-1").status_code == 200
        assert_error(client.delete("/documents/new-1"), 401, "unauthorized")
        wrong = {"Authorization": "Bearer read-key"}
        assert_error(client.delete("/documents/new-1", headers=wrong), 401, "unauthorized")
        assert client.delete("/documents/new-1", headers={"Authorization": "Bearer write-key"}).status_code == 200


def test_writes_off_serves_read_only(index_dir):
    with serve(index_dir, writes=False) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        assert_error(client.post("/documents", json={"documents": [NEW]}), 403, "writes_disabled")
        assert_error(client.delete("/documents/D1"), 403, "writes_disabled")
        assert search_ids(client, "anything")
    assert not index_dir.with_name("index.wal").exists()


def test_a_log_that_cannot_be_opened_stops_the_start_with_advice(index_dir, tmp_path):
    from densehybrid.service.startup import StartupError

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings = ServiceSettings(index=index_dir, write_log=blocker / "wal")
    with pytest.raises(StartupError, match="--no-writes"):
        create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index_dir))


def test_compose_keeps_indexes_read_only_unless_the_operator_turns_writes_on():
    from pathlib import Path

    import yaml

    compose = yaml.safe_load((Path(__file__).parents[1] / "docker-compose.yml").read_text())
    service = compose["services"]["densehybrid"]
    assert service["environment"]["DENSEHYBRID_WRITES"] == "${DENSEHYBRID_WRITES:-false}"
    assert "indexes:/data/indexes:ro" in service["volumes"]
    assert ServiceSettings(writes="false").write_log_dir is None  # how the service reads that default


def test_writes_yield_to_running_searches(index_dir):
    """With searches running, a write waits its turn (turn_ms) so that writes keep the server busy at most
    write_share of the time; the searches meanwhile are all answered."""
    import threading

    with serve(index_dir, write_share=0.01) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        stop, statuses = threading.Event(), []

        def searching() -> None:
            with httpx.Client(base_url=live.url, timeout=30) as reader:
                while not stop.is_set():
                    statuses.append(reader.post("/search", json={"query": "quokka wombat", "k": 3}).status_code)

        def a_search_answered_since(count: int) -> None:
            # pacing applies only while searches run: one must have finished since the last write
            wait_until(lambda: len(statuses) > count, timeout=30, interval=0.001, what="a search answered")

        reader = threading.Thread(target=searching)
        reader.start()
        try:
            turns = []
            for i in range(4):
                a_search_answered_since(len(statuses))
                response = client.post("/documents", json={"documents": [{**NEW, "id": f"paced-{i}"}]})
                assert response.status_code == 200, response.text
                turns.append(response.json()["timing"]["turn_ms"])
        finally:
            stop.set()
            reader.join()
        # after the first write, each is held back ~99x the time the previous one kept the server busy
        assert max(turns[1:]) > 1.0, turns
        assert statuses and set(statuses) == {200}
        assert scrape(client, "densehybrid_write_turn_wait_seconds_count") == 4
        assert scrape(client, "densehybrid_write_turn_wait_seconds_sum") * 1000 >= max(turns[1:]) * 0.9
