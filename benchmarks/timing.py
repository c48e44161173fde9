"""Latency samples -> percentiles. Wall-clock only; every figure is "on this machine"."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Percentiles and mean of ``n`` samples, in milliseconds."""

    p50: float
    p95: float
    p99: float
    mean: float
    min: float
    n: int

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """Nearest-rank percentile: the smallest sample with at least ``q`` % of the samples at or below it
    (a latency someone really saw, never an interpolation); None when there are no samples."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    if ordered.size == 0:
        return None
    rank = max(1, math.ceil(ordered.size * q / 100))
    return float(ordered[rank - 1])


def summarize(samples_ms: list[float] | np.ndarray) -> Timing:
    s = np.asarray(samples_ms, dtype=np.float64)
    p50, p95, p99 = (percentile(s, q) for q in (50, 95, 99))
    return Timing(p50, p95, p99, float(s.mean()), float(s.min()), int(s.size))


def time_calls(fn: Callable[[], object], *, repeats: int, warmup: int = 2) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000.0)
    return summarize(samples)


def round_robin(calls: dict[Any, Callable[[int], object]], rounds: int, *, warmup: int) -> dict[Any, list]:
    """What ``calls[key](i)`` returns in rounds ``i`` after ``warmup`` dropped ones, the keys taking turns
    within each round, so that drift in a shared machine's load hits every call alike."""
    samples: dict = {key: [] for key in calls}
    for i in range(warmup + rounds):
        for key, call in calls.items():
            got = call(i)
            if i >= warmup:
                samples[key].append(got)
    return samples


def ratio(a: float, b: float) -> float | None:
    """a / b rounded, None when b is not positive."""
    return round(a / b, 4) if b > 0 else None
