"""Starting the server under test, the one way every benchmark does: in this process (:class:`LiveServer`,
uvicorn in a thread: tests and quick runs), or as a child process on a free loopback port
(:func:`start_server` / :func:`server_process`: ``densehybrid serve`` of a real model, or
``servers.hash_server`` over the weightless encoder), ready before it is driven and stopped after.

    with LiveServer(create_app(settings, encoder=HashEncoder("dhr"))) as server:
        httpx.get(server.url + "/ready")
    with server_process(serve_command("--index", str(index))) as (proc, url):
        ...

Nothing in the service imports this module: it drives servers, it is not on a request's path.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

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


def serve_command(*args: str) -> list[str]:
    """``densehybrid serve ARGS`` in this Python, logging warnings only (a later ``--log-level`` in ARGS wins)."""
    return [sys.executable, "-m", "densehybrid", "serve", "--log-level", "WARNING", *args]


def start_server(command: Sequence[str], *, ready_timeout_s: float = 120.0, env: dict | None = None,
                 stdout=None, stderr=None) -> tuple[subprocess.Popen, str]:
    """``command --port P`` on a free loopback port, once it answers ``/ready`` -> (the process, its URL).

    A process that exits first, or is not ready in time, is stopped and :class:`ServerNotReady` raised;
    the caller stops a started one (:func:`stop_process`), or uses :func:`server_process`."""
    port = free_port()
    proc = subprocess.Popen([*command, "--port", str(port)], env=env, stdout=stdout, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    wait_for_process_ready(url, proc, timeout_s=ready_timeout_s)
    return proc, url


@contextlib.contextmanager
def server_process(command: Sequence[str], *, stop_timeout_s: float = 30.0,
                   **start) -> Iterator[tuple[subprocess.Popen, str]]:
    """:func:`start_server` for a ``with`` block: (the process, its URL), stopped when the block ends."""
    proc, url = start_server(command, **start)
    try:
        yield proc, url
    finally:
        stop_process(proc, stop_timeout_s)
