"""Where request work runs: small inputs are tokenized on the event loop, big ones on a thread;
``serve`` freezes the loaded heap before it listens."""

import asyncio
import concurrent.futures
import gc

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.served.loading import load_index
from densehybrid.service import serve as serve_module
from densehybrid.service.app import create_app
from densehybrid.service.pipeline import INLINE_TOKENIZE_CHARS
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder


class WhereTokenized(FakeEncoder):
    """Records, per tokenize call, whether it ran on the event loop's thread."""

    def __init__(self, kind: str, **options):
        super().__init__(kind, **options)
        self.on_event_loop: list[bool] = []

    def tokenize(self, texts, role, **options):
        try:
            asyncio.get_running_loop()
            self.on_event_loop.append(True)
        except RuntimeError:
            self.on_event_loop.append(False)
        return super().tokenize(texts, role, **options)


@pytest.fixture(scope="module")
def index_dir(toy_index):
    return toy_index("dhr", count=20)


def test_small_inputs_are_tokenized_on_the_event_loop_and_big_ones_on_a_thread(index_dir):
    encoder = WhereTokenized("dhr")
    big = ["lexical " * 400] * 3  # 9,600 characters in all
    assert sum(map(len, big)) > INLINE_TOKENIZE_CHARS
    with LiveServer(create_app(ServiceSettings(warmup=False), encoder=encoder, index=load_index(index_dir))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as client:
        for body, path in [({"texts": ["a short query"]}, "/encode"), ({"query": "a short query"}, "/search"),
                           ({"texts": big, "role": "passage"}, "/encode"), ({"queries": big}, "/search")]:
            before = len(encoder.on_event_loop)
            assert client.post(path, json=body).status_code == 200
            assert len(encoder.on_event_loop) == before + 1
    assert encoder.on_event_loop == [True, True, False, False]


def test_a_full_queue_is_refused_before_any_tokenizing():
    encoder = WhereTokenized("cls", delay_s=0.3)
    settings = ServiceSettings(queue_size=2, max_batch_size=1, warmup=False)
    with LiveServer(create_app(settings, encoder=encoder)) as live:
        def one(i):
            with httpx.Client(base_url=live.url, timeout=30) as client:
                return client.post("/encode", json={"texts": [f"text {i}"]}).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(one, range(8)))
    assert 429 in statuses and set(statuses) <= {200, 429}
    # room is checked, the text tokenized and the job queued without yielding in between: every
    # tokenized request was queued and answered, every refused one cost no tokenizing
    assert len(encoder.on_event_loop) == statuses.count(200)


def test_serve_freezes_the_loaded_heap_before_it_listens(monkeypatch):
    frozen_when_listening = []

    class NotListening:
        def __init__(self, config):
            pass

        def run(self):
            frozen_when_listening.append(gc.get_freeze_count())

    monkeypatch.setattr(serve_module, "load_components", lambda settings: (FakeEncoder("cls"), None))
    monkeypatch.setattr(serve_module.uvicorn, "Server", NotListening)
    try:
        serve_module.serve(ServiceSettings(warmup=False, log_json=False))
    finally:
        gc.unfreeze()
    assert frozen_when_listening and frozen_when_listening[0] > 0

