"""The GPU machine's one-command run (benchmarks/gpu/gpu_run.sh), rehearsed on the CPU at tiny sizes, so that the
script is known to work before a GPU is lent: its time there is short and counted from the cold start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from densehybrid.bench.gpu.results import device_name
from densehybrid.bench.targets import GPU_TARGETS

REPO = Path(__file__).resolve().parents[1]


def test_results_are_named_for_the_device():
    assert device_name({"machine": {"cuda": "NVIDIA H100 80GB HBM3"}}) == "nvidia-h100-80gb-hbm3"
    assert device_name({"machine": {"cuda": None}}) == "cpu-rehearsal"


@pytest.mark.slow
def test_the_rehearsal_runs_every_step_and_checks_every_gpu_target(tmp_path):
    env = {**os.environ, "DENSEHYBRID_GPU_REHEARSAL": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu" / "gpu_run.sh"), str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"^\d+ (passed|skipped)", (tmp_path / "pytest-gpu.log").read_text().splitlines()[-1])
    assert (tmp_path / "pytest-gpu.xml").exists()
    results = json.loads((tmp_path / "gpu-cpu-rehearsal.json").read_text())
    assert results["config"]["preset"] == "gpu-rehearsal" and results["sections_missing"] == []
    assert {"memory", "search", "encoder", "service"} <= set(results)
    checked = {t["name"]: t for t in results["targets"]}
    assert set(checked) == {t.name for t in GPU_TARGETS}
    assert all(t["value"] is not None for t in checked.values()), checked  # every figure was measured
    table = (tmp_path / "gpu-cpu-rehearsal.md").read_text()
    assert "a 12-token text with tokenization" in table and "bare_masked_lm" in table
