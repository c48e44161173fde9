"""The request pipeline: the encoder worker hands a query straight to the search stage, without the
event loop; store health is checked off the event loop; a failing hand-on fails only its own job."""

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
from starlette.requests import Request

from support.fake_encoder import FakeEncoder
from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.servers.toy_index import build_toy_index
from densehybrid.index.search.params import SearchParams
from densehybrid.index.served.loading import load_index
from densehybrid.service import startup
from densehybrid.service.app import create_app
from densehybrid.service.batcher import Batcher
from densehybrid.service.settings import ServiceSettings


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    return build_toy_index(FakeEncoder("dhr"), tmp_path_factory.mktemp("pipeline-index"), count=20)


def connected_request() -> Request:
    """A request whose client stays connected (receive() never reports a disconnect)."""
    async def receive():
        await asyncio.Event().wait()

    return Request({"type": "http", "method": "POST", "path": "/search", "headers": []}, receive)


class SpiedSearcher:
    """The served index, recording on which thread each search was queued and ran."""

    def __init__(self, index):
        self.index = index
        self.searched = threading.Event()
        self.ran_on: list[str] = []

    @property
    def name(self):
        return self.index.name

    def search(self, queries, params):
        self.ran_on.append(threading.current_thread().name)
        found = self.index.search(queries, params)
        self.searched.set()
        return found


def test_the_search_stage_starts_while_the_event_loop_is_blocked(index_dir):
    """Between encode and search nothing runs on the event loop: with the loop held after the query is
    queued, the search still happens, queued from the encoder thread."""
    rt = startup.build_runtime(ServiceSettings(warmup=False), FakeEncoder("dhr"), load_index(index_dir))
    spy = SpiedSearcher(rt.index)
    rt.search_batcher.searcher = spy
    submitted_from: list[str] = []
    submit = rt.search_batcher.submit

    def recording_submit(*args, **kwargs):
        submitted_from.append(threading.current_thread().name)
        return submit(*args, **kwargs)

    rt.search_batcher.submit = recording_submit
    params = SearchParams(k=3, first_stage="ip", candidates=10, theta=0.1, rerank=True)

    async def scenario():
        search = asyncio.ensure_future(rt.pipeline.search(connected_request(), ["lexical query"], params,
                                                          lambda queries, found: found.ids))
        await asyncio.sleep(0)  # one step of the request: tokenized and queued, now waiting
        assert not search.done()
        searched_with_loop_held = spy.searched.wait(timeout=30)  # blocks the event loop's thread
        return searched_with_loop_held, await search

    startup.start(rt)
    try:
        searched_with_loop_held, (ids, timing) = asyncio.run(scenario())
    finally:
        startup.stop(rt)
    assert searched_with_loop_held
    assert submitted_from == ["densehybrid-encoder"]
    assert len(spy.ran_on) == 1 and spy.ran_on[0].startswith("densehybrid-search")
    assert len(ids) == 1 and len(ids[0]) == 3
    assert list(timing) == ["queue_ms", "encode_ms", "search_ms", "rerank_ms", "total_ms"]


def test_hits_with_text_and_explanations_are_shaped_on_the_search_thread(index_dir):
    index = load_index(index_dir)
    app = create_app(ServiceSettings(warmup=False), encoder=FakeEncoder("dhr"), index=index)
    rt = app.state.runtime
    shaped_on: list[str] = []
    get_many = rt.index.get_many

    def recording_get_many(ids):
        shaped_on.append(threading.current_thread().name)
        return get_many(ids)

    rt.index.get_many = recording_get_many
    with LiveServer(app) as live:
        answer = httpx.post(live.url + "/search", json={"query": "lexical query", "k": 2, "return_text": True,
                                                       "explain": True}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert [hit["text"] is not None and "explanation" in hit for hit in answer.json()["results"]] == [True, True]
    assert len(shaped_on) == 1 and shaped_on[0].startswith("densehybrid-search")


def test_a_blocked_store_check_delays_neither_health_nor_search(index_dir):
    index = load_index(index_dir)
    checking, release = threading.Event(), threading.Event()
    answers = iter([])

    def healthy():
        checking.set()
        release.wait(30)
        return next(answers, True)

    index.healthy = healthy
    app = create_app(ServiceSettings(warmup=False, store_check_s=0.01), encoder=FakeEncoder("dhr"), index=index)
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        assert checking.wait(30)  # the check is under way and stays blocked until released
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200
        assert client.post("/search", json={"query": "lexical query", "k": 2}).status_code == 200
        assert not release.is_set()
        answers = iter([False] * 10_000)  # the store is lost from the next check on
        release.set()
        assert wait_until(lambda: client.get("/ready").status_code == 503)
        refused = client.post("/search", json={"query": "lexical query", "k": 2})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "store_unavailable"
        assert client.get("/ready").json()["status"] == "vector store unreachable"
        answers = iter([])  # back
        assert wait_until(lambda: client.get("/ready").status_code == 200)


def wait_until(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
    return False


def test_a_failing_hand_on_fails_its_own_job_only():
    encoder = FakeEncoder("cls")
    batcher = Batcher(encoder, max_batch_size=8, max_wait_s=0.0)

    def broken(outcome, future):
        raise RuntimeError("next stage refused")

    def forward(outcome, future):
        future.set_result(("handed on", outcome.encoded.values))

    kept = batcher.submit(encoder.tokenize(["kept"], "query"), "query", then=forward)
    failed = batcher.submit(encoder.tokenize(["failed"], "query"), "query", then=broken)
    plain = batcher.submit(encoder.tokenize(["plain"], "query"), "query")
    batcher.start()  # all three were queued first: one batch
    try:
        label, values = kept.result(timeout=30)
        with pytest.raises(RuntimeError, match="next stage refused"):
            failed.result(timeout=30)
        alone = plain.result(timeout=30)
    finally:
        batcher.stop()
    assert label == "handed on" and alone.batch_texts == 3
    np.testing.assert_array_equal(values, FakeEncoder("cls").encode(["kept"], "query").values)
