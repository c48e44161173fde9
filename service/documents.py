"""Writes: ``POST /documents`` and ``DELETE /documents/{id}``, and reading one document back.

A write encodes its passages with the index's own model through the pipeline
(role passage, its wait not counted as a search's), then logs and applies the change on the general thread pool
(:meth:`index.live.LiveIndex.upsert` fsyncs before it returns, and the fsync
must not hold up the search threads), so the 2xx leaves only once the change
is durable, and a search started after it sees the change. Each write may
start a background compaction (:mod:`service.compaction`). Writes take turns, and while searches
are being served they yield part of the time to them (:mod:`service.write_pacing`); ``turn_ms``
in a write's timing is how long it waited for its turn.
"""

from __future__ import annotations

import time

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from densehybrid.index.building.build import passage_text
from densehybrid.index.storage.documents import Document
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.writes.live import LiveIndex, UnknownDocument
from densehybrid.index.writes.wal import LogFullError
from densehybrid.service.errors import InsufficientStorage, WriteFailed, WritesDisabled
from densehybrid.service.handlers import require_index, served_prompts, unknown_document
from densehybrid.service.pipeline import TextOptions, ms, record
from densehybrid.service.runtime import Runtime


def _writable(rt: Runtime) -> LiveIndex:
    index = require_index(rt)
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


def document_fields(given) -> dict | None:
    """A written document's field values, as the request model checked them against the index's fields and
    types; an empty keyword list is no value, as in a built index."""
    if given is None:
        return None
    values = {name: value for name, value in given.model_dump(by_alias=True, exclude_none=True).items() if value != []}
    return values or None


async def add_documents(rt: Runtime, request: Request, body) -> dict:
    index = _writable(rt)
    started = time.perf_counter()
    docs = [Document(d.id, d.title, d.text, document_fields(d.fields)) for d in body.documents]
    # as index build encodes passages: after the index's passage prompt, cut from the right when over-long
    passages = TextOptions(truncate=True, prompt=served_prompts(rt).for_role("passage"))
    async with rt.pipeline.write_turn() as idle:
        turn = time.perf_counter()
        done = await rt.pipeline.encode(request, [passage_text(d) for d in docs], "passage", passages,
                                        reading=False)
        idle(done.queue_ms / 1000)
        logged = time.perf_counter()
        seq = await run_in_threadpool(_logged, index.upsert, docs, done.encoded.values, done.encoded.gates)
    rt.compactor.maybe_start()
    timing = record(request, {"turn_ms": ms(turn - started), "queue_ms": done.queue_ms, "encode_ms": done.encode_ms,
                              "log_ms": ms(time.perf_counter() - logged),
                              "total_ms": ms(time.perf_counter() - started)})
    return {"ids": [d.id for d in docs], "seq": seq, "documents": index.count, "timing": timing}


def _delete(index: LiveIndex, doc_id: str) -> int:
    try:
        return _logged(index.delete, doc_id)
    except UnknownDocument:
        raise unknown_document(index, doc_id) from None


async def delete_document(rt: Runtime, request: Request, doc_id: str) -> dict:
    index = _writable(rt)
    started = time.perf_counter()
    async with rt.pipeline.write_turn():
        turn = time.perf_counter()
        seq = await run_in_threadpool(_delete, index, doc_id)
    rt.compactor.maybe_start()
    timing = record(request, {"turn_ms": ms(turn - started), "total_ms": ms(time.perf_counter() - started)})
    return {"ids": [doc_id], "seq": seq, "documents": index.count, "timing": timing}


async def get_document(rt: Runtime, doc_id: str) -> dict:
    index = require_index(rt)
    doc = await rt.pipeline.on_search_threads(index.get, doc_id)
    if doc is None:
        raise unknown_document(index, doc_id)
    return {"id": doc.id, "title": doc.title, "text": doc.text}
