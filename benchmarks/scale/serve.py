"""The serving part of ``densehybrid bench --scale N``: a real query encoder over N imported rows, over HTTP.

The offline MiniLM (``--kind cls --pooling mean --normalize``, 384 dims) is served three ways, each
by a fresh ``densehybrid serve`` process with the default settings (start-up warm-up included): the
model alone, then over N seeded rows of the model's dim written in Pyserini's layout and imported
with the exact flat first stage, then imported with an HNSW graph. For each: seconds from process
start to ``/ready``, resident memory before the first query (anonymous and file-backed pages, from
``/proc``), the first ``/search``'s latency (a flat index's pages come in with it) and the ``/search``
p50 of the queries after it, batch 1, one client on the loopback.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from densehybrid.bench.scale import pyserini_layout, vectors
from densehybrid.bench.servers.start import serve_command, start_server, stop_process
from densehybrid.bench.timing import summarize
from densehybrid.encoder.config import EncoderConfig
from densehybrid.index.building.commands import load_model
from densehybrid.index.building.importing import ImportOptions, import_pyserini
from densehybrid.index.building.first_stage import AnnConfig
from densehybrid.index.engines.hnsw_engine import HNSWConfig

SERVE_MODEL = EncoderConfig(model="minilm", kind="cls", pooling="mean", normalize=True)
MODEL_FLAGS = ["--model", "minilm", "--kind", "cls", "--pooling", "mean", "--normalize"]
QUERIES = ("what is the capital of australia", "how long does it take to boil an egg",
           "symptoms of vitamin d deficiency", "what does a dense retriever do", "average salary of a nurse",
           "how to lower blood pressure naturally", "when was the eiffel tower built", "define photosynthesis",
           "best time to visit japan", "how many calories in a banana", "what causes tides in the ocean",
           "difference between a virus and bacteria", "how to convert celsius to fahrenheit",
           "who wrote pride and prejudice", "what is the speed of light", "how do vaccines work")


def memory_mb(pid: int) -> dict[str, float]:
    """Resident memory of a process in MiB: anonymous pages, file-backed pages and their sum (Linux)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    anon, file = (int(fields[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile"))
    return {"rss_mb": round(anon + file, 1), "anon_mb": round(anon, 1), "file_mb": round(file, 1)}


def _search_ms(client, text: str) -> float:
    started = time.perf_counter()
    client.post("/search", json={"query": text, "k": 10}).raise_for_status()
    return (time.perf_counter() - started) * 1000


def serve_once(flags: list[str], queries: int = 40, ready_timeout_s: float = 600.0) -> dict:
    """Start ``densehybrid serve FLAGS``; ready time, memory before the first query, /search latencies."""
    import httpx

    started = time.perf_counter()
    proc, url = start_server(serve_command(*flags), ready_timeout_s=ready_timeout_s, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        out = {"ready_s": round(time.perf_counter() - started, 2), "before_first_query": memory_mb(proc.pid)}
        if "--index" in flags:
            with httpx.Client(base_url=url, timeout=120) as client:
                out["first_search_ms"] = round(_search_ms(client, QUERIES[0]), 2)
                samples = [_search_ms(client, QUERIES[i % len(QUERIES)]) for i in range(1, queries + 1)]
            out["search"] = summarize(samples).to_dict()
            out["after_searches"] = memory_mb(proc.pid)
        return out
    finally:
        stop_process(proc)


def _import(source: Path, out: Path, spec, ann: AnnConfig | None) -> float:
    started = time.perf_counter()
    import_pyserini(source, out, spec, ImportOptions(ann=ann))
    return round(time.perf_counter() - started, 2)


def run_serving(rows: int, work: Path, ann: AnnConfig = HNSWConfig(), seed: int = 0, queries: int = 40) -> dict:
    """The model alone, then over ``rows`` imported rows: flat, then the approximate first stage ``ann`` (see the
    module docstring), under its type."""
    spec = load_model(SERVE_MODEL, "cpu").spec
    work = work / f"serve-n{rows}-d{spec.dim}"
    shutil.rmtree(work, ignore_errors=True)
    xb = vectors.passages(rows, spec.dim, seed)
    source = pyserini_layout.write_pyserini_dir(work / "pyserini", xb, [f"p{i}" for i in range(rows)])
    del xb
    result = {"model": SERVE_MODEL.model, "dim": spec.dim, "rows": rows, "model_only": serve_once(MODEL_FLAGS)}
    try:
        for name, first_stage in (("flat", None), (ann.to_dict()["type"], ann)):
            import_s = _import(source, work / name, spec, first_stage)
            result[name] = {"import_s": import_s, **serve_once(["--index", str(work / name)], queries)}
            shutil.rmtree(work / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result
