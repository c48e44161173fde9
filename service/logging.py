"""Structured logs: one JSON object per line (DESIGN §6).

Handlers are configured once, at start, by :func:`configure`. Modules log with
``logging.getLogger(__name__)`` and pass structured fields as
``extra={"fields": {...}}``; the access log line of each request carries the
request id, route, status and stage times.
"""

from __future__ import annotations

import json
import logging
import sys
import time

ACCESS_LOGGER = "densehybrid.access"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


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
