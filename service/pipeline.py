"""One request pipeline: tokenize -> encode -> search (first stage + rerank) -> shape, timed per stage.

Every route that encodes goes through :class:`Pipeline` (``/search``, ``/encode``, ``/explain``,
``/documents`` and the OpenAI, TEI and Cohere routes), so queueing, disconnects, timeouts and stage
times behave the same everywhere.

Small inputs are tokenized on the event loop, big ones on a thread; the texts are queued for the
encoder worker right after, without yielding, so a full queue is refused before any tokenizing.
When the forward is done, the worker hands each job straight to its next stage (``then``): for
``/search`` the search batcher, whose thread also shapes the hits (document text, explanations).
Only the final answer comes back to the event loop.

Thread hand-offs and future kinds of one ``/search``:

- before: loop (tokenize) -> encoder thread -> loop -> search thread -> loop, and with
  ``return_text`` or ``explain`` once more -> search thread -> loop: 4 to 6 hand-offs, through three
  kinds of future (a ``concurrent.futures.Future`` per stage, an ``asyncio.Future`` wrapping each,
  and an ``asyncio.Task`` running the encoder wait under ``wait_for``, beside the disconnect watcher).
- after: loop (tokenize) -> encoder thread -> search thread (search and shaping) -> loop: 3
  hand-offs whatever is asked, through one ``concurrent.futures.Future`` per request, seen by the
  loop through one ``asyncio.Future``; the disconnect watcher is the only task.

Inputs too big to tokenize on the loop add a round trip to a tokenizer thread, before as after.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from starlette.concurrency import run_in_threadpool

from densehybrid.encoder.base import Direction, Encoded, Encoder, Role, SparseVector, TokenizedText
from densehybrid.index.errors import MilvusUnavailableError
from densehybrid.service.batcher import Batcher, EncodeOutcome, Output
from densehybrid.service.errors import (ClientGone, InvalidRequest, PayloadTooLarge, QueueFull, RequestTimeout,
                                        ServiceError, search_error)
from densehybrid.service.health import Health
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.search_batcher import SearchBatcher, SearchOutcome, SearchParams
from densehybrid.service.tracing import trace_of
from densehybrid.service.write_pacing import WritePacer

T = TypeVar("T")

# Tokenizing one query takes ~10 µs and 16 short passages ~0.5 ms (MiniLM's tokenizer, 2 CPU cores):
# less than a hop to a worker thread and back, which under 32 clients cost 2-40 ms of GIL hand-offs.
INLINE_TOKENIZE_CHARS = 8192


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def record(request: Request, timing: dict[str, float]) -> dict[str, float]:
    """Stage times for the ``Server-Timing`` header (the middleware reads them); returned for the body."""
    request.state.timing = timing
    return timing


@dataclass(frozen=True)
class TextOptions:
    """How a request's texts are tokenized: cut to the role's max length (else refused, 413), from which
    end, and after which prompt (its tokens count toward the limit and are never cut)."""

    truncate: bool = True
    direction: Direction = "right"
    prompt: str = ""


@dataclass(frozen=True)
class EncodedTexts:
    """One request's texts through tokenizer and worker: rows, token items and stage times."""

    encoded: Encoded | list[SparseVector]
    items: list[TokenizedText]
    queue_ms: float
    tokenize_ms: float
    encode_ms: float
    total_ms: float

    @property
    def tokens(self) -> int:
        return sum(item.length for item in self.items)

    @property
    def timing(self) -> dict[str, float]:
        return {"queue_ms": self.queue_ms, "tokenize_ms": self.tokenize_ms, "encode_ms": self.encode_ms,
                "total_ms": self.total_ms}


@dataclass(frozen=True)
class _Searched:
    encoded: EncodeOutcome
    found: SearchOutcome
    shaped: Any


async def _wait_for_disconnect(request: Request) -> None:
    # after the body is read, receive() only returns when the client goes away
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Pipeline:
    def __init__(self, encoder: Encoder, batcher: Batcher, search_batcher: SearchBatcher | None,
                 search_pool: Executor, health: Health, metrics: ServiceMetrics, *, timeout_s: float,
                 retry_after_s: int = 1, pacer: WritePacer | None = None):
        self.encoder = encoder
        self.batcher = batcher
        self.search_batcher = search_batcher
        self.search_pool = search_pool
        self.health = health
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.pacer = pacer if pacer is not None else WritePacer()

    # -- stages ----------------------------------------------------------------
    async def tokenize(self, texts: list[str], role: Role, options: TextOptions = TextOptions()) -> list[TokenizedText]:
        """Token ids for the encoder worker; a full queue is refused (429) before any tokenizing, an over-long
        text that may not be truncated (413) after."""
        self.batcher.check_room(len(texts))
        tokenize = functools.partial(self.encoder.tokenize, texts, role, direction=options.direction,
                                     prompt=options.prompt)
        if sum(len(text) for text in texts) <= INLINE_TOKENIZE_CHARS:
            items = tokenize()
        else:
            items = await run_in_threadpool(tokenize)
        cut = sum(item.truncated for item in items)
        if cut and not options.truncate:
            self.metrics.count_rejected("input_too_long")
            self._refuse_truncated(items, role)
        if cut:
            self.metrics.count_truncated(role, options.direction, cut)
        return items

    async def wait(self, request: Request, future: Future, *, background: bool = False) -> Any:
        """The request's answer. A client that disconnects first, or the timeout, takes a job still queued
        out of the queue; one already encoding or searching finishes unread. While a job that is not
        ``background`` (a write's) is waited for, writes yield to it (:class:`WritePacer`)."""
        if background:
            return await self._wait(request, future)
        with self.pacer.reading():
            return await self._wait(request, future)

    async def _wait(self, request: Request, future: Future) -> Any:
        waiter = asyncio.wrap_future(future)
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            done, _ = await asyncio.wait({waiter, watcher}, timeout=self.timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the handler is cancelled: never leave the job queued
            watcher.cancel()
            if not waiter.done():
                waiter.cancel()
                if future.cancel():
                    self.batcher.withdraw(future)
        if waiter in done:
            return waiter.result()
        if watcher in done:
            self.metrics.count_rejected("client_disconnected")
            raise ClientGone("the client closed the connection before its answer was ready")
        self.metrics.count_rejected("timeout")
        raise RequestTimeout(f"no answer within {self.timeout_s:g} s (request_timeout_s); retry later")

    @contextlib.asynccontextmanager
    async def write_turn(self) -> AsyncIterator[Callable[[float], None]]:
        """One write's turn (:meth:`WritePacer.writing`); refused (429) when the line of waiting writes is full."""
        if self.pacer.full:
            self.metrics.count_rejected("writes_backlogged")
            raise QueueFull(f"{self.pacer.waiting} writes are waiting their turn behind searches; retry later",
                            self.retry_after_s)
        asked = time.perf_counter()
        async with self.pacer.writing() as idle:
            self.metrics.observe_write_turn(time.perf_counter() - asked)
            yield idle

    async def on_search_threads(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.search_pool, functools.partial(fn, *args))

    # -- what routes call ------------------------------------------------------
    async def encode(self, request: Request, texts: list[str], role: Role, options: TextOptions = TextOptions(), *,
                     output: Output = "vectors", background: bool = False) -> EncodedTexts:
        """Rows of ``texts``. ``options.truncate`` False refuses over-long texts (413) before they reach the
        worker; ``output="lexical"`` asks for the lexical vectors, refused (422) for models without one;
        ``background`` lets queued searches go first (writes)."""
        if output == "lexical" and not self.encoder.has_lexical:
            raise InvalidRequest(f"the served model ({self.encoder.spec.kind!r}) is dense-only: it has no lexical "
                                 "vector over the vocabulary; use /embed")
        trace = trace_of(request)
        started = time.perf_counter()
        items = await self.tokenize(texts, role, options)
        tokenized = time.perf_counter()
        job = self.batcher.submit(items, role, output, background=background)
        outcome: EncodeOutcome = await self.wait(request, job, background=background)
        trace.tokenized(started, tokenized, items)
        trace.encoded(tokenized, outcome, role)
        return EncodedTexts(outcome.encoded, items, round(outcome.queue_ms, 3), ms(tokenized - started),
                            round(outcome.encode_ms, 3), ms(time.perf_counter() - started))

    def _refuse_truncated(self, items: list[TokenizedText], role: Role) -> None:
        cut = [i for i, item in enumerate(items) if item.truncated]
        if cut:
            limit = self.encoder.spec.max_length(role)
            raise PayloadTooLarge(f"input {cut[0]} has {items[cut[0]].untruncated_length} tokens, over the {role} "
                                  f"limit of {limit} tokens (special tokens and the prompt count toward it); send "
                                  "truncate=true to cut it to the limit")

    async def search(self, request: Request, texts: list[str], params: SearchParams | None,
                     shape: Callable[[Encoded, SearchOutcome], T],
                     options: TextOptions = TextOptions()) -> tuple[T | None, dict[str, float]]:
        """``shape(queries, found)`` of the search of ``texts``, computed on the search thread, and the stage
        times; ``params`` None (k = 0) encodes only."""
        trace = trace_of(request)
        started = time.perf_counter()
        items = await self.tokenize(texts, "query", options)
        tokenized = time.perf_counter()
        then = None if params is None else functools.partial(self._search_next, params, shape)
        try:
            done = await self.wait(request, self.batcher.submit(items, "query", then=then))
        except MilvusUnavailableError as exc:
            self.health.lost()
            raise search_error(exc, self.retry_after_s) from exc
        except ServiceError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as a JSON error, the server keeps serving
            raise search_error(exc, self.retry_after_s) from exc
        if params is None:
            encoded, search_ms, rerank_ms, shaped = done, 0.0, 0.0, None
        else:
            encoded, shaped = done.encoded, done.shaped
            search_ms, rerank_ms = done.found.search_ms, done.found.rerank_ms
            trace.searched(done.found, params, self.search_batcher.searcher)
        trace.tokenized(started, tokenized, items)
        trace.encoded(tokenized, encoded, "query")
        timing = {"queue_ms": round(encoded.queue_ms, 3), "encode_ms": round(encoded.encode_ms, 3),
                  "search_ms": round(search_ms, 3), "rerank_ms": round(rerank_ms, 3),
                  "total_ms": ms(time.perf_counter() - started)}
        return shaped, record(request, timing)

    def _search_next(self, params: SearchParams, shape, encoded: EncodeOutcome, future: Future) -> None:
        """On the encoder thread, right after the forward: queue the search with the request's own future."""
        finish = functools.partial(self._searched, params, shape, encoded)
        self.search_batcher.submit(encoded.encoded, params, future=future, finish=finish)

    def _searched(self, params: SearchParams, shape, encoded: EncodeOutcome, found: SearchOutcome) -> _Searched:
        rerank_s = found.rerank_ms / 1000 if found.rerank_ms else None
        self.metrics.observe_search(params.first_stage, found.search_ms / 1000, rerank_s)
        if found.selectivity is not None:
            self.metrics.observe_filter(found.selectivity)
        return _Searched(encoded, found, shape(encoded.encoded, found))

    async def encode_then(self, request: Request, texts: list[str], stage: str, fn: Callable[[Encoded], T],
                          options: TextOptions = TextOptions()) -> tuple[T, dict[str, float]]:
        """``fn`` of the queries' rows, run on a search thread straight after the forward; ``stage`` names its
        time."""
        trace = trace_of(request)
        started = time.perf_counter()
        items = await self.tokenize(texts, "query", options)
        tokenized = time.perf_counter()
        outcome, value, seconds = await self.wait(request, self.batcher.submit(
            items, "query", then=functools.partial(self._on_pool, fn)))
        trace.tokenized(started, tokenized, items)
        trace.encoded(tokenized, outcome, "query")
        timing = {"queue_ms": round(outcome.queue_ms, 3), "encode_ms": round(outcome.encode_ms, 3),
                  stage: ms(seconds), "total_ms": ms(time.perf_counter() - started)}
        return value, record(request, timing)

    def _on_pool(self, fn, outcome: EncodeOutcome, future: Future) -> None:
        def run() -> None:
            try:
                started = time.perf_counter()
                value = fn(outcome.encoded)
                future.set_result((outcome, value, time.perf_counter() - started))
            except Exception as exc:  # noqa: BLE001 - delivered to the request
                future.set_exception(exc)

        self.search_pool.submit(run)

    async def score(self, request: Request, query: str, texts: list[str], *, lam: float,
                    query_options: TextOptions = TextOptions(),
                    passage_options: TextOptions = TextOptions()) -> np.ndarray:
        """Scores of ``texts`` (as passages) for ``query`` with the served model's own score: the gated inner
        product for kinds with gates, the inner product otherwise (the index's scores for the same pair)."""
        started = time.perf_counter()
        asked = await self.encode(request, [query], "query", query_options)
        passages = await self.encode(request, texts, "passage", passage_options)
        scoring = time.perf_counter()
        scores = await self.on_search_threads(_score_passages, asked.encoded, passages.encoded,
                                              self.encoder.spec.gated_dim, lam)
        stages = ("queue_ms", "tokenize_ms", "encode_ms")
        record(request, {**{s: round(asked.timing[s] + passages.timing[s], 3) for s in stages},
                         "score_ms": ms(time.perf_counter() - scoring), "total_ms": ms(time.perf_counter() - started)})
        return scores


def _score_passages(query: Encoded, passages: Encoded, gated_dim: int, lam: float) -> np.ndarray:
    from densehybrid.index.search import gip

    xq = gip.scale_queries(query.values, gated_dim, lam)
    return gip.exhaustive(xq, query.gates, passages.values, passages.gates)[0]
