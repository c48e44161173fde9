"""Recall@k of found rows against exact ones: the one measure the calibration, the live sampling and the
benchmarks share."""

from __future__ import annotations

import numpy as np


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Per query, the share of its exact top-k rows (Q, k) that ``found`` (Q, k') holds (-1s never count)."""
    return np.array([len(set(f[f >= 0].tolist()) & set(e[e >= 0].tolist())) / max(1, int((e >= 0).sum()))
                     for f, e in zip(found, exact)])
