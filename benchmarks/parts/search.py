"""First stage (Faiss FlatIP), exact GIP rerank and approximate-GIP first stage, on synthetic rows.

Speed of a brute-force scan depends on sizes, not on values, so rows are seeded
random numbers. The DHR-like rows for rerank and approximate GIP have the real
layout: float16 values ``[DLR (768) ; dense (128)]`` with ~150 non-zero DLR dims, and
uint8 gates in 0..39 (30522 / 768 rows of a DLR fold).
"""

from __future__ import annotations

import logging

import faiss
import numpy as np

from densehybrid.bench.parts.memory import available_bytes
from densehybrid.bench.timing import ratio, time_calls
from densehybrid.index.search import gip
from densehybrid.index.engines import faiss_engine

log = logging.getLogger(__name__)

DLR_DIM, DENSE_DIM, GATE_ROWS, PASSAGE_NNZ, QUERY_NNZ = 768, 128, 40, 150, 12
CHUNK = 100_000


def affordable_rows(requested: int, bytes_per_row: int, share: float = 0.4) -> int:
    """``requested`` capped so the arrays take at most ``share`` of the available memory."""
    return max(1000, min(requested, int(available_bytes() * share) // bytes_per_row))


def flat_index(rows: int, dim: int, seed: int = 0) -> faiss.IndexFlatIP:
    rng = np.random.default_rng(seed)
    index = faiss.IndexFlatIP(dim)
    for s in range(0, rows, CHUNK):
        index.add(rng.standard_normal((min(CHUNK, rows - s), dim), dtype=np.float32))
    return index


def dhr_rows(rows: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """values (rows, 896) float16, gates (rows, 768) uint8."""
    rng = np.random.default_rng(seed)
    values = np.empty((rows, DLR_DIM + DENSE_DIM), dtype=np.float16)
    gates = np.empty((rows, DLR_DIM), dtype=np.uint8)
    for s in range(0, rows, CHUNK):
        n = min(CHUNK, rows - s)
        lexical = rng.random((n, DLR_DIM), dtype=np.float32)
        values[s:s + n, :DLR_DIM] = np.where(lexical < PASSAGE_NNZ / DLR_DIM, lexical * (1.5 * DLR_DIM / PASSAGE_NNZ), 0)
        values[s:s + n, DLR_DIM:] = rng.standard_normal((n, DENSE_DIM), dtype=np.float32) / np.sqrt(DENSE_DIM)
        gates[s:s + n] = rng.integers(0, GATE_ROWS, (n, DLR_DIM), dtype=np.uint8)
    return values, gates


def dhr_queries(count: int, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """xq (count, 896) float32 with QUERY_NNZ DLR dims above θ = 0.1, gq (count, 768) uint8."""
    rng = np.random.default_rng(seed)
    xq = np.zeros((count, DLR_DIM + DENSE_DIM), dtype=np.float32)
    for q in range(count):
        xq[q, rng.choice(DLR_DIM, QUERY_NNZ, replace=False)] = rng.uniform(0.5, 2.0, QUERY_NNZ)
    xq[:, DLR_DIM:] = rng.standard_normal((count, DENSE_DIM), dtype=np.float32) / np.sqrt(DENSE_DIM)
    return xq, rng.integers(0, GATE_ROWS, (count, DLR_DIM), dtype=np.uint8)


def first_stage(config, device: str, bandwidth: dict) -> dict:
    dim = config.first_stage_dim
    rows = affordable_rows(config.first_stage_rows, dim * 4)
    index = flat_index(rows, dim)
    xq = np.random.default_rng(3).standard_normal((config.batch_size, dim), dtype=np.float32)
    out = {"rows": rows, "dim": dim, "requested_rows": config.first_stage_rows, "bytes": rows * dim * 4,
           "faiss_device": "cpu"}
    one = time_calls(lambda: faiss_engine.search(index, xq[:1], config.depth), repeats=config.first_stage_repeats)
    with faiss_engine.omp_threads(2):
        two = time_calls(lambda: index.search(xq[:1], config.depth), repeats=max(3, config.first_stage_repeats // 2))
    out["batch1_ms_1_thread"] = one.to_dict()
    out["batch1_ms_2_threads"] = two.to_dict()
    out["batch1_qps"] = round(1000.0 / one.p50, 2)
    scanned = rows * dim * 4 / (one.p50 / 1000.0)
    out["batch1_scan_gbps"] = round(scanned / 1e9, 3)
    out["batch1_scan_fraction_of_1_thread_bandwidth"] = ratio(scanned / 1e9, bandwidth.get("read_gbps_1_thread", 0))
    out["batch1_scan_fraction_of_2_thread_bandwidth"] = ratio(scanned / 1e9, bandwidth.get("read_gbps_2_threads", 0))
    before = faiss.cvar.distance_compute_blas_threshold
    try:
        for label, threshold in (("faiss_default", before), ("blas_tuned", faiss_engine.BATCHED_BLAS_THRESHOLD)):
            faiss.cvar.distance_compute_blas_threshold = threshold
            batch = time_calls(lambda: faiss_engine.search(index, xq, config.depth), repeats=2, warmup=1)
            out[f"batch{config.batch_size}_{label}_qps"] = round(config.batch_size * 1000.0 / batch.p50, 2)
    finally:
        faiss.cvar.distance_compute_blas_threshold = before
    out["faiss_default_blas_threshold"] = int(before)
    return out


def rerank_and_approx(config, first_stage_ms: float) -> dict:
    rows = affordable_rows(config.first_stage_rows, (DLR_DIM + DENSE_DIM) * 2 + DLR_DIM)
    values, gates = dhr_rows(rows)
    xq, gq = dhr_queries(1)
    rng = np.random.default_rng(4)
    k1 = min(config.rerank_candidates, rows)
    candidates = rng.choice(rows, k1, replace=False)[None, :].astype(np.int64)
    rerank = time_calls(lambda: gip.rerank(xq, gq, values, gates, candidates, 10), repeats=config.first_stage_repeats)
    out = {"rows": rows, "candidates": k1, "ms": rerank.to_dict(),
           "fraction_of_first_stage_batch1": ratio(rerank.p50, first_stage_ms)}
    n = min(config.approx_rows, rows)
    ip_index = faiss.IndexFlatIP(values.shape[1])
    for s in range(0, n, CHUNK):
        ip_index.add(values[s:min(n, s + CHUNK)].astype(np.float32))
    ip = time_calls(lambda: faiss_engine.search(ip_index, xq, config.depth), repeats=config.approx_repeats)
    approx = time_calls(lambda: gip.approx_topk(xq, gq, values[:n], gates[:n], 0.1, config.depth),
                        repeats=config.approx_repeats, warmup=1)
    approx_section = {"rows": n, "dim": int(values.shape[1]), "theta": 0.1, "ip_ms": ip.to_dict(),
                      "approx_gip_ms": approx.to_dict(), "approx_over_ip": ratio(approx.p50, ip.p50)}
    return {"rerank": out, "approx_vs_ip": approx_section}


def device_copy_gbps(device: str, nbytes: int = 1 << 30) -> float:
    """Bytes read per second by a copy within ``device`` (on a CPU: within memory) (reads + writes counted once each: 2 x nbytes)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    on_gpu = torch.device(device).type == "cuda"
    timed = time_calls(lambda: (dst.copy_(src), on_gpu and torch.cuda.synchronize(device)), repeats=10, warmup=2)
    return 2 * nbytes / (timed.p50 / 1000.0) / 1e9


def torch_first_stage(config, device: str, bandwidth: dict) -> dict:
    """The exact torch first stage (the GPU path) at the same size, and its GIP rerank of K1 candidates."""
    import torch

    from densehybrid.index.engines.torch_engine import TorchFlatIndex, search_devices

    on_gpu = device.startswith("cuda")
    dtype = torch.float16 if on_gpu else torch.float32
    dim, item = config.first_stage_dim, 2 if on_gpu else 4
    rows = affordable_rows(config.first_stage_rows, dim * 4)  # the host copy is float32 while it is built
    xb = np.random.default_rng(0).standard_normal((rows, dim), dtype=np.float32)
    index = TorchFlatIndex(xb, None, search_devices(device) if on_gpu else ["cpu"], dtype=dtype)
    del xb
    xq = np.random.default_rng(3).standard_normal((1, dim), dtype=np.float32)
    timed = time_calls(lambda: index.search(xq, config.depth), repeats=config.first_stage_repeats, warmup=2)
    # the depth a search without a rerank asks for: k (10) and one row past the cut
    shallow = time_calls(lambda: index.search(xq, 11), repeats=config.first_stage_repeats, warmup=2)
    scanned = rows * dim * item / (timed.p50 / 1000.0) / 1e9
    if on_gpu:
        reference, kind = device_copy_gbps(search_devices(device)[0]), "device copy bandwidth"
    else:
        reference, kind = bandwidth.get("read_gbps_2_threads", 0), "2-thread read bandwidth"
    del index
    values, gates = dhr_rows(min(rows, max(config.rerank_candidates * 4, 100_000)))
    dhr = TorchFlatIndex(values, gates, search_devices(device) if on_gpu else ["cpu"], dtype=dtype)
    qv, qg = dhr_queries(1)
    k1 = min(config.rerank_candidates, values.shape[0])
    candidates = np.random.default_rng(4).choice(values.shape[0], k1, replace=False)[None, :].astype(np.int64)
    rerank = time_calls(lambda: dhr.rerank(qv, qg, candidates, 10), repeats=config.first_stage_repeats, warmup=2)
    return {"device": device, "dtype": str(dtype).removeprefix("torch."), "rows": rows, "dim": dim, "k": config.depth,
            "batch1_ms": timed.to_dict(), "scan_gbps": round(scanned, 3), "bandwidth_gbps": round(reference, 2),
            "batch1_k11_ms": shallow.to_dict(),
            "fraction_of_bandwidth_k11": ratio(rows * dim * item / (shallow.p50 / 1000.0) / 1e9, reference),
            "bandwidth_kind": kind, "fraction_of_bandwidth": ratio(scanned, reference),
            "rerank_candidates": k1, "rerank_ms": rerank.to_dict()}


def run(config, device: str, bandwidth: dict) -> dict:
    out = {}
    if config.faiss_search:
        fs = first_stage(config, device, bandwidth)
        out = {"first_stage": fs, **rerank_and_approx(config, fs["batch1_ms_1_thread"]["p50"])}
    out["torch"] = torch_first_stage(config, device, bandwidth)
    return out
