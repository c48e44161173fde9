"""Rows of a (memory-mapped) array read in chunks, some of them left out: how a first stage is built without
the rows its calibration holds out."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

CHUNK_ROWS = 65_536


def chunks(xb: np.ndarray, skip: np.ndarray | None = None, size: int = CHUNK_ROWS
           ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(rows (n,) int64, ``xb[rows]`` (n, dim) float32) in chunks of ``size`` rows, the rows ``skip`` left out."""
    for s in range(0, len(xb), size):
        rows = np.arange(s, min(s + size, len(xb)), dtype=np.int64)
        part = np.asarray(xb[s:s + size], dtype=np.float32)
        if skip is not None and len(skip):
            kept = ~np.isin(rows, skip)
            rows, part = rows[kept], part[kept]
        if len(rows):
            yield rows, part


def without(rows: np.ndarray, skip: np.ndarray | None) -> np.ndarray:
    """``rows`` less those in ``skip`` (a training sample without the held-out rows)."""
    return rows if skip is None or not len(skip) else rows[~np.isin(rows, skip)]
