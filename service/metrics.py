"""Prometheus metrics of one app (docs/metrics.md), in its own registry.

The names are a contract with the Grafana dashboards: add, never rename.
Durations are seconds in histograms whose buckets resolve milliseconds and
reach past the request timeout, so that a request that times out still lands
in a finite bucket. Work that is shared is timed where it happens: a batch
metric (``*_batch_*``) is observed once per encoder forward or coalesced
search, a request metric once per HTTP request (each request sees the whole
time of the batch it rode in).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,
                    0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
SLOW_BUCKETS = (15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# the fraction of rows a filter keeps: decades down to one row in a million, then coarser up to all
SELECTIVITY_BUCKETS = (1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.99, 1.0)
# recall@10 of one sampled query: fine near the top, where targets sit
RECALL_BUCKETS = (0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99, 1.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


def duration_buckets(timeout_s: float) -> tuple[float, ...]:
    """Millisecond-resolving buckets whose last finite bound is the first one at or past ``timeout_s``."""
    if timeout_s <= DURATION_BUCKETS[-1]:
        return DURATION_BUCKETS
    longer = tuple(b for b in SLOW_BUCKETS if b < timeout_s)
    return (*DURATION_BUCKETS, *longer, next((b for b in SLOW_BUCKETS if b >= timeout_s), timeout_s))


class ServiceMetrics:
    """Every metric family of the service; the batcher and middleware report into it."""

    def __init__(self, registry: CollectorRegistry | None = None, *, request_timeout_s: float = 30.0):
        self.registry = registry or CollectorRegistry()
        r, p = self.registry, "densehybrid_"
        seconds = duration_buckets(request_timeout_s)
        self.requests = Counter(p + "requests_total", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.request_duration = Histogram(p + "request_duration_seconds", "HTTP request duration (per request)",
                                          ["route"], buckets=seconds, registry=r)
        self.encode_duration = Histogram(p + "encode_duration_seconds", "encoder forward duration (per batch)", ["role"],
                                         buckets=seconds, registry=r)
        self.first_stage_duration = Histogram(p + "first_stage_duration_seconds",
                                              "first-stage search time each request saw (per request; a coalesced "
                                              "search counts once for each of its requests)",
                                              ["first_stage"], buckets=seconds, registry=r)
        self.rerank_duration = Histogram(p + "rerank_duration_seconds",
                                         "exact GIP rerank time each request saw (per request)",
                                         buckets=seconds, registry=r)
        self.search_batch_first_stage = Histogram(p + "search_batch_first_stage_seconds",
                                                  "first-stage duration of one coalesced search (per batch)",
                                                  ["first_stage"], buckets=seconds, registry=r)
        self.search_batch_rerank = Histogram(p + "search_batch_rerank_seconds",
                                             "rerank duration of one coalesced search (per batch)",
                                             buckets=seconds, registry=r)
        self.queue_wait = Histogram(p + "queue_wait_seconds", "time a request waits for the encoder worker",
                                    buckets=seconds, registry=r)
        self.queue_depth = Gauge(p + "queue_depth", "texts waiting for the encoder worker", registry=r)
        self.batch_size = Histogram(p + "batch_size", "texts per encoder forward", buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram(p + "batch_tokens", "padded tokens per encoder forward",
                                      buckets=BATCH_TOKEN_BUCKETS, registry=r)
        self.rejected = Counter(p + "rejected_total", "requests rejected before work, by reason", ["reason"], registry=r)
        self.index_documents = Gauge(p + "index_documents", "documents in the served index", registry=r)
        self.index_dims = Gauge(p + "index_dims", "dimensions of the served index's vectors", registry=r)
        self.model = Info(p + "model", "the served model", registry=r)
        self.search_batch = Histogram(p + "search_batch_queries", "queries per coalesced first-stage call",
                                      buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.write_log_bytes = Gauge(p + "write_log_bytes", "bytes in the write-ahead log not yet compacted", registry=r)
        self.pending_changes = Gauge(p + "pending_changes", "logged changes not yet folded into the index", registry=r)
        self.last_compaction = Gauge(p + "last_compaction_timestamp_seconds",
                                     "Unix time of the last finished compaction (0: none yet)", registry=r)
        self.compactions = Counter(p + "compactions_total", "compactions by outcome", ["outcome"], registry=r)
        self.write_turn_wait = Histogram(p + "write_turn_wait_seconds",
                                         "time a write waited for its turn (writes yield to searches; write_share)",
                                         buckets=seconds, registry=r)
        self.batch_failures = Counter(p + "batch_failures_total", "encoder forwards that raised", ["role"], registry=r)
        self.truncated = Counter(p + "truncated_texts_total", "texts cut to their role's max length, by the end cut",
                                 ["role", "direction"], registry=r)
        self.filter_selectivity = Histogram(p + "filter_selectivity",
                                            "fraction of the index's rows a filtered search kept (per request; "
                                            "its count is the number of filtered searches)",
                                            buckets=SELECTIVITY_BUCKETS, registry=r)

        self.first_stage_recall = Histogram(p + "first_stage_recall",
                                            "recall@10 of the first stage on sampled live queries against an exact "
                                            "scan of the same rows (per sampled query; recall_sample_rate)",
                                            ["index", "first_stage", "filtered"], buckets=RECALL_BUCKETS, registry=r)
        self.recall_samples = Counter(p + "first_stage_recall_samples_total",
                                      "live recall samples by outcome: measured, dropped (the sample queue was full) "
                                      "or failed", ["outcome"], registry=r)
        self.live_recall = Gauge(p + "first_stage_live_recall",
                                 "mean recall@10 of the last recall_window sampled queries (NaN before the first)",
                                 ["filtered"], registry=r)
        self.recall_target = Gauge(p + "first_stage_recall_target",
                                   "the recall@10 the index's approximate first stage was built to keep (--target-recall; "
                                   "0 for an exact scan or a build without a target)",
                                   registry=r)

        self.first_stage_breadth = Gauge(p + "first_stage_breadth",
                                         "the default breadth of the approximate first stage (ef_search, nprobe or "
                                         "margin), as recall steering left it", ["knob"], registry=r)
        self.breadth_changes = Counter(p + "first_stage_breadth_changes_total",
                                       "default breadth changes made by recall steering", ["direction"], registry=r)

    # -- reports from the encoder worker (see service.batcher.BatchObserver) --
    def observe_batch(self, role: str, texts: int, tokens: int, seconds: float) -> None:
        self.batch_size.observe(texts)
        self.batch_tokens.observe(tokens)
        self.encode_duration.labels(role=role).observe(seconds)

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def set_queue_depth(self, texts: int) -> None:
        self.queue_depth.set(texts)

    def count_rejected(self, reason: str) -> None:
        self.rejected.labels(reason=reason).inc()

    def count_truncated(self, role: str, direction: str, texts: int) -> None:
        self.truncated.labels(role=role, direction=direction).inc(texts)

    def count_batch_failure(self, role: str) -> None:
        self.batch_failures.labels(role=role).inc()

    # -- reports from the search path and the HTTP layer --
    def observe_search(self, first_stage: str, search_s: float, rerank_s: float | None) -> None:
        self.first_stage_duration.labels(first_stage=first_stage).observe(search_s)
        if rerank_s is not None:
            self.rerank_duration.observe(rerank_s)

    def observe_search_batch(self, first_stage: str, queries: int, search_s: float, rerank_s: float | None) -> None:
        """One coalesced first-stage call (and its rerank), however many requests shared it."""
        self.search_batch.observe(queries)
        self.search_batch_first_stage.labels(first_stage=first_stage).observe(search_s)
        if rerank_s is not None:
            self.search_batch_rerank.observe(rerank_s)

    def observe_filter(self, selectivity: float) -> None:
        self.filter_selectivity.observe(selectivity)

    def watch_recall(self, index: str, first_stage: str, target: float | None, live) -> tuple:
        """Report a :class:`service.live_recall.LiveRecall` (``live``): its window's means at scrape time, and the
        (observe, count) callables it reports each sample through."""
        for filtered in (False, True):
            self.live_recall.labels(filtered=str(filtered).lower()).set_function(lambda f=filtered: live.mean(f))
        if target is not None:
            self.recall_target.set(target)

        def observe(filtered: bool, recall: float) -> None:
            self.first_stage_recall.labels(index=index, first_stage=first_stage,
                                           filtered=str(filtered).lower()).observe(recall)

        return observe, lambda outcome: self.recall_samples.labels(outcome=outcome).inc()

    def watch_breadth(self, knob: str, breadth: float) -> Callable[[str, float], None]:
        """Report the steered default breadth: its value now, and the callable each change reports through."""
        self.first_stage_breadth.labels(knob=knob).set(breadth)
        current = {"breadth": breadth}

        def changed(knob: str, to: float) -> None:
            self.breadth_changes.labels(direction="wider" if to > current["breadth"] else "narrower").inc()
            self.first_stage_breadth.labels(knob=knob).set(to)
            current["breadth"] = to

        return changed

    def observe_write_turn(self, seconds: float) -> None:
        self.write_turn_wait.observe(seconds)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.request_duration.labels(route=route).observe(seconds)

    def describe_model(self, *, kind: str, model_id: str, device: str, skip_mlm: bool, backend: str = "torch",
                       precision: str = "fp32", index_precision: str | None = None) -> None:
        """``precision``: what queries are encoded in; ``index_precision``: what the index's passages were ("" without one)."""
        self.model.info({"kind": kind, "model_id": model_id, "device": device, "skip_mlm": str(skip_mlm).lower(),
                         "backend": backend, "precision": precision, "index_precision": index_precision or ""})

    def describe_index(self, documents: int, dims: int) -> None:
        self.index_documents.set(documents)
        self.index_dims.set(dims)

    def watch_writes(self, log_bytes, pending, last_compaction) -> None:
        """Read the live index's write state at scrape time (callables returning numbers)."""
        self.write_log_bytes.set_function(log_bytes)
        self.pending_changes.set_function(pending)
        self.last_compaction.set_function(lambda: last_compaction() or 0.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
