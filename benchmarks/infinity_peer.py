"""infinity-emb as the peer of the /encode benchmark: its own virtual environment (never a dependency of
this project), created on first use, and a server process on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from densehybrid.bench.servers import free_port, wait_for_process_ready

INFINITY_REQUIREMENT = "infinity-emb[server,torch]==0.0.78"
TORCH_REQUIREMENT = "torch==2.13.0"  # first, so that pip takes the local CPU build


def infinity_venv(directory: Path) -> Path:
    """The infinity-emb executable in its own virtual environment, created on first use."""
    executable = directory / "bin" / "infinity_emb"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
        pip = [str(directory / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, TORCH_REQUIREMENT], check=True)
        subprocess.run([*pip, INFINITY_REQUIREMENT], check=True)
    return executable


def start_infinity(executable: Path, model_dir: Path, batch_size: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([str(executable), "v2", "--model-id", str(model_dir), "--engine", "torch", "--device", "cpu",
                             "--batch-size", str(batch_size), "--pooling-method", "mean", "--no-bettertransformer",
                             "--port", str(port), "--host", "127.0.0.1", "--log-level", "warning"],
                            env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for_process_ready(url, proc, "/health", timeout_s=600)
    return proc, url
