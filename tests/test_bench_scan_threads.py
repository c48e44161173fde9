"""``python -m densehybrid.bench.scale.scan_threads``: each thread count measured alone and under clients, with and
without the code sample."""

import pytest
from typer.testing import CliRunner

from densehybrid.bench.scale import scan_threads
from densehybrid.cli.demo_corpus import write_stdlib_corpus
from densehybrid.cli.main import app
from support.index_files import write_queries


def test_each_thread_count_is_measured_and_answers_as_the_first(tmp_path, fake_models):
    write_stdlib_corpus(tmp_path / "corpus.jsonl", limit=600)
    built = CliRunner().invoke(app, ["index", "build", "--corpus", str(tmp_path / "corpus.jsonl"), "--model",
                                     "fake:cls", "--out", str(tmp_path / "index"), "--no-progress", "--ann", "pqscan",
                                     "--pqscan-margin", "0.05"])
    assert built.exit_code == 0, built.output
    write_queries(tmp_path / "q.jsonl", [f"query {i} about {t}" for i, t in enumerate(["files", "dates", "sockets"])])
    out = scan_threads.run(tmp_path / "index", [f"few={tmp_path / 'q.jsonl'}:2", f"all={tmp_path / 'q.jsonl'}"],
                           [1, 2], [1, 3], rounds=2, seconds=0.1, top_list=True)
    assert out["rows"] == 600 and out["queries"] == {"few": 2, "all": 3} and out["same_answers"]
    stores = ["1", "2", "1, top list", "2, top list"]
    assert {t: timing["n"] for t, timing in out["latency_ms"].items()} == dict.fromkeys(stores, 5)  # every query
    for t in stores:
        for clients in (1, 3):
            assert len(out["throughput"][t][clients]["rounds_qps"]) == 2 and out["throughput"][t][clients]["median_qps"] > 0
    assert set(out["ratios"]) == set(stores[1:])
    assert set(out["ratios"]["2, top list"]) == {"p50", "p95", "qps_1_clients", "qps_3_clients"}
    assert "| 2 / 1 |" in scan_threads.markdown(out) and "| 2, top list / 1 |" in scan_threads.markdown(out)


def test_an_index_without_product_codes_is_refused_by_name(tmp_path, fake_models):
    write_stdlib_corpus(tmp_path / "corpus.jsonl", limit=50)
    CliRunner().invoke(app, ["index", "build", "--corpus", str(tmp_path / "corpus.jsonl"), "--model", "fake:cls",
                             "--out", str(tmp_path / "index"), "--no-progress"])
    write_queries(tmp_path / "q.jsonl", ["a query"])
    with pytest.raises(SystemExit, match="a pqscan first stage is needed, this index has flat_ip"):
        scan_threads.run(tmp_path / "index", [f"q={tmp_path / 'q.jsonl'}"], [1, 2], [1], rounds=1, seconds=0.1)
