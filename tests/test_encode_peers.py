"""The /encode peer benchmark's bookkeeping: summaries, stage split and the median round."""

import asyncio

import pytest

from densehybrid.bench.encode_peers import Run, closed_loop, densehybrid_request, median_round, workload_texts
from densehybrid.bench.fake_encoder import FakeEncoder
from densehybrid.bench.servers import LiveServer
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings


def test_summary_splits_client_latency_into_server_stages_and_the_rest():
    run = Run(latencies_ms=[10.0, 20.0, 30.0, 40.0], elapsed_s=2.0,
              stage_ms={"queue_ms": [1.0] * 4, "tokenize_ms": [2.0] * 4, "encode_ms": [5.0] * 4})
    summary = run.summary()
    assert summary["req_s"] == 2.0 and summary["requests"] == 4
    assert summary["p50_ms"] == 25.0
    assert summary["stages"] == {"queue_ms": 1.0, "tokenize_ms": 2.0, "encode_ms": 5.0, "other_ms": 17.0}


def test_median_round_picks_the_middle_throughput_per_cell():
    rounds = [{"query": {8: {"req_s": r}}} for r in (30.0, 10.0, 20.0)]
    assert median_round(rounds)["query"][8]["req_s"] == 20.0


@pytest.mark.parametrize("workload,count", [("query", 1), ("passages", 16)])
def test_closed_loop_against_a_live_server_counts_every_answer(workload, count):
    assert len(workload_texts(workload, 3)) == count
    app = create_app(ServiceSettings(max_request_texts=16), encoder=FakeEncoder("cls"))
    with LiveServer(app) as live:
        run = asyncio.run(closed_loop(live.url, densehybrid_request(workload), clients=4, requests=12))
    summary = run.summary()
    assert summary["statuses"] == {200: 12} and summary["requests"] == 12
    assert set(summary["stages"]) == {"queue_ms", "tokenize_ms", "encode_ms", "other_ms"}
    assert all(value >= 0 for name, value in summary["stages"].items() if name != "other_ms")
