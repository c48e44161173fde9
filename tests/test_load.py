"""The load test in its short form (the 10-minute soak: ``densehybrid loadtest --soak-s 600``).

A server process on loopback with a forward of 40 ms + 10 ms per text (batches of up to 4, a queue of
32 texts), driven by benchmarks/load/loadtest.py: below saturation everything is answered; beyond it the
excess is shed with 429 + Retry-After while the queue stays at its bound and nothing times out; RSS
stays flat over the soak.
"""

import pytest

from densehybrid.bench.load.loadtest import FakeServerConfig, LoadConfig, run_load
from densehybrid.bench.load.probe import rss_drift, server_quantiles
from densehybrid.bench.timing import percentile, summarize

SERVER = FakeServerConfig()
ENCODER_CEILING_RPS = SERVER.max_batch_size / ((SERVER.base_ms + SERVER.per_text_ms * SERVER.max_batch_size) / 1000)


def test_percentile_is_nearest_rank():
    values = sorted(float(v) for v in range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input is fine


def test_benchmark_summaries_use_the_same_percentile():
    samples = [float(v) for v in range(100, 0, -1)]
    timing = summarize(samples)
    assert (timing.p50, timing.p95, timing.p99) == (percentile(samples, 50), percentile(samples, 95), 99.0)


def test_rss_drift_compares_the_end_with_the_first_third():
    samples = [(float(t), 100.0 + (5.0 if t >= 6 else 0.0)) for t in range(9)]
    drift = rss_drift(samples)
    assert drift["rss_after_third_mb"] == 100.0 and drift["drift_mb"] == 5.0 and drift["drift_percent"] == 5.0


def test_server_quantiles_come_from_the_histogram_delta_between_two_scrapes():
    def scrape(counts):
        lines = [f'densehybrid_queue_wait_seconds_bucket{{le="{le}"}} {c}' for le, c in zip(["0.01", "0.1", "1.0", "+Inf"], counts)]
        return "# TYPE densehybrid_queue_wait_seconds histogram\n" + "\n".join(lines) + "\n"

    before, after = scrape([5, 5, 5, 5]), scrape([5 + 90, 5 + 99, 5 + 100, 5 + 100])  # this phase: 90/9/1
    q = server_quantiles(before, after, "densehybrid_queue_wait_seconds", {}, qs=(50, 95, 99, 100))
    assert q == {"p50_le_ms": 10.0, "p95_le_ms": 100.0, "p99_le_ms": 100.0, "p100_le_ms": 1000.0}


@pytest.mark.slow
def test_short_load_run_sheds_beyond_saturation_and_memory_stays_flat(tmp_path):
    config = LoadConfig(saturation_s=4, phase_s=4, soak_s=20, concurrency=(16,), overload=2.5, rss_every_s=1)
    report = run_load(config, SERVER, tmp_path)
    phases = {p["phase"].split(" ")[0]: p for p in report["phases"]}
    assert 0 < report["saturation_rps"] <= 1.2 * ENCODER_CEILING_RPS, report["saturation_rps"]
    for name in ("50%", "soak"):  # comfortably below saturation: every request answered
        assert set(phases[name]["statuses"]) == {200}, phases[name]
    overload = phases["2.5x"]
    assert set(overload["statuses"]) == {200, 429}, overload  # no timeouts, no 5xx, nothing else
    assert overload["shed_fraction"] > 0 and overload["retry_after_missing"] == 0
    assert overload["max_queue_depth"] <= SERVER.queue_size
    assert overload["server"]["queue_wait"]["p99_le_ms"] is not None
    rss = report["soak_rss"]
    assert len(rss["samples"]) >= 10 and abs(rss["drift_mb"]) < 16, rss
