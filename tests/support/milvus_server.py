"""A real Milvus server for the tests marked ``milvus_server``: a standalone server process, its own etcd
(embedded) and local storage, on loopback ports of its own.

The server is PyPI's ``milvus`` package ("embedded Milvus": the Milvus standalone binary and its config
template). It lives in a virtual environment of its own, created on first use in the user cache like
the infinity peer's (``densehybrid.bench.infinity_peer``), never among this project's dependencies: its
binary is an old server release, outside what the project audits. The tests talk to it with the project's
own client (pymilvus 3), as a deployment would.

This module starts the binary itself (not the package's ``default_server``) so that a test can stop it,
kill it and start it again on the same ports and the same data: what a server restart does to a
service and an export is what the tests marked ``milvus_server`` check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

MILVUS_VERSION = "2.3.5"
REQUIREMENT = f"milvus=={MILVUS_VERSION}"
VENV_ENV = "DENSEHYBRID_MILVUS_SERVER_VENV"  # a prepared environment elsewhere (default: the user cache)
START_TIMEOUT_S = 180.0
GRACEFUL_STOP_S = 10  # Docker's default grace before SIGKILL

# Run by the server environment's python: the package writes milvus.yaml (every port given) and unpacks
# the binary and its libraries into the base directory; prints what to run.
_PREPARE = """
import json, os, sys
import milvus
base, ports = sys.argv[1], json.loads(sys.argv[2])
config = milvus.MilvusServerConfig(data_dir=base, **ports)
config.resolve()
milvus._initialize_data_files(config.base_data_dir)
print(json.dumps({"binary": os.path.join(config.base_data_dir, "bin", "milvus"),
                  "config": os.path.join(config.base_data_dir, "configs", "milvus.yaml")}))
"""


def server_venv(directory: Path | None = None) -> Path:
    """The python of the server's own virtual environment, created on first use."""
    directory = Path(directory or os.environ.get(VENV_ENV) or
                     Path.home() / ".cache" / "densehybrid" / f"milvus-server-{MILVUS_VERSION}")
    python = directory / "bin" / "python"
    marker = directory / f".{REQUIREMENT}"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", REQUIREMENT], check=True)
        marker.touch()
    return python


def _port_keys(python: Path) -> list[str]:
    probe = subprocess.run([str(python), "-c", "import milvus, json; c = milvus.MilvusServerConfig(); "
                            "print(json.dumps(sorted(k for k in c.configurable_items if k.endswith('_port'))))"],
                           check=True, capture_output=True, text=True)
    return json.loads(probe.stdout)


def _etcd_config(path: Path, client_port: int, peer_port: int) -> None:
    """The embedded etcd's own ports (its defaults, 2379 and 2380, would clash with any other etcd here)."""
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    path.write_text(f"name: densehybrid-test\nlisten-client-urls: {client}\nadvertise-client-urls: {client}\n"
                    f"listen-peer-urls: {peer}\ninitial-advertise-peer-urls: {peer}\n"
                    f"initial-cluster: densehybrid-test={peer}\n")


def _edit_config(milvus_yaml: Path, etcd_yaml: Path) -> None:
    """The embedded etcd's config file; the components' own address 127.0.0.1 (by default the machine's first
    address, which they then call each other on); and a SIGTERM stop bounded by the server itself, as an
    orchestrator bounds it (2.3.5 waits up to 1800 s, and its stop does not finish here: its components keep
    retrying the root coordinator that stopped first)."""
    text = milvus_yaml.read_text()
    for old, new, count in (("\netcd:\n", f"\netcd:\n  config:\n    path: {etcd_yaml}\n", 1),
                            ("\n  ip: #", "\n  ip: 127.0.0.1 #", -1),
                            ("gracefulStopTimeout: 1800", f"gracefulStopTimeout: {GRACEFUL_STOP_S}", 1)):
        assert old in text, f"{milvus_yaml}: no {old.strip()!r}"
        text = text.replace(old, new, count)
    milvus_yaml.write_text(text)


class MilvusServer:
    """One Milvus standalone process over ``base`` (its config, data and logs); ``uri`` for the client.

    ``start``, ``stop`` (SIGTERM, as an orchestrator stops it) and ``kill`` (SIGKILL) may be repeated:
    the ports and the data stay, so a restarted server is the same server."""

    def __init__(self, python: Path, base: Path):
        from densehybrid.bench.servers.start import free_port

        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        # the server listens on every interface: a port must be free there, not only on loopback
        ports = {key: free_port("0.0.0.0") for key in _port_keys(python)}
        prepared = json.loads(subprocess.run([str(python), "-c", _PREPARE, str(base), json.dumps(ports)],
                                             check=True, capture_output=True, text=True).stdout)
        self.binary = Path(prepared["binary"])
        self.port, self.metrics_port = ports["proxy_port"], free_port("0.0.0.0")
        etcd_yaml = base / "configs" / "etcd.yaml"
        _etcd_config(etcd_yaml, free_port("0.0.0.0"), free_port("0.0.0.0"))
        _edit_config(Path(prepared["config"]), etcd_yaml)
        self.env = {**os.environ, "DEPLOY_MODE": "STANDALONE", "METRICS_PORT": str(self.metrics_port),
                    "MILVUS_RUN_DIR": str(base / "run"),
                    "LD_LIBRARY_PATH": ":".join(filter(None, [str(self.binary.parent), os.environ.get("LD_LIBRARY_PATH")]))}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """The server's own health route: every component up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2) as answer:
                return answer.status == 200 and b"OK" in answer.read()
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Start the process and wait until it is healthy; returns the seconds that took."""
        assert not self.running, "already running"
        began = time.monotonic()
        self.starts += 1
        log = open(self.base / "logs" / f"milvus-{self.starts}.log", "wb")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen([str(self.binary), "run", "standalone"], cwd=self.base, env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        while time.monotonic() - began < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Milvus {MILVUS_VERSION} exited with {self.proc.returncode} while starting; "
                                   f"its log: {self.log_tail()}")
            if self.healthy():
                return time.monotonic() - began
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"Milvus {MILVUS_VERSION} was not healthy within {timeout_s:g} s; its log: {self.log_tail()}")

    def stop(self, timeout_s: float = GRACEFUL_STOP_S + 20) -> None:
        """SIGTERM, as Docker or systemd stop a server; SIGKILL if it has not exited after ``timeout_s``."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the server dies mid-work, as in a crash or an out-of-memory kill."""
        if self.running:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def ensure_running(self) -> None:
        if not (self.running and self.healthy()):
            self.stop()
            self.start()

    def log_tail(self, chars: int = 3000) -> str:
        logs = sorted((self.base / "logs").glob("milvus-*.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1].read_text(errors="replace")[-chars:] if logs else "(no log)"

    def drop_all(self) -> None:
        """Every collection dropped: a test module starts on an empty server."""
        from pymilvus import MilvusClient

        client = MilvusClient(uri=self.uri, timeout=30)
        try:
            for name in client.list_collections():
                client.drop_collection(name)
        finally:
            client.close()


def unavailable(reason: str):
    """Skip, naming the cause; under CI=true fail instead: CI must run the tests marked ``milvus_server``."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI must run the tests marked milvus_server", pytrace=False)
    pytest.skip(reason)


def start_server(base: Path) -> MilvusServer:
    """The run's server, started; unavailable (skip, or fail under CI) when it cannot be installed or started."""
    try:
        python = server_venv()
    except (OSError, subprocess.CalledProcessError) as exc:
        unavailable(f"cannot install the Milvus {MILVUS_VERSION} server ({REQUIREMENT}) in its own environment: {exc}")
    try:
        server = MilvusServer(python, base)
        server.start()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        unavailable(f"cannot start the Milvus {MILVUS_VERSION} server: {exc}")
    return server


class MilvusTarget:
    """Where a test module exports: Milvus Lite (a database file per name) or the run's real server."""

    def __init__(self, kind: str, root: Path, server: MilvusServer | None = None):
        self.kind, self.root, self.server = kind, root, server

    def uri(self, name: str = "lite") -> str:
        """A Lite database file ``name.db``, or the server (one for every name: collections differ by name)."""
        return self.server.uri if self.server is not None else str(self.root / f"{name}.db")
