"""The issue's targets, each a ratio measured in one run, checked against a results dict.

A target is reported, never asserted: a missed target is a finding to explain
with the measurement, not a failed test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    limit: float
    higher_is_better: bool
    value: Callable[[dict], float | None]

    def check(self, results: dict) -> dict:
        try:
            value = self.value(results)
        except (KeyError, TypeError, IndexError):
            value = None
        met = None if value is None else (value >= self.limit if self.higher_is_better else value <= self.limit)
        return {"name": self.name, "description": self.description, "limit": self.limit,
                "op": ">=" if self.higher_is_better else "<=", "value": value, "met": met}


def _query(results: dict, backend: str, variant: str) -> float:
    latency = results["encoder"]["query_latency_ms"][backend]
    return max(row[variant]["ratio_to_cls_p50"] for row in latency.values())  # the worse query length


def _best_backend(results: dict) -> str:
    latency = results["encoder"]["query_latency_ms"]
    return "onnx" if "onnx" in latency else "torch"


def _passages(results: dict) -> float:
    rows = results["encoder"]["passage_throughput"]
    backend = _best_backend(results)
    return min(row[f"{backend}_over_bare"] for key, row in rows.items() if isinstance(row, dict))


TARGETS = (
    Target("skip_mlm_query", "skip-MLM query encode p50 / [CLS]-only (worse of 12 and 32 tokens, best backend)",
           1.10, False, lambda r: _query(r, _best_backend(r), "aggretriever_skip_mlm")),
    Target("full_agg_query", "full Aggretriever query encode p50 / [CLS]-only (worse length, best backend)",
           1.35, False, lambda r: _query(r, _best_backend(r), "aggretriever")),
    Target("passage_throughput", "our passages/s / bare transformers forward (worst variant, best backend)",
           0.9, True, _passages),
    Target("scan_bandwidth", "batch-1 first-stage bytes/s / measured 1-thread read bandwidth",
           0.6, True, lambda r: r["search"]["first_stage"]["batch1_scan_fraction_of_1_thread_bandwidth"]),
    Target("rerank_vs_first_stage", "exact GIP rerank of 10k candidates / batch-1 first stage",
           0.10, False, lambda r: r["search"]["rerank"]["fraction_of_first_stage_batch1"]),
    Target("search_http_overhead_ms", "/search overhead over the in-process work at concurrency 1, p50 ms (best batching mode)",
           2.0, False, lambda r: r["service"]["search_http_overhead_p50_ms"]),
    Target("encode_concurrency_gain", "/encode requests/s at the highest concurrency / one client (best batching mode)",
           3.0, True, lambda r: max(v for v in r["service"]["encode_rps_ratio_max_vs_1"].values() if v is not None)),
)


def check_all(results: dict) -> list[dict]:
    return [t.check(results) for t in TARGETS]
