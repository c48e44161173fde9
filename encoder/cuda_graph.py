"""One way to capture a CUDA graph, for every path that replays one: the encoder's padded buckets, the
first stage's product and top-k, and the benchmarks' floors under both.

A capture needs its warm-up runs off the default stream (lazy initialisation such as cuBLAS workspaces
must not happen inside it), its own capture mode (``thread_local``: other threads of the service go on
launching work while one captures), and no garbage collection while it runs: a collected object's graph
destroyed inside another capture invalidates that capture (seen on an H200 when one test's encoder, held
only by a reference cycle, went while the next test captured).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

WARMUP_RUNS = 2


def capture(run: Callable[[], T], device: torch.device, *, pool=None, warmup_runs: int = WARMUP_RUNS
            ) -> tuple[T, torch.cuda.CUDAGraph]:
    """Run ``run`` ``warmup_runs`` times on a side stream, then capture it: -> (its outputs, the graph).

    The outputs are the graph's static tensors: every ``graph.replay()`` rewrites them in place from
    whatever the captured inputs hold then. ``pool`` lets several graphs share one memory pool (only
    for graphs that never replay at the same time). Raises ``RuntimeError`` when the work cannot be
    captured (a host synchronisation inside it, for one), and ``ValueError`` off CUDA.
    """
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup_runs):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            outputs = run()
    finally:
        if collecting:
            gc.enable()
    return outputs, graph
