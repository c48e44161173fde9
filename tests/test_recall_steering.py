"""Recall steering: the default breadth moves one measured step wider under the target and one narrower well
above it, within the operator's limits, counting only unfiltered samples at the default breadth; served, the
live recall of a too-narrow default widens it and /info, the answers and /metrics say so."""

import time

import httpx
import numpy as np
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.search.filters import Eq
from densehybrid.index.search.params import SearchParams
from densehybrid.index.served.loading import load_index
from densehybrid.index.served.stated_recall import BreadthLimits
from densehybrid.service.app import create_app
from densehybrid.service.recall_steering import RecallSteering, next_breadth, steps
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder
from test_live_recall import QUERIES, pqscan_dir  # noqa: F401 - the module's index fixture, reused

CURVE = [{"breadth": b, "recall_at_10": r, "exact_top10": r, "p50_ms": 1.0, "p99_ms": 1.0}
         for b, r in [(16, 0.8), (32, 0.9), (64, 0.95), (128, 0.98), (256, 0.99)]]
WIDE = BreadthLimits(ef_search=10_000, nprobe=65_536)


def _steering(ef_search=64, limits=WIDE, samples=10, slack=0.02):
    applied = []
    first_stage = {"type": "hnsw", "ef_search": ef_search,
                   "calibration": {"knob": "ef_search", "target_recall": 0.95, "curve": CURVE}}
    steering = RecallSteering(first_stage, lambda knob, value: applied.append((knob, value)), limits,
                              samples=samples, slack=slack)
    return steering, applied


def _feed(steering, recall, n=10, params=SearchParams(), filtered=False):
    for _ in range(n):
        steering.observe(params, filtered, recall)


def test_steps_are_the_measured_breadths_within_the_limit():
    assert steps(CURVE, 100) == [16, 32, 64] and steps(CURVE, None) == [16, 32, 64, 128, 256]
    assert next_breadth(64, [16, 32, 64, 128], wider=True) == 128
    assert next_breadth(48, [16, 32, 64, 128], wider=False) == 32  # a breadth given at build, between two
    assert next_breadth(128, [16, 32, 64, 128], wider=True) is None


def test_under_the_target_the_default_widens_one_step_and_the_old_samples_are_set_aside():
    steering, applied = _steering()
    _feed(steering, 0.90, n=9)
    assert applied == []  # not enough samples yet
    _feed(steering, 0.90, n=1)
    assert applied == [("ef_search", 128)] and steering.breadth == 128
    assert steering.summary()["samples_at_breadth"] == 0
    change = steering.summary()["changes"][0]
    assert change["from"] == 64 and change["to"] == 128 and change["live_recall_at_10"] == 0.9


def test_well_above_the_target_it_narrows_and_near_it_it_stays():
    steering, applied = _steering()
    _feed(steering, 0.96)  # above, but within the slack
    assert applied == []
    _feed(steering, 0.99)
    assert applied == [("ef_search", 32)]


def test_it_never_steps_past_the_operators_limit_nor_past_the_measured_range():
    steering, applied = _steering(ef_search=64, limits=BreadthLimits(ef_search=64, nprobe=1))
    _feed(steering, 0.5, n=30)
    assert applied == []  # 128 is measured but over max_ef_search
    steering, applied = _steering(ef_search=16)
    _feed(steering, 1.0, n=30)
    assert applied == []  # nothing narrower was measured


def test_filtered_samples_and_requests_with_their_own_breadth_do_not_count():
    steering, applied = _steering()
    _feed(steering, 0.1, filtered=True, n=50)
    _feed(steering, 0.1, params=SearchParams(ef_search=16), n=50)
    _feed(steering, 0.1, params=SearchParams(filter=Eq("a", "b")), filtered=True, n=50)
    assert applied == [] and steering.summary()["samples_at_breadth"] == 0


def test_a_first_stage_without_a_target_cannot_be_steered():
    with pytest.raises(ValueError, match="no breadth to steer"):
        RecallSteering({"type": "flat"}, lambda k, v: None, WIDE)
    with pytest.raises(ValueError, match="no breadth to steer"):
        RecallSteering({"type": "pqscan", "margin": 0.04, "calibration": {"target_recall": None, "curve": CURVE}},
                       lambda k, v: None, WIDE)


def test_served_a_too_narrow_default_is_widened_by_the_live_recall(pqscan_dir):  # noqa: F811
    index = load_index(pqscan_dir)
    first_stage = index.manifest["first_stage"]
    first_stage["margin"] = 0.0  # as if the build had chosen no margin: too narrow for these queries
    first_stage["calibration"]["target_recall"] = 0.99
    settings = ServiceSettings(index=pqscan_dir, max_wait_ms=1, writes=False, recall_sample_rate=1.0,
                               recall_steering=True, recall_steering_samples=10, recall_sample_queue=1000)
    with LiveServer(create_app(settings, encoder=FakeEncoder("cls"), index=index)) as live, \
            httpx.Client(base_url=live.url, timeout=30) as client:
        assert client.get("/info").json()["index"]["first_stage"]["steering"]["breadth"] == 0
        deadline = time.monotonic() + 60
        while not client.get("/info").json()["index"]["first_stage"]["steering"]["changes"]:
            assert time.monotonic() < deadline, "never steered"
            for q in QUERIES[:10]:
                client.post("/search", json={"query": q, "k": 10}).raise_for_status()
        measured = -1  # the queued samples measured (one may step again), before reading what they left
        while (now := client.get("/info").json()["index"]["first_stage"]["live_recall"]["measured"]) != measured:
            measured = now
            time.sleep(0.5)
        info = client.get("/info").json()["index"]["first_stage"]
        change = info["steering"]["changes"][0]
        assert change["from"] == 0 and change["to"] > 0 and change["live_recall_at_10"] < 0.99
        assert info["margin"] == info["steering"]["breadth"] >= change["to"]
        answer = client.post("/search", json={"query": QUERIES[0], "k": 10}).json()["index"]["first_stage"]
        assert answer["margin"] == info["steering"]["breadth"]  # the next answers search, and state, the new default
        metrics = client.get("/metrics").text
        assert 'densehybrid_first_stage_breadth_changes_total{direction="wider"}' in metrics
        gauge = float(metrics.split('densehybrid_first_stage_breadth{knob="margin"} ')[1].split()[0])
        # samples still queued may step it again meanwhile: the gauge is one of the breadths it stepped to
        steps = client.get("/info").json()["index"]["first_stage"]["steering"]["changes"]
        assert any(np.isclose(gauge, step["to"]) for step in steps), (gauge, steps)
