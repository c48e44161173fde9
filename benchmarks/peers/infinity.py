"""infinity-emb as the peer of the /encode benchmark: its own virtual environment (never a dependency of
this project), created on first use, and a server process on a free loopback port.

Two engines: ``torch`` serves the model directory as it is; ``optimum`` (ONNX Runtime, infinity's fastest
on a CPU) serves an ``optimum-cli export onnx`` of it, saved as one ``model.onnx`` file, from inside that
folder (``--model-id .``), the way infinity finds a local ONNX model. The optimum engine needs older
pins than infinity's own (optimum 1.24 still has the ONNX Runtime classes infinity imports)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from densehybrid.bench.servers.start import free_port, wait_for_process_ready

ENGINES = ("torch", "optimum")
INFINITY_VERSION = "0.0.78"
TORCH_REQUIREMENT = "torch==2.13.0"  # first, so that pip takes the local CPU build
REQUIREMENTS = {
    "torch": [f"infinity-emb[server,torch]=={INFINITY_VERSION}"],
    "optimum": [f"infinity-emb[server,optimum]=={INFINITY_VERSION}", "optimum[onnxruntime]>=1.24,<1.25",
                "transformers>=4.48,<4.49", "pyarrow<18", "datasets<3.3", "onnxscript"],
}
ONNX_FILE = "model.onnx"


def infinity_venv(directory: Path, engine: str = "torch") -> Path:
    """The infinity-emb executable of ``engine`` in its own virtual environment, created on first use."""
    executable = directory / "bin" / "infinity_emb"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
        pip = [str(directory / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, TORCH_REQUIREMENT], check=True)
        subprocess.run([*pip, *REQUIREMENTS[engine]], check=True)
    return executable


# optimum 1.24 predates torch's dynamo exporter, the default now: its external-data clean-up fails on the
# one weights file that exporter writes. The TorchScript exporter writes one self-contained model.onnx.
_EXPORT = """
import functools, sys, torch
torch.onnx.export = functools.partial(torch.onnx.export, dynamo=False)
from optimum.exporters.onnx import main_export
main_export(sys.argv[1], output=sys.argv[2], task="feature-extraction", library_name="transformers")
"""


def optimum_export(executable: Path, model_dir: Path, out: Path) -> Path:
    """The ``optimum-cli export onnx`` of ``model_dir`` (as a plain transformers model: infinity pools) in ``out``,
    made once, one ``model.onnx`` file."""
    if (out / ONNX_FILE).is_file():
        return out
    staged = out.with_name(out.name + ".partial")
    subprocess.run([str(executable.parent / "python"), "-c", _EXPORT, str(model_dir), str(staged)], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.exists():
        shutil.rmtree(out)
    staged.rename(out)
    return out


def start_infinity(executable: Path, model_dir: Path, batch_size: int,
                   engine: str = "torch") -> tuple[subprocess.Popen, str]:
    """An infinity server of ``model_dir`` (for ``optimum``: the folder :func:`optimum_export` made)."""
    port = free_port()
    env = {**os.environ, "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    common = ["--batch-size", str(batch_size), "--pooling-method", "mean", "--port", str(port), "--host", "127.0.0.1",
              "--log-level", "warning", "--device", "cpu"]
    if engine == "optimum":
        args, cwd = ["--model-id", ".", "--engine", "optimum"], model_dir
    else:
        args, cwd = ["--model-id", str(model_dir), "--engine", "torch", "--no-bettertransformer"], None
    proc = subprocess.Popen([str(executable), "v2", *args, *common], env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for_process_ready(url, proc, "/health", timeout_s=600)
    return proc, url


@dataclass(frozen=True)
class InfinityPeer:
    """infinity on one engine: its executable, the directory it serves, and the model name it answers to."""

    engine: str
    executable: Path
    served_dir: Path

    @classmethod
    def prepare(cls, engine: str, model_dir: Path, venv: Path | None = None) -> "InfinityPeer":
        """Install (once) and, for ``optimum``, export (once) into the user cache."""
        cache = Path.home() / ".cache" / "densehybrid"
        default_venv = cache / ("infinity-venv" if engine == "torch" else f"infinity-venv-{engine}")
        executable = infinity_venv(venv or default_venv, engine)
        served = optimum_export(executable, model_dir, cache / "infinity-onnx" / model_dir.name) \
            if engine == "optimum" else model_dir
        return cls(engine, executable, served)

    @property
    def model_name(self) -> str:
        """Its ``--model-id``: ``.`` for optimum, started inside the export."""
        return "." if self.engine == "optimum" else str(self.served_dir)

    def start(self, batch_size: int) -> tuple[subprocess.Popen, str]:
        return start_infinity(self.executable, self.served_dir, batch_size, self.engine)
