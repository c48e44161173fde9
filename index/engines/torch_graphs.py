"""The exact first stage of one resident chunk replayed from CUDA graphs: the product and the top-k.

On an H200, over a million float16 rows with k = 1,000, the product and the top-k replayed from a
graph took 0.44 ms, where the whole search launched op by op took 0.68 ms (0.59 ms with the replay):
``torch.topk`` of a long row runs several kernels with host work between them, which a graph
replays back to back. One graph per k, captured at its first use and kept for
the ``MAX_GRAPHS`` most recent; each holds a score buffer of one row per index row, so only single
queries replay (a batch, under load, runs op by op). A capture runs in the thread-local capture
mode, as the encoder's do, so the encoder's work in its own thread does not break it; a capture
that fails anyway turns the graphs off, with a warning, and the search runs op by op.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from densehybrid.encoder.device import to_host

log = logging.getLogger(__name__)

MAX_GRAPHS = 8
MAX_K = 10_000


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    queries: torch.Tensor  # (Q, dim) input, in the storage dtype
    scores: torch.Tensor  # (Q, k) output
    rows: torch.Tensor  # (Q, k) output, chunk-local


class GraphedTopK:
    """``q @ values.T`` then the top ``k`` (unordered), for ``values`` (N, dim) resident on one CUDA device."""

    def __init__(self, values: torch.Tensor):
        self.values = values
        self.enabled = values.is_cuda
        self._graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self._lock = threading.Lock()

    def fits(self, queries: int, k: int) -> bool:
        return self.enabled and queries == 1 and k <= MAX_K

    def __call__(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """queries (Q, dim) on the device, in the storage dtype -> (scores float32, chunk rows) (Q, k) on the
        host, unordered; None when the capture failed (run it eagerly)."""
        with self._lock:
            shape = (queries.shape[0], k)
            found = self._graphs.get(shape)
            if found is None:
                found = self._capture(shape)
                if found is None:
                    return None
            self._graphs.move_to_end(shape)
            found.queries.copy_(queries)
            found.graph.replay()
            scores, rows = to_host(found.scores, found.rows)
            return scores, rows

    def _top(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        top = torch.topk(queries @ self.values.T, k, dim=1, sorted=False)
        return top.values, top.indices

    def _capture(self, shape: tuple[int, int]) -> _Graph | None:
        device = self.values.device
        queries = torch.zeros((shape[0], self.values.shape[1]), dtype=self.values.dtype, device=device)
        try:
            side = torch.cuda.Stream(device)  # a capture needs its warm-up off the default stream
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                self._top(queries, shape[1])
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                scores, rows = self._top(queries, shape[1])
        except RuntimeError as exc:
            self.enabled = False
            log.warning("CUDA graph capture of the first stage (%d queries, k=%d) failed (%s: %s); it runs eagerly",
                        shape[0], shape[1], type(exc).__name__, exc)
            return None
        if len(self._graphs) >= MAX_GRAPHS:
            self._graphs.popitem(last=False)
        self._graphs[shape] = _Graph(graph, queries, scores, rows)
        return self._graphs[shape]
