"""The routes of the HTTP API (docs/http-api.md). Each validates with its schema, calls one handler and returns."""

import time

from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_core import to_json

from densehybrid.service import documents, handlers
from densehybrid.service.metrics import CONTENT_TYPE
from densehybrid.service.runtime import Runtime
from densehybrid.service.responses import (EncodeResponse, ErrorBody, ExplainResponse, Health, Info, Ready,
                                           RecallResponse, SearchResponse, StoredDocument, WriteResult)
from densehybrid.service.recall_route import measure_recall
from densehybrid.service.recall_schema import recall_request_model
from densehybrid.service.schemas import documents_request_model, request_models

_ERROR_TEXTS = {
    401: "missing or wrong API key",
    413: "body or batch over the limits, or a text over the max length with truncation off",
    415: "body not sent as Content-Type: application/json",
    422: "malformed or out-of-range fields",
    429: "encoder queue full; see Retry-After",
    500: "encoding or search failed for this request",
    503: "not ready, no index loaded, or timed out",
}
_UNKNOWN_ID = {404: "unknown document id"}
_WRITES = {403: "writes are off on this server", 507: "disk full: the change was not applied"}


def error_responses(body: type[BaseModel] = ErrorBody, more: dict[int, str] | None = None) -> dict:
    """The documented error statuses, with ``body`` as their schema, plus ``more`` ({status: description})."""
    return {status: {"model": body, "description": text} for status, text in (_ERROR_TEXTS | (more or {})).items()}


_ERRORS = error_responses()


def json_response(body: dict, request: Request, *, exclude_none: bool = False) -> Response:
    """A handler's already-typed answer as JSON, bypassing response_model (which then only documents it).

    The time it takes joins the request's stage times as ``serialize_ms`` (in the Server-Timing header:
    the body is already written)."""
    started = time.perf_counter()
    content = to_json(body, exclude_none=exclude_none)
    timing = getattr(request.state, "timing", None)
    if timing is not None:
        timing["serialize_ms"] = round((time.perf_counter() - started) * 1000, 3)
    return Response(content, media_type="application/json")


def build_router(runtime: Runtime) -> APIRouter:
    field_types = runtime.index.field_types if runtime.index is not None else {}
    models = request_models(runtime.settings.limits, handlers.served_prompts(runtime), field_types)
    SearchRequest, EncodeRequest, ExplainRequest = models.search, models.encode, models.explain
    router = APIRouter()

    @router.post("/search", response_model=SearchResponse, responses=_ERRORS, tags=["retrieval"],
                 response_model_exclude_none=True)
    async def search(request: Request, body: SearchRequest = Body()) -> dict:  # type: ignore[valid-type]
        """Top-k documents for a query (or a batch of queries), with the time of each stage."""
        return json_response(await handlers.search(runtime, request, body), request, exclude_none=True)

    @router.post("/encode", response_model=EncodeResponse, responses=_ERRORS, tags=["retrieval"])
    async def encode(request: Request, body: EncodeRequest = Body()) -> dict:  # type: ignore[valid-type]
        """Vectors (and gates) of texts, as the index stores them (the dense part unscaled)."""
        # serialized in Rust, skipping FastAPI's per-float re-validation: that walk held the event loop
        # long enough to cap throughput under many clients (docs/performance.md, "What each change measured")
        options = handlers.request_text_options(runtime, body.role, body)
        return json_response(await handlers.encode(runtime, request, body.texts, body.role, options), request)

    @router.post("/explain", response_model=ExplainResponse, responses=error_responses(more=_UNKNOWN_ID),
                 tags=["retrieval"])
    async def explain(request: Request, body: ExplainRequest = Body()) -> dict:  # type: ignore[valid-type]
        """Matched terms of a query and a document, and the lexical/semantic split of its score."""
        return await handlers.explain(runtime, request, body)

    RecallRequest = recall_request_model(SearchRequest, runtime.settings.limits)

    @router.post("/recall", response_model=RecallResponse, responses=_ERRORS, tags=["ops"],
                 response_model_exclude_none=True)
    async def recall(request: Request, body: RecallRequest = Body()) -> dict:  # type: ignore[valid-type]
        """Recall@10 of the first stage on given queries (or sampled rows), with a filter and a breadth, against an
        exact scan of the same rows; needs the API key when one is configured."""
        return await measure_recall(runtime, request, body)

    DocumentsRequest = documents_request_model(runtime.settings.limits, field_types)

    @router.post("/documents", response_model=WriteResult, responses=error_responses(more=_WRITES), tags=["writes"])
    async def add_documents(request: Request, body: DocumentsRequest = Body()) -> dict:  # type: ignore[valid-type]
        """Add documents (an existing id is replaced); answered once the change is durable in the log."""
        return await documents.add_documents(runtime, request, body)

    @router.get("/documents/{doc_id}", response_model=StoredDocument, responses=error_responses(more=_UNKNOWN_ID),
                tags=["writes"])
    async def get_document(doc_id: str) -> dict:
        """One document as the index holds it now (written ones included)."""
        return await documents.get_document(runtime, doc_id)

    @router.delete("/documents/{doc_id}", response_model=WriteResult,
                   responses=error_responses(more=_WRITES | _UNKNOWN_ID), tags=["writes"])
    async def delete_document(request: Request, doc_id: str) -> dict:
        """Delete one document; answered once the change is durable in the log."""
        return await documents.delete_document(runtime, request, doc_id)

    @router.get("/health", response_model=Health, tags=["ops"])
    async def health() -> dict:
        """The process is alive."""
        return {"status": "ok"}

    @router.get("/ready", response_model=Ready, responses={503: {"model": Ready}}, tags=["ops"])
    async def ready() -> Response:
        """Model (and index) loaded and warmed up."""
        body = {"ready": runtime.ready, "status": runtime.status}
        return JSONResponse(body, status_code=200 if runtime.ready else 503)

    @router.get("/info", response_model=Info, responses={401: _ERRORS[401]}, tags=["ops"])
    async def info() -> dict:
        """What is served: model, kind, dims, device, skip_mlm, max lengths, index size, limits."""
        return handlers.info(runtime)

    @router.get("/metrics", tags=["ops"], response_class=Response,
                responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"}})
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE)

    return router
