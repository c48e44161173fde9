"""``python -m densehybrid.bench.scale.tiled``: a corpus tiled from an index's rows, its near copies, and a run over
sizes scored against the tiled rows' exact top 10."""

import numpy as np
import pytest
from densehybrid.bench.scale import tiled
from support.index_files import built_stdlib_index, write_queries


def test_each_further_copy_is_a_near_neighbour_of_its_row_with_its_norm_not_a_duplicate(tmp_path):
    rows = np.random.default_rng(1).standard_normal((300, 64)).astype(np.float16) * 3
    out = tiled.tiled_rows(rows, 3, 0.2, tmp_path / "t.npy")
    assert out.shape == (900, 64) and out.dtype == np.float16
    np.testing.assert_array_equal(out[:300], rows)
    original = rows.astype(np.float32)
    for copy in (1, 2):
        moved = np.asarray(out[copy * 300:(copy + 1) * 300], np.float32)
        assert not np.array_equal(moved, original)
        np.testing.assert_allclose(np.linalg.norm(moved, axis=1), np.linalg.norm(original, axis=1), rtol=2e-3)
        cosine = (moved * original).sum(1) / np.linalg.norm(moved, axis=1) / np.linalg.norm(original, axis=1)
        assert abs(np.median(cosine) - 1 / np.sqrt(1 + 0.2 ** 2)) < 0.01
    assert not np.array_equal(out[300:600], out[600:900])  # each copy drawn anew


def test_a_run_measures_each_size_and_thread_count_and_removes_its_rows(tmp_path, fake_models):
    # a margin that takes every row in: the searches' top 10 is the exact one
    index, _ = built_stdlib_index(tmp_path, 400, options=("--ann", "pqscan", "--pqscan-margin", "10"))
    write_queries(tmp_path / "q.jsonl", [f"query {i} about {t}" for i, t in enumerate(["files", "dates", "sockets"])])
    groups = [f"few={tmp_path / 'q.jsonl'}:2", f"all={tmp_path / 'q.jsonl'}"]
    out = tiled.run(index, tmp_path / "scratch", groups, [1, 2], [1, 2], 0.2, 1)
    assert [s["rows"] for s in out["sizes"]] == [400, 800] and out["queries"] == {"few": 2, "all": 3}
    for size in out["sizes"]:
        assert {t: timing["n"] for t, timing in size["latency_ms"].items()} == {"1": 5, "2": 5}
        assert size["recall_at_10"] == {"few": 1.0, "all": 1.0}
        assert set(size["ratios_p50"]) == {"2"}
    assert set(out["p50_exponents"]) == {"1", "2"} and len(out["p50_exponents"]["1"]) == 1
    assert list((tmp_path / "scratch").iterdir()) == []
    assert "| 800 |" in tiled.markdown(out)


def test_an_index_without_product_codes_is_refused_by_name(tmp_path, fake_models):
    index, _ = built_stdlib_index(tmp_path, 50)
    write_queries(tmp_path / "q.jsonl", ["a query"])
    with pytest.raises(SystemExit, match="a pqscan first stage is needed, this index has flat_ip"):
        tiled.run(index, tmp_path / "scratch", [f"q={tmp_path / 'q.jsonl'}"], [1], [1], 0.2, 1)
