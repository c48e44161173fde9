"""The product's targets, each a ratio measured in one run, checked against a results dict.

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
    """The ratio to [CLS]-only at the worse of the query lengths."""
    rows = results["encoder"]["query_latency_ms"][backend]
    return max(row[variant]["ratio_to_cls_p50"] for length, row in rows.items() if length.startswith("len"))


def _passages(results: dict, backend: str) -> float:
    """Ours / bare forward for the worst variant."""
    rows = [row for row in results["encoder"]["passage_throughput"].values() if isinstance(row, dict)]
    return min(row[f"{backend}_over_bare"] for row in rows)


def _encoder_targets(backend: str) -> tuple[Target, ...]:
    return (
        Target(f"skip_mlm_query_{backend}", f"{backend}: skip-MLM query p50 / [CLS]-only (worse of the lengths)",
               1.10, False, lambda r: _query(r, backend, "aggretriever_skip_mlm")),
        Target(f"full_agg_query_{backend}", f"{backend}: full Aggretriever query p50 / [CLS]-only (worse length)",
               1.35, False, lambda r: _query(r, backend, "aggretriever")),
    )


# our overhead: our torch encoders vs a bare transformers (torch) forward of the same network (the masked LM
# where the kind uses the MLM head); the ONNX rows of the table compare another runtime with it, which is a
# backend comparison
PASSAGE_TARGET = Target("passage_throughput", "torch: our passages/s / bare transformers forward (worst variant)",
                        0.9, True, lambda r: _passages(r, "torch"))

TARGETS = (
    *_encoder_targets("torch"),
    *_encoder_targets("onnx"),
    PASSAGE_TARGET,
    Target("scan_bandwidth", "batch-1 first-stage bytes/s / measured 1-thread read bandwidth",
           0.6, True, lambda r: r["search"]["first_stage"]["batch1_scan_fraction_of_1_thread_bandwidth"]),
    Target("rerank_vs_first_stage", "exact GIP rerank of 10k candidates / batch-1 first stage",
           0.10, False, lambda r: r["search"]["rerank"]["fraction_of_first_stage_batch1"]),
    Target("search_http_overhead_ms", "/search overhead over the in-process work at concurrency 1, p50 ms (best batching mode)",
           2.0, False, lambda r: r["service"]["search_http_overhead_p50_ms"]),
    Target("encode_concurrency_gain", "/encode requests/s at the highest concurrency / one client (best batching mode)",
           3.0, True, lambda r: max(v for v in r["service"]["encode_rps_ratio_max_vs_1"].values() if v is not None)),
)


# the GPU machine's run (the gpu presets): absolute latencies where the target is one, on the device
GPU_TARGETS = (
    Target("query_p50_ms", "torch: full Aggretriever query p50 ms, 12-token text, tokenization included",
           1.5, False, lambda r: r["encoder"]["query_latency_ms"]["torch"]["text_with_tokenize"]["aggretriever"]["p50"]),
    *_encoder_targets("torch"),
    PASSAGE_TARGET,
    Target("first_stage_bandwidth", "torch first stage, batch 1: bytes/s / device copy bandwidth",
           0.7, True, lambda r: r["search"]["torch"]["fraction_of_bandwidth"]),
    Target("rerank_10k_ms", "exact GIP rerank of 10k candidates on the device, p50 ms",
           0.5, False, lambda r: r["search"]["torch"]["rerank_ms"]["p50"]),
    Target("search_http_p50_ms", "/search p50 ms over HTTP, one client (best batching mode)",
           5.0, False, lambda r: r["service"]["search_p50_ms_one_client"]),
    Target("search_rps", "/search requests/s at the highest concurrency (best batching mode)",
           1000.0, True, lambda r: r["service"]["search_rps_at_max_concurrency"]),
)


def targets_for(preset: str) -> tuple[Target, ...]:
    return GPU_TARGETS if preset.startswith("gpu") else TARGETS


def check_all(results: dict) -> list[dict]:
    return [t.check(results) for t in targets_for(results["config"]["preset"])]
