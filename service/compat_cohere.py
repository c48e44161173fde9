"""Cohere-compatible rerank: ``POST /v1/rerank`` and ``POST /v2/rerank``.

For the ``cohere`` SDK (``Client`` uses v1, ``ClientV2`` v2). Each document is scored as a passage
against the query with the served model's own score (GIP for kinds with gates, inner product
otherwise); ``relevance_score`` is that raw score, so it is comparable across requests of one model
but not bounded to [0, 1] as Cohere's models' are. ``model``, when given, must be the served one.
``truncate`` and ``truncation_direction`` are extension fields, as on ``/encode``; the query gets the
served query prompt and the documents the passage prompt, as a search of the index would.
"""


import uuid
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from densehybrid.service import handlers
from densehybrid.service.routes import error_responses
from densehybrid.service.runtime import Runtime
from densehybrid.service.schemas import (Direction, JsonBool, PositiveInt, RequestBody, Text, direction_field,
                                         truncate_field)


class DocumentObject(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: Text


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict | None = None


class RerankResponse(BaseModel):
    id: str
    results: list[RerankResult]
    meta: dict


def rerank_request(max_texts: int, version: int) -> type[BaseModel]:
    Documents = Annotated[list[Text | DocumentObject], Field(min_length=1, max_length=max_texts)]

    class CohereRerankRequest(RequestBody):
        model_config = ConfigDict(extra="forbid", title=f"CohereRerankV{version}Request")
        model: str | None = Field(None, description="the served model's id, when given")
        query: Text
        documents: Documents = Field(description=f"up to {max_texts} texts (or objects with a `text` field)")
        top_n: PositiveInt | None = Field(None, description="results to return; default: all")
        return_documents: JsonBool = Field(version == 1, description="include each result's document")
        max_chunks_per_doc: PositiveInt | None = Field(None, description="accepted and ignored (v1)")
        max_tokens_per_doc: PositiveInt | None = Field(None, description="accepted and ignored; the model's "
                                                   "max passage length applies (v2)")
        rank_fields: list[Literal["text"]] | None = Field(None, description="only 'text' is supported")
        truncate: JsonBool | None = truncate_field()
        truncation_direction: Direction = direction_field()

    return CohereRerankRequest


def build_router(runtime: Runtime) -> APIRouter:
    router = APIRouter(tags=["cohere"], responses=error_responses(more={404: "the model is not the served one"}))
    for version in (1, 2):
        router.add_api_route(f"/v{version}/rerank", _rerank_route(runtime, version), methods=["POST"],
                             response_model=RerankResponse, response_model_exclude_none=True,
                             summary=f"Cohere rerank (API v{version})",
                             description="Documents ordered by their score for the query.")
    return router


def _rerank_route(runtime: Runtime, version: int):
    RerankRequest = rerank_request(runtime.settings.max_request_texts, version)

    async def rerank(request: Request, body: RerankRequest = Body()) -> dict:  # type: ignore[valid-type]
        return await rerank_documents(runtime, request, body, version)

    return rerank


async def rerank_documents(rt: Runtime, request: Request, body, version: int) -> dict:
    handlers.require_model(rt, body.model)
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    scores = await handlers.rerank(rt, request, body.query, texts, truncate=body.truncate,
                                   direction=body.truncation_direction)
    order = np.argsort(-scores, kind="stable")[:body.top_n]
    results = [{"index": int(i), "relevance_score": float(scores[i]),
                "document": {"text": texts[i]} if body.return_documents else None} for i in order]
    return {"id": str(uuid.uuid4()), "results": results,
            "meta": {"api_version": {"version": str(version)}, "billed_units": {"search_units": 1}}}
