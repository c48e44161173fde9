"""Faults around a live server: clients that go away, and indexes that must not be served.

Already covered elsewhere, not repeated here: a failing forward fails only its batch
(tests/test_batcher.py, tests/test_service_api.py::test_failed_forward_is_500_for_its_batch_only),
SIGTERM drains in-flight requests (tests/test_service_lifecycle.py, and as PID 1 in a container:
tests/test_deploy_sigterm.py), one disconnecting client and one flipped byte refused by ``serve``
(tests/test_service_lifecycle.py), every loader check in-process (tests/test_index_store.py).
Added here: many clients leaving free their queue places at once (not when the worker reaches them),
on /search too; other damage through the real ``serve`` command; a real model's kind or weights
not matching the index, end to end.
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder
from support.metrics import rejected, scrape
from support.waiting import wait_until

pytestmark = pytest.mark.slow  # server processes started on broken indexes, clients that leave

REPO = Path(__file__).resolve().parents[1]


# -- clients that disconnect -----------------------------------------------------------
@pytest.mark.parametrize("route,body", [("/encode", {"texts": ["gone before encoding"]}),
                                        ("/search", {"query": "gone before encoding"})])
def test_disconnected_clients_leave_nothing_queued_and_nothing_encoded(route, body, toy_index):
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.index.served.loading import load_index

    encoder = FakeEncoder("dhr", delay_s=2.5)
    index = load_index(toy_index("dhr", count=20))
    settings = ServiceSettings(max_batch_size=1, queue_size=8, warmup=False)
    with LiveServer(create_app(settings, encoder=encoder, index=index)) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        batcher = live.app.state.runtime.batcher
        busy = threading.Thread(target=lambda: c.post("/encode", json={"texts": ["keeps the worker busy"]}))
        busy.start()
        wait_until(lambda: len(encoder.batch_sizes) == 1, what="the busy job is encoding")

        def impatient(_):
            with httpx.Client(base_url=live.url, timeout=0.25) as quick, pytest.raises(httpx.TimeoutException):
                quick.post(route, json=body)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(impatient, range(6)))
        # while the worker is still busy, the queue is already empty again: the jobs left with their clients
        wait_until(lambda: batcher.depth == 0, timeout=0.5, what="the queue emptied while the worker is busy")
        assert busy.is_alive() and len(encoder.batch_sizes) == 1  # the worker was busy all along
        busy.join(timeout=10)
        # the worker takes jobs in order: once a later job is encoded, none of the six is still waiting
        assert c.post("/encode", json={"texts": ["a later job"]}).status_code == 200
        assert len(encoder.batch_sizes) == 2  # the busy job and the later one: none of the six was encoded
        assert rejected(c)["client_disconnected"] == 6
        assert scrape(c, "densehybrid_queue_depth") == 0
        # all eight queue places are free: a full-queue burst is accepted, not refused
        encoder.delay_s = 0.05
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda i: c.post("/encode", json={"texts": [f"after {i}"]}).status_code,
                                     range(8)))
        assert statuses.count(200) >= 8 - 1, statuses  # at most one could still be refused by timing


# -- indexes that must not be served ---------------------------------------------------------
@pytest.fixture(scope="module")
def served_index(tmp_path_factory, tiny_bert_dir):
    """A small index of a real (tiny, random) model, built through the CLI like a user would."""
    from densehybrid.encoder.loading import load_encoder
    from densehybrid.index.building.build import BuildOptions, build_index
    from densehybrid.bench.servers.toy_index import write_toy_corpus

    root = tmp_path_factory.mktemp("served")
    encoder = load_encoder(str(tiny_bert_dir), kind="dhr", device="cpu")
    return build_index(encoder, write_toy_corpus(root / "corpus.jsonl", 24), root / "index",
                       BuildOptions(progress=False, batch_size=8))


def serve(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "densehybrid", "serve", "--port", "0", "--log-plain", *args],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"},
                          capture_output=True, text=True, timeout=timeout_s)


def corrupt_copy(index: Path, target: Path, damage) -> Path:
    shutil.copytree(index, target)
    damage(target)
    return target


def _recount(d: Path) -> None:
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["count"] += 1
    (d / "manifest.json").write_text(json.dumps(manifest))


DAMAGES = {
    "truncated vectors": (lambda d: (d / "vectors.faiss").write_bytes((d / "vectors.faiss").read_bytes()[:999]),
                          ["vectors.faiss", "truncated"]),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), ["manifest.json", "missing"]),
    "count that lies": (_recount, ["vectors.faiss"]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_server_refuses_a_corrupted_index_with_a_clear_message(served_index, tmp_path, damage):
    harm, words = DAMAGES[damage]
    broken = corrupt_copy(served_index, tmp_path / "broken", harm)
    done = serve("--index", str(broken))
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-2000:]
    assert "error:" in output and "cannot load index" in output and "Traceback" not in output, output[-2000:]
    for word in words:
        assert word in output, (word, output[-2000:])


@pytest.mark.parametrize("flags,words", [
    (["--kind", "cls"], ["does not match", "kind"]),
    (["--model", "OTHER"], ["does not match", "weights_hash"]),
])
def test_server_refuses_a_model_that_does_not_match_the_index(served_index, tmp_path, flags, words):
    from densehybrid.encoder.random_checkpoint import write_random_checkpoint

    if "OTHER" in flags:  # same architecture, other weights: vectors that would silently mean nothing
        flags = ["--model", str(write_random_checkpoint(tmp_path / "other", arch="bert", seed=99))]
    done = serve("--index", str(served_index), *flags)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-2000:]
    assert "Traceback" not in output and all(w in output for w in words), output[-2000:]


def test_the_intact_index_loads(served_index):
    """The control for the refusals above: the same index, untouched, is served."""
    from densehybrid.service.startup import load_components

    encoder, index = load_components(ServiceSettings(index=served_index, device="cpu"))
    assert index.count == 24 and encoder.spec.weights_hash == index.spec.weights_hash
