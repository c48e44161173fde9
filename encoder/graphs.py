"""Short batches replayed from CUDA graphs, over a few padded (rows, length) buckets.

A query is a dozen tokens: its forward is a few hundred small kernels, so on a GPU the launches, not
the arithmetic, set its time (a BERT-base query forward: ~5.7 ms eager, ~0.7 ms replayed from a graph
on an H100). Each bucket's forward is captured once into a graph over static input buffers; a batch
then runs in the smallest bucket that holds it, with its rows padded by masked positions and the spare
rows filled with a copy of its first row. Every row's output depends only on its own unmasked tokens,
so padding changes no row's vector beyond float rounding, and the spare rows are dropped.

On the CPU the same buckets run eagerly over the same buffers (no graph): that is the twin the tests
exercise everywhere, while the capture itself runs only where CUDA does.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from densehybrid.encoder.cuda_graph import capture
from densehybrid.encoder.device import autocast, to_host

log = logging.getLogger(__name__)

# (ids, mask) -> values (B, dim) and gates (B, gated) or None: an encoder's forward for one role
Forward = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)  # up to the service's default batch of 64 texts
# capped per role: queries (32 tokens by default) get 8, 16, 32; passages (128) all five
DEFAULT_LENGTHS = (8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Buckets:
    """The padded shapes that are captured: every rows x every length (lengths capped at ``max_length``)."""

    rows: tuple[int, ...] = DEFAULT_ROWS
    lengths: tuple[int, ...] = DEFAULT_LENGTHS

    def capped(self, max_length: int) -> "Buckets":
        """The lengths that fit ``max_length``, ending at ``max_length`` itself when a bucket passes it."""
        lengths = tuple(sorted({min(n, max_length) for n in self.lengths}))
        return Buckets(tuple(sorted(set(self.rows))), lengths)

    def pick(self, rows: int, longest: int) -> tuple[int, int] | None:
        """The smallest bucket holding ``rows`` texts of at most ``longest`` tokens; None when none does."""
        r = bisect.bisect_left(self.rows, rows)
        n = bisect.bisect_left(self.lengths, longest)
        if r == len(self.rows) or n == len(self.lengths):
            return None
        return self.rows[r], self.lengths[n]

    def all(self) -> list[tuple[int, int]]:
        return [(r, n) for r in self.rows for n in self.lengths]


@dataclass
class _Bucket:
    inputs: torch.Tensor  # (2, rows, length) int64 on the device: ids then mask, filled by one copy
    values: torch.Tensor | None = None  # the forward's outputs, rewritten by every replay
    gates: torch.Tensor | None = None
    graph: object | None = None  # torch.cuda.CUDAGraph; None on the CPU (run eagerly)


@dataclass
class ReplayedForward:
    """One role's forward, run in padded buckets; captured as CUDA graphs on a CUDA device.

    Thread-safe: a lock serialises the buckets' shared buffers (the service has one encoder worker,
    so it never waits there)."""

    forward: Forward
    device: torch.device
    pad_id: int
    buckets: Buckets
    _captured: dict[tuple[int, int], _Bucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _capture_failed: bool = False
    # one memory pool for every bucket's graph: replays never overlap (the lock) and each replay's outputs
    # are copied out before the next, so the buckets' temporaries can share memory; the pool then holds
    # about the largest bucket's forward, not the sum of all of them
    _pool: object | None = None

    @property
    def uses_graphs(self) -> bool:
        return self.device.type == "cuda"

    @property
    def graph_count(self) -> int:
        """Buckets captured as CUDA graphs so far (0 on a CPU, or after a failed capture)."""
        return sum(bucket.graph is not None for bucket in self._captured.values())

    def fits(self, rows: int, longest: int) -> bool:
        return self.buckets.pick(rows, longest) is not None

    def capture_all(self) -> None:
        """Capture every bucket now (the service's warm-up), so no request pays for a capture."""
        with self._lock:
            for shape in self.buckets.all():
                self._bucket(shape)

    def __call__(self, rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray | None]:
        """Token ids of at most the largest bucket's rows and length -> values and gates on the host."""
        shape = self.buckets.pick(len(rows), max(len(r) for r in rows))
        if shape is None:
            raise ValueError(f"{len(rows)} texts of up to {max(len(r) for r in rows)} tokens fit no bucket")
        host = _padded(rows, shape, self.pad_id)
        with self._lock, torch.inference_mode():
            bucket = self._bucket(shape)
            bucket.inputs.copy_(host, non_blocking=False)
            if bucket.graph is not None:
                bucket.graph.replay()
            else:
                bucket.values, bucket.gates = self._run(bucket.inputs)
            gates = None if bucket.gates is None else bucket.gates[:len(rows)]
            values, gates = to_host(bucket.values[:len(rows)], gates)
        return values, gates

    def _run(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # no weight-cast cache under a capture: the cache's copies would be freed when autocast exits
        # while the graph still reads them
        with autocast(self.device, cache_enabled=False):
            values, gates = self.forward(inputs[0], inputs[1])
        return values.float(), gates  # the cast to float32 is part of the graph: one launch less per replay

    def _bucket(self, shape: tuple[int, int]) -> _Bucket:
        bucket = self._captured.get(shape)
        if bucket is not None:
            return bucket
        with torch.inference_mode():
            rows, length = shape
            inputs = torch.full((2, rows, length), self.pad_id, dtype=torch.long, device=self.device)
            inputs[1].zero_()
            inputs[1, :, 0] = 1  # the capture's own inputs only need a shape; replays copy in real ones
            bucket = _Bucket(inputs)
            if self.uses_graphs and not self._capture_failed:
                try:
                    if self._pool is None:
                        self._pool = torch.cuda.graph_pool_handle()
                    (bucket.values, bucket.gates), bucket.graph = capture(lambda: self._run(inputs), self.device,
                                                                           pool=self._pool)
                    log.debug("captured a CUDA graph for %d rows x %d tokens", rows, length)
                except RuntimeError as exc:  # a model with a host sync in its forward cannot be captured
                    self._capture_failed = True
                    log.warning("CUDA graph capture of %d rows x %d tokens failed (%s: %s); this encoder's "
                                "forwards run eagerly", rows, length, type(exc).__name__, exc)
        self._captured[shape] = bucket
        return bucket


def _padded(rows: Sequence[Sequence[int]], shape: tuple[int, int], pad_id: int) -> torch.Tensor:
    """(2, bucket rows, bucket length) int64 on the host: ids then mask; spare rows repeat the first."""
    bucket_rows, length = shape
    host = np.zeros((2, bucket_rows, length), dtype=np.int64)
    host[0] = pad_id
    for i, ids in enumerate(rows):
        host[0, i, :len(ids)] = ids
        host[1, i, :len(ids)] = 1
    host[:, len(rows):] = host[:, :1]
    return torch.from_numpy(host)
