"""The benchmark runs end to end in --quick mode and writes the documented JSON (no timing asserts)."""

import json
import math

import pytest

from densehybrid.bench import report
from densehybrid.bench.cli import config_from
from densehybrid.bench.targets import TARGETS


def numbers(tree):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from numbers(value)
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield tree


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    from densehybrid.bench.cli import run_and_report

    out = tmp_path_factory.mktemp("bench") / "bench.json"
    run_and_report(config_from("quick", threads=1), out)
    return json.loads(out.read_text())


def test_quick_run_writes_every_section(quick_results):
    r = quick_results
    assert {"memory", "search", "encoder", "service", "targets", "machine", "config"} <= set(r)
    assert r["memory"]["read_gbps_1_thread"] > 0 and r["memory"]["read_gbps_2_threads"] > 0
    fs = r["search"]["first_stage"]
    assert fs["rows"] == 20_000 and fs["dim"] == 768
    for key in ("batch1_ms_1_thread", "batch1_ms_2_threads", "batch1_qps", "batch1_scan_fraction_of_1_thread_bandwidth",
                "batch16_faiss_default_qps", "batch16_blas_tuned_qps"):
        assert key in fs
    assert r["search"]["rerank"]["candidates"] == 2_000
    assert {"ip_ms", "approx_gip_ms", "approx_over_ip"} <= set(r["search"]["approx_vs_ip"])
    torch_stage = r["search"]["torch"]  # the GPU path's first stage, here on the CPU
    assert torch_stage["device"] == "cpu" and torch_stage["rows"] == 20_000 and torch_stage["dtype"] == "float32"
    assert torch_stage["fraction_of_bandwidth"] > 0 and torch_stage["rerank_candidates"] == 2_000


def test_quick_run_measures_every_encoder_variant_on_both_backends(quick_results):
    latency = quick_results["encoder"]["query_latency_ms"]
    for backend in ("torch", "onnx"):
        for length in ("len12", "len32"):
            row = latency[backend][length]
            references = {"bare_backbone", "bare_masked_lm"} if backend == "torch" else set()
            assert set(row) == {"cls", "aggretriever", "aggretriever_skip_mlm", "dhr"} | references
            assert row["cls"]["ratio_to_cls_p50"] == 1.0
            assert all(t["n"] == 3 and t["p50"] <= t["p99"] for t in row.values())
        texts = latency[backend]["text_with_tokenize"]
        assert set(texts) == {"cls", "aggretriever", "aggretriever_skip_mlm", "dhr"}
        assert all(t["n"] == 3 and t["p50"] <= t["p99"] for t in texts.values())
    for row in (v for v in quick_results["encoder"]["passage_throughput"].values() if isinstance(v, dict)):
        assert {"bare_transformers_pps", "torch_pps", "onnx_pps", "torch_over_bare", "onnx_over_bare"} <= set(row)


def test_quick_run_drives_a_live_server_with_and_without_batching(quick_results):
    s = quick_results["service"]
    for mode in ("batching_on", "batching_on_nowait", "batching_off"):
        for route in ("/search", "/encode"):
            for level in ("c1", "c4"):
                assert {"p50_ms", "p95_ms", "rps", "server_total_p50_ms", "overhead_p50_ms"} <= set(s[mode][route][level])
    assert "search_ms" in s["in_process"] and "encode_ms" in s["in_process"]
    assert set(s["search_overhead_p50_ms"]) == set(s["encode_rps_ratio_max_vs_1"]) == {"on", "on_nowait", "off"}


def test_every_target_is_evaluated_and_every_number_is_finite(quick_results):
    assert [t["name"] for t in quick_results["targets"]] == [t.name for t in TARGETS]
    assert all(t["value"] is not None and t["met"] in (True, False) for t in quick_results["targets"])
    assert all(math.isfinite(x) for x in numbers(quick_results))


def test_table_has_a_row_per_measurement(quick_results):
    sections = [row[0] for row in report.rows(quick_results)]
    assert report.markdown(quick_results).count("\n| ") == len(sections) + 1  # header + one line per row
    for section in ("memory", "first stage", "rerank", "approx GIP", "encoder", "passages", "service", "target"):
        assert section in sections


def test_the_table_prints_figures_a_device_did_not_measure(quick_results, capsys):
    """A None figure (a bandwidth not measured on this device) prints as '-' instead of crashing."""
    import copy

    results = copy.deepcopy(quick_results)
    results["search"]["first_stage"]["batch1_scan_fraction_of_2_thread_bandwidth"] = None
    results["search"]["torch"]["fraction_of_bandwidth"] = None
    results["search"]["rerank"]["fraction_of_first_stage_batch1"] = None
    report.print_table(results)
    assert " - of 2-thread" in capsys.readouterr().out


def test_bench_help_lists_its_flags():
    from typer.testing import CliRunner

    from densehybrid.cli.main import app

    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0
    for flag in ("--quick", "--device", "--only", "--rows", "--threads", "--out"):
        assert flag in result.output


def test_bench_options_reach_the_config(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import densehybrid.bench.cli as bench_cli
    from densehybrid.cli.main import app

    seen = []
    monkeypatch.setattr(bench_cli, "run_and_report", lambda config, out, markdown: seen.append((config, out, markdown)))
    result = CliRunner().invoke(app, ["bench", "--quick", "--only", "encoder", "--only", "search", "--threads", "1",
                                      "--backends", "onnx", "--service-backend", "torch", "--rows", "500",
                                      "--out", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    ((config, out, markdown),) = seen
    assert (config.preset, config.sections, config.threads, config.backends, config.service_backend,
            config.first_stage_rows) == ("quick", ("encoder", "search"), 1, ("onnx",), "torch", 500)
    assert (out, markdown) == (tmp_path / "b.json", None)


@pytest.mark.parametrize("args", [["--quick", "--full"], ["--only", "gpu"], ["--threads", "0"]])
def test_bench_refuses_bad_options_before_running(monkeypatch, args):
    from typer.testing import CliRunner

    import densehybrid.bench.cli as bench_cli
    from densehybrid.cli.main import app

    monkeypatch.setattr(bench_cli, "run_and_report", lambda *a: pytest.fail("ran despite a bad option"))
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output


def test_python_m_bench_is_the_same_command():
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "densehybrid.bench", "--help"], capture_output=True, text=True,
                           env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert shown.returncode == 0, shown.stderr
    for flag in ("--quick", "--full", "--only", "--backends", "--service-kind"):
        assert flag in shown.stdout


def test_client_processes_are_summed_over_their_common_wall_time():
    from densehybrid.bench.load.client import Samples, summary

    first = Samples([1.0, 2.0, 3.0], [0.5] * 3, [0.1] * 3, began=100.0, ended=101.0)
    second = Samples([4.0, 5.0], [0.7] * 2, [0.2] * 2, began=100.5, ended=102.0)
    level = summary([first, second], requests=5)
    assert level["rps"] == 2.5  # 5 requests from the first start to the last end (2 s)
    assert level["p50_ms"] == 3.0 and level["server_total_p50_ms"] == 0.5 and level["client_processes"] == 2
