"""Writes: ``POST /documents`` and ``DELETE /documents/{id}``, and the background compactor.

A write encodes its passages with the index's own model through the encoder worker
(role passage), then logs and applies the change
(:meth:`index.live.LiveIndex.upsert` fsyncs before it returns) on the general thread pool, so the 2xx leaves only
once the change is durable, and a search started after it sees the change. When enough
changes are pending, one background thread folds them into a new index generation.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from densehybrid.index.build import passage_text
from densehybrid.index.documents import Document
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.live import LiveIndex, UnknownDocument
from densehybrid.index.wal import LogFullError
from densehybrid.service.errors import InsufficientStorage, NotFound, ServiceError, WritesDisabled
from densehybrid.service.handlers import (_in_search_pool, _ms, _record, encode_for, require_index, require_ready,
                                          tokenize)
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.runtime import Runtime

log = logging.getLogger(__name__)


class WriteFailed(ServiceError):
    status, type = 500, "write_error"


def _writable(rt: Runtime) -> LiveIndex:
    index = require_index(rt)
    require_ready(rt)
    if index.remote:
        raise WritesDisabled("this server serves a Milvus collection, read only: writes need a local index "
                             "(start it with --index DIR and writes on)")
    if not index.writable:
        raise WritesDisabled("this server serves its index read only (start it with --index DIR and writes on)")
    return index


def _logged(fn, *args):
    """Run a logging write, mapping storage failures to their HTTP errors."""
    try:
        return fn(*args)
    except LogFullError as exc:
        raise InsufficientStorage(f"{exc}; the change was not applied") from exc
    except IndexWriteError as exc:
        raise WriteFailed(f"{exc}; the change was not applied") from exc


async def add_documents(rt: Runtime, request: Request, body) -> dict:
    index = _writable(rt)
    started = time.perf_counter()
    docs = [Document(d.id, d.title, d.text) for d in body.documents]
    items = await tokenize(rt, [passage_text(d) for d in docs], "passage")
    outcome = await encode_for(rt, request, items, "passage")
    encoded = outcome.encoded
    logged = time.perf_counter()
    # the fsync runs on the general thread pool, never on the search threads that answer queries
    seq = await run_in_threadpool(_logged, index.upsert, docs, encoded.values, encoded.gates)
    rt.compactor.maybe_start()
    timing = _record(request, {"queue_ms": round(outcome.queue_ms, 3), "encode_ms": round(outcome.encode_ms, 3),
                               "log_ms": _ms(time.perf_counter() - logged),
                               "total_ms": _ms(time.perf_counter() - started)})
    return {"ids": [d.id for d in docs], "seq": seq, "documents": index.count, "timing": timing}


def _delete(index: LiveIndex, doc_id: str) -> int:
    try:
        return _logged(index.delete, doc_id)
    except UnknownDocument:
        raise NotFound(f"no document with id {doc_id!r} in index {index.name!r}") from None


async def delete_document(rt: Runtime, request: Request, doc_id: str) -> dict:
    index = _writable(rt)
    started = time.perf_counter()
    seq = await run_in_threadpool(_delete, index, doc_id)
    rt.compactor.maybe_start()
    timing = _record(request, {"total_ms": _ms(time.perf_counter() - started)})
    return {"ids": [doc_id], "seq": seq, "documents": index.count, "timing": timing}


async def get_document(rt: Runtime, doc_id: str) -> dict:
    index = require_index(rt)
    require_ready(rt)
    doc = await _in_search_pool(rt, index.get, doc_id)
    if doc is None:
        raise NotFound(f"no document with id {doc_id!r} in index {index.name!r}")
    return {"id": doc.id, "title": doc.title, "text": doc.text}


COMPACTION_NICENESS = 10


class Compactor:
    """Starts at most one background compaction at a time once ``threshold`` changes are pending."""

    def __init__(self, index: LiveIndex, threshold: int, metrics: ServiceMetrics):
        self.index = index
        self.threshold = threshold
        self.metrics = metrics
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = False

    def maybe_start(self) -> None:
        with self._lock:
            busy = self._thread is not None and self._thread.is_alive()
            if busy or self._stopping or self.index.pending_changes < self.threshold:
                return
            self._thread = threading.Thread(target=self._run, name="densehybrid-compaction", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            # below the request threads on the CPU (Linux nices threads one by one); best effort
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPACTION_NICENESS)
        except (OSError, AttributeError):
            pass
        try:
            self.index.compact()
            self.metrics.compactions.labels(outcome="ok").inc()
        except Exception:  # noqa: BLE001 - the log keeps every change; the next trigger retries
            self.metrics.compactions.labels(outcome="failed").inc()
            log.exception("compaction failed; the changes stay in the write-ahead log")

    def stop(self, timeout_s: float = 300.0) -> None:
        """Let a running compaction finish (it is safe to kill, but finishing saves the work)."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
