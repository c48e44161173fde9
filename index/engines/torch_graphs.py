"""The exact first stage on one device: the product and the top-k over its resident chunks, replayed from
CUDA graphs for a single query.

``torch.topk`` of a long row runs several kernels with host work between them; a graph replays them
back to back (on an H200, a million float16 rows, k = 1,000: 0.44 ms replayed against 0.68 ms op by
op). What is left is the top-k itself, a sizeable share once the product reads the rows at the
device's copy rate. So a chunk's scores may be cut into equal parts: the top k of each part, then the
top k of their union, which holds the chunk's top k (each of those is among the top k of its own
part). Whether that is faster depends on the device and the sizes, so each k's capture times every
split on the device and keeps the fastest (:data:`PARTS`).

One graph per k, captured at its first use and kept for the ``MAX_GRAPHS`` most recent; each holds
a score buffer of one row per index row, so only single queries replay (a batch, under load, runs
op by op through :func:`top_k_over_chunks`, the same code). A capture that fails turns the graphs
off, with a warning, and the search runs op by op.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from densehybrid.encoder.cuda_graph import capture

log = logging.getLogger(__name__)

MAX_GRAPHS = 8
MAX_K = 10_000
PARTS = (1, 4, 16, 64)  # the splits of a chunk's scores that a capture times (1: one top-k over the chunk)
TIMED_REPLAYS = 10


def top_k_in_parts(scores: torch.Tensor, k: int, parts: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``k`` of each row of ``scores`` (Q, N), unordered: (values, columns) (Q, k).

    With ``parts`` > 1, the top k of each of ``parts`` slices of N // parts columns, then of their union
    and the few columns past the last slice. Exact: a column among a row's top k is among the top k of
    its own slice. Falls back to one top-k when a slice would hold fewer than k columns."""
    q, n = scores.shape
    width = n // max(parts, 1)
    if parts <= 1 or width < k:
        top = torch.topk(scores, k, dim=1, sorted=False)
        return top.values, top.indices
    covered = parts * width
    part = torch.topk(scores[:, :covered].reshape(q, parts, width), k, dim=2, sorted=False)
    offsets = torch.arange(0, covered, width, device=scores.device).view(1, parts, 1)
    values, columns = part.values.reshape(q, parts * k), (part.indices + offsets).reshape(q, parts * k)
    if covered < n:  # fewer than ``parts`` columns past the last slice: all of them are candidates
        values = torch.cat([values, scores[:, covered:]], 1)
        columns = torch.cat([columns, torch.arange(covered, n, device=scores.device).expand(q, -1)], 1)
    top = torch.topk(values, k, dim=1, sorted=False)
    return top.values, columns.gather(1, top.indices)


def top_k_over_chunks(queries: torch.Tensor, chunks: Sequence[torch.Tensor], starts: Sequence[int], k: int, *,
                      parts: int = 1, masks: Sequence[torch.Tensor | None] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``queries @ rows.T`` over one device's ``chunks`` (rows numbered from ``starts``), top ``k`` unordered:
    (scores, global rows) (Q, ≤ k). ``masks`` (one (rows,) bool tensor or None per chunk) keeps only those
    rows: the others score -inf before the top-k."""
    scores, rows = [], []
    for i, (start, chunk) in enumerate(zip(starts, chunks)):
        # the top-k reads the scores in the storage dtype (the product's own output: float16 on a GPU),
        # which the H200 measured at 0.13 ms for 1,000 of a million against 0.17 ms in float32
        chunk_scores = queries @ chunk.T
        if masks is not None and masks[i] is not None:
            chunk_scores.masked_fill_(~masks[i], float("-inf"))
        values, columns = top_k_in_parts(chunk_scores, min(k, chunk.shape[0]), parts)
        scores.append(values)
        rows.append(columns + start)
    if len(chunks) == 1:
        return scores[0], rows[0]
    merged, merged_rows = torch.cat(scores, 1), torch.cat(rows, 1)
    top = torch.topk(merged, min(k, merged.shape[1]), dim=1, sorted=False)
    return top.values, merged_rows.gather(1, top.indices)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    queries: torch.Tensor  # (1, dim) float32 input on the device; the graph casts it to the storage dtype
    scores: torch.Tensor  # (1, k) float32 output
    rows: torch.Tensor  # (1, k) output, global row numbers
    parts: int  # the split its capture found fastest
    timed_ms: dict[int, float]  # each split's replay time at capture
    staged: _Staging | None = None  # the chosen graph's pinned host buffers


class _Staging:
    """Pinned host buffers for one graph's query and top k, with numpy views of them: a query goes in and
    its top k comes out by copies that wait for nothing, and only one wait follows the replay (each
    pageable copy, and each allocation of a pinned one, would cost the host its own round trip)."""

    def __init__(self, graph: _Graph):
        self.queries = torch.empty(graph.queries.shape, dtype=torch.float32, pin_memory=True)
        self.scores = torch.empty(graph.scores.shape, dtype=torch.float32, pin_memory=True)
        self.rows = torch.empty(graph.rows.shape, dtype=graph.rows.dtype, pin_memory=True)
        self.queries_view, self.scores_view = self.queries.numpy(), self.scores.numpy()
        self.rows_view = self.rows.numpy()


class GraphedTopK:
    """The single-query first stage over one device's ``chunks`` (rows numbered from ``starts``), replayed
    from CUDA graphs; off (``enabled`` False) on a CPU."""

    def __init__(self, chunks: Sequence[torch.Tensor], starts: Sequence[int]):
        self.chunks, self.starts = list(chunks), list(starts)
        self.enabled = bool(self.chunks) and self.chunks[0].is_cuda
        self._graphs: OrderedDict[int, _Graph] = OrderedDict()
        self._lock = threading.Lock()

    def fits(self, queries: int, k: int) -> bool:
        return self.enabled and queries == 1 and k <= MAX_K

    def choices(self) -> dict[int, dict]:
        """Per k captured so far: the split kept and each split's replay time (ms) when it was chosen."""
        with self._lock:
            return {k: {"parts": g.parts, "timed_ms": dict(g.timed_ms)} for k, g in self._graphs.items()}

    @torch.inference_mode()  # the graphs' tensors are inference tensors: only such a mode may write them
    def __call__(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """queries (1, dim) float32 on the host -> (scores float32, global rows) (1, k) on the host,
        unordered; None when the capture failed (run it op by op)."""
        with self._lock:
            found = self._graphs.get(k)
            if found is None:
                found = self._capture(k)
                if found is None:
                    return None
            self._graphs.move_to_end(k)
            staged = found.staged
            staged.queries_view[...] = queries
            found.queries.copy_(staged.queries, non_blocking=True)
            found.graph.replay()
            staged.scores.copy_(found.scores, non_blocking=True)
            staged.rows.copy_(found.rows, non_blocking=True)
            torch.cuda.current_stream(found.scores.device).synchronize()
            return staged.scores_view.copy(), staged.rows_view.copy()  # the buffers serve the next query

    def _splits(self, k: int) -> list[int]:
        """The splits that differ for ``k``: a part narrower than k falls back to one top-k."""
        smallest = min(chunk.shape[0] for chunk in self.chunks)
        return [parts for parts in PARTS if parts == 1 or smallest // parts >= k]

    def _capture(self, k: int) -> _Graph | None:
        device, dtype = self.chunks[0].device, self.chunks[0].dtype
        queries = torch.randn((1, self.chunks[0].shape[1]), device=device)

        def first_stage(parts: int) -> tuple[torch.Tensor, torch.Tensor]:
            scores, rows = top_k_over_chunks(queries.to(dtype), self.chunks, self.starts, k, parts=parts)
            return scores.float(), rows

        timed: dict[int, tuple[float, _Graph]] = {}
        try:
            for parts in self._splits(k):
                (scores, rows), graph = capture(lambda: first_stage(parts), device)
                timed[parts] = (_replay_ms(graph), _Graph(graph, queries, scores, rows, parts, {}))
        except RuntimeError as exc:
            self.enabled = False
            log.warning("CUDA graph capture of the first stage (k=%d) failed (%s: %s); it runs op by op",
                        k, type(exc).__name__, exc)
            return None
        best = min(timed, key=lambda parts: timed[parts][0])
        chosen = timed[best][1]
        chosen.timed_ms = {parts: round(ms, 4) for parts, (ms, _) in timed.items()}
        chosen.staged = _Staging(chosen)
        log.debug("first stage k=%d: %d parts (replays: %s ms)", k, best, chosen.timed_ms)
        if len(self._graphs) >= MAX_GRAPHS:
            self._graphs.popitem(last=False)
        self._graphs[k] = chosen
        return chosen


def _replay_ms(graph: torch.cuda.CUDAGraph, replays: int = TIMED_REPLAYS) -> float:
    """Mean device time of one replay, from CUDA events around ``replays`` back-to-back replays."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays
