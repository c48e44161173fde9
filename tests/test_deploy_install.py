"""The image's install steps work: the CPU variant of deploy/install.sh in a fresh venv, then the server from it.

The Dockerfile's build stage runs ``sh deploy/install.sh "${VARIANT}" /opt/venv /src``
on a copy of the build context; so does this test, with the context cut the way
.dockerignore cuts it. The one difference is where torch comes from: the CPU
image sets ``TORCH_INDEX_URL`` to the PyTorch CPU index, here it is left empty
and pip's configured index serves the CPU build (as in ``.ci/run``). The script
itself fails if a CUDA torch slipped in. Then, as the container does:
``densehybrid-setup`` (deploy/setup.sh) builds an index with a real model,
``densehybrid serve`` starts from the venv (not from the source tree) with its
settings from ``DENSEHYBRID_*`` variables, and the HEALTHCHECK script probes it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from densehybrid.bench.servers.start import free_port
from densehybrid.encoder import zoo

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.realmodel]


def docker_context(into: Path) -> Path:
    """Copy what .dockerignore lets into the build (its ``!`` lines after ``**``), nothing else."""
    for line in (REPO / ".dockerignore").read_text().splitlines():
        if not line.startswith("!"):
            continue
        source = REPO / line[1:].rstrip("/")
        target = into / source.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(source, target)
    return into


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that would let the source tree or other settings leak in."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "VIRTUAL_ENV", "TORCH_INDEX_URL"} and not k.startswith("DENSEHYBRID_")}
    return {**env, "DENSEHYBRID_CACHE_DIR": str(zoo.cache_dir()), **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv made by deploy/install.sh cpu from a copy of the Docker build context."""
    work = tmp_path_factory.mktemp("image")
    context = docker_context(work / "src")
    venv = work / "venv"
    proc = subprocess.run(["sh", str(context / "deploy/install.sh"), "cpu", str(venv), str(context)],
                          cwd=work, env=clean_env(), capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "install.sh: cpu: torch 2.13.0" in proc.stdout and "(CUDA None)" in proc.stdout, proc.stdout[-1000:]
    return venv


def test_install_sh_rejects_an_unknown_variant(tmp_path):
    proc = subprocess.run(["sh", str(REPO / "deploy/install.sh"), "tpu", str(tmp_path / "v"), str(REPO)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "cpu or gpu" in proc.stderr
    assert not (tmp_path / "v").exists()


def test_the_installed_package_comes_from_the_venv(installed, tmp_path):
    code = ("import densehybrid.service as s, densehybrid.encoder as e, densehybrid.index as i; "
            "print(s.__file__, e.__file__, i.__file__)")
    proc = subprocess.run([str(installed / "bin/python"), "-c", code], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert all(path.startswith(str(installed)) for path in proc.stdout.split()), proc.stdout
    for generic in ("service", "encoder", "index", "benchmarks"):  # nothing generic lands in site-packages
        absent = subprocess.run([str(installed / "bin/python"), "-c", f"import {generic}"], cwd=tmp_path,
                                env=clean_env(), capture_output=True, text=True, timeout=120)
        assert absent.returncode != 0, generic


def run_setup(installed: Path, tmp_path: Path, corpus: Path, index_dir: Path) -> subprocess.CompletedProcess:
    env = clean_env(PATH=f"{installed / 'bin'}{os.pathsep}{os.environ['PATH']}", DENSEHYBRID_MODEL="splade-tiny",
                    DENSEHYBRID_FETCH_MODELS="splade-tiny", DENSEHYBRID_CORPUS=str(corpus),
                    DENSEHYBRID_INDEX=str(index_dir), DENSEHYBRID_DEVICE="cpu")
    return subprocess.run(["sh", str(REPO / "deploy/setup.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def probe(installed: Path, route: str, port: int) -> int:
    """The image's HEALTHCHECK command, run with the venv's python."""
    return subprocess.run([str(installed / "bin/python"), str(REPO / "deploy/healthcheck.py"), route],
                          env=clean_env(DENSEHYBRID_PORT=str(port)), capture_output=True, timeout=30).returncode


def test_setup_then_serve_from_the_venv(installed, splade_tiny_dir, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    topics = ["dense retrieval with gated inner products", "bm25 lexical matching", "faiss flat inner product index",
              "query latency of transformer encoders", "aggregating term weights into a dense vector"]
    corpus.write_text("".join(json.dumps({"_id": f"D{i}", "title": "", "text": t}) + "\n"
                              for i, t in enumerate(topics)))
    index_dir = tmp_path / "indexes" / "default"

    built = run_setup(installed, tmp_path, corpus, index_dir)
    assert built.returncode == 0 and (index_dir / "manifest.json").is_file(), built.stdout + built.stderr
    assert "splade-tiny: ONNX graphs in" in built.stdout  # for replicas whose cache is read-only
    again = run_setup(installed, tmp_path, corpus, index_dir)
    assert again.returncode == 0 and "not rebuilding" in again.stdout, again.stdout + again.stderr

    port = free_port()
    env = clean_env(DENSEHYBRID_INDEX=str(index_dir), DENSEHYBRID_HOST="127.0.0.1", DENSEHYBRID_PORT=str(port),
                    DENSEHYBRID_DEVICE="cpu", DENSEHYBRID_LOG_JSON="false")
    with open(tmp_path / "serve.log", "wb") as log:
        server = subprocess.Popen([str(installed / "bin/densehybrid"), "serve"], cwd=tmp_path, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        assert probe(installed, "/ready", port) != 0  # nothing listens yet, or not warmed: the probe says no
        deadline = time.monotonic() + 180
        while probe(installed, "/ready", port) != 0:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "the server from the venv did not become ready"
            time.sleep(0.5)
        assert probe(installed, "/health", port) == 0
        url = f"http://127.0.0.1:{port}"
        hits = httpx.post(url + "/search", json={"query": "bm25 lexical matching", "k": 3}, timeout=30).json()
        assert [h["id"] for h in hits["results"]][0] == "D1", hits
        assert hits["index"]["documents"] == len(topics)
        assert httpx.get(url + "/info", timeout=30).json()["model"]["backend"] == "onnx"  # auto, on the CPU
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) in (0, -signal.SIGTERM)  # not PID 1 here: see test_deploy_sigterm.py
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
