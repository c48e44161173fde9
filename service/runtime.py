"""What one server process serves: the encoder, its worker, the index and its searcher.

:func:`load_components` reads the model and index named by the settings and
checks that they belong together (DESIGN §2.2, §4): the index manifest names
its model, so an index alone is enough, and a model given explicitly must
match the index's recorded weights hash. :class:`Runtime` then owns the
encoder worker and the search threads, warms them up, and reports readiness.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from densehybrid.encoder.base import Encoder
from densehybrid.service.batcher import Batcher
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.search_batcher import SearchBatcher
from densehybrid.service.settings import ServiceSettings

log = logging.getLogger(__name__)

WARMUP_QUERY = "what is a dense hybrid retriever"


class StartupError(RuntimeError):
    """The model or index cannot be served; the message says which and why."""


def load_components(settings: ServiceSettings) -> tuple[Encoder, Any]:
    """(encoder, index or None) from the settings; raises :class:`StartupError` with a clear message."""
    if settings.milvus_uri is not None:
        index = _open_collection(settings)
    else:
        index = _load_index(settings) if settings.index is not None else None
    if index is None and settings.model is None:
        raise StartupError("nothing to serve: give --index DIR (its manifest names the model) or --model M")
    if index is not None:  # before the model loads: a wrong search device fails fast
        from densehybrid.index.searcher import SearchError, resolve_search_device

        try:
            resolve_search_device(settings.search_device, index)
        except SearchError as exc:
            raise StartupError(str(exc)) from exc
    encoder = _load_encoder(settings, index)
    if index is not None:
        from densehybrid.index.errors import IndexAccessError
        from densehybrid.index.files import check_compatible

        try:
            check_compatible(index.spec, encoder.spec)
        except (IndexAccessError, ValueError) as exc:
            where = settings.index if settings.milvus_uri is None else f"{settings.milvus_uri}#{settings.collection}"
            raise StartupError(f"model {encoder.spec.model_id!r} does not match index {where}: {exc}") from exc
    return encoder, index


def _load_index(settings: ServiceSettings):
    from densehybrid.index.errors import IndexAccessError
    from densehybrid.index.files import load_index

    try:
        index = load_index(settings.index)
    except (IndexAccessError, OSError, ValueError) as exc:
        raise StartupError(f"cannot load index {settings.index}: {exc}") from exc
    log.info("index loaded", extra={"fields": {"index": str(settings.index), "documents": index.count}})
    return index


def _open_collection(settings: ServiceSettings):
    from densehybrid.index.errors import IndexAccessError
    from densehybrid.index.milvus import open_collection

    try:
        index = open_collection(settings.milvus_uri, settings.collection, timeout_s=settings.milvus_timeout_s)
    except IndexAccessError as exc:
        raise StartupError(f"cannot serve Milvus collection {settings.collection!r} at {settings.milvus_uri}: {exc}") from exc
    log.info("collection opened", extra={"fields": {"milvus_uri": settings.milvus_uri, "collection": settings.collection,
                                                     "documents": index.count}})
    return index


class StoreHealth:
    """Whether the served index answers (``index.healthy()``: a local one always does, a Milvus
    collection when its server does), checked at most every ``interval_s``."""

    def __init__(self, index, interval_s: float):
        self._check = index.healthy if index is not None else None
        self.interval_s = interval_s
        self._ok, self._checked = True, float("-inf")
        self._lock = threading.Lock()

    def ok(self) -> bool:
        if self._check is None:
            return True
        with self._lock:
            if time.monotonic() - self._checked >= self.interval_s:
                self._ok, self._checked = bool(self._check()), time.monotonic()
            return self._ok

    def lost(self) -> None:
        """A call failed: report not ready until the next successful check."""
        with self._lock:
            self._ok, self._checked = False, time.monotonic()


def _load_encoder(settings: ServiceSettings, index) -> Encoder:
    from densehybrid.encoder.backends.onnx_backend import OnnxBackendError
    from densehybrid.encoder.config import EncoderConfig
    from densehybrid.encoder.loading import load_encoder

    config = settings.encoder_config()
    if index is not None:  # rebuild the encoder the index was built with, then what the settings give
        config = EncoderConfig.from_spec(index.spec).updated(config)
    try:
        encoder = load_encoder(config, backend=settings.backend, device=settings.device)
    except OnnxBackendError as exc:
        raise StartupError(f"cannot run model {config.model!r} on {settings.backend}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - any loading failure becomes one clear start-up message
        raise StartupError(f"cannot load model {config.model!r}: {type(exc).__name__}: {exc}") from exc
    log.info("model loaded", extra={"fields": {"model": config.model, "kind": encoder.spec.kind,
                                               "device": encoder.device, "backend": encoder.backend}})
    return encoder


class Runtime:
    """The loaded encoder (+ index), the encoder worker, the search threads and readiness."""

    def __init__(self, settings: ServiceSettings, encoder: Encoder, index=None, *,
                 metrics: ServiceMetrics | None = None):
        self.settings = settings
        self.encoder = encoder
        self.metrics = metrics or ServiceMetrics(request_timeout_s=settings.request_timeout_s)
        self.index = self._live(index) if index is not None else None
        self.searcher = self.index
        self.batcher = Batcher(encoder, max_batch_size=settings.max_batch_size,
                               max_batch_tokens=settings.max_batch_tokens, max_wait_s=settings.max_wait_ms / 1000,
                               queue_size=settings.queue_size, retry_after_s=settings.retry_after_s,
                               observer=self.metrics)
        self.search_pool = ThreadPoolExecutor(settings.search_threads, thread_name_prefix="densehybrid-search")
        self.search_batcher = (SearchBatcher(self.searcher, self.search_pool, self.metrics.observe_search_batch)
                               if self.searcher is not None else None)
        self._ready = threading.Event()
        self.store_health = StoreHealth(index, settings.store_check_s)
        self._status = "starting"
        spec = encoder.spec
        self.metrics.describe_model(kind=spec.kind, model_id=spec.model_id, device=encoder.device, skip_mlm=spec.skip_mlm,
                                    backend=encoder.backend)
        self.compactor = None
        if self.index is not None:
            self.metrics.describe_index(self.index.count, spec.dim)
            if self.index.log is not None:
                from densehybrid.service.documents import Compactor

                self.compactor = Compactor(self.index, settings.compact_after_changes, self.metrics)
                self.metrics.watch_writes(self.index.log.size_bytes, lambda: self.index.pending_changes,
                                          lambda: self.index.last_compaction)

    def _live(self, index):
        """The index as served: a live index, writable when the settings name a write-ahead log."""
        from densehybrid.index.errors import IndexAccessError
        from densehybrid.index.live import LiveIndex

        log_dir = self.settings.write_log_dir
        try:
            return LiveIndex.open(index.path, lambda base: self._make_searcher(base, self.settings.search_device), log_dir=log_dir,
                                  base=index)
        except (IndexAccessError, OSError, ValueError) as exc:
            raise StartupError(f"cannot open the write-ahead log {log_dir} of index {index.path}: {exc} "
                               "(serve read only with --no-writes)") from exc

    @staticmethod
    def _make_searcher(index, search_device: str):
        from densehybrid.index.searcher import Searcher, resolve_search_device

        device = resolve_search_device(search_device, index)
        log.info("search device", extra={"fields": {"search_device": device}})
        return Searcher(index, device=device)

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.store_health.ok()

    @property
    def status(self) -> str:
        if self._ready.is_set() and not self.store_health.ok():
            return "vector store unreachable"
        return self._status

    @status.setter
    def status(self, value: str) -> None:
        self._status = value

    def start(self) -> None:
        self.batcher.start()
        self.status = "warming up"

    def warm_up(self) -> None:
        """One query through tokenizer, worker, first stage and rerank; then ready."""
        started = time.perf_counter()
        if self.settings.warmup:
            items = self.encoder.tokenize([WARMUP_QUERY], "query")
            encoded = self.batcher.submit(items, "query").result(timeout=self.settings.request_timeout_s * 10).encoded
            if self.searcher is not None:
                self.searcher.search(encoded, k=min(10, self.index.count), candidates=min(100, self.index.count))
        self.status = "ready"
        self._ready.set()
        log.info("ready", extra={"fields": {"warmup_ms": round((time.perf_counter() - started) * 1000, 1)}})

    def stop(self) -> None:
        self._ready.clear()
        self.status = "shutting down"
        self.batcher.stop()
        self.search_pool.shutdown(wait=True)
        if self.compactor is not None:
            self.compactor.stop()
        if self.index is not None:
            self.index.close()
