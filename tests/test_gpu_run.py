"""The GPU machine's one-command run (benchmarks/gpu/gpu_run.sh), rehearsed on the CPU at tiny sizes, so that the
script is known to work before a GPU is lent: its time there is short and counted from the cold start."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from densehybrid.bench.gpu.results import device_name, main
from densehybrid.cli.demo_corpus import write_stdlib_corpus
from densehybrid.bench.targets import GPU_TARGETS

REPO = Path(__file__).resolve().parents[1]


def test_results_are_named_for_the_device():
    assert device_name({"machine": {"cuda": "NVIDIA H100 80GB HBM3"}}) == "nvidia-h100-80gb-hbm3"
    assert device_name({"machine": {"cuda": None}}) == "cpu-rehearsal"


@pytest.mark.slow
def test_the_rehearsal_runs_every_step_and_checks_every_gpu_target(tmp_path):
    data = tmp_path / "data"  # real passages (the standard library's docs) in the two files the GPU run encodes
    data.mkdir()
    write_stdlib_corpus(tmp_path / "corpus.jsonl", limit=400)
    for name in ("packages", "msmarco"):
        (data / f"{name}.jsonl.gz").write_bytes(gzip.compress((tmp_path / "corpus.jsonl").read_bytes()))
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": str(i), "text": f"how to parse {word} files"}) + "\n"
                                                for i, word in enumerate(("json", "csv", "xml", "toml") * 10)))
    env = {**os.environ, "DENSEHYBRID_GPU_REHEARSAL": "1", "DENSEHYBRID_GPU_DATA": str(data), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu" / "gpu_run.sh"), str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"^\d+ (passed|skipped)", (tmp_path / "pytest-gpu.log").read_text().splitlines()[-1])
    assert (tmp_path / "pytest-gpu.xml").exists()
    results = json.loads((tmp_path / "gpu-cpu-rehearsal.json").read_text())
    assert results["config"]["preset"] == "gpu-rehearsal" and results["sections_missing"] == []
    assert {"memory", "search", "encoder", "service", "first_stage_parts", "msmarco_scale", "live_recall"} <= set(results)
    live = results["live_recall"]["live_recall"]
    assert live["cost"]["queries"] == 40 and live["control"]["sampled"] == 0
    assert live["truth"]["default"]["samples"] == 40 and live["truth"]["default"]["offline_recall_at_10"] == 1.0
    assert {c["label"] for c in results["corpus_encode"]} == {"aggretriever packages", "aggretriever msmarco"}
    assert results["msmarco_scale"]["rows"] == 100_000 and results["msmarco_scale"]["fits"]
    checked = {t["name"]: t for t in results["targets"]}
    assert set(checked) == {t.name for t in GPU_TARGETS}
    assert all(t["value"] is not None for t in checked.values()), checked  # every figure was measured
    table = (tmp_path / "gpu-cpu-rehearsal.md").read_text()
    assert "a 12-token text with tokenization" in table and "bare_masked_lm" in table
    assert "MS MARCO scale" in table and "`index build` of 300 passages" in table and "live recall" in table


def test_steps_outside_the_benchmark_alone_still_give_a_results_file(tmp_path):
    corpus = {"label": "minilm packages", "passages": 10, "mean_tokens": 5.0, "batch_size": 32, "device_name": "cpu",
              "build_pps": 100.0, "bare_forward_pps": 90.0, "bare_with_tokenization_pps": 80.0,
              "build_over_bare_forward": 1.11, "projected_build_s": {"packages_827k": 8272.8, "msmarco_8.8M": 88418.2}}
    (tmp_path / "corpus-minilm-packages.json").write_text(json.dumps(corpus))
    path = main(tmp_path)
    results = json.loads(path.read_text())
    assert path.name == "gpu-cpu-rehearsal.json" and results["corpus_encode"] == [corpus]
    assert "memory" in results["sections_missing"] and "corpus_encode" not in results["sections_missing"]
    assert "minilm packages: `index build` of 10 passages" in path.with_suffix(".md").read_text()


def test_rows_drawn_on_a_device_are_written_as_an_index_holding_exactly_them(tmp_path):
    from densehybrid.bench.scale.gpu import rows_that_fit, write_index
    from densehybrid.bench.scale.vectors import clustered_chunks_on
    from densehybrid.encoder.loading import load_encoder
    from densehybrid.encoder.random_checkpoint import write_random_checkpoint
    from densehybrid.index.served.loading import load_index, verify_index

    spec = load_encoder(str(write_random_checkpoint(tmp_path / "model", "tiny")), kind="aggretriever", device="cpu").spec
    assert rows_that_fit(3_000, spec.dim, "cpu") == 3_000
    steps = write_index(tmp_path / "index", spec, 3_000, "cpu", seed=4)
    assert steps["vectors_bytes"] > 3_000 * spec.dim * 2 and not (tmp_path / "index.partial").exists()
    verify_index(tmp_path / "index")  # every checksum, the vectors' (hashed while written) too
    index = load_index(tmp_path / "index")
    drawn = np.concatenate(list(clustered_chunks_on("cpu", 3_000, spec.dim, seed=4)))
    np.testing.assert_array_equal(np.asarray(index.values), drawn)
    assert drawn.dtype == np.float16 and np.unique(drawn, axis=0).shape[0] == 3_000
    assert index.count == 3_000 and index.doc_ids[2_999] == "D2999"
