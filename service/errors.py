"""One exception hierarchy for the service and one mapping to HTTP (docs/http-api.md).

Every error leaves as ``{"error": {"type": ..., "message": ...}}`` with its
status; 429 adds ``Retry-After``. The OpenAI-compatible routes (``/v1/embeddings``,
``/v1/models``) answer in OpenAI's shape ``{"error": {"message", "type", "code"}}``
so that its SDKs raise their own typed errors. Handlers raise :class:`ServiceError`
subclasses; validation errors of FastAPI and routing errors of Starlette are
mapped here too, so that no other module decides a status code.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from densehybrid.index.errors import MilvusUnavailableError

log = logging.getLogger(__name__)

# request-size limits live in the schemas as max_length; exceeding them is a 413, not a 422
_SIZE_LIMITED_FIELDS = {("body", "queries"), ("body", "texts"), ("body", "input"), ("body", "inputs"),
                        ("body", "documents")}
OPENAI_PATHS = ("/v1/embeddings", "/v1/models")


class ServiceError(Exception):
    status = 500
    type = "internal_error"
    headers: dict[str, str] = {}

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidRequest(ServiceError):
    status, type = 422, "invalid_request"


class PayloadTooLarge(ServiceError):
    status, type = 413, "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status, type = 415, "unsupported_media_type"


class MethodNotAllowed(ServiceError):
    status, type = 405, "method_not_allowed"

    def __init__(self, message: str, allow: list[str]):
        super().__init__(message)
        self.headers = {"Allow": ", ".join(allow)}


class Unauthorized(ServiceError):
    status, type = 401, "unauthorized"
    headers = {"WWW-Authenticate": "Bearer"}


class NotFound(ServiceError):
    status, type = 404, "not_found"


class _RetryLater(ServiceError):
    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}


class QueueFull(_RetryLater):
    status, type = 429, "overloaded"


class NotReady(ServiceError):
    """Model or index not loaded (yet), or the service is shutting down."""

    status, type = 503, "not_ready"


class StoreUnavailable(_RetryLater):
    """The remote vector store (Milvus) cannot be reached; the service recovers when it is back."""

    status, type = 503, "store_unavailable"


class NoIndex(ServiceError):
    status, type = 503, "no_index"


class RequestTimeout(ServiceError):
    """No answer within ``request_timeout_s``: the encoder or the search threads are overloaded."""

    status, type = 503, "timeout"


class EncoderFailed(ServiceError):
    """The forward pass of this request's batch raised; other batches are unaffected."""

    status, type = 500, "encoder_error"


class ClientGone(ServiceError):
    """The client disconnected while waiting; nobody reads this answer (nginx's 499 in the logs)."""

    status, type = 499, "client_closed_request"


class InsufficientStorage(ServiceError):
    """The disk is full: the change was not logged, so it was not applied."""

    status, type = 507, "insufficient_storage"


class WritesDisabled(ServiceError):
    status, type = 403, "writes_disabled"


class SearchFailed(ServiceError):
    status, type = 500, "search_error"


class WriteFailed(ServiceError):
    """The change could not be logged (other than a full disk), so it was not applied."""

    status, type = 500, "write_error"


def search_error(exc: Exception, retry_after_s: int = 1) -> ServiceError:
    """What a failed search stage tells the client: its own fault (422), the store's (503) or ours (500)."""
    from densehybrid.index.search.searcher import SearchError

    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, SearchError):
        return InvalidRequest(str(exc))
    if isinstance(exc, MilvusUnavailableError):
        return StoreUnavailable(str(exc), retry_after_s)
    return SearchFailed(f"search failed: {type(exc).__name__}: {exc}")


def error_body(error_type: str, message: str, status: int = 500, path: str = "") -> dict:
    if path.startswith(OPENAI_PATHS):
        # OpenAI's families of `type`; our finer type goes to `code`
        family = "server_error" if status >= 500 else "invalid_request_error"
        return {"error": {"message": message, "type": family, "code": error_type}}
    return {"error": {"type": error_type, "message": message}}


def service_error_response(exc: ServiceError, path: str = "") -> JSONResponse:
    return JSONResponse(error_body(exc.type, exc.message, exc.status, path), status_code=exc.status,
                        headers=exc.headers)


# pydantic's wording for these names a regex or a parser; the client needs to know what to send instead
_PLAIN_MESSAGES = {
    "string_pattern_mismatch": "is blank; send text with at least one non-whitespace character",
    "string_too_short": "is empty; send text with at least one non-whitespace character",
    "missing": "is missing; send it in the JSON object",
}


_SEND_JSON = 'send one JSON object, e.g. {"query": "what is a dense retriever", "k": 10}'


def _body_message(err: dict) -> str | None:
    """The sentence for a body that is not a JSON object at all (empty or malformed), else None."""
    loc = tuple(err.get("loc", ()))
    if err.get("type") == "missing" and loc == ("body",):
        return f"the body is empty: {_SEND_JSON}"
    if err.get("type") == "json_invalid":
        where = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        return f"the body is not valid JSON{where}: {_SEND_JSON}"
    return None


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    for err in errors:
        if (message := _body_message(err)) is not None:
            return message
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {_PLAIN_MESSAGES.get(err.get('type'), err.get('msg', 'invalid'))}")
    return "; ".join(parts)


def validation_error_response(exc: RequestValidationError, path: str = "") -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") in ("too_long", "string_too_long") and tuple(e.get("loc", ()))[:2] in _SIZE_LIMITED_FIELDS
           for e in errors):
        return service_error_response(PayloadTooLarge(_validation_message(exc)), path)
    return service_error_response(InvalidRequest(_validation_message(exc)), path)


def http_error_response(exc: StarletteHTTPException, path: str = "") -> JSONResponse:
    if exc.status_code == 400:  # FastAPI's "error parsing the body" (e.g. invalid UTF-8): a malformed request
        return service_error_response(InvalidRequest(f"malformed request body: {exc.detail}"), path)
    kinds = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large", 400: "bad_request"}
    body = error_body(kinds.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code, path)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def error_response(exc: Exception, path: str = "") -> JSONResponse:
    """The one answer to any exception a request raised."""
    if isinstance(exc, ServiceError):
        if exc.status >= 500:
            log.warning("request failed: %s: %s", exc.type, exc.message)
        return service_error_response(exc, path)
    if isinstance(exc, RequestValidationError):
        return validation_error_response(exc, path)
    if isinstance(exc, StarletteHTTPException):
        return http_error_response(exc, path)
    if isinstance(exc, MilvusUnavailableError):
        log.warning("vector store unreachable: %s", exc)
        return service_error_response(StoreUnavailable(str(exc)), path)
    log.exception("unhandled error", exc_info=exc)
    return service_error_response(ServiceError("internal error"), path)


def install_error_handlers(app: FastAPI) -> None:
    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, request.url.path)

    for handled in (ServiceError, RequestValidationError, StarletteHTTPException, MilvusUnavailableError, Exception):
        app.add_exception_handler(handled, on_error)
