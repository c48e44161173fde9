"""What a load test reads of the server process from outside: its /metrics histograms and its memory.

The server's own latency (from its histograms) is kept apart from the client's, because on a shared
machine the load driver's event loop lags too; RSS over a soak shows whether anything grows.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def _buckets(metrics_text: str, family: str, labels: dict[str, str]) -> dict[float, float]:
    """Cumulative histogram buckets {upper bound: count} of one labelled series in a /metrics text."""
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == family:
            for sample in fam.samples:
                if sample.name.endswith("_bucket") and all(sample.labels.get(k) == v for k, v in labels.items()):
                    out[float(sample.labels["le"])] = out.get(float(sample.labels["le"]), 0.0) + sample.value
    return out


def server_quantiles(before: str, after: str, family: str, labels: dict[str, str],
                     qs: tuple[float, ...] = (50, 99)) -> dict[str, float | None]:
    """Upper bounds (ms) of the buckets holding each quantile of what the server observed between two scrapes.

    Separates the server's own latency from the client's: on a shared machine the load driver's event
    loop lags too, which inflates what the client measures."""
    start, end = _buckets(before, family, labels), _buckets(after, family, labels)
    deltas = sorted((le, end[le] - start.get(le, 0.0)) for le in end)
    total = deltas[-1][1] if deltas else 0.0
    result: dict[str, float | None] = {}
    for q in qs:
        bound = next((le for le, count in deltas if total and count >= total * q / 100), None)
        result[f"p{q:g}_le_ms"] = None if bound is None else (bound * 1000 if bound != float("inf") else bound)
    return result


def rss_mb(pid: int) -> float | None:
    """Resident set size of a process in MiB (Linux /proc), None if unavailable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_drift(samples: list[tuple[float, float]]) -> dict:
    """RSS at the end of the soak against the first third's end (allocator warm-up excluded)."""
    if len(samples) < 3:
        return {"samples": samples}
    third = samples[len(samples) // 3][1]
    last = statistics.median(mb for _, mb in samples[-3:])
    return {"rss_start_mb": samples[0][1], "rss_after_third_mb": third, "rss_end_mb": last,
            "drift_mb": round(last - third, 1), "drift_percent": round(100 * (last - third) / third, 2),
            "samples": samples}
