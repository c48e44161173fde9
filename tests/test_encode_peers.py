"""The /encode peer benchmark: wrk against a live server, its result line, the summaries and the median round."""

import shutil

import httpx
import pytest
from support.deploy_tools import require_tool

from densehybrid.bench.load import wrk
from densehybrid.bench.load.wrk import parse_wrk_output, run_wrk, summarize
from densehybrid.bench.load.workloads import densehybrid_request, workload_texts
from densehybrid.bench.peers.encode import median_round, print_table
from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder

WRK_LINE = ('wrk noise\nWRK_JSON {"duration_us":2000000,"errors":{"connect":0,"read":1,"timeout":0,"write":0},'
            '"latency_ms":{"max":50.0,"mean":20.0,"p50":18.0,"p90":30.0,"p99":45.0},"requests":5,'
            '"stages_ms":{"encode":5.0,"queue":1.0,"tokenize":2.0},"statuses":{"200":5}}\n')
WITH_REFUSALS = WRK_LINE.replace('"statuses":{"200":5}', '"statuses":{"200":4,"429":1}')


def test_the_wrk_line_parses_into_a_summary_split_into_server_stages_and_the_rest():
    summary = summarize(parse_wrk_output(WRK_LINE))
    assert summary["requests"] == 5 and summary["req_s"] == 2.5
    assert summary["statuses"] == {200: 5} and summary["errors"] == {"read": 1}
    assert (summary["p50_ms"], summary["p99_ms"]) == (18.0, 45.0)
    assert summary["stages"] == {"queue_ms": 1.0, "tokenize_ms": 2.0, "encode_ms": 5.0, "other_ms": 12.0}


def test_refused_answers_count_in_no_throughput_and_leave_other_out():
    summary = summarize(parse_wrk_output(WITH_REFUSALS))
    assert summary["req_s"] == 2.0 and summary["statuses"] == {200: 4, 429: 1}  # 2xx answers per second
    # wrk's mean latency includes the quick 429s, the server's stage means only the 2xx answers
    assert summary["stages"] == {"queue_ms": 1.0, "tokenize_ms": 2.0, "encode_ms": 5.0}


def test_other_is_client_latency_minus_the_servers_total_when_it_sends_one():
    result = parse_wrk_output(WRK_LINE.replace('"tokenize":2.0', '"tokenize":2.0,"total":9.5'))
    assert summarize(result)["stages"] == {"queue_ms": 1.0, "tokenize_ms": 2.0, "encode_ms": 5.0, "total_ms": 9.5,
                                           "other_ms": 10.5}


def test_serialization_follows_the_servers_total_and_is_not_other():
    result = parse_wrk_output(WRK_LINE.replace('"tokenize":2.0', '"tokenize":2.0,"total":9.5,"serialize":0.5'))
    assert summarize(result)["stages"] == {"queue_ms": 1.0, "tokenize_ms": 2.0, "encode_ms": 5.0, "total_ms": 9.5,
                                           "serialize_ms": 0.5, "other_ms": 10.0}


def test_a_run_without_the_result_line_is_an_error():
    with pytest.raises(RuntimeError, match="no WRK_JSON line"):
        parse_wrk_output("Running 1s test @ http://127.0.0.1:1\n")


def test_a_missing_wrk_names_its_install(monkeypatch):
    monkeypatch.setattr(wrk.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="apt-get install wrk"):
        run_wrk("http://127.0.0.1:1", "/encode", [{}], clients=1, duration_s=1)


def test_median_round_picks_the_middle_throughput_per_cell():
    rounds = [{"query": {8: {"req_s": r}}} for r in (30.0, 10.0, 20.0)]
    assert median_round(rounds)["query"][8]["req_s"] == 20.0


def test_the_search_table_says_infinity_only_embeds_the_query(capsys):
    cell = {"req_s": 10.0, "p50_ms": 5.0, "p99_ms": 9.0, "statuses": {200: 100}}
    print_table({"search": {8: cell}}, {"search": {8: cell}})
    title = capsys.readouterr().out.strip().splitlines()[0]
    assert title.startswith("/search") and "infinity: /embeddings of the same query" in title
    assert "upper bound" in title


def test_where_the_time_goes_is_printed_for_every_client_count_with_its_refusals(capsys):
    calm = {"req_s": 10.0, "p50_ms": 5.0, "p99_ms": 9.0, "statuses": {200: 100},
            "stages": {"queue_ms": 1.0, "encode_ms": 3.0, "other_ms": 1.0}}
    full = {"req_s": 9.0, "p50_ms": 5.0, "p99_ms": 90.0, "statuses": {200: 90, 429: 40},
            "stages": {"queue_ms": 60.0, "encode_ms": 3.0}}
    print_table({"query": {8: calm, 64: full}}, None)
    lines = capsys.readouterr().out.splitlines()
    assert "      8 clients: queue 1.0, encode 3.0, other 1.0" in lines
    assert "     64 clients: queue 60.0, encode 3.0; 40 answers not 2xx {200: 90, 429: 40}" in lines


@pytest.fixture(scope="module")
def server(toy_index):
    index_dir = toy_index("cls", count=40)
    app = create_app(ServiceSettings(max_request_texts=16), encoder=FakeEncoder("cls"), index=load_index(index_dir))
    with LiveServer(app) as live:
        yield live


def server_timing_names(url: str, path: str, body: dict) -> set[str]:
    header = httpx.post(url + path, json=body, timeout=30).headers["server-timing"]
    return {part.split(";")[0].strip() for part in header.split(",")}


@pytest.mark.parametrize("workload,texts", [("query", 1), ("passages", 16), ("search", 1)])
def test_wrk_against_a_live_server_counts_every_answer_and_reads_server_timing(server, workload, texts):
    require_tool("wrk", shutil.which("wrk"))
    assert len(workload_texts(workload, 3)) == texts
    path, bodies = densehybrid_request(workload)
    summary = run_wrk(server.url, path, bodies, clients=4, duration_s=1)
    assert summary["req_s"] > 0 and summary["requests"] > 0
    assert summary["statuses"] == {200: summary["requests"]} and summary["errors"] == {}
    sent = server_timing_names(server.url, path, bodies[0])
    assert set(summary["stages"]) == {f"{name}_ms" for name in sent} | {"other_ms"}
    assert all(value >= 0 for name, value in summary["stages"].items() if name != "other_ms")
