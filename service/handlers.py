"""What each route does: check, run the request pipeline, shape the answer.

Routes stay thin and call one function here; the work itself (tokenize,
encode, search, with their times and the threads they run on) is
:class:`service.pipeline.Pipeline`'s. Readiness is read from a flag kept by
:class:`service.health.Health`, never checked on the event loop.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from fastapi import Request

from densehybrid.encoder.base import Direction, Encoded, Role
from densehybrid.encoder.prompts import Prompts, PromptError
from densehybrid.index.search import identifiers
from densehybrid.index.search.params import SearchParams
from densehybrid.index.served.stated_recall import stated
from densehybrid.service import scoring
from densehybrid.service.batcher import Output
from densehybrid.service.errors import (InvalidRequest, NoIndex, NotFound, NotReady, PayloadTooLarge,
                                        StoreUnavailable)
from densehybrid.service.pipeline import EncodedTexts, TextOptions, record
from densehybrid.service.runtime import Runtime
from densehybrid.service.stated import measured_on_traffic, requested_breadth

TRUNCATION_NOTE = ("a text longer than its role's max length (prompt and special tokens included) is truncated to it, "
                   "keeping its first tokens (truncation_direction left: its last), when the request's truncate "
                   "is true or, without one, auto_truncate is on; otherwise it gets 413 naming its token count")


def require_ready(rt: Runtime) -> None:
    if not rt.health.store_ok:
        raise StoreUnavailable(f"the vector store is unreachable ({rt.status}); retry later", rt.settings.retry_after_s)
    if not rt.ready:
        raise NotReady(f"the service is not ready ({rt.status})")


def require_index(rt: Runtime):
    """The served index, once the service is ready for it (:func:`require_ready`)."""
    if rt.index is None:
        raise NoIndex("no index loaded: this server runs encode-only (start it with --index DIR)")
    require_ready(rt)
    return rt.index


def unknown_document(index, doc_id: str) -> NotFound:
    return NotFound(f"no document with id {doc_id!r} in index {index.name!r}")


def require_model(rt: Runtime, name: str | None) -> str:
    """The served model's id; ``name`` (when given) must be it: one process serves one model."""
    served = rt.encoder.spec.model_id
    if name is not None and name != served:
        raise NotFound(f"model {name!r} is not served here; this server serves {served!r}")
    return served


# -- truncation and prompts ------------------------------------------------------------
def served_prompts(rt: Runtime) -> Prompts:
    """The index's prompts (its passages were encoded after them); without an index, the server's own."""
    if rt.index is not None:
        return rt.index.prompts
    return Prompts.of(rt.settings.query_prompt, rt.settings.passage_prompt)


def text_options(rt: Runtime, role: Role, *, truncate: bool | None = None, direction: Direction = "right",
                 prompt_name: str | None = None, search: bool = False) -> TextOptions:
    """A request's truncation (``truncate`` None: the server's auto_truncate) and the prompt of ``role``:
    the one ``prompt_name`` names (422 when the role may not use it), else the role's. A ``search`` always
    uses the index's query prompt, and refuses a ``prompt_name`` that is not it."""
    prompts = served_prompts(rt)
    try:
        prompt = prompts.check_search(prompt_name) if search else prompts.resolve(role, prompt_name)
    except PromptError as exc:
        raise InvalidRequest(str(exc)) from None
    return TextOptions(rt.settings.auto_truncate if truncate is None else truncate, direction.lower(), prompt)


class TextFields(Protocol):
    """The fields of a request body that say how its texts are tokenized."""

    truncate: bool | None
    truncation_direction: Direction | None
    prompt_name: str | None


def request_text_options(rt: Runtime, role: Role, body: TextFields, *, search: bool = False) -> TextOptions:
    """:func:`text_options` from a body's ``truncate``, ``truncation_direction`` and ``prompt_name``."""
    return text_options(rt, role, truncate=body.truncate, direction=body.truncation_direction or "right",
                        prompt_name=body.prompt_name, search=search)


# -- /encode and the compatible APIs ------------------------------------------------
async def encode_texts(rt: Runtime, request: Request, texts: list[str], role: Role,
                       options: TextOptions | None = None, *, output: Output = "vectors") -> EncodedTexts:
    """The one encode path of every route that returns vectors (``/encode`` and the compatible APIs);
    ``options`` None: the server's truncation default and the role's prompt."""
    require_ready(rt)
    options = options or text_options(rt, role)
    done = await rt.pipeline.encode(request, texts, role, options, output=output)
    record(request, done.timing)
    return done


async def encode(rt: Runtime, request: Request, texts: list[str], role: Role,
                 options: TextOptions | None = None) -> dict:
    done = await encode_texts(rt, request, texts, role, options)
    encoded, spec = done.encoded, rt.encoder.spec
    return {
        "vectors": encoded.values.tolist(),
        "gates": None if encoded.gates is None else encoded.gates.tolist(),
        "dim": spec.dim, "gated_dim": spec.gated_dim, "kind": spec.kind, "role": role,
        "truncated": [item.truncated for item in done.items],
        "timing": done.timing,
    }


def served_lambda(rt: Runtime) -> float:
    """λ of the query's dense part: the served index's, else the model's."""
    return float(rt.index.lam) if rt.index is not None else float(rt.encoder.spec.lam)


async def rerank(rt: Runtime, request: Request, query: str, texts: list[str], *, truncate: bool | None = None,
                 direction: Direction = "right") -> np.ndarray:
    """Scores of ``texts`` for ``query`` (the TEI and Cohere rerank routes): the query after the query prompt,
    the texts after the passage prompt, as a search of the index would score them."""
    require_ready(rt)
    return await scoring.score(
        rt.pipeline, request, query, texts, lam=served_lambda(rt),
        query_options=text_options(rt, "query", truncate=truncate, direction=direction),
        passage_options=text_options(rt, "passage", truncate=truncate, direction=direction))


# -- /search -------------------------------------------------------------------
def _explanation(rt: Runtime, query: Encoded, row: int, lam: float) -> dict:
    from densehybrid.index.search.explain import explain

    source, local_row = rt.index.locate(row)  # a base row, or a row written since (index.live)
    found = explain(query, source, local_row, lam=lam, vocab_size=rt.encoder.spec.vocab_size or 0)
    terms = [{"token_id": t.token_id, "term": rt.encoder.term(t.token_id), "query_weight": t.query_weight,
              "passage_weight": t.passage_weight, "contribution": t.contribution}
             for t in found.terms[:rt.settings.max_explain_terms]]
    return {"terms": terms, "lexical": float(found.lexical), "semantic": float(found.semantic),
            "total": float(found.total)}


def _check_text_size(rt: Runtime, returned_bytes: int) -> None:
    limit = rt.settings.max_return_text_bytes
    if returned_bytes > limit:
        raise PayloadTooLarge(f"return_text would send over the limit of {limit} bytes of text "
                              "(max_return_text_bytes): lower k or leave return_text off")


def _hits(rt: Runtime, body, encoded: Encoded, found, lam: float, held: list[list[bool]] | None = None
          ) -> list[list[dict]]:
    """Search results -> one hit list per query, with text and explanations when asked: the first
    ``max_explain_hits`` hits in answer order are explained, the rest are not (:func:`explained_hits`).
    ``held``: per query, which hits hold the query whole (an identifier's holders, ranked first)."""
    per_query, text_bytes = [], 0
    explain_left = rt.settings.max_explain_hits if body.explain else 0
    for q, (ids, scores, rows) in enumerate(zip(found.ids, found.scores, found.rows)):
        hits = [{"id": str(doc_id), "score": float(score), "rank": rank}
                for rank, (doc_id, score) in enumerate(zip(ids, scores), start=body.offset + 1)]
        if found.lexical_scores is not None:
            for hit, lexical, dense in zip(hits, found.lexical_scores[q], found.dense_scores[q]):
                hit.update(lexical_score=lexical, dense_score=dense, fused_score=hit["score"])
        for hit, holds in zip(hits, held[q] if held else ()):
            if holds:
                hit.update(exact_match=True, fused_score=hit["score"] - identifiers.HOLDER_BONUS)
        if body.return_text:
            for hit, doc in zip(hits, rt.index.get_many([h["id"] for h in hits])):
                hit.update(title=doc.title if doc else None, text=doc.text if doc else None)
                text_bytes += len((hit["title"] or "").encode()) + len((hit["text"] or "").encode())
            _check_text_size(rt, text_bytes)
        for hit, row in zip(hits[:explain_left], rows):
            hit["explanation"] = _explanation(rt, encoded[q:q + 1], int(row), lam)
        explain_left -= min(explain_left, len(hits))
        if body.fields:
            for hit, values in zip(hits, rt.index.field_values(rows, body.fields)):
                hit["fields"] = values
        per_query.append(hits)
    return per_query


async def search(rt: Runtime, request: Request, body) -> dict:
    index = require_index(rt)
    texts = [body.query] if body.query is not None else list(body.queries)
    k = min(body.k, max(index.count - body.offset, 0))  # 0: the page is past the last hit
    candidates = min(max(body.candidates, k), index.count)
    lam = index.lam if body.lam is None else body.lam
    breadth, asked = requested_breadth(rt, index.first_stage, body)
    params = SearchParams(k=k, offset=body.offset, first_stage=body.first_stage, candidates=candidates,
                          theta=body.theta, rerank=body.rerank, lam=body.lam, method=body.fusion, rrf_k=body.rrf_k,
                          filter=body.filter, **breadth)
    options = request_text_options(rt, "query", body, search=True)
    holders_first = bool(k) and identifiers.applies(index, params, texts)

    def shape(encoded: Encoded, found) -> list[list[dict]]:
        held = None
        if holders_first:
            found, held = identifiers.holders_first_page(found, texts, rt.index.get_many, body.offset, k)
        return _hits(rt, body, encoded, found, lam, held)

    searched = identifiers.widened(params, index.count) if holders_first else params
    per_query, timing = await rt.pipeline.search(request, texts, searched if k else None, shape, options)
    if per_query is None:
        per_query = [[] for _ in texts]
    answer = {"results": per_query[0] if body.query is not None else per_query, "timing": timing,
              "index": {"name": index.name, "documents": index.count, "kind": rt.encoder.spec.kind,
                        "first_stage": stated(index.first_stage, params, asked)}}
    if body.explain:
        answer["explained"] = explained_hits(rt, per_query)
    return answer


def explained_hits(rt: Runtime, per_query: list[list[dict]]) -> dict:
    """How many hits of an explained search carry an explanation (the first ones, in answer order) and how many
    do not: queries x k may pass max_explain_hits, a product of two fields that JSON Schema cannot bound."""
    limit, hits = rt.settings.max_explain_hits, sum(map(len, per_query))
    return {"hits": min(hits, limit), "unexplained": max(hits - limit, 0), "max_explain_hits": limit}


# -- /explain ------------------------------------------------------------------
async def explain(rt: Runtime, request: Request, body) -> dict:
    index = require_index(rt)
    row = index.row_of(body.id)
    if row is None:
        raise unknown_document(index, body.id)
    lam = index.lam if body.lam is None else body.lam
    found, timing = await rt.pipeline.encode_then(request, [body.query], "explain_ms",
                                                  lambda encoded: _explanation(rt, encoded, row, lam),
                                                  text_options(rt, "query", truncate=body.truncate,
                                                               direction=body.truncation_direction, search=True))
    return {"id": body.id, **found, "timing": timing}


# -- /info ---------------------------------------------------------------------
def info(rt: Runtime) -> dict:
    spec, index, s = rt.encoder.spec, rt.index, rt.settings
    return {
        "model": {"model_id": spec.model_id, "dense_model_id": spec.dense_model_id, "kind": spec.kind,
                  "dim": spec.dim, "gated_dim": spec.gated_dim, "lam": spec.lam, "skip_mlm": spec.skip_mlm,
                  "device": rt.encoder.device, "backend": rt.encoder.backend,
                  "precision": rt.encoder.precision, "max_query_length": spec.max_query_length,
                  "max_passage_length": spec.max_passage_length, "truncation": TRUNCATION_NOTE},
        "index": None if index is None else {"name": index.name, "documents": index.count,
                                             "dim": spec.dim, "lam": float(index.lam), "fields": index.field_types,
                                             "fusion": index.manifest.get("fusion"),
                                             "identifiers_first": identifiers.described(index),
                                             "precision": index.encoded_precision,
                                             "first_stage": index.first_stage | measured_on_traffic(rt)},
        "search_lambda": None if index is None else float(index.lam),
        "limits": {"max_k": s.max_k, "max_candidates": s.max_candidates, "max_ef_search": s.max_ef_search,
                   "max_nprobe": s.max_nprobe,
                   "max_request_texts": s.max_request_texts,
                   "max_body_bytes": s.max_body_bytes, "max_batch_size": s.max_batch_size,
                   "max_explain_hits": s.max_explain_hits, "max_explain_terms": s.max_explain_terms,
                   "max_return_text_bytes": s.max_return_text_bytes,
                   "queue_size": s.queue_size},
        "ready": rt.ready,
        "prompts": served_prompts(rt).to_dict(),
        # text-embeddings-inference's top-level fields, for TEI clients
        "model_id": spec.model_id, "max_input_length": spec.max_passage_length,
        "max_client_batch_size": s.max_request_texts, "max_batch_tokens": s.max_batch_tokens,
        "auto_truncate": s.auto_truncate,
    }

