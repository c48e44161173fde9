"""The server a load test starts when it is given no ``--url``: a HashEncoder with a device-like forward
time over a small toy index, in a child process on a free loopback port (``fake_server``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from densehybrid.bench.servers import stop_process


@dataclass(frozen=True)
class FakeServerConfig:
    """The server ``run_load`` starts when no ``--url`` is given."""

    # measured (docs/performance.md): a DistilBERT-base forward of one 32-token query takes 46-79 ms on this machine kind
    base_ms: float = 40.0
    per_text_ms: float = 10.0
    max_batch_size: int = 4
    queue_size: int = 32
    documents: int = 500



@contextlib.contextmanager
def fake_server(config: FakeServerConfig, workdir: Path, timeout_s: float = 120) -> Iterator[tuple[str, int]]:
    """A ``serve`` child process on a free loopback port; yields (url, pid) and stops it afterwards."""
    command = [sys.executable, "-m", "densehybrid.bench.load_server", "--workdir", str(workdir),
               "--config", json.dumps(asdict(config))]
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        line = ""
        while not line.startswith("LISTENING "):
            line = proc.stdout.readline()
            if (not line and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"the load-test server did not start (exit code {proc.poll()})")
        yield line.split()[1], proc.pid
    finally:
        stop_process(proc)


def _serve_fake(workdir: Path, config: FakeServerConfig) -> None:
    """Child process: build (or reuse) a toy index, serve it on 127.0.0.1:0, print the URL once ready."""
    from densehybrid.bench.hash_encoder import HashEncoder
    from densehybrid.bench.servers import LiveServer
    from densehybrid.bench.toy_index import build_toy_index
    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    class DeviceLikeEncoder(HashEncoder):
        """Forward time grows with the batch, like a real model; the sleep releases the GIL like a GPU call."""

        def encode_tokenized(self, items, role):
            time.sleep((config.base_ms + config.per_text_ms * len(items)) / 1000)
            return super().encode_tokenized(items, role)

    index_dir = workdir / "index" / "index"
    if not index_dir.exists():
        build_toy_index(HashEncoder("dhr"), workdir / "index", count=config.documents)
    settings = ServiceSettings(max_batch_size=config.max_batch_size, queue_size=config.queue_size, log_level="WARNING")
    app = create_app(settings, encoder=DeviceLikeEncoder("dhr"), index=load_index(index_dir))
    with LiveServer(app) as live:
        sys.stdout.write(f"LISTENING {live.url}\n")
        sys.stdout.flush()
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        while not stopped.wait(0.5):
            pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="(internal) the load test's server child process")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--config", default="{}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    args.workdir.mkdir(parents=True, exist_ok=True)
    _serve_fake(args.workdir, FakeServerConfig(**json.loads(args.config)))


if __name__ == "__main__":
    main()
