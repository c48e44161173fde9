"""Benchmark sizes: ``quick`` (CI, seconds), ``default`` (a few minutes on 2 cores), ``full``, and ``gpu``
(the GPU machine's run, benchmarks/gpu/gpu_run.sh) with ``gpu-rehearsal``, the same steps at CPU sizes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SECTIONS = ("memory", "search", "encoder", "service")


@dataclass(frozen=True)
class BenchConfig:
    preset: str
    # memory bandwidth
    bandwidth_bytes: int
    # first stage (Faiss FlatIP over N x 768 float32) and rerank / approximate GIP
    first_stage_rows: int
    first_stage_dim: int = 768
    first_stage_repeats: int = 20
    batch_size: int = 64
    depth: int = 1000
    rerank_candidates: int = 10_000
    approx_rows: int = 100_000
    approx_repeats: int = 5
    faiss_search: bool = True  # the CPU first stage, rerank and approximate GIP (False: the torch path alone)
    # encoders (DistilBERT-base shape, random weights)
    encoder_shape: str = "distilbert-base"
    query_lengths: tuple[int, ...] = (12, 32)
    encoder_repeats: int = 30
    passage_batch: int = 32
    passage_length: int = 128
    passage_batches: int = 1
    backends: tuple[str, ...] = ("torch", "onnx")
    # service (a live loopback server)
    service_kind: str = "dhr"
    service_backend: str = "torch"
    service_docs: int = 10_000
    service_requests: int = 64
    concurrency: tuple[int, ...] = (1, 8, 32)
    service_in_thread: bool = False  # quick: uvicorn in a thread of this process instead of a subprocess
    client_processes: int = 1  # load-generating processes (one Python client saturates near 200 requests/s)
    batching_modes: tuple[str, ...] = ("on", "on_nowait", "off")  # service_bench.BATCHING's names
    sections: tuple[str, ...] = SECTIONS
    device: str | None = None  # None: CUDA when present
    threads: int | None = None  # torch / ONNX Runtime / Faiss threads; None keeps torch's default

    def with_overrides(self, **changes) -> "BenchConfig":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESETS = {
    "quick": BenchConfig(
        preset="quick", bandwidth_bytes=32 << 20, first_stage_rows=20_000, first_stage_repeats=5,
        batch_size=16, depth=100, rerank_candidates=2_000, approx_rows=20_000, approx_repeats=2,
        encoder_shape="tiny", encoder_repeats=3, passage_batch=4, passage_length=32, passage_batches=1,
        service_docs=500, service_requests=8, concurrency=(1, 4), service_in_thread=True),
    "default": BenchConfig(preset="default", bandwidth_bytes=1 << 30, first_stage_rows=1_000_000),
    "full": BenchConfig(preset="full", bandwidth_bytes=2 << 30, first_stage_rows=1_000_000, first_stage_repeats=50,
                        approx_rows=1_000_000, encoder_repeats=100, passage_batches=3, service_docs=100_000,
                        service_requests=256),
    # one H100/H200 in about 3 minutes: the query encoder of the coCondenser Aggretriever's shape, the
    # torch first stage over 1M x 768 fp16 rows generated on the machine, a 1M-document service
    "gpu": BenchConfig(preset="gpu", bandwidth_bytes=1 << 30, first_stage_rows=1_000_000, approx_rows=100_000,
                       encoder_shape="bert-base", encoder_repeats=100, passage_batches=10, backends=("torch",),
                       faiss_search=False, service_kind="aggretriever", service_docs=1_000_000,
                       service_requests=1024, concurrency=(1, 8, 64), batching_modes=("on_nowait",),
                       client_processes=8, device="cuda"),
    "gpu-rehearsal": BenchConfig(
        preset="gpu-rehearsal", bandwidth_bytes=32 << 20, first_stage_rows=20_000, first_stage_repeats=5,
        batch_size=16, depth=100, rerank_candidates=2_000, approx_rows=20_000, approx_repeats=2,
        encoder_shape="tiny", encoder_repeats=3, passage_batch=4, passage_length=32, backends=("torch",),
        faiss_search=False, service_kind="aggretriever", service_docs=500, service_requests=16, concurrency=(1, 4),
        batching_modes=("on_nowait",), client_processes=2, device="cpu"),
}
