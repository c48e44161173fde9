"""Memory read bandwidth: the physical limit of a brute-force scan (docs/performance.md).

A large float32 array is read with numpy's SIMD ``max`` (it touches every byte
once and does almost no arithmetic), by one thread and by several threads, each
on its own slice (numpy releases the GIL in the reduction). The best of a few
runs is reported: bandwidth is a capacity, not a typical time.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def read_bandwidth(array: np.ndarray, threads: int, repeats: int = 5) -> float:
    """Bytes per second reading ``array`` once with ``threads`` threads (best of ``repeats``)."""
    parts = np.array_split(array.reshape(-1), threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - start)
    return array.nbytes / best


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); a large number elsewhere so sizes are not capped."""
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def run(config) -> dict:
    array = np.random.default_rng(0).random(config.bandwidth_bytes // 4, dtype=np.float32)
    out = {"array_bytes": int(array.nbytes)}
    for threads in (1, 2):
        out[f"read_gbps_{threads}_thread{'s' if threads > 1 else ''}"] = round(read_bandwidth(array, threads) / 1e9, 3)
    return out
