"""Concurrent searches coalesced into one Faiss call per parameter set (docs/performance.md).

Faiss answers a batch of queries far faster than the same queries one by one
(one BLAS matrix product instead of one scan per query). Searches run on the
runtime's search threads; whenever a thread becomes free it takes *every*
search waiting at that moment, groups them by their parameters (k, first
stage, candidates, θ, rerank, λ) and runs one ``Searcher.search`` per group.
Nothing waits on purpose: a lone request is searched at once, and requests
that arrive while a search runs share the next one. A failing group fails
only its own requests.

:meth:`SearchBatcher.submit` may be called from any thread (the encoder
worker hands each encoded query on directly) and may bring the request's
future, already running, and a ``finish`` step that shapes the answer on the
search thread before the future resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from densehybrid.encoder.base import Encoded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchParams:
    k: int
    first_stage: str
    candidates: int
    theta: float
    rerank: bool
    lam: float | None
    method: str | None = None
    offset: int = 0
    rrf_k: float | None = None
    filter: object | None = None  # an index.filters node (hashable: equal filters search together)
    ef_search: int | None = None  # the graph breadth of an hnsw first stage (None: the index's)


@dataclass(frozen=True)
class SearchOutcome:
    """One request's rows of a (possibly shared) search; times are those of the shared call."""

    ids: list[list[str]]
    scores: list[list[float]]
    rows: list[list[int]]
    search_ms: float
    rerank_ms: float
    group_queries: int
    started: float = 0.0  # time.perf_counter() when the shared call began (the first stage, then the rerank)
    lexical_scores: list[list[float]] | None = None  # per hit, for kinds with a lexical and a dense part
    dense_scores: list[list[float]] | None = None
    selectivity: float | None = None  # the fraction of rows the filter kept


# (first stage, queries in the call, first-stage seconds, rerank seconds or None): once per coalesced call
GroupObserver = Callable[[str, int, float, "float | None"], None]


@dataclass(frozen=True)
class _Search:
    queries: Encoded
    future: Future
    finish: Callable[[SearchOutcome], Any] | None


def _resolve(job: _Search, outcome: SearchOutcome) -> None:
    try:
        job.future.set_result(outcome if job.finish is None else job.finish(outcome))
    except Exception as exc:  # noqa: BLE001 - a failing finish fails its own request only
        if not job.future.done():
            job.future.set_exception(exc)


class SearchBatcher:
    def __init__(self, searcher, executor: Executor, on_group: GroupObserver | None = None):
        self.searcher = searcher
        self.on_group = on_group or (lambda first_stage, queries, search_s, rerank_s: None)
        self.executor = executor
        self._lock = threading.Lock()
        self._pending: dict[SearchParams, list[_Search]] = {}
        self._scheduled = False
        self._held = 0

    def submit(self, queries: Encoded, params: SearchParams, *, future: Future | None = None,
               finish: Callable[[SearchOutcome], Any] | None = None) -> Future:
        """Queue one search; the future resolves to its :class:`SearchOutcome`, or to ``finish`` of it."""
        job = _Search(queries, future if future is not None else Future(), finish)
        with self._lock:
            self._pending.setdefault(params, []).append(job)
            start_drain = self._claim_drain()
        if start_drain:
            self._start_drain()
        return job.future

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Queue searches without starting a drain until the block ends. The encoder worker hands on a whole
        batch inside one: its queries then search together, instead of the first one starting a search
        thread that competes with the worker for the interpreter while the rest are still being handed on."""
        with self._lock:
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
                start_drain = bool(self._pending) and self._claim_drain()
            if start_drain:
                self._start_drain()

    def _claim_drain(self) -> bool:
        """(Under the lock.) Whether the caller must start the drain: none is scheduled and none is held."""
        if self._scheduled or self._held:
            return False
        self._scheduled = True
        return True

    def _start_drain(self) -> None:
        try:
            self.executor.submit(self._drain)
        except RuntimeError as exc:  # the search threads are shut down: nothing would ever drain these
            self._abandon(exc)

    def _abandon(self, exc: Exception) -> None:
        with self._lock:
            groups, self._pending, self._scheduled = self._pending, {}, False
        for jobs in groups.values():
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)

    async def search(self, queries: Encoded, params: SearchParams) -> SearchOutcome:
        return await asyncio.wrap_future(self.submit(queries, params))

    def _drain(self) -> None:
        with self._lock:
            groups, self._pending, self._scheduled = self._pending, {}, False
        for params, jobs in groups.items():
            # a future handed on by the encoder worker is running already: its caller can no longer cancel it
            live = [j for j in jobs if j.future.running() or j.future.set_running_or_notify_cancel()]
            if live:
                self._run_group(params, live)

    def _run_group(self, params: SearchParams, jobs: list[_Search]) -> None:
        try:
            self._search_group(params, jobs)
        except Exception as exc:  # noqa: BLE001 - delivered to every request of the group still waiting
            log.warning("search of %d queries failed: %s: %s", sum(len(j.queries) for j in jobs), type(exc).__name__,
                        exc)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)

    def _search_group(self, params: SearchParams, jobs: list[_Search]) -> None:
        started = time.perf_counter()
        found = self.searcher.search(Encoded.concat([j.queries for j in jobs]), k=params.k,
                                     first_stage=params.first_stage, candidates=params.candidates, theta=params.theta,
                                     rerank=params.rerank, lam=params.lam, method=params.method,
                                     offset=params.offset, rrf_k=params.rrf_k, ef_search=params.ef_search,
                                     **({} if params.filter is None else {"filter": params.filter}))
        total = len(found.ids)
        search_ms, rerank_ms = float(found.timing.get("search_ms", 0.0)), float(found.timing.get("rerank_ms", 0.0))
        self.on_group(params.first_stage, total, search_ms / 1000, rerank_ms / 1000 if rerank_ms else None)
        offset = 0
        for job in jobs:
            rows = slice(offset, offset + len(job.queries))
            parts = [None if p is None else p[rows] for p in (found.lexical_scores, found.dense_scores)]
            _resolve(job, SearchOutcome(found.ids[rows], found.scores[rows], found.rows[rows], search_ms, rerank_ms,
                                        total, started, *parts,
                                        selectivity=getattr(found, "selectivity", None)))
            offset += len(job.queries)
