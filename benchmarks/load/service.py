"""Service: /search and /encode against a live loopback server vs the same work in process.

The server runs in its own process (``densehybrid serve``) so that the client's
Python does not share its GIL; ``--quick`` runs it in a thread instead. Each
concurrency level sends the same ``service_requests`` requests through that many
concurrent connections; throughput is requests / wall time. Dynamic batching "on"
is the default batcher (32 texts, 2 ms wait), "off" is one text per forward.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from densehybrid.encoder.random_checkpoint import write_random_checkpoint
from densehybrid.bench.load import client
from densehybrid.bench.servers.start import free_port, stop_process
from densehybrid.bench.timing import ratio, time_calls
from densehybrid.encoder.base import Encoded
from densehybrid.encoder.loading import load_encoder
from densehybrid.index.search.params import SearchParams

log = logging.getLogger(__name__)

WORDS = ("dense sparse hybrid retrieval passage query vector index lexical semantic gate model search rank "
         "token weight score neural network language corpus document answer question fast exact").split()
# "on" is the server's default; "on_nowait" batches whatever queued while the previous forward ran
# (continuous batching: no wait at low load); "off" is one text per forward.
BATCHING = {"on": {"max_batch_size": 32, "max_wait_ms": 2.0}, "on_nowait": {"max_batch_size": 32, "max_wait_ms": 0.0},
            "off": {"max_batch_size": 1, "max_wait_ms": 0.0}}
# the stages an in-process call also runs; everything else in a request's latency is service overhead
# (HTTP, JSON, validation, the hop to the encoder worker and its queue wait)


def query_texts(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(5, 10)))) for _ in range(count)]


def build_index(root: Path, encoder, docs: int) -> Path:
    """An index of seeded random rows in the encoder's layout (search cost depends on sizes only)."""
    from densehybrid.index.building.build import build_from_arrays
    from densehybrid.index.storage.documents import Document

    spec = encoder.spec
    rng = np.random.default_rng(5)
    values = rng.random((docs, spec.dim), dtype=np.float32)
    gates = rng.integers(0, 40, (docs, spec.gated_dim), dtype=np.uint8) if spec.gated_dim else None
    documents = [Document(f"D{i}", "", f"passage {i}") for i in range(docs)]
    return build_from_arrays(root / "index", spec, Encoded(values, gates), documents)


def in_process(encoder, index_dir: Path, texts: list[str], repeats: int, device: str | None = None) -> dict:
    """Encode, and encode + search, called directly: the search on the device the server picks for it."""
    from densehybrid.index.served.loading import load_index
    from densehybrid.index.search.search_device import resolve_search_device
    from densehybrid.index.search.searcher import Searcher

    index = load_index(index_dir)
    searcher = Searcher(index, device=resolve_search_device(device, index))
    cycle = iter(range(1 << 30))

    def encode():
        return encoder.encode([texts[next(cycle) % len(texts)]], "query")

    def search():
        return searcher.search(encode(), SearchParams(k=10))
    return {"encode_ms": time_calls(encode, repeats=repeats, warmup=3).to_dict(),
            "search_ms": time_calls(search, repeats=repeats, warmup=3).to_dict()}


@contextlib.contextmanager
def server_process(index_dir: Path, backend: str, device: str | None, batching: dict, threads: int | None = None,
                   timeout_s: float = 300.0):
    port = free_port()
    cmd = [sys.executable, "-m", "densehybrid", "serve", "--index", str(index_dir), "--port", str(port),
           "--backend", backend, "--max-batch-size", str(batching["max_batch_size"]),
           "--max-wait-ms", str(batching["max_wait_ms"]), "--log-level", "WARNING", "--max-request-texts", "64"]
    if device:
        cmd += ["--device", device]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with _process(cmd, f"http://127.0.0.1:{port}", env, timeout_s) as server:
        yield server


# the floor under any /search overhead on this machine: the same server stack (uvicorn + FastAPI,
# JSON in and out) with a handler that does nothing
NOOP_APP = """
import sys, uvicorn
from fastapi import FastAPI
app = FastAPI()
@app.get("/ready")
def ready():
    return {"ready": True}
@app.post("/search")
def search(body: dict):
    return {"results": [{"id": f"D{i}", "score": 1.0, "rank": i + 1} for i in range(10)],
            "timing": {"queue_ms": 0.0, "encode_ms": 0.0, "search_ms": 0.0, "rerank_ms": 0.0, "total_ms": 0.0}}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


@contextlib.contextmanager
def _process(cmd: list[str], url: str, env: dict, timeout_s: float):
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready in time")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        stop_process(proc)


def noop_floor(config, texts: list[str]) -> dict:
    """/search latency of a do-nothing FastAPI handler in its own process: the HTTP+JSON floor."""
    port = free_port()
    with _process([sys.executable, "-c", NOOP_APP, str(port)], f"http://127.0.0.1:{port}", dict(os.environ), 60) as (url, _):
        return client.drive(url, "/search", [{"query": t, "k": 10} for t in texts], 1)


@contextlib.contextmanager
def server_thread(index_dir: Path, backend: str, device: str | None, batching: dict, threads: int | None = None):
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    settings = ServiceSettings(index=index_dir, backend=backend, device=device, port=0, log_level="WARNING",
                               max_batch_size=batching["max_batch_size"], max_wait_ms=batching["max_wait_ms"])
    with LiveServer(create_app(settings)) as server:
        yield server.url, None


def load_levels(url: str, config, texts: list[str]) -> dict:
    routes = {"/search": [{"query": t, "k": 10} for t in texts],
              "/encode": [{"texts": [t], "role": "query"} for t in texts]}
    out: dict = {}
    with client.client_pool(config.client_processes) as pool:
        for route, bodies in routes.items():
            for c in config.concurrency:
                level = out.setdefault(route, {})[f"c{c}"] = client.drive_level(url, route, bodies, c, pool, config.client_processes)
                log.info("%s at %d clients: %s requests/s, p50 %s ms", route, c, level["rps"], level["p50_ms"])
    return out


PROFILE_DIR_VARIABLE = "DENSEHYBRID_BENCH_PROFILE_DIR"


def profiled_level(url: str, pid: int, config, texts: list[str], out_dir: Path) -> dict:
    """The highest-concurrency /search level once more, with py-spy sampling the server's threads (raw
    stacks, one line per stack and count, into ``out_dir``): where the server's time goes under load."""
    concurrency = config.concurrency[-1]
    if shutil.which("py-spy") is None:
        return {"py_spy": "not installed"}
    out_dir.mkdir(parents=True, exist_ok=True)
    stacks = out_dir / f"server-search-c{concurrency}.txt"
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration", "8", "--rate", "250", "--format", "raw",
                            "--nonblocking", "--threads", "--output", str(stacks)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # py-spy attaches
    bodies = [{"query": t, "k": 10} for t in texts] * 4  # long enough to fill most of the recording
    with client.client_pool(config.client_processes) as pool:
        level = client.drive_level(url, "/search", bodies, concurrency, pool, config.client_processes)
    _, errors = spy.communicate(timeout=60)
    return {**level, "stacks": stacks.name if stacks.exists() else None, "py_spy": errors[-500:]}


def run(config, device: str | None) -> dict:
    texts = query_texts(config.service_requests)
    with tempfile.TemporaryDirectory(prefix="densehybrid-bench-svc-") as tmp:
        model_dir = write_random_checkpoint(Path(tmp) / "model", config.encoder_shape)
        encoder = load_encoder(str(model_dir), kind=config.service_kind, device=device,
                               backend=config.service_backend, cache_root=Path(tmp) / "onnx")
        index_dir = build_index(Path(tmp), encoder, config.service_docs)
        log.info("service: a %d-document index built", config.service_docs)
        out = {"kind": config.service_kind, "backend": config.service_backend, "docs": config.service_docs,
               "requests_per_level": len(texts), "server": "thread" if config.service_in_thread else "process",
               "in_process": in_process(encoder, index_dir, texts, repeats=max(5, min(30, len(texts))), device=device)}
        del encoder
        if not config.service_in_thread:
            out["noop_floor_c1"] = noop_floor(config, texts)
        serve = server_thread if config.service_in_thread else server_process
        for mode in config.batching_modes:
            started = time.perf_counter()
            with serve(index_dir, config.service_backend, device, BATCHING[mode], config.threads) as (url, pid):
                log.info("service: server ready in %.1f s (batching %s)", time.perf_counter() - started, mode)
                out[f"batching_{mode}"] = load_levels(url, config, texts)
                if pid is not None and os.environ.get(PROFILE_DIR_VARIABLE):
                    out[f"profiled_{mode}"] = profiled_level(url, pid, config, texts, Path(os.environ[PROFILE_DIR_VARIABLE]))
    first, last = f"c{config.concurrency[0]}", f"c{config.concurrency[-1]}"
    search_c1 = {mode: out[f"batching_{mode}"]["/search"][first] for mode in config.batching_modes}
    # per request, same process, same moment: robust to other load on the machine, unlike the
    # difference of two p50s measured minutes apart
    out["search_overhead_p50_ms"] = {mode: level["overhead_p50_ms"] for mode, level in search_c1.items()}
    out["search_http_json_p50_ms"] = {  # client p50 minus the server's own total: HTTP, JSON, framework
        mode: round(level["p50_ms"] - level["server_total_p50_ms"], 3) for mode, level in search_c1.items()}
    out["search_in_process_delta_p50_ms"] = {  # the naive comparison, for reference
        mode: round(level["p50_ms"] - out["in_process"]["search_ms"]["p50"], 3) for mode, level in search_c1.items()}
    out["search_http_overhead_p50_ms"] = min(out["search_overhead_p50_ms"].values())
    out["encode_rps_ratio_max_vs_1"] = {mode: ratio(out[f"batching_{mode}"]["/encode"][last]["rps"],
                                                    out[f"batching_{mode}"]["/encode"][first]["rps"])
                                        for mode in config.batching_modes}
    if "off" in config.batching_modes:
        out["encode_rps_batching_over_off_at_max"] = {
            mode: ratio(out[f"batching_{mode}"]["/encode"][last]["rps"], out["batching_off"]["/encode"][last]["rps"])
            for mode in config.batching_modes if mode != "off"}
    out["search_rps_at_max_concurrency"] = max(out[f"batching_{mode}"]["/search"][last]["rps"]
                                               for mode in config.batching_modes)
    out["search_p50_ms_one_client"] = min(level["p50_ms"] for level in search_c1.values())
    return out
