"""The servers the benchmarks start: a live in-process server, a free loopback port, waiting for a
server process to become ready, and stopping it.

    with LiveServer(create_app(settings, encoder=HashEncoder("dhr"))) as server:
        httpx.get(server.url + "/ready")

Nothing in the service imports this module: it drives servers, it is not on a request's path.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import uvicorn
from fastapi import FastAPI


def free_port(*hosts: str) -> int:
    """A TCP port that is free on every one of ``hosts`` (default: 127.0.0.1) right now."""
    hosts = hosts or ("127.0.0.1",)
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {hosts}")


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout=timeout_s)


class ServerNotReady(RuntimeError):
    """A server process exited, or did not answer its readiness route in time."""


def wait_for_process_ready(url: str, proc: subprocess.Popen, path: str = "/ready", timeout_s: float = 120.0) -> None:
    """Poll ``url + path`` until it answers 200. If ``proc`` exits first (its piped stderr, if any, is in
    the message) or the time runs out, the process is stopped and :class:`ServerNotReady` raised."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
            raise ServerNotReady(f"the server exited with {proc.returncode} before {url}{path} answered" +
                                 (f":\n{err}" if err else ""))
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_process(proc)
    raise ServerNotReady(f"{url}{path} did not answer 200 within {timeout_s:g} s")


class LiveServer:
    """uvicorn in a thread; ``url`` is set once it listens (and, by default, once the app is ready)."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, wait_ready: bool = True,
                 timeout_s: float = 30.0):
        self.app = app
        self.wait_ready = wait_ready
        self.timeout_s = timeout_s
        config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
                                timeout_graceful_shutdown=10)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="densehybrid-live-server", daemon=True)
        self.url = ""

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the live server did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        runtime = self.app.state.runtime
        while self.wait_ready and not runtime.ready:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the live server did not become ready ({runtime.status})")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
