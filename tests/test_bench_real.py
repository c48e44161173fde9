"""``bench.scale.real``: approximate first stages on a corpus's own index, against its exact scan, per query group."""

import json

import numpy as np
from typer.testing import CliRunner

from support.index_files import built_stdlib_index, write_queries

from densehybrid.bench.scale import filtered, real, real_report, real_serve
from densehybrid.cli.demo_corpus import write_stdlib_corpus
from densehybrid.cli.main import app


def test_every_choice_and_breadth_is_measured_per_group_beside_the_calibration(tmp_path, fake_models):
    _, texts = built_stdlib_index(tmp_path, 600)
    for name, chosen in (("near", texts[:20]), ("far", ["how tall is the eiffel tower", "best pasta recipe"])):
        write_queries(tmp_path / f"{name}.jsonl", chosen)
    out = real.run(tmp_path / "index", [f"near={tmp_path / 'near.jsonl'}:10", f"far={tmp_path / 'far.jsonl'}"],
                   ["pqscan", "hnsw"], [])
    assert out["rows"] == 600 and out["queries"] == {"near": 10, "far": 2}
    pqscan, hnsw = out["choices"]
    assert (pqscan["knob"], hnsw["knob"]) == ("margin", "ef_search")
    for row in (pqscan, hnsw):
        assert row["calibrated"]["breadth"] in [p["breadth"] for p in row["sweep"]]
        for point in row["sweep"]:
            assert 0 <= point["far"]["recall_at_10"] <= 1 and point["p99_ms"] >= point["p50_ms"] > 0
    assert [p["breadth"] for p in pqscan["fixed_rescore_sweep"]] == list(real.FIXED_RESCORE)
    table = real_report.markdown(out)
    assert "| pqscan, margin 0 | rescore 50 |" in table and "(calibrated)" in table
    assert real_report.plot(out, tmp_path / "real.png").stat().st_size > 1000


def _point(breadth, mean_ms, recall):
    return {"breadth": breadth, "mean_ms": mean_ms, "g": {"recall_at_10": recall, "exact_top10": recall}}


def test_a_margin_is_set_beside_the_fixed_count_interpolated_at_its_mean_latency():
    row = {"sweep": [_point(0.02, 1.0, 0.5), _point(0.05, 1.5, 0.9), _point(0.1, 9.0, 1.0)],
           "fixed_rescore_sweep": [_point(300, 2.0, 0.8), _point(50, 1.0, 0.6)]}  # noisy order: sorted by latency
    rows = real_report.at_equal_latency(row, ["g"])
    assert [r["margin"] for r in rows] == [0.02, 0.05]  # 9 ms lies beyond the fixed sweep
    assert rows[0]["g"] == {"margin": 0.5, "fixed": 0.6}
    assert rows[1]["g"] == {"margin": 0.9, "fixed": 0.7}  # halfway between 1 and 2 ms
    table = real_report.equal_latency_markdown({"queries": {"g": 3}, "choices": [row]})
    assert "| 0.05 | 1.5 | 0.900 / 0.700 |" in table


def test_the_served_answers_are_timed_and_scored_against_the_exact_top_10(tmp_path, minilm_dir):
    write_stdlib_corpus(tmp_path / "corpus.jsonl", limit=400)
    built = CliRunner().invoke(app, ["index", "build", "--corpus", str(tmp_path / "corpus.jsonl"), "--model", "minilm",
                                     "--kind", "cls", "--pooling", "mean", "--normalize", "--out", str(tmp_path / "index"), "--no-progress"])
    assert built.exit_code == 0, built.output
    texts = [json.loads(line)["text"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    write_queries(tmp_path / "near.jsonl", [t[:80] for t in texts[:6]])
    out = real_serve.run(tmp_path / "index", [f"near={tmp_path / 'near.jsonl'}:4"], ready_timeout_s=300)
    assert out["rows"] == 400 and out["queries"] == {"near": 4}
    assert out["first_stage"]["type"] == "flat" and out["search_ms"]["n"] == 4
    assert out["recall_at_10"]["near"] == 1.0  # an exact scan, scored against the vectors the server made
    assert out["server_ms"]["encode_ms"]["p50"] > 0 and out["search_ms"]["p50"] > out["server_ms"]["search_ms"]["p50"]


def test_the_live_recall_of_a_gated_kind_matches_an_offline_comparison_of_its_first_stage(tmp_path,
                                                                                         splade_tiny_dir):
    from densehybrid.bench.scale import live_recall

    write_stdlib_corpus(tmp_path / "corpus.jsonl", limit=300)
    built = CliRunner().invoke(app, ["index", "build", "--corpus", str(tmp_path / "corpus.jsonl"), "--model",
                                     "splade-tiny", "--kind", "dlr", "--out", str(tmp_path / "index"), "--no-progress",
                                     "--ann", "pqscan", "--pqscan-margin", "0.3"])
    assert built.exit_code == 0, built.output
    texts = [json.loads(line)["text"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    groups = {"near": [t[:80] for t in texts[:6]], "far": ["what is the capital of france", "how do whales sleep"]}
    truth = live_recall.truth(tmp_path / "index", groups, {"margin": 0, "rescore": 10})
    for breadth in ("default", "narrow"):  # the GIP rerank reorders the hits; the first stage's are compared
        assert truth[breadth]["samples"] == 8 and abs(truth[breadth]["difference"]) <= 1e-3, truth


def test_the_live_recall_matches_an_offline_comparison_and_its_cost_is_measured(tmp_path, minilm_dir):
    from densehybrid.bench.scale import live_recall

    write_stdlib_corpus(tmp_path / "corpus.jsonl", limit=400)
    built = CliRunner().invoke(app, ["index", "build", "--corpus", str(tmp_path / "corpus.jsonl"), "--model", "minilm",
                                     "--kind", "cls", "--pooling", "mean", "--normalize", "--out", str(tmp_path / "index"),
                                     "--no-progress", "--ann", "pqscan"])
    assert built.exit_code == 0, built.output
    texts = [json.loads(line)["text"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    groups = {"near": [t[:80] for t in texts[:8]], "far": ["what is the capital of france", "how do whales sleep"]}
    truth = live_recall.truth(tmp_path / "index", groups, {"margin": 0, "rescore": 10})
    for breadth in ("default", "narrow"):
        assert truth[breadth]["samples"] == 10 and truth[breadth]["dropped"] == 0
        assert abs(truth[breadth]["difference"]) <= 1e-3, truth  # the same answers, scored twice
        assert abs(truth[breadth]["metrics_difference"]) <= 1e-3, truth
    cost = live_recall.cost(tmp_path / "index", texts[:6], 1.0)
    assert cost["sampled"] >= 6 and cost["search_ms_sampling"]["n"] == cost["search_ms_not_sampling"]["n"] == 6
    assert cost["sampling_busy_s"] > 0 and 0 < cost["sampling_cpu_share_of_one_core"] < 1


def test_filtered_recall_is_measured_per_engine_and_filter_against_the_kept_rows_exact_top_10(tmp_path, fake_models):
    _, texts = built_stdlib_index(tmp_path, 600)
    write_queries(tmp_path / "near.jsonl", texts[:6])
    out = filtered.run(tmp_path / "index", [f"near={tmp_path / 'near.jsonl'}"], ["pqscan", "hnsw"],
                       tmp_path / "scratch", {"hnsw": 16})
    assert out["rows"] == 600 and set(out["engines"]) == {"pqscan", "hnsw"}
    assert out["engines"]["hnsw"]["breadth"] == {"ef_search": 16}
    for engine in out["engines"].values():
        assert list(engine["filters"]) == list(filtered.KINDS)
        for entry in engine["filters"].values():
            assert 0 <= entry["near"]["recall_at_10"] <= 1 and entry["p99_ms"] >= entry["p50_ms"] > 0
    again = filtered.run(tmp_path / "index", [f"near={tmp_path / 'near.jsonl'}"], ["hnsw"], tmp_path / "scratch", {})
    assert again["engines"]["hnsw"]["breadth"] != {"ef_search": 16}  # the written graph reused, at its own breadth
    assert "| hnsw | least-like-20 |" in filtered.markdown({"before": out, "after": again})
    results = tmp_path / "filtered.json"
    results.write_text(json.dumps({"machine": "this one", "notes": {"before": "why"}, "runs": {"before": out}}))
    filtered.main([str(tmp_path / "index"), "--queries", f"near={tmp_path / 'near.jsonl'}", "--ann", "hnsw",
                   "--scratch", str(tmp_path / "scratch"), "--label", "later", "--out", str(results)])
    kept = json.loads(results.read_text())  # a later run is filed beside the earlier ones and their notes
    assert kept["notes"] == {"before": "why"} and kept["machine"] == "this one"
    assert set(kept["runs"]) == {"before", "later"} and kept["runs"]["before"] == json.loads(json.dumps(out))


def test_the_least_like_filter_keeps_the_rows_of_lowest_score_and_ties_count_alike():
    scores = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 0.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
                       16.0, 17.0, 18.0, 19.0], np.float32)
    mask = filtered.kept_rows("least-like-20", scores, {})
    assert np.flatnonzero(mask).tolist() == [1, 2, 3, 5]
    assert filtered.recall(np.flatnonzero(mask), scores, mask) == (1.0, False)
    assert filtered.recall(np.array([1, -1]), scores, mask) == (0.25, True)
    assert filtered.recall(np.array([0]), scores, mask)[0] == 0.0  # a row the filter drops: a wrong answer
