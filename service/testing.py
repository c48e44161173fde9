"""A live server on a free loopback port, in a thread: for tests, benchmarks and the demo.

    with LiveServer(create_app(settings, encoder=FakeEncoder())) as server:
        httpx.get(server.url + "/ready")
"""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


class LiveServer:
    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, ready_timeout_s: float = 30.0):
        self.app = app
        self.ready_timeout_s = ready_timeout_s
        config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
                                timeout_graceful_shutdown=10)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="densehybrid-live-server", daemon=True)
        self.url = ""

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the live server did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        runtime = self.app.state.runtime
        while not runtime.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
