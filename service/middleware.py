"""The HTTP edge of every request: request id, API key, body limit, Server-Timing, metrics, access log, trace.

A plain ASGI middleware so that it sees every response, errors included, and
can refuse a body before it is read: a ``Content-Length`` over the limit is
answered 413 at once, and a chunked body is counted as it streams.
"""

from __future__ import annotations

import hmac
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence

from fastapi import HTTPException
from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from densehybrid.service import logging as service_logging
from densehybrid.service.errors import (MethodNotAllowed, PayloadTooLarge, Unauthorized, UnsupportedMediaType,
                                        service_error_response)
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.tracing import Tracing

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
WRITE_PATH = "/documents"
_ALLOWED_CACHE_SIZE = 4096
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def server_timing(timing: dict[str, float]) -> str:
    """``{"queue_ms": 0.4, ...}`` -> ``queue;dur=0.4, ...`` (W3C Server-Timing)."""
    return ", ".join(f"{name.removesuffix('_ms')};dur={value:g}" for name, value in timing.items())


def request_id_from(headers: Headers) -> str:
    """The client's X-Request-ID when it is a sane token, else a fresh one."""
    sent = headers.get("x-request-id", "")
    return sent if _REQUEST_ID.match(sent) else uuid.uuid4().hex


def _route_label(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def is_write(method: str, path: str) -> bool:
    """Requests that change the index (reading a document is a read)."""
    return method in ("POST", "DELETE", "PUT", "PATCH") and (path == WRITE_PATH or path.startswith(WRITE_PATH + "/"))


def _is_cors_preflight(scope: Scope, headers: Headers) -> bool:
    """Browsers send CORS preflights without credentials; they run no handler (CORS answers or 405)."""
    return scope["method"] == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers


def _leaf_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes themselves, with included routers opened up (FastAPI wraps them in one route each)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner.routes)
        else:
            yield route


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str] | None:
    """The methods the routes at this path accept, when none accepts this request's method; else None.

    None also when no route has the path (the router answers 404). Routes sharing a path (a GET page
    and a POST API at ``/``) each contribute their methods, so ``Allow`` lists them all."""
    if any(route.matches(scope)[0] == Match.FULL for route in routes):
        return None
    methods = {method for route in _leaf_routes(routes) if route.matches(scope)[0] == Match.PARTIAL
               for method in getattr(route, "methods", None) or ()}
    return sorted(methods) or None


def _is_json(content_type: str) -> bool:
    """application/json, or any application/*+json, with or without parameters (charset)."""
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


class ServiceMiddleware:
    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics, api_key: str | None, max_body_bytes: int,
                 write_api_key: str | None = None, routes: Sequence[BaseRoute] = (), tracing: Tracing | None = None):
        self.app = app
        self.tracing = tracing  # None: tracing off, no span of any kind
        self.routes = routes  # the app's route list, complete once the app serves
        self._allowed: dict[tuple[str, str], list[str] | None] = {}  # (method, path) -> allowed_methods
        self.metrics = metrics
        self.api_key = api_key.encode() if api_key else None
        # writes need a key whenever any is configured: the write key if set, else the API key
        self.write_api_key = write_api_key.encode() if write_api_key else self.api_key
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = Headers(scope=scope)
        request_id = request_id_from(headers)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        trace = self.tracing.begin(headers, started) if self.tracing is not None else None
        if trace is not None:
            state["trace"] = trace
        status = 500

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                out = MutableHeaders(scope=message)
                out["x-request-id"] = request_id
                # the stage times a handler recorded, else at least the total so far
                timing = state.get("timing") or {"total_ms": round((time.perf_counter() - started) * 1000, 3)}
                out["server-timing"] = server_timing(timing)
                if trace is not None:
                    trace.responded = time.perf_counter()
            await send(message)

        try:
            refusal = self._refusal(scope, headers)
            if refusal is not None:
                await service_error_response(refusal, scope["path"])(scope, receive, send_with_headers)
            else:
                await self.app(scope, self._limited(receive), send_with_headers)
        finally:
            route = _route_label(scope)
            elapsed = time.perf_counter() - started
            self.metrics.observe_request(route, status, elapsed)
            service_logging.log_request(request_id=request_id, method=scope["method"], route=route,
                                        path=scope["path"], status=status, duration_ms=elapsed * 1000,
                                        timing=state.get("timing"))
            if trace is not None:
                self.tracing.finish(trace, method=scope["method"], route=route, path=scope["path"], status=status,
                                    request_id=request_id, ended=started + elapsed)

    def _refusal(self, scope: Scope, headers: Headers):
        """An error to answer instead of running the app, or None."""
        key = self.write_api_key if is_write(scope["method"], scope["path"]) else self.api_key
        if (key is not None and scope["path"] not in OPEN_PATHS and not _is_cors_preflight(scope, headers)
                and not self._authorized(headers, key)):
            self.metrics.count_rejected("unauthorized")
            return Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")
        # routing before the body checks: a method the path does not take is a 405, whatever the body
        allow = None if _is_cors_preflight(scope, headers) else self._allowed_methods(scope)
        if allow is not None:
            return MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; use {', '.join(allow)}",
                                    allow)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            self.metrics.count_rejected("body_too_large")
            return PayloadTooLarge(f"request body over the limit of {self.max_body_bytes} bytes")
        if scope["method"] == "POST" and not _is_json(headers.get("content-type", "")):
            self.metrics.count_rejected("unsupported_media_type")
            return UnsupportedMediaType("every POST body is JSON: send it with 'Content-Type: application/json' "
                                        "(curl: -H 'Content-Type: application/json')")
        return None

    def _allowed_methods(self, scope: Scope) -> list[str] | None:
        """:func:`allowed_methods`, remembered per method and path (matching every route costs ~70 us)."""
        key = (scope["method"], scope["path"])
        if key not in self._allowed:
            if len(self._allowed) >= _ALLOWED_CACHE_SIZE:  # paths come from clients: keep the memory bounded
                self._allowed.clear()
            self._allowed[key] = allowed_methods(self.routes, scope)
        return self._allowed[key]

    @staticmethod
    def _authorized(headers: Headers, key: bytes) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that stops a streamed body once it passes the limit."""
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    self.metrics.count_rejected("body_too_large")
                    raise HTTPException(413, f"request body over the limit of {self.max_body_bytes} bytes")
            return message

        return limited_receive
