"""MS MARCO's size served from one GPU's memory: N float16 rows (8.8M by default) in the index format.

Nothing that large can travel to a lent GPU machine, so the rows are drawn there by torch, on the device
(the clustered shape of ``scale_vectors``), and written as a build writes them: ``vectors.faiss`` in a
stream (hashed while written), the ids, a passage table of ids alone, the manifest. Then, each timed:

- the first stage in process: the index opened as the service opens it and its rows copied to the device;
  batch-1 searches at k = 1,000 and at k = 11 (a search without a rerank: 10 and one past the cut),
  against the device's copy bandwidth, and the split of the top-k each capture chose;
- the service: ``densehybrid serve`` on the device with a query encoder of the BERT-base Aggretriever's
  shape (random weights: speed does not depend on them): seconds to ``/ready``, the device memory its
  process holds, ``/search`` at one client and at the highest concurrency (the multi-process client).

With ``--live-recall FILE[:N]`` (a BEIR queries file), then the live recall on the same index, served on the
device (``bench.scale.live_recall``): what sampling 1 % of N searches costs their ``/search`` p50 and p99
against a server that does not sample (with an A/A control of two that do not), and the recall a server
sampling every one of the first ``TRUTH_QUERIES`` reports against an offline exact scan of its answers
(1.0 for this exact first stage, where the check is that the sampling runs on the device and says so).

Rows that would not fit the device's free memory (with room for the encoder and the scores) are cut to
the largest count that fits, and the output says so.

    python -m densehybrid.bench.scale.gpu OUT_JSON [--rows N] [--shape bert-base|tiny] [--device cuda] [--work DIR]
        [--live-recall FILE[:N]]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from densehybrid.bench.load import client
from densehybrid.bench.scale import live_recall
from densehybrid.bench.scale.real import read_queries
from densehybrid.bench.scale.vectors import clustered_chunks_on
from densehybrid.bench.parts.search import device_copy_gbps
from densehybrid.bench.load.service import BATCHING, query_texts, server_process
from densehybrid.bench.timing import ratio, time_calls
from densehybrid.encoder.loading import load_encoder
from densehybrid.encoder.random_checkpoint import write_random_checkpoint
from densehybrid.index.building.first_stage import write_checked_vectors
from densehybrid.index.storage import durable, files
from densehybrid.index.storage.documents import Document, write_docs_at
from densehybrid.index.served.loading import load_index
from densehybrid.index.storage.vectors import VECTORS

MSMARCO_PASSAGES = 8_841_823
LIVE_RATE, TRUTH_QUERIES = 0.01, 200
KIND, SHAPE = "aggretriever", "bert-base"
RESERVED_BYTES = 6 << 30  # beside the rows: the server's encoder, its CUDA graphs, a batch's scores


def rows_that_fit(requested: int, dim: int, device: str) -> int:
    """``requested`` rows, or the most float16 rows of ``dim`` the device's free memory holds beside
    :data:`RESERVED_BYTES` (no limit off CUDA)."""
    if not device.startswith("cuda"):
        return requested
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return max(1, min(requested, (free - RESERVED_BYTES) // (dim * 2)))


def write_index(out: Path, spec, rows: int, device: str, seed: int = 0) -> dict:
    """Draw ``rows`` rows of ``spec.dim`` on ``device`` and publish them as an index at ``out``; seconds per step."""
    staged = out.with_name(out.name + ".partial")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    steps = {}
    started = time.perf_counter()
    digest = write_checked_vectors(staged, clustered_chunks_on(device, rows, spec.dim, seed), count=rows, dim=spec.dim)
    steps["vectors_s"] = time.perf_counter() - started
    started = time.perf_counter()
    files.write_doc_ids(staged, (f"D{i}" for i in range(rows)))
    write_docs_at(staged, ((i, Document(f"D{i}", "", "")) for i in range(rows)))
    steps["ids_and_passages_s"] = time.perf_counter() - started
    started = time.perf_counter()
    files.write_manifest(staged, name="gpu-scale", spec=spec, count=rows, lam=spec.lam, first_stage={"type": "flat_ip"},
                         extra={"lambda": {"method": "model"}}, digests={VECTORS: digest})
    durable.publish(staged, out, overwrite=True)
    steps["manifest_s"] = time.perf_counter() - started
    return {name: round(s, 2) for name, s in steps.items()} | {
        "vectors_bytes": (out / VECTORS).stat().st_size}


def first_stage(index_dir: Path, device: str, repeats: int) -> dict:
    """Batch-1 exact searches over the index's rows resident on ``device``, as the service holds them."""
    started = time.perf_counter()
    index = load_index(index_dir)
    store = index.vector_store(device, engine="torch")  # the torch scan on the CPU too (the twin)
    resident = store.resident
    loaded_s = time.perf_counter() - started
    xq = np.random.default_rng(3).standard_normal((1, resident.dim), dtype=np.float32)
    out = {"rows": resident.count, "dim": resident.dim, "dtype": str(resident.dtype).removeprefix("torch."),
           "chunks": sum(len(chunks) for chunks in resident.shards), "rows_to_device_s": round(loaded_s, 2)}
    on_gpu = device.startswith("cuda")
    nbytes = resident.count * resident.dim * (2 if on_gpu else 4)
    reference = device_copy_gbps(device, min(nbytes, 1 << 30))
    out["copy_gbps"] = round(reference, 1)
    for k in (1000, 11):
        timed = time_calls(lambda: resident.search(xq, k), repeats=repeats, warmup=3)
        scanned = nbytes / (timed.p50 / 1000.0) / 1e9
        out[f"k{k}"] = {"ms": timed.to_dict(), "scan_gbps": round(scanned, 1),
                        "fraction_of_copy_bandwidth": ratio(scanned, reference)}
    out["split_chosen"] = {k: choice for graphed in resident.graphed for k, choice in graphed.choices().items()}
    store = resident = index = None  # the rows leave the device before the server takes it
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return out


def _nvidia_smi(query: str) -> list[list[str]]:
    """nvidia-smi's CSV answer to ``query`` as rows of fields; [] where there is no nvidia-smi."""
    try:
        listed = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True,
                                text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[field.strip() for field in line.split(",")] for line in listed.splitlines() if line.strip()]


def process_device_mib(pid: int) -> float | None:
    """The device memory ``pid`` holds (its CUDA context included); None where nvidia-smi does not list it
    (none installed, or a container that shows the host's process ids)."""
    return next((float(used) for listed, used in _nvidia_smi("--query-compute-apps=pid,used_memory")
                 if listed == str(pid)), None)


def device_used_mib(device: str) -> float | None:
    """Memory in use on the device, every process's; None without nvidia-smi."""
    index = int(device.partition(":")[2] or 0)
    rows = _nvidia_smi("--query-gpu=memory.used")
    return float(rows[index][0]) if len(rows) > index else None


def serve(index_dir: Path, device: str, concurrency: tuple[int, ...], requests: int, client_processes: int) -> dict:
    """``densehybrid serve`` of the index on ``device``: ready time, device memory, /search per concurrency."""
    texts = query_texts(requests)
    bodies = [{"query": t, "k": 10} for t in texts]
    before = device_used_mib(device)
    started = time.perf_counter()
    with server_process(index_dir, "torch", device, BATCHING["on_nowait"], timeout_s=600) as (url, pid):
        out = {"ready_s": round(time.perf_counter() - started, 2), "device_memory_mib": process_device_mib(pid)}
        after = device_used_mib(device)
        # the device's use before and after the server started: its share where nvidia-smi lists no pids
        out["device_used_delta_mib"] = None if before is None or after is None else after - before
        with client.client_pool(client_processes) as pool:
            for c in concurrency:
                out[f"/search c{c}"] = client.drive_level(url, "/search", bodies, c, pool, client_processes)
    return out


def live_recall_on_device(index_dir: Path, device: str, texts: list[str]) -> dict:
    """Sampling's cost to ``/search`` at :data:`LIVE_RATE` over ``texts`` (and the A/A control), and the live
    recall's truth over the first :data:`TRUTH_QUERIES`, every server on ``device``."""
    flags = ("--device", device)
    return {"cost": live_recall.cost(index_dir, texts, LIVE_RATE, flags),
            "control": live_recall.cost(index_dir, texts, LIVE_RATE, flags, control=True),
            "truth": live_recall.truth(index_dir, {"queries": texts[:TRUTH_QUERIES]}, None, flags)}


def run(out_json: Path, rows: int, device: str, work: Path, *, shape: str = SHAPE,
        concurrency: tuple[int, ...] = (1, 64), requests: int = 1024, client_processes: int = 8,
        repeats: int = 50, live_queries: str | None = None) -> dict:
    model_dir = write_random_checkpoint(work / "model", shape)
    spec = load_encoder(str(model_dir), kind=KIND, device="cpu").spec
    served = rows_that_fit(rows, spec.dim, device)
    result: dict = {"device": device, "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda")
                    else "cpu", "requested_rows": rows, "rows": served, "dim": spec.dim,
                    "fits": served == rows, "kind": KIND, "encoder_shape": shape}
    index_dir = work / "index"
    result["write"] = write_index(index_dir, spec, served, device)
    result["first_stage"] = first_stage(index_dir, device, repeats)
    result["service"] = serve(index_dir, device, concurrency, requests, client_processes)
    if live_queries:
        result["live_recall"] = live_recall_on_device(index_dir, device, read_queries(f"queries={live_queries}")[1])
    out_json.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_json", type=Path)
    parser.add_argument("--rows", type=int, default=MSMARCO_PASSAGES)
    parser.add_argument("--shape", default=SHAPE, help="the query encoder's shape (random weights): bert-base or tiny")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--work", type=Path, help="where the model and index are written (default: a temporary folder)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--client-processes", type=int, default=8)
    parser.add_argument("--live-recall", metavar="FILE[:N]", help="then the live recall's cost and truth over these "
                        "queries (a BEIR queries.jsonl, its first N)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="densehybrid-gpu-scale-", dir=args.work) as work:
        result = run(args.out_json, args.rows, args.device, Path(work), shape=args.shape,
                     concurrency=tuple(args.concurrency),
                     requests=args.requests, client_processes=args.client_processes, live_queries=args.live_recall)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
