"""Structured logs: one JSON object per line (docs/configuration.md).

Handlers are configured once, at start, by :func:`configure`. Modules log with
``logging.getLogger(__name__)`` and pass structured fields as
``extra={"fields": {...}}``; the access log line of each request carries the
request id, route, status and stage times.
"""

from __future__ import annotations

import json
import logging
import sys

import pythonjsonlogger.core
import pythonjsonlogger.json

ACCESS_LOGGER = "densehybrid.access"


class JsonFormatter(pythonjsonlogger.json.JsonFormatter):
    """python-json-logger's formatter with the project's keys: ts, level, logger, message, then the
    record's ``fields`` at the top level (request_id, route, status, timing, ...) and ``exception``."""

    def __init__(self):
        super().__init__("%(levelname)s %(name)s %(message)s", timestamp="ts", json_ensure_ascii=False,
                         rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception"},
                         reserved_attrs=[*pythonjsonlogger.core.RESERVED_ATTRS, "fields"])

    def add_fields(self, log_data: dict, record: logging.LogRecord, message_dict: dict) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data["level"] = log_data["level"].lower()
        log_data.update(getattr(record, "fields", None) or {})


class PlainFormatter(logging.Formatter):
    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        return f"{line} {json.dumps(fields, default=str)}" if fields else line


def configure(level: str = "INFO", *, json_lines: bool = True) -> None:
    """Send every logger (uvicorn's included) to stderr in one format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # one line per missing SIMD build otherwise
    # our access line replaces uvicorn's (it has the request id and stage times)
    logging.getLogger("uvicorn.access").disabled = True


def log_request(*, request_id: str, method: str, route: str, path: str, status: int,
                duration_ms: float, timing: dict | None) -> None:
    fields = {"request_id": request_id, "method": method, "route": route, "path": path,
              "status": status, "duration_ms": round(duration_ms, 3)}
    if timing:
        fields["timing"] = timing
    logging.getLogger(ACCESS_LOGGER).info("%s %s %d", method, path, status, extra={"fields": fields})
