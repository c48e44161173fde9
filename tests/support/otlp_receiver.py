"""A real OTLP/HTTP traces receiver: an HTTP server that decodes what an exporter POSTs to ``/v1/traces``.

It parses the protobuf ``ExportTraceServiceRequest`` (opentelemetry-proto's generated classes, the
schema the Collector uses), answers with an ``ExportTraceServiceResponse`` as the Collector does, and
keeps every span with its resource's attributes. No Collector build exists on Debian or PyPI; this is
the receiving half of one, enough to check what the service sends.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PROTOBUF = "application/x-protobuf"


def _value(any_value: AnyValue):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return None if kind is None else getattr(any_value, kind)


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict
    status_code: int

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` listens on a free loopback port; ``receiver.url`` is its base URL."""

    def __init__(self):
        self.spans: list[ReceivedSpan] = []
        self.requests: list[dict] = []  # path, content type and encoding of each POST
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def _store(self, body: bytes) -> None:
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        spans = []
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ReceivedSpan(span.name, span.trace_id.hex(), span.span_id.hex(),
                                              span.parent_span_id.hex(), span.kind, span.start_time_unix_nano,
                                              span.end_time_unix_nano, _attributes(span.attributes), resource,
                                              span.status.code))
        with self._lock:
            self.spans.extend(spans)

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                encoding = self.headers.get("content-encoding", "")
                with receiver._lock:
                    receiver.requests.append({"path": self.path, "content_type": self.headers.get("content-type"),
                                              "encoding": encoding})
                if self.path != "/v1/traces" or self.headers.get("content-type") != PROTOBUF:
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                try:
                    receiver._store(body)
                except Exception:  # noqa: BLE001 - a body that is not an export request
                    self.send_error(400)
                    return
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", PROTOBUF)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        return Handler
