"""What each route does: tokenize, encode through the worker, search, shape the answer.

Routes stay thin and call one function here. Blocking work leaves the event
loop: tokenization runs in the default thread pool (off the encoder's
critical path), forwards on the encoder worker, search and explain on the
runtime's search threads. Stage times go into the response body and into
``request.state.timing`` for the ``Server-Timing`` header.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass

import numpy as np

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from densehybrid.encoder.base import Encoded, Role, SparseVector, TokenizedText
from densehybrid.index.errors import MilvusUnavailableError
from densehybrid.index.searcher import SearchError
from densehybrid.service.batcher import EncodeOutcome, Output
from densehybrid.service.errors import (ClientGone, InvalidRequest, NoIndex, NotFound, NotReady, PayloadTooLarge,
                                        SearchFailed, StoreUnavailable)
from densehybrid.service.runtime import Runtime
from densehybrid.service.search_batcher import SearchParams

TRUNCATION_NOTE = "texts longer than the role's max length are truncated to it, not rejected"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def require_ready(rt: Runtime) -> None:
    if not rt.store_health.ok():
        raise StoreUnavailable(f"the vector store is unreachable ({rt.status}); retry later", rt.settings.retry_after_s)
    if not rt.ready:
        raise NotReady(f"the service is not ready ({rt.status})")


def require_index(rt: Runtime):
    if rt.index is None:
        raise NoIndex("no index loaded: this server runs encode-only (start it with --index DIR)")
    return rt.index


def require_model(rt: Runtime, name: str | None) -> str:
    """The served model's id; ``name`` (when given) must be it: one process serves one model."""
    served = rt.encoder.spec.model_id
    if name is not None and name != served:
        raise NotFound(f"model {name!r} is not served here; this server serves {served!r}")
    return served


async def _wait_for_disconnect(request: Request) -> None:
    # after the body is read, receive() only returns when the client goes away
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def encode_for(rt: Runtime, request: Request, items: list[TokenizedText], role: Role,
                     output: Output = "vectors") -> EncodeOutcome:
    """Encode through the worker; a client that disconnects first takes its job out of the queue."""
    job = asyncio.ensure_future(rt.batcher.encode(items, role, rt.settings.request_timeout_s, output))
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is cancelled: never leave the job queued
        watcher.cancel()
        gone = not job.done()
        if gone:
            job.cancel()
    if gone:
        rt.metrics.count_rejected("client_disconnected")
        raise ClientGone("the client closed the connection before its texts were encoded")
    return job.result()


# Tokenizing one query takes ~10 µs and 16 short passages ~0.5 ms (MiniLM's tokenizer, this 2-core
# machine): less than a hop to a worker thread and back, which under 32 clients cost 2-40 ms of GIL
# hand-offs (issue 18). Small inputs are tokenized on the event loop, big ones on a thread.
INLINE_TOKENIZE_CHARS = 8192


async def tokenize(rt: Runtime, texts: list[str], role: Role) -> list[TokenizedText]:
    """Token ids for the encoder worker; a full queue is refused (429) before any tokenizing."""
    rt.batcher.check_room(len(texts))
    if sum(len(text) for text in texts) <= INLINE_TOKENIZE_CHARS:
        return rt.encoder.tokenize(texts, role)
    return await run_in_threadpool(rt.encoder.tokenize, texts, role)


async def _in_search_pool(rt: Runtime, fn, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(rt.search_pool, functools.partial(fn, *args, **kwargs))


def _record(request: Request, timing: dict[str, float]) -> dict[str, float]:
    request.state.timing = timing
    return timing


# -- /encode -------------------------------------------------------------------
@dataclass(frozen=True)
class EncodedTexts:
    """One request's texts through tokenizer and worker: rows, token items and stage times."""

    encoded: Encoded | list[SparseVector]
    items: list[TokenizedText]
    timing: dict[str, float]

    @property
    def tokens(self) -> int:
        return sum(item.length for item in self.items)


async def encode_texts(rt: Runtime, request: Request, texts: list[str], role: Role, *,
                       truncate: bool = True, output: Output = "vectors") -> EncodedTexts:
    """The one encode path of every route that returns vectors (``/encode`` and the compatible APIs).

    ``truncate=False`` refuses over-long texts (413) before they reach the worker; ``output="lexical"``
    asks for the lexical vectors, refused (422) for models without one."""
    require_ready(rt)
    if output == "lexical" and not rt.encoder.has_lexical:
        raise InvalidRequest(f"the served model ({rt.encoder.spec.kind!r}) is dense-only: it has no lexical "
                             "vector over the vocabulary; use /embed")
    started = time.perf_counter()
    items = await tokenize(rt, texts, role)
    tokenized = time.perf_counter()
    if not truncate:
        _refuse_truncated(rt, items, role)
    outcome = await encode_for(rt, request, items, role, output)
    timing = _record(request, {"queue_ms": round(outcome.queue_ms, 3), "tokenize_ms": _ms(tokenized - started),
                               "encode_ms": round(outcome.encode_ms, 3), "total_ms": _ms(time.perf_counter() - started)})
    return EncodedTexts(outcome.encoded, items, timing)


def _refuse_truncated(rt: Runtime, items: list[TokenizedText], role: Role) -> None:
    cut = [i for i, item in enumerate(items) if item.truncated]
    if cut:
        limit = rt.encoder.spec.max_length(role)
        raise PayloadTooLarge(f"input {cut[0]} is longer than the {role} limit of {limit} tokens "
                              "(send truncate=true to cut it to the limit)")


async def encode(rt: Runtime, request: Request, texts: list[str], role: Role) -> dict:
    done = await encode_texts(rt, request, texts, role)
    encoded, spec = done.encoded, rt.encoder.spec
    return {
        "vectors": encoded.values.tolist(),
        "gates": None if encoded.gates is None else encoded.gates.tolist(),
        "dim": spec.dim, "gated_dim": spec.gated_dim, "kind": spec.kind, "role": role,
        "truncated": [item.truncated for item in done.items],
        "timing": done.timing,
    }


# -- rerank (the TEI and Cohere routes) -----------------------------------------
def served_lambda(rt: Runtime) -> float:
    """λ of the query's dense part: the served index's, else the model's."""
    return float(rt.index.lam) if rt.index is not None else float(rt.encoder.spec.lam)


def _score_passages(query: Encoded, passages: Encoded, gated_dim: int, lam: float) -> np.ndarray:
    from densehybrid.index import gip

    xq = gip.scale_queries(query.values, gated_dim, lam)
    return gip.exhaustive(xq, query.gates, passages.values, passages.gates)[0]


async def rerank(rt: Runtime, request: Request, query: str, texts: list[str], *, truncate: bool = True) -> np.ndarray:
    """Scores of ``texts`` (as passages) for ``query``, with the served model's own score: the gated inner
    product for kinds with gates, the inner product otherwise (the index's scores for the same pair)."""
    started = time.perf_counter()
    asked = await encode_texts(rt, request, [query], "query", truncate=truncate)
    passages = await encode_texts(rt, request, texts, "passage", truncate=truncate)
    scoring = time.perf_counter()
    scores = await _in_search_pool(rt, _score_passages, asked.encoded, passages.encoded,
                                   rt.encoder.spec.gated_dim, served_lambda(rt))
    stages = ("queue_ms", "tokenize_ms", "encode_ms")
    _record(request, {**{s: round(asked.timing[s] + passages.timing[s], 3) for s in stages},
                      "score_ms": _ms(time.perf_counter() - scoring), "total_ms": _ms(time.perf_counter() - started)})
    return scores


# -- /search -------------------------------------------------------------------
def _explanation(rt: Runtime, query: Encoded, row: int, lam: float) -> dict:
    from densehybrid.index.explain import explain

    source, local_row = rt.index.locate(row)  # a base row, or a row written since (index.live)
    found = explain(query, source, local_row, lam=lam, vocab_size=rt.encoder.spec.vocab_size or 0)
    terms = [{"token_id": t.token_id, "term": rt.encoder.term(t.token_id), "query_weight": t.query_weight,
              "passage_weight": t.passage_weight, "contribution": t.contribution}
             for t in found.terms[:rt.settings.max_explain_terms]]
    return {"terms": terms, "lexical": float(found.lexical), "semantic": float(found.semantic),
            "total": float(found.total)}


def _check_explain_cost(rt: Runtime, queries: int, k: int) -> None:
    limit = rt.settings.max_explain_hits
    if queries * k > limit:
        raise InvalidRequest(f"explain=true for {queries} x {k} hits is over the limit of {limit} "
                             "explained hits per request (max_explain_hits): lower k or send fewer queries")


def _check_text_size(rt: Runtime, returned_bytes: int) -> None:
    limit = rt.settings.max_return_text_bytes
    if returned_bytes > limit:
        raise PayloadTooLarge(f"return_text would send over the limit of {limit} bytes of text "
                              "(max_return_text_bytes): lower k or leave return_text off")


def _hits(rt: Runtime, body, encoded: Encoded, found, lam: float) -> list[list[dict]]:
    """Search results -> one hit list per query, with text and explanations when asked."""
    per_query, text_bytes = [], 0
    for q, (ids, scores, rows) in enumerate(zip(found.ids, found.scores, found.rows)):
        hits = [{"id": str(doc_id), "score": float(score), "rank": rank}
                for rank, (doc_id, score) in enumerate(zip(ids, scores), start=1)]
        if body.return_text:
            for hit, doc in zip(hits, rt.index.docs.get_many([h["id"] for h in hits])):
                hit.update(title=doc.title if doc else None, text=doc.text if doc else None)
                text_bytes += len((hit["title"] or "").encode()) + len((hit["text"] or "").encode())
            _check_text_size(rt, text_bytes)
        if body.explain:
            for hit, row in zip(hits, rows):
                hit["explanation"] = _explanation(rt, encoded[q:q + 1], int(row), lam)
        per_query.append(hits)
    return per_query


async def search(rt: Runtime, request: Request, body) -> dict:
    index = require_index(rt)
    require_ready(rt)
    started = time.perf_counter()
    texts = [body.query] if body.query is not None else list(body.queries)
    k = min(body.k, index.count)
    if body.explain:
        _check_explain_cost(rt, len(texts), k)
    items = await tokenize(rt, texts, "query")
    outcome = await encode_for(rt, request, items, "query")
    candidates = min(max(body.candidates, k), index.count)
    lam = index.lam if body.lam is None else body.lam
    if k == 0:
        per_query, search_ms, rerank_ms = [[] for _ in texts], 0.0, 0.0
    else:
        params = SearchParams(k, body.first_stage, candidates, body.theta, body.rerank, body.lam, body.fusion)
        try:
            found = await rt.search_batcher.search(outcome.encoded, params)
        except SearchError as exc:
            raise InvalidRequest(str(exc)) from exc
        except MilvusUnavailableError as exc:
            rt.store_health.lost()
            raise StoreUnavailable(str(exc), rt.settings.retry_after_s) from exc
        except Exception as exc:  # noqa: BLE001 - reported as a JSON 500, the server keeps serving
            raise SearchFailed(f"search failed: {type(exc).__name__}: {exc}") from exc
        search_ms, rerank_ms = found.search_ms, found.rerank_ms
        rt.metrics.observe_search(body.first_stage, search_ms / 1000, rerank_ms / 1000 if rerank_ms else None)
        if body.return_text or body.explain:  # reads documents or scores terms: off the event loop
            per_query = await _in_search_pool(rt, _hits, rt, body, outcome.encoded, found, lam)
        else:
            per_query = _hits(rt, body, outcome.encoded, found, lam)
    timing = _record(request, {"queue_ms": round(outcome.queue_ms, 3), "encode_ms": round(outcome.encode_ms, 3),
                               "search_ms": round(search_ms, 3), "rerank_ms": round(rerank_ms, 3),
                               "total_ms": _ms(time.perf_counter() - started)})
    return {"results": per_query[0] if body.query is not None else per_query, "timing": timing,
            "index": {"name": index.name, "documents": index.count, "kind": rt.encoder.spec.kind}}


# -- /explain ------------------------------------------------------------------
async def explain(rt: Runtime, request: Request, body) -> dict:
    index = require_index(rt)
    require_ready(rt)
    started = time.perf_counter()
    row = index.row_of(body.id)
    if row is None:
        raise NotFound(f"no document with id {body.id!r} in index {index.name!r}")
    items = await tokenize(rt, [body.query], "query")
    outcome = await encode_for(rt, request, items, "query")
    lam = index.lam if body.lam is None else body.lam
    explain_started = time.perf_counter()
    found = await _in_search_pool(rt, _explanation, rt, outcome.encoded, row, lam)
    timing = _record(request, {"queue_ms": round(outcome.queue_ms, 3), "encode_ms": round(outcome.encode_ms, 3),
                               "explain_ms": _ms(time.perf_counter() - explain_started),
                               "total_ms": _ms(time.perf_counter() - started)})
    return {"id": body.id, **found, "timing": timing}


# -- /info ---------------------------------------------------------------------
def info(rt: Runtime) -> dict:
    spec, index, s = rt.encoder.spec, rt.index, rt.settings
    return {
        "model": {"model_id": spec.model_id, "dense_model_id": spec.dense_model_id, "kind": spec.kind,
                  "dim": spec.dim, "gated_dim": spec.gated_dim, "lam": spec.lam, "skip_mlm": spec.skip_mlm,
                  "device": rt.encoder.device, "backend": rt.encoder.backend, "max_query_length": spec.max_query_length,
                  "max_passage_length": spec.max_passage_length, "truncation": TRUNCATION_NOTE},
        "index": None if index is None else {"name": index.name, "documents": index.count,
                                             "dim": spec.dim, "lam": float(index.lam)},
        "search_lambda": None if index is None else float(index.lam),
        "limits": {"max_k": s.max_k, "max_candidates": s.max_candidates, "max_request_texts": s.max_request_texts,
                   "max_body_bytes": s.max_body_bytes, "max_batch_size": s.max_batch_size,
                   "max_explain_hits": s.max_explain_hits, "max_explain_terms": s.max_explain_terms,
                   "max_return_text_bytes": s.max_return_text_bytes,
                   "queue_size": s.queue_size},
        "ready": rt.ready,
        # text-embeddings-inference's top-level fields, for TEI clients
        "model_id": spec.model_id, "max_input_length": spec.max_passage_length,
        "max_client_batch_size": s.max_request_texts, "max_batch_tokens": s.max_batch_tokens,
    }

