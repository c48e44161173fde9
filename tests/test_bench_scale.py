"""``densehybrid bench --scale``: Pyserini's layout round trip, and a small run end to end."""

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.bench.scale import pyserini_layout, serve as scale_serve, vectors as scale_vectors
from densehybrid.bench.scale.search import exhaustive_top
from densehybrid.cli.main import app
from densehybrid.index.building.importing import read_pyserini
from densehybrid.index.engines.hnsw_engine import HNSWConfig


def test_a_pyserini_directory_holds_the_vectors_and_ids_in_row_order(tmp_path):
    xb = scale_vectors.passages(300, 16, seed=3)
    ids = [f"msmarco-{i}" for i in range(300)]
    directory = pyserini_layout.write_pyserini_dir(tmp_path / "p", xb, ids)
    assert sorted(p.name for p in directory.iterdir()) == ["docid", "index"]
    assert (directory / "docid").read_text().splitlines() == ids
    got = read_pyserini(directory)  # what index import reads
    np.testing.assert_array_equal(got.rows, xb)
    assert got.doc_ids == ids


def test_seeded_vectors_repeat_and_queries_differ_from_passages():
    a, b = scale_vectors.passages(500, 8, seed=1), scale_vectors.passages(500, 8, seed=1)
    np.testing.assert_array_equal(a, b)
    assert not np.isin(scale_vectors.queries(5, 8, seed=1), a).all()


def test_fitted_distractors_keep_the_real_rows_and_match_their_moments():
    rng = np.random.default_rng(0)
    real = rng.standard_normal((4000, 6)) @ np.diag([3, 2, 1, 0.5, 0.2, 0.1]) + 1.0
    drawn = scale_vectors.passages(40_000, 6, seed=2, fit=real)
    np.testing.assert_array_equal(drawn[:4000], real.astype(np.float32))
    np.testing.assert_allclose(drawn[4000:].mean(0), real.mean(0), atol=0.05)
    np.testing.assert_allclose(np.cov(drawn[4000:], rowvar=False), np.cov(real, rowvar=False), atol=0.1)


def test_exhaustive_top_is_numpy_argsort():
    xb, xq = scale_vectors.passages(2000, 16, seed=4), scale_vectors.queries(7, 16, seed=4)
    want = np.argsort(-(xq @ xb.T), axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(exhaustive_top(xq, xb), want)


def test_bench_scale_writes_the_numbers_and_cleans_up(tmp_path):
    out, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    with_plot = pytest.importorskip("matplotlib", reason="the plot needs matplotlib") is not None
    result = CliRunner().invoke(app, ["bench", "--scale", "3000", "--scale-dim", "32", "--out", str(out),
                                      "--plot", str(plot), "--threads", "1", "--no-scale-serve"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())
    assert run["rows"] == 3000 and run["dim"] == 32 and run["flat"]["recall_at_10"] >= 0.99
    sweep = {s["ef_search"]: s for s in run["hnsw_sweep"]}
    assert sweep[512]["recall_at_10"] >= 0.98 and sweep[512]["recall_at_10"] >= sweep[16]["recall_at_10"]
    # sq8 codes: a byte per dim (and the added one) beside each node's links (2 M at level 0, 4 bytes each)
    assert run["files"]["first_stage.hnsw.faiss"] <= 3000 * ((32 + 1) + 1.25 * 2 * 32 * 4) + 65_536
    assert run["pyserini_files"]["index"] > 3000 * 32 * 4
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" or not with_plot
    assert not (tmp_path / "scale-data").exists() or not any((tmp_path / "scale-data").iterdir())
    assert "serving" not in run


def test_memory_of_a_process_is_its_anonymous_and_file_pages():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    got = scale_serve.memory_mb(os.getpid())
    assert got["rss_mb"] == pytest.approx(got["anon_mb"] + got["file_mb"], abs=0.2)
    assert got["rss_mb"] == pytest.approx(int(fields["VmRSS"].split()[0]) / 1024, rel=0.2)  # shmem aside


def test_serving_part_serves_the_model_alone_then_flat_then_hnsw(minilm_dir, tmp_path):
    """A real encoder over 2,000 imported rows of its dim: every server answered, numbers in their places."""
    run = scale_serve.run_serving(2000, tmp_path, HNSWConfig(m=8, ef_construction=32), queries=5)
    assert (run["model"], run["dim"], run["rows"]) == ("minilm", 384, 2000)
    assert "search" not in run["model_only"] and run["model_only"]["ready_s"] > 0
    for name in ("flat", "hnsw"):
        served = run[name]
        assert served["search"]["n"] == 5 and served["search"]["p50"] > 0 and served["first_search_ms"] > 0
        memory = served["before_first_query"]
        assert memory["rss_mb"] > 0 and memory["anon_mb"] > 0 and served["import_s"] > 0
    assert not any(tmp_path.iterdir())  # the rows and both indexes are removed
