"""``bench.scale.growth``: every first stage built on prefixes of a corpus's own index and measured at each size,
and the exponents and the projection its report derives from them."""

import json
import math

import numpy as np
import pytest

from support.index_files import built_stdlib_index, write_queries

from densehybrid.bench.scale import growth, growth_report


def test_every_first_stage_is_built_and_measured_at_each_prefix_and_again_without_a_rebuild(tmp_path, fake_models):
    index, texts = built_stdlib_index(tmp_path, 900)
    write_queries(tmp_path / "near.jsonl", texts[:12])
    write_queries(tmp_path / "far.jsonl", ["how tall is the eiffel tower", "best pasta recipe"])
    specs = [f"near={tmp_path / 'near.jsonl'}:8", f"far={tmp_path / 'far.jsonl'}"]
    out = growth.run(index, tmp_path / "scratch", specs, [450, 0], tmp_path / "partial.json")
    assert [p["rows"] for p in out["sizes"]] == [450, 900] and out["queries"] == {"near": 8, "far": 2}
    assert json.loads((tmp_path / "partial.json").read_text())["sizes"][1]["rows"] == 900  # written as it goes
    for point in out["sizes"]:
        assert set(growth_report.STAGES) <= set(point)
        assert point["flat"]["sets"]["near"]["recall_at_10"] == 1.0  # the exact scan is its own reference
        for stage in growth_report.STAGES:
            assert 0 <= point[stage]["sets"]["far"]["recall_at_10"] <= 1
            assert point[stage]["p99_ms"] >= point[stage]["p50_ms"] > 0
        # one thread or two, the same codes, margin and rescoring find the same rows
        assert point["pqscan"]["sets"] == point["pqscan-2t"]["sets"] and point["pqscan"]["margin"] >= 0
        assert point["hnsw"]["ef_search"] > 0 and point["hnsw"]["build_s"] >= 0
    assert (tmp_path / "scratch" / "450" / "pqscan" / growth.RECORD).exists()
    again = growth.run(index, tmp_path / "scratch", specs, [450], reuse=True)
    first, second = out["sizes"][0], again["sizes"][0]
    assert second["pqscan"]["margin"] == first["pqscan"]["margin"] and second["hnsw"]["build_s"] == first["hnsw"]["build_s"]
    assert second["pqscan"]["sets"] == first["pqscan"]["sets"]


def _result(rows, p50, dim=384):
    sizes = [{"rows": n, "load_average": [1.0, 1.0, 1.0],
              **{s: {"p50_ms": p50[s][i], "p99_ms": p50[s][i] * 2, "build_s": 10.0 * n / rows[0],
                     "sets": {"g": {"recall_at_10": 1.0, "exact_top10": 1.0}}} for s in growth_report.STAGES}}
             for i, n in enumerate(rows)]
    return {"dim": dim, "model": "m", "queries": {"g": 5}, "sizes": sizes}


def test_exponents_are_the_slopes_of_the_logs_and_the_projection_states_its_assumptions():
    rows = [100_000, 200_000, 400_000, 800_000]
    p50 = {"flat": [1.0 * (n / 1e5) for n in rows], "pqscan": [2.0 * (n / 1e5) ** 0.5 for n in rows],
           "pqscan-2t": [1.6 * (n / 1e5) ** 0.5 for n in rows], "hnsw": [3.0] * 4}
    result = _result(rows, p50)
    fitted = growth_report.fit(result)
    assert fitted["flat p50_ms"] == pytest.approx(1.0, abs=1e-3) and fitted["pqscan p50_ms"] == pytest.approx(0.5, abs=1e-3)
    assert fitted["hnsw p50_ms"] == pytest.approx(0.0, abs=1e-3) and fitted["pqscan build_s"] == pytest.approx(1.0, abs=1e-3)
    assert "flat build_s" not in fitted  # the exact scan builds nothing
    projected = growth_report.project(result, 3_200_000, 768, 16)
    largest = 2.0 * 8 ** 0.5
    assert projected["p50_ms"]["pqscan"] == pytest.approx(round(largest * 2 * 2, 2), abs=0.01)  # x4 rows^0.5, x2 dims
    share = 2 * 0.8 - 1  # two threads took 0.8 of one: Amdahl's serial share 0.6
    assert projected["serial_share"] == pytest.approx(share)
    assert projected["p50_ms"]["pqscan-16t"] == pytest.approx(round(projected["p50_ms"]["pqscan"] * (share + (1 - share) / 16), 2), abs=0.01)
    assert projected["p50_ms"]["flat"] == pytest.approx(8.0 * 4 * 2, abs=0.01)
    assert any("serial share" in a for a in projected["assumptions"])
    linear = projected["pqscan_fixed_plus_per_row"]  # least squares of a + b·rows through the four points
    b, a = np.polyfit(rows, p50["pqscan"], 1)
    assert linear["fixed_ms"] == pytest.approx(a, abs=1e-3) and linear["per_million_rows_ms"] == pytest.approx(b * 1e6, abs=1e-3)
    assert linear["p50_ms_16t"] == pytest.approx(round((a + b * 3_200_000 / 16) * 2, 2), abs=0.01)
    result |= {"fit": fitted, "projection": projected}
    table = growth_report.markdown(result)
    assert "| 800,000 | pqscan-2t |" in table and "projected p50 at 3,200,000 x 768" in table


def test_fewer_than_two_sizes_fit_nothing_and_a_serial_share_stays_within_0_and_1():
    assert growth_report.exponent([100], [1.0]) is None and growth_report.exponent([100, 200], [1.0, 0.0]) is None
    slope, _ = growth_report.exponent([10, 1000], [1.0, 100.0])
    assert math.isclose(slope, 1.0)
    assert growth_report.serial_share(1.0, 0.4) == 0.0 and growth_report.serial_share(1.0, 1.3) == 1.0


def test_the_plot_draws_cost_and_recall_against_the_rows(tmp_path):
    result = _result([1000, 2000], {s: [1.0, 2.0] for s in growth_report.STAGES})
    assert growth_report.plot(result, tmp_path / "g.png").stat().st_size > 1000
    assert np.isfinite(growth_report.fit(result)["flat p50_ms"])


def test_the_report_fits_and_projects_a_saved_result_again(tmp_path, capsys):
    path = tmp_path / "growth.json"
    path.write_text(json.dumps(_result([1000, 4000], {s: [1.0, 2.0] for s in growth_report.STAGES})))
    growth_report.main([str(path), "--project-rows", "16000", "--project-dim", "384", "--plot", str(tmp_path / "g.png")])
    saved = json.loads(path.read_text())
    assert saved["fit"]["flat p50_ms"] == pytest.approx(0.5, abs=1e-3)
    assert saved["projection"]["p50_ms"]["flat"] == pytest.approx(4.0, abs=0.01)  # x4 rows at exponent 0.5
    assert "projected p50 at 16,000 x 384" in capsys.readouterr().out and (tmp_path / "g.png").exists()
