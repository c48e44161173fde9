"""SIGTERM to a live ``densehybrid serve`` running as PID 1: in-flight requests finish, exit code 0.

``docker stop`` and a Compose scale-down send SIGTERM to the container's PID 1
(the server, exec-form ENTRYPOINT), then SIGKILL after the grace period
(``stop_grace_period: 40s`` in docker-compose.yml). The test reproduces that:
the server runs as PID 1 of a new PID namespace (``unshare --pid --fork``, as root, which CI is) and gets
SIGTERM from outside it, as from the container runtime. PID 1 matters for the
exit code: uvicorn drains, then re-raises the signal it caught; the kernel drops
a default-action signal that PID 1 sends itself, so the process exits 0 (a
non-PID-1 server ends "killed by SIGTERM" instead, 143 in a shell).

The request is made slow with a real batching knob: with ``--max-wait-ms 1000``
a lone request waits up to a second for company in the encoder queue, so it is
provably in flight when the signal lands.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from densehybrid.bench.servers.start import free_port, stop_process

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.realmodel


def can_be_pid1() -> bool:
    """Whether ``unshare`` may create a PID namespace here (root, or user namespaces allowed)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "--pid", "--fork", "--kill-child", "sh", "-c", "test $$ -eq 1"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def child_of(parent: int, timeout_s: float = 10.0) -> int:
    """The pid (in our namespace) of ``parent``'s only child: the server behind ``unshare --fork``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                return int(stat.parent.name)
        time.sleep(0.05)
    raise AssertionError(f"process {parent} has no child")


def wait_until(predicate, timeout_s: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}) while waiting for {what}")
        try:
            if predicate():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def queued_texts(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("densehybrid_queue_depth "):
            return float(line.split()[1])
    return 0.0


def start_server_as_pid1(port: int, log_path: Path) -> subprocess.Popen:
    """``unshare`` (the returned process) forks the server as PID 1 of a new PID namespace and exits with its code."""
    cmd = ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "densehybrid", "serve", "--model", "splade-tiny", "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port), "--max-wait-ms", "1000", "--log-plain"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_sigterm_to_pid1_lets_the_in_flight_request_finish_then_exits_0(splade_tiny_dir, tmp_path):
    if not can_be_pid1():
        pytest.fail("cannot create a PID namespace here (unshare needs root): run the tests as root, as CI does",
                    pytrace=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    proc = start_server_as_pid1(port, log_path)
    try:
        server_pid = child_of(proc.pid)
        wait_until(lambda: httpx.get(url + "/ready", timeout=2).status_code == 200, 180, "/ready", proc)
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(httpx.post, url + "/encode", json={"texts": ["a slow request"], "role": "query"},
                                    timeout=30)
            wait_until(lambda: queued_texts(url) >= 1, 10, "the request to reach the encoder queue", proc)
            signalled = time.monotonic()
            os.kill(server_pid, signal.SIGTERM)  # from outside its namespace, like the container runtime
            response = in_flight.result(timeout=30)
        assert response.status_code == 200, response.text
        assert len(response.json()["vectors"]) == 1
        assert proc.wait(timeout=30) == 0, log_path.read_text()
        assert time.monotonic() - signalled < 30  # drained, not killed at the grace limit
        with pytest.raises(httpx.TransportError):  # and it no longer listens
            httpx.get(url + "/health", timeout=2)
    finally:
        stop_process(proc, timeout_s=10)
    log = log_path.read_text()
    assert "Application shutdown complete" in log and "Traceback" not in log, log
