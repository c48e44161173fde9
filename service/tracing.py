"""OpenTelemetry traces of requests, sent over OTLP/HTTP: on only when ``otlp_endpoint`` is set.

Off (the default), nothing of the OpenTelemetry SDK is imported or built: the middleware skips
tracing with one ``None`` check and the pipeline's calls go to :data:`NO_TRACE`, whose methods
do nothing.

On, each HTTP request gets a server span, a child of the caller's span when the request carries a
W3C ``traceparent`` header, with one child span per stage: ``tokenize``, ``queue``, ``encode``,
``first_stage``, ``rerank`` and ``serialize``. The stages run on the event loop, the encoder worker
and the search threads, which already time them; the spans are made afterwards, on the event
loop, from those measured start and end times, so that no worker thread pays for tracing.

The encoder worker and the search batcher serve many requests with one forward and one search
call. Each request gets its own ``encode`` and ``first_stage`` spans carrying the shared call's
times and its size (``densehybrid.batch.texts``, ``densehybrid.search.group_queries``): a request's
trace then shows where its own time went, and agrees with the ``timing`` of its response. A batch
span linked to its requests would instead start one more trace per forward, apart from the traces
of the requests it served.
"""

from __future__ import annotations

import importlib.metadata
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
EXPORT_TIMEOUT_S = 10.0


class TracingUnavailable(RuntimeError):
    """Tracing was asked for but the OpenTelemetry SDK is not installed."""


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: a bare collector URL gets ``/v1/traces``; a URL with a path is used as given."""
    return endpoint.rstrip("/") + TRACES_PATH if urlsplit(endpoint).path in ("", "/") else endpoint


class _NoTrace:
    """What the pipeline records into when the request is not traced: nothing."""

    __slots__ = ()

    def tokenized(self, *args: Any, **kwargs: Any) -> None:
        pass

    def encoded(self, *args: Any, **kwargs: Any) -> None:
        pass

    def searched(self, *args: Any, **kwargs: Any) -> None:
        pass

    def annotate(self, **attributes: Any) -> None:
        pass


NO_TRACE = _NoTrace()


def trace_of(request) -> "RequestTrace | _NoTrace":
    """The request's trace (put in the ASGI scope's state by the middleware), else :data:`NO_TRACE`."""
    return request.scope.get("state", {}).get("trace", NO_TRACE)


class RequestTrace:
    """The stages of one traced request, as measured (``time.perf_counter`` seconds), until the response is sent."""

    __slots__ = ("parent", "started", "epoch_ns", "stages", "attributes", "responded")

    def __init__(self, parent, started: float):
        self.parent = parent  # the caller's context (from traceparent), or an empty one
        self.started = started
        # one reading of both clocks maps the measured times onto the wall clock spans need
        self.epoch_ns = time.time_ns() - int((time.perf_counter() - started) * 1e9)
        self.stages: list[tuple[str, float, float, dict[str, Any]]] = []
        self.attributes: dict[str, Any] = {}
        self.responded: float | None = None

    def ns(self, at: float) -> int:
        return self.epoch_ns + int((at - self.started) * 1e9)

    def stage(self, name: str, start: float, end: float, **attributes: Any) -> None:
        self.stages.append((name, start, end, attributes))

    def annotate(self, **attributes: Any) -> None:
        """Attributes of the request span (``densehybrid.`` is prefixed)."""
        self.attributes.update({f"densehybrid.{key}": value for key, value in attributes.items() if value is not None})

    # -- what the pipeline reports ---------------------------------------------------
    def tokenized(self, start: float, end: float, items) -> None:
        self.stage("tokenize", start, end, **{"densehybrid.texts": len(items),
                                               "densehybrid.tokens": sum(item.length for item in items),
                                               "densehybrid.truncated": sum(bool(item.truncated) for item in items)})

    def encoded(self, submitted: float, outcome, role: str) -> None:
        """``queue`` from the hand-over to the worker to its forward, ``encode`` the forward (shared by the batch)."""
        forward = submitted + outcome.queue_ms / 1000
        self.stage("queue", submitted, forward)
        self.stage("encode", forward, forward + outcome.encode_ms / 1000,
                   **{"densehybrid.role": role, "densehybrid.batch.texts": outcome.batch_texts})

    def searched(self, found, params, index_name: str) -> None:
        """``first_stage`` and ``rerank`` of the (possibly shared) search call of the index ``index_name``."""
        hits = sum(map(len, found.ids))
        end = found.started + found.search_ms / 1000
        self.stage("first_stage", found.started, end, **_present({
            "densehybrid.index": index_name, "densehybrid.first_stage": params.first_stage, "densehybrid.k": params.k,
            "densehybrid.candidates": params.candidates, "densehybrid.fusion": params.method,
            "densehybrid.search.group_queries": found.group_queries}))
        if found.rerank_ms > 0:
            self.stage("rerank", end, end + found.rerank_ms / 1000,
                       **_present({"densehybrid.candidates": params.candidates, "densehybrid.lambda": params.lam}))
        self.annotate(index=index_name, k=params.k, candidates=params.candidates, fusion=params.method, hits=hits)


def _present(attributes: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in attributes.items() if value is not None}


class Tracing:
    """The tracer of one server process: makes each request's spans and hands them to the batch exporter."""

    def __init__(self, provider, propagator):
        from opentelemetry import trace

        self._trace = trace
        self._server = trace.SpanKind.SERVER
        self._error = trace.Status(trace.StatusCode.ERROR)
        self.provider = provider
        self.tracer = provider.get_tracer("densehybrid.service")
        self.propagator = propagator

    def begin(self, headers: Mapping[str, str], started: float) -> RequestTrace:
        return RequestTrace(self.propagator.extract(carrier=headers), started)

    def finish(self, trace: RequestTrace, **request: Any) -> None:
        """Emit the request's span and its stages' (after the response is sent); a failure costs the trace only."""
        try:
            self._emit(trace, **request)
        except Exception:  # noqa: BLE001 - tracing must never fail a request
            log.warning("could not record the trace of a request", exc_info=True)

    def _emit(self, trace: RequestTrace, *, method: str, route: str, path: str, status: int, request_id: str,
              ended: float) -> None:
        span = self.tracer.start_span(
            f"{method} {route}", context=trace.parent, kind=self._server, start_time=trace.ns(trace.started),
            attributes={"http.request.method": method, "http.route": route, "url.path": path,
                        "http.response.status_code": status, "densehybrid.request_id": request_id,
                        **trace.attributes})
        if status >= 500:
            span.set_status(self._error)
        if span.is_recording():
            inside = self._trace.set_span_in_context(span)
            for name, start, end, attributes in trace.stages:
                self.tracer.start_span(name, context=inside, start_time=trace.ns(start),
                                       attributes=attributes).end(end_time=trace.ns(end))
            if trace.stages and trace.responded is not None:
                last = max(end for _, _, end, _ in trace.stages)
                self.tracer.start_span("serialize", context=inside, start_time=trace.ns(last)).end(
                    end_time=trace.ns(max(last, trace.responded)))
        span.end(end_time=trace.ns(ended))

    def shutdown(self) -> None:
        """Send what is queued, then stop the exporter's thread: each export gives up after EXPORT_TIMEOUT_S, the
        whole flush after the SDK's 30 s."""
        self.provider.shutdown()


def configure(endpoint: str | None, service_name: str) -> Tracing | None:
    """The process's tracing, or None when no endpoint is set (nothing of the SDK is imported then)."""
    if endpoint is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise TracingUnavailable(f"--otlp-endpoint needs the OpenTelemetry SDK ({exc.name} is missing): "
                                 "pip install 'densehybrid[otel]'") from exc
    resource = Resource.create({"service.name": service_name, "service.version": _version()})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    # the processor's queue is bounded (2048 spans unless OTEL_BSP_MAX_QUEUE_SIZE says otherwise): when the
    # collector is slow or down, spans are dropped instead of piling up in memory
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint),
                                                                    timeout=EXPORT_TIMEOUT_S)))
    return Tracing(provider, TraceContextTextMapPropagator())


def _version() -> str:
    try:
        return importlib.metadata.version("densehybrid")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
