"""Start-up: load the model and index, check they belong together, build the runtime, warm up.

:func:`load_components` reads the model and index named by the settings and
checks that they belong together: the index manifest names its model, so an
index alone is enough, and a model given explicitly must match the index's
recorded weights hash. :func:`build_runtime` wraps the index for serving and
builds the batchers, the search threads and the pipeline; :func:`start`,
:func:`warm_up` and :func:`stop` take it through its life.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from densehybrid.encoder.base import Encoder
from densehybrid.index.search.params import SearchParams
from densehybrid.service.blas import one_thread_for_pooled_blas
from densehybrid.service.batcher import Batcher
from densehybrid.service.health import Health
from densehybrid.service.recall_watch import live_recall_of, steering_of
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.pipeline import Pipeline
from densehybrid.service.runtime import Runtime
from densehybrid.service.search_batcher import SearchBatcher
from densehybrid.service.settings import ServiceSettings
from densehybrid.service.tracing import TracingUnavailable, configure as configure_tracing
from densehybrid.service.write_pacing import WritePacer

if TYPE_CHECKING:
    from densehybrid.index.search.served import StoredIndex

log = logging.getLogger(__name__)

WARMUP_QUERY = "what is a dense hybrid retriever"
# rows an exhaustive first stage scans at warm-up: enough for its candidates, a few MB of a large index
WARMUP_ROWS = 1024


class StartupError(RuntimeError):
    """The model or index cannot be served; the message says which and why."""


def load_components(settings: ServiceSettings) -> tuple[Encoder, StoredIndex | None]:
    """(encoder, index or None) from the settings; raises :class:`StartupError` with a clear message."""
    if settings.milvus_uri is not None:
        index = _open_collection(settings)
    else:
        index = _load_index(settings) if settings.index is not None else None
    if index is None and settings.model is None:
        raise StartupError("nothing to serve: give --index DIR (its manifest names the model) or --model M")
    if index is not None:  # before the model loads: contradicting prompts and a wrong search device fail fast
        check_prompts(settings, index.prompts)
        from densehybrid.index.errors import SearchError
        from densehybrid.index.search.search_device import resolve_search_device

        try:
            resolve_search_device(settings.search_device, index)
        except SearchError as exc:
            raise StartupError(str(exc)) from exc
    encoder = _load_encoder(settings, index)
    if index is not None:
        from densehybrid.index.errors import IndexAccessError
        from densehybrid.index.storage.compatibility import check_compatible

        try:
            check_compatible(index.spec, encoder.spec)
        except (IndexAccessError, ValueError) as exc:
            where = settings.index if settings.milvus_uri is None else f"{settings.milvus_uri}#{settings.collection}"
            raise StartupError(f"model {encoder.spec.model_id!r} does not match index {where}: {exc}") from exc
    return encoder, index


def check_prompts(settings: ServiceSettings, recorded) -> None:
    """Prompts given to the server must be the index's: its passages were encoded after them."""
    for role, given in (("query", settings.query_prompt), ("passage", settings.passage_prompt)):
        if given is not None and given != recorded.for_role(role):
            raise StartupError(f"--{role}-prompt {given!r} contradicts the index, whose {role} prompt is "
                               f"{recorded.for_role(role)!r} (recorded in its manifest); leave the flag out to use "
                               "the index's, or rebuild the index with the new prompt")


def _load_index(settings: ServiceSettings):
    from densehybrid.index.errors import IndexAccessError
    from densehybrid.index.served.loading import load_index

    try:
        index = load_index(settings.index)
    except (IndexAccessError, OSError, ValueError) as exc:
        raise StartupError(f"cannot load index {settings.index}: {exc}") from exc
    log.info("index loaded", extra={"fields": {"index": str(settings.index), "documents": index.count}})
    return index


def _open_collection(settings: ServiceSettings):
    from densehybrid.index.errors import IndexAccessError
    from densehybrid.index.served.milvus import open_collection

    try:
        index = open_collection(settings.milvus_uri, settings.collection, timeout_s=settings.milvus_timeout_s)
    except IndexAccessError as exc:
        raise StartupError(f"cannot serve Milvus collection {settings.collection!r} at {settings.milvus_uri}: {exc}") from exc
    log.info("collection opened", extra={"fields": {"milvus_uri": settings.milvus_uri, "collection": settings.collection,
                                                     "documents": index.count}})
    return index


def _load_encoder(settings: ServiceSettings, index) -> Encoder:
    from densehybrid.encoder.backends.onnx_backend import OnnxBackendError
    from densehybrid.encoder.config import EncoderConfig
    from densehybrid.encoder.loading import load_encoder
    from densehybrid.encoder.precision import PrecisionError

    config = settings.encoder_config()
    if index is not None:  # rebuild the encoder the index was built with, then what the settings give
        config = EncoderConfig.from_spec(index.spec).updated(config)
    precision = query_precision(settings, index)
    try:
        encoder = load_encoder(config, backend=settings.backend, device=settings.device, precision=precision,
                               cuda_graphs=None if settings.cuda_graphs else False)
    except PrecisionError as exc:
        raise StartupError(f"cannot encode with model {config.model!r} in {precision}: {exc}") from exc
    except OnnxBackendError as exc:
        raise StartupError(f"cannot run model {config.model!r} on {settings.backend}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - any loading failure becomes one clear start-up message
        raise StartupError(f"cannot load model {config.model!r}: {type(exc).__name__}: {exc}") from exc
    log.info("model loaded", extra={"fields": {"model": config.model, "kind": encoder.spec.kind,
                                               "device": encoder.device, "backend": encoder.backend,
                                               "precision": encoder.precision}})
    return encoder


def query_precision(settings: ServiceSettings, index) -> str:
    """The precision queries are encoded in: the index's passages' unless the settings say otherwise, and then
    only with ``allow_precision_mismatch`` (vectors of two precisions score a little apart)."""
    recorded = index.encoded_precision if index is not None else None
    if settings.precision is None:
        return recorded or "fp32"
    if recorded is not None and settings.precision != recorded and not settings.allow_precision_mismatch:
        raise StartupError(f"--precision {settings.precision} differs from the index, whose passages were encoded "
                           f"in {recorded} (recorded in its manifest); leave the flag out to use {recorded}, "
                           "rebuild the index, or pass --allow-precision-mismatch")
    return settings.precision


def build_runtime(settings: ServiceSettings, encoder: Encoder, index: StoredIndex | None = None, *,
                  metrics: ServiceMetrics | None = None) -> Runtime:
    """The parts that serve ``encoder`` (and ``index``, wrapped as a live index), not started yet."""
    if index is not None:  # also here: tests and tools hand an index in without load_components
        check_prompts(settings, index.prompts)
    metrics = metrics or ServiceMetrics(request_timeout_s=settings.request_timeout_s)
    served = _live(settings, index) if index is not None else None
    if settings.search_threads > 1:  # searches side by side: each computes its own products
        one_thread_for_pooled_blas()
    pool = ThreadPoolExecutor(settings.search_threads, thread_name_prefix="densehybrid-search")
    search_batcher = SearchBatcher(served, pool, metrics.observe_search_batch) if served is not None else None
    batcher = Batcher(encoder, max_batch_size=settings.max_batch_size, max_batch_tokens=settings.max_batch_tokens,
                      max_wait_s=settings.max_wait_ms / 1000, queue_size=settings.queue_size,
                      retry_after_s=settings.retry_after_s, observer=metrics,
                      hand_on=search_batcher.held if search_batcher is not None else None)
    health = Health(served, settings.store_check_s)
    live_recall = live_recall_of(settings, served, metrics) if served is not None and not served.remote else None
    steering = steering_of(settings, served, live_recall, metrics)
    pipeline = Pipeline(encoder, batcher, search_batcher, pool, health, metrics,
                        timeout_s=settings.request_timeout_s, retry_after_s=settings.retry_after_s,
                        pacer=WritePacer(settings.write_share, settings.max_waiting_writes), live_recall=live_recall)
    spec = encoder.spec
    metrics.describe_model(kind=spec.kind, model_id=spec.model_id, device=encoder.device, skip_mlm=spec.skip_mlm,
                           backend=encoder.backend, precision=encoder.precision,
                           index_precision=index.encoded_precision if index is not None else None)
    compactor = None
    if served is not None:
        metrics.describe_index(served.count, spec.dim)
        if served.log is not None:
            from densehybrid.service.compaction import Compactor

            compactor = Compactor(served, settings.compact_after_changes, metrics)
            metrics.watch_writes(served.log.size_bytes, lambda: served.pending_changes,
                                 lambda: served.last_compaction)
    try:
        tracing = configure_tracing(settings.otlp_endpoint, settings.otlp_service_name)
    except TracingUnavailable as exc:
        raise StartupError(str(exc)) from exc
    return Runtime(settings=settings, encoder=encoder, index=served, batcher=batcher, search_pool=pool,
                   search_batcher=search_batcher, pipeline=pipeline, metrics=metrics, health=health,
                   compactor=compactor, tracing=tracing, live_recall=live_recall, steering=steering)


def _live(settings: ServiceSettings, index):
    """The index as served: a live index, writable when the settings name a write-ahead log."""
    from densehybrid.index.writes.live import LiveIndex
    from densehybrid.index.errors import IndexAccessError

    log_dir = settings.write_log_dir
    try:
        return LiveIndex.open(index.path, lambda base: _make_searcher(base, settings), log_dir=log_dir,
                              base=index)
    except (IndexAccessError, OSError, ValueError) as exc:
        raise StartupError(f"cannot open the write-ahead log {log_dir} of index {index.path}: {exc} "
                           "(serve read only with --no-writes)") from exc


def _make_searcher(index, settings: ServiceSettings):
    from densehybrid.index.engines.pqscan_shards import default_scan_threads
    from densehybrid.index.search.search_device import resolve_search_device
    from densehybrid.index.search.searcher import Searcher

    device = resolve_search_device(settings.search_device, index)
    scan_threads = settings.scan_threads or default_scan_threads(index.count)
    log.info("search device", extra={"fields": {"search_device": device, "scan_threads": scan_threads}})
    return Searcher(index, device=device, scan_threads=scan_threads)


def start(rt: Runtime) -> None:
    rt.batcher.start()
    if rt.live_recall is not None:
        rt.live_recall.start()
    rt.health.start()
    rt.health.status = "warming up"


def warm_up(rt: Runtime) -> None:
    """One query through tokenizer, worker, first stage and rerank, handed on as a request's are (over a
    bounded part of the index, :func:`warm_up_params`); then ready."""
    started = time.perf_counter()
    if rt.settings.warmup:
        rt.encoder.prepare_replay("query")
        items = rt.encoder.tokenize([WARMUP_QUERY], "query")
        then = _warm_search(rt) if rt.search_batcher is not None else None
        rt.batcher.submit(items, "query", then=then).result(timeout=rt.settings.request_timeout_s * 10)
    rt.health.warmed_up()
    log.info("ready", extra={"fields": {"warmup_ms": round((time.perf_counter() - started) * 1000, 1)}})


def warm_up_params(index) -> SearchParams:
    """The warm-up's search: every stage a request's takes, reading a bounded part of the index.

    An exhaustive first stage (flat, the torch scan, a Milvus FLAT collection) scans the first
    ``WARMUP_ROWS`` rows only: a full scan would page a whole memory-mapped index into memory before
    the first request asks for it. A graph walk reads about ``ef_search`` rows whatever the index's
    size, a Milvus IVF collection about ``nprobe`` lists, and product codes (held in memory, an eighth of the rows'
    size) about ``rescore`` rows, so those first stages search as a request's would.
    """
    # a local or Milvus HNSW first stage names its breadth, a Milvus IVF one its lists, a pqscan one its rescoring
    walks_part = any(knob in index.first_stage for knob in ("ef_search", "nprobe", "rescore"))
    bounded = not walks_part and index.count > WARMUP_ROWS
    return SearchParams(k=max(1, min(10, index.count)), candidates=max(1, min(100, index.count)),
                        row_limit=WARMUP_ROWS if bounded else None)


def _warm_search(rt: Runtime):
    params = warm_up_params(rt.index)

    def then(outcome, future):
        rt.search_batcher.submit(outcome.encoded, params, future=future)

    return then


def stop(rt: Runtime) -> None:
    rt.health.stop()
    rt.batcher.stop()
    if rt.live_recall is not None:
        rt.live_recall.close()
    rt.search_pool.shutdown(wait=True)
    if rt.compactor is not None:
        rt.compactor.stop()
    if rt.index is not None:
        rt.index.close()
    if rt.tracing is not None:  # last: the spans of the requests answered while stopping go out too
        rt.tracing.shutdown()
