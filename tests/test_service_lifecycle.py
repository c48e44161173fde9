"""Start-up checks, graceful shutdown and clients that go away (the service's lifecycle)."""

import concurrent.futures
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from densehybrid.index.storage.vectors import VECTORS
from densehybrid.service.app import create_app
from densehybrid.service.startup import StartupError, load_components
from densehybrid.service.settings import ServiceSettings
from densehybrid.bench.servers.start import LiveServer, free_port, stop_process, wait_for_process_ready
from densehybrid.bench.servers.toy_index import build_toy_index

import support
from support.fake_encoder import FakeEncoder
from support.metrics import rejected, scrape
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    return build_toy_index(FakeEncoder("dhr"), tmp_path_factory.mktemp("lifecycle-index"), count=40)


def cli(*args, timeout=60):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "densehybrid", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.slow  # a `densehybrid serve` process
def test_serve_refuses_a_corrupted_index_with_a_clear_message(index_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in index_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    vectors = broken / VECTORS  # truncated: start-up checks sizes (a flipped bit is for `index verify`)
    vectors.write_bytes(vectors.read_bytes()[:-10])
    result = cli("serve", "--index", str(broken), "--port", "0")
    assert result.returncode == 2
    message = " ".join(result.stdout.split())
    assert "cannot load index" in message and VECTORS in message


@pytest.mark.slow  # a `densehybrid serve` process
def test_serve_without_model_or_index_says_what_to_give():
    result = cli("serve")
    assert result.returncode == 2 and "--index" in result.stdout and "--model" in result.stdout


def test_a_model_that_does_not_match_the_index_is_refused(index_dir, monkeypatch):
    from densehybrid.encoder import loading

    monkeypatch.setattr(loading, "load_encoder", lambda model, **kw: FakeEncoder("dhr", dlr_dim=640))
    with pytest.raises(StartupError, match="does not match index"):
        load_components(ServiceSettings(index=index_dir))
    retrained = FakeEncoder("dhr")
    retrained.spec = dataclasses.replace(retrained.spec, weights_hash="other-weights")  # same shapes
    monkeypatch.setattr(loading, "load_encoder", lambda model, **kw: retrained)
    with pytest.raises(StartupError, match="weights_hash"):
        load_components(ServiceSettings(index=index_dir, model="somewhere/else"))
    monkeypatch.setattr(loading, "load_encoder", lambda model, **kw: FakeEncoder("dhr"))
    loaded, index = load_components(ServiceSettings(index=index_dir))
    assert index.count == 40 and loaded.spec.weights_hash == index.spec.weights_hash


def test_index_alone_rebuilds_the_encoder_its_manifest_names(index_dir, monkeypatch):
    from densehybrid.encoder import loading

    calls = []
    monkeypatch.setattr(loading, "load_encoder", lambda config, **kw: calls.append(config) or FakeEncoder("dhr"))
    load_components(ServiceSettings(index=index_dir))
    load_components(ServiceSettings(index=index_dir, model="other-path-to-same-model"))
    assert [c.model for c in calls] == ["fake-dhr", "other-path-to-same-model"]
    assert (calls[0].kind, calls[0].dlr_dim, calls[0].max_query_length) == ("dhr", 768, 32)


def test_a_client_that_leaves_takes_its_job_out_of_the_queue(index_dir):
    # the busy forward lasts long enough for the server to notice the leaver on a loaded machine
    encoder = FakeEncoder("cls", delay_s=1.5)
    app = create_app(ServiceSettings(max_batch_size=1, warmup=False), encoder=encoder)
    with LiveServer(app) as live:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            busy = pool.submit(httpx.post, live.url + "/encode", json={"texts": ["keeps the worker busy"]},
                               timeout=30)
            wait_until(lambda: encoder.batch_sizes, what="the busy job is encoding")
            with pytest.raises(httpx.TimeoutException):
                httpx.post(live.url + "/encode", json={"texts": ["leaves early"]}, timeout=0.2)
            assert busy.result().status_code == 200
        # the worker takes jobs in order: once a later job is encoded, the abandoned one is not waiting
        assert httpx.post(live.url + "/encode", json={"texts": ["a later job"]}, timeout=30).status_code == 200
        assert encoder.batch_sizes == [1, 1]  # the busy job and the later one, not the abandoned one
        assert rejected(live.url) == {"client_disconnected": 1.0}
        assert app.state.runtime.batcher.depth == 0


SERVER_SCRIPT = textwrap.dedent("""
    import sys, uvicorn
    from support.fake_encoder import FakeEncoder
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings
    app = create_app(ServiceSettings(max_batch_size=1), encoder=FakeEncoder("cls", delay_s=0.5))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_config=None, timeout_graceful_shutdown=20)
""")


@pytest.mark.slow  # a server process
def test_sigterm_lets_in_flight_requests_finish():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": support.PYTHONPATH}
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_process_ready(url, proc, timeout_s=60)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(httpx.post, url + "/encode", json={"texts": [f"in flight {i}"]}, timeout=30)
                       for i in range(4)]
            wait_until(lambda: scrape(url, "densehybrid_queue_depth") >= 3, timeout=30,
                       what="all four inside: one encoding, three queued")
            proc.send_signal(signal.SIGTERM)
            statuses = [f.result().status_code for f in futures]
        assert statuses == [200, 200, 200, 200]
        # uvicorn shuts down gracefully, then re-raises the signal so the exit status tells it was SIGTERM
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        stop_process(proc)
