"""One request pipeline: tokenize -> encode -> next stage (search, or any work on a search thread), timed.

Every route that encodes goes through :class:`Pipeline` (``/search``, ``/encode``, ``/explain``,
``/documents`` and the OpenAI, TEI and Cohere routes), and every one of its uses runs the same core
(:meth:`Pipeline._run`): tokenize, queue for the encoder worker with the job's next stage, wait,
trace. So queueing, disconnects, timeouts and stage times behave the same everywhere.

Small inputs are tokenized on the event loop, big ones on a thread; the texts are queued for the
encoder worker right after, without yielding, so a full queue is refused before any tokenizing.
When the forward is done, the worker hands each job straight to its next stage (``then``): for
``/search`` the search batcher, whose thread also shapes the hits (document text, explanations).
Only the final answer comes back to the event loop: loop (tokenize) -> encoder thread -> search
thread -> loop, through one ``concurrent.futures.Future`` per request (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from densehybrid.encoder.base import Direction, Encoded, Encoder, Role, SparseVector, TokenizedText
from densehybrid.index.errors import MilvusUnavailableError
from densehybrid.index.search.params import SearchParams
from densehybrid.service.batcher import Batcher, EncodeOutcome, Output, Then
from densehybrid.service.errors import (ClientGone, InvalidRequest, PayloadTooLarge, QueueFull, RequestTimeout,
                                        ServiceError, search_error)
from densehybrid.service.health import Health
from densehybrid.service.live_recall import LiveRecall
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.search_batcher import SearchBatcher, SearchOutcome
from densehybrid.service.tracing import trace_of
from densehybrid.service.write_pacing import WritePacer

T = TypeVar("T")

# below this many characters tokenizing costs less than a hop to a worker thread and back, whose GIL
# hand-offs grow with the clients (docs/performance.md, "What each change measured")
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
class _Finished:
    """What a request's future resolves to: the forward's outcome and what its next stage made of it."""

    encoded: EncodeOutcome
    found: SearchOutcome | None = None  # the search, when the next stage searched
    value: Any = None  # the next stage's answer
    stage_ms: float = 0.0  # the next stage's own time, when it ran on a search thread


@dataclass(frozen=True)
class _Run:
    """One pass through the core: the answer, the tokens, and when tokenizing began and ended."""

    done: _Finished
    items: list[TokenizedText]
    started: float
    tokenized: float

    def timing(self, **stages: float) -> dict[str, float]:
        """The encoder's stage times, ``stages``, and the time since tokenizing began."""
        encoded = self.done.encoded
        return {"queue_ms": round(encoded.queue_ms, 3), "encode_ms": round(encoded.encode_ms, 3), **stages,
                "total_ms": ms(time.perf_counter() - self.started)}


def _encoded_only(encoded: EncodeOutcome, future: Future) -> None:
    """The next stage of a job that only encodes: the rows are the answer."""
    future.set_result(_Finished(encoded))


async def _wait_for_disconnect(request: Request) -> None:
    # after the body is read, receive() only returns when the client goes away
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Pipeline:
    def __init__(self, encoder: Encoder, batcher: Batcher, search_batcher: SearchBatcher | None,
                 search_pool: Executor, health: Health, metrics: ServiceMetrics, *, timeout_s: float,
                 retry_after_s: int = 1, pacer: WritePacer | None = None, live_recall: LiveRecall | None = None):
        self.encoder = encoder
        self.batcher = batcher
        self.search_batcher = search_batcher
        self.search_pool = search_pool
        self.health = health
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.pacer = pacer if pacer is not None else WritePacer()
        self.live_recall = live_recall

    # -- the core ------------------------------------------------------------------
    async def _run(self, request: Request, texts: list[str], role: Role, options: TextOptions, then: Then, *,
                   output: Output = "vectors", reading: bool = True) -> _Run:
        """Tokenize ``texts``, queue them for the worker with their next stage ``then`` (which resolves the
        request's future with a :class:`_Finished`), wait for it, and trace the encoder's stages."""
        trace = trace_of(request)
        started = time.perf_counter()
        items = await self.tokenize(texts, role, options)
        tokenized = time.perf_counter()
        done: _Finished = await self.wait(request, self.batcher.submit(items, role, output, then), reading=reading)
        trace.tokenized(started, tokenized, items)
        trace.encoded(tokenized, done.encoded, role)
        return _Run(done, items, started, tokenized)

    async def tokenize(self, texts: list[str], role: Role, options: TextOptions = TextOptions()) -> list[TokenizedText]:
        """Token ids for the encoder worker; a full queue is refused (429) before any tokenizing, an over-long
        text that may not be truncated (413) after."""
        self.batcher.check_room(len(texts))
        if sum(len(text) for text in texts) <= INLINE_TOKENIZE_CHARS:
            items = self.encoder.tokenize(texts, role, direction=options.direction, prompt=options.prompt)
        else:
            items = await run_in_threadpool(self.encoder.tokenize, texts, role, direction=options.direction,
                                            prompt=options.prompt)
        cut = sum(item.truncated for item in items)
        if cut and not options.truncate:
            self.metrics.count_rejected("input_too_long")
            self._refuse_truncated(items, role)
        if cut:
            self.metrics.count_truncated(role, options.direction, cut)
        return items

    def _refuse_truncated(self, items: list[TokenizedText], role: Role) -> None:
        cut = [i for i, item in enumerate(items) if item.truncated]
        if cut:
            limit = self.encoder.spec.max_length(role)
            raise PayloadTooLarge(f"input {cut[0]} has {items[cut[0]].untruncated_length} tokens, over the {role} "
                                  f"limit of {limit} tokens (special tokens and the prompt count toward it); send "
                                  "truncate=true to cut it to the limit")

    async def wait(self, request: Request, future: Future, *, reading: bool = True) -> Any:
        """The request's answer. A client that disconnects first, or the timeout, takes a job still queued
        out of the queue; one already encoding or searching finishes unread. While a ``reading`` request
        (anything but a write's own encode) is waited for, writes yield to it (:class:`WritePacer`)."""
        if not reading:
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

    # -- what routes call ------------------------------------------------------
    async def encode(self, request: Request, texts: list[str], role: Role, options: TextOptions = TextOptions(), *,
                     output: Output = "vectors", reading: bool = True) -> EncodedTexts:
        """Rows of ``texts``. ``options.truncate`` False refuses over-long texts (413) before they reach the
        worker; ``output="lexical"`` asks for the lexical vectors, refused (422) for models without one;
        ``reading`` False: a write's passages, which searches do not yield to."""
        if output == "lexical" and not self.encoder.has_lexical:
            raise InvalidRequest(f"the served model ({self.encoder.spec.kind!r}) is dense-only: it has no lexical "
                                 "vector over the vocabulary; use /embed")
        run = await self._run(request, texts, role, options, _encoded_only, output=output, reading=reading)
        encoded = run.done.encoded
        return EncodedTexts(encoded.encoded, run.items, round(encoded.queue_ms, 3), ms(run.tokenized - run.started),
                            round(encoded.encode_ms, 3), ms(time.perf_counter() - run.started))

    async def search(self, request: Request, texts: list[str], params: SearchParams | None,
                     then: Callable[[Encoded, SearchOutcome], T],
                     options: TextOptions = TextOptions()) -> tuple[T | None, dict[str, float]]:
        """``then(queries, found)`` of the search of ``texts``, computed on the search thread, and the stage
        times; ``params`` None (k = 0) encodes only."""
        next_stage = _encoded_only if params is None else self._searching(params, then)
        try:
            run = await self._run(request, texts, "query", options, next_stage)
        except MilvusUnavailableError as exc:
            self.health.lost()
            raise search_error(exc, self.retry_after_s) from exc
        except ServiceError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as a JSON error, the server keeps serving
            raise search_error(exc, self.retry_after_s) from exc
        found = run.done.found
        if found is not None:
            trace_of(request).searched(found, params, self.search_batcher.searcher.name)
        timing = run.timing(search_ms=round(found.search_ms, 3) if found else 0.0,
                            rerank_ms=round(found.rerank_ms, 3) if found else 0.0)
        return run.done.value, record(request, timing)

    def _searching(self, params: SearchParams, then: Callable[[Encoded, SearchOutcome], Any]) -> Then:
        """The next stage of a search's encode: on the encoder thread, queue the search with the request's own
        future; on the search thread, count it and shape the answer with ``then``."""
        def search(encoded: EncodeOutcome, future: Future) -> None:
            def shape(found: SearchOutcome) -> _Finished:
                rerank_s = found.rerank_ms / 1000 if found.rerank_ms else None
                self.metrics.observe_search(params.first_stage, found.search_ms / 1000, rerank_s)
                if found.selectivity is not None:
                    self.metrics.observe_filter(found.selectivity)
                shaped = _Finished(encoded, found, then(encoded.encoded, found))
                if self.live_recall is not None:  # a draw, and for a drawn query a put that never blocks
                    self.live_recall.offer(encoded.encoded, params)
                return shaped

            self.search_batcher.submit(encoded.encoded, params, future=future, then=shape)

        return search

    async def encode_then(self, request: Request, texts: list[str], stage: str, then: Callable[[Encoded], T],
                          options: TextOptions = TextOptions()) -> tuple[T, dict[str, float]]:
        """``then`` of the queries' rows, run on a search thread straight after the forward; ``stage`` names
        its time."""
        run = await self._run(request, texts, "query", options, self._on_search_thread(then))
        return run.done.value, record(request, run.timing(**{stage: run.done.stage_ms}))

    def _on_search_thread(self, then: Callable[[Encoded], Any]) -> Then:
        """The next stage that runs ``then`` of the rows on a search thread, timed."""
        def hand_to_pool(encoded: EncodeOutcome, future: Future) -> None:
            def run() -> None:
                try:
                    started = time.perf_counter()
                    value = then(encoded.encoded)
                    future.set_result(_Finished(encoded, value=value, stage_ms=ms(time.perf_counter() - started)))
                except Exception as exc:  # noqa: BLE001 - delivered to the request
                    future.set_exception(exc)

            self.search_pool.submit(run)

        return hand_to_pool

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
        return await asyncio.get_running_loop().run_in_executor(self.search_pool, fn, *args)
