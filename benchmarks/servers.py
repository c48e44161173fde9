"""Servers under test for the benchmarks and the test suite: a live in-process server, a free
loopback port, stopping a child process, and a small toy index.

    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"))) as server:
        httpx.get(server.url + "/ready")

Nothing in the service imports this module: it is harness, not a production code path.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from densehybrid.encoder.base import Encoder

TOPICS = ["dense retrieval", "lexical matching", "gated inner product", "aggregation of term weights",
          "faiss flat index", "query latency", "passage ranking", "bm25 baseline", "neural reranking",
          "vector quantization"]


def free_port(*hosts: str) -> int:
    """A TCP port that is free on every one of ``hosts`` (default: 127.0.0.1) right now."""
    hosts = hosts or ("127.0.0.1",)
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {hosts}")


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout=timeout_s)


class ServerNotReady(RuntimeError):
    """A server process exited, or did not answer its readiness route in time."""


def wait_for_process_ready(url: str, proc: subprocess.Popen, path: str = "/ready", timeout_s: float = 120.0) -> None:
    """Poll ``url + path`` until it answers 200. If ``proc`` exits first (its piped stderr, if any, is in
    the message) or the time runs out, the process is stopped and :class:`ServerNotReady` raised."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
            raise ServerNotReady(f"the server exited with {proc.returncode} before {url}{path} answered" +
                                 (f":\n{err}" if err else ""))
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_process(proc)
    raise ServerNotReady(f"{url}{path} did not answer 200 within {timeout_s:g} s")


class LiveServer:
    """uvicorn in a thread; ``url`` is set once it listens (and, by default, once the app is ready)."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, wait_ready: bool = True,
                 timeout_s: float = 30.0):
        self.app = app
        self.wait_ready = wait_ready
        self.timeout_s = timeout_s
        config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
                                timeout_graceful_shutdown=10)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="densehybrid-live-server", daemon=True)
        self.url = ""

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the live server did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        runtime = self.app.state.runtime
        while self.wait_ready and not runtime.ready:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the live server did not become ready ({runtime.status})")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


def write_toy_corpus(path: Path, count: int = 80, seed: int = 0) -> Path:
    """A BEIR-style ``corpus.jsonl`` of ``count`` short passages built from a few topics."""
    import random

    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            words = rng.sample(" ".join(TOPICS).split(), 6) + [f"doc{i}"]
            f.write(json.dumps({"_id": f"D{i}", "title": f"passage {i}", "text": " ".join(words)}) + "\n")
    return path


def build_toy_index(encoder: Encoder, directory: Path, count: int = 80) -> Path:
    """A small real index (the project's builder) of :func:`write_toy_corpus`."""
    from densehybrid.index.build import BuildOptions, build_index

    directory.mkdir(parents=True, exist_ok=True)
    corpus = write_toy_corpus(directory / "corpus.jsonl", count)
    return build_index(encoder, corpus, directory / "index", BuildOptions(progress=False, batch_size=16))
