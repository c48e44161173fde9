"""An HNSW index served over HTTP: ``ef_search`` per request, bounded by a setting, and the first stage
named in /info and in every answer (FakeEncoder, a loopback server)."""

import json

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder

COUNT = 400
WORDS = ["graph", "vector", "search", "index", "latency", "recall", "memory", "disk", "query", "passage"]


def _corpus(path):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(COUNT):
            words = " ".join(WORDS[(i * j + i // 7) % len(WORDS)] for j in range(1, 6))
            f.write(json.dumps({"_id": f"D{i}", "text": f"{words} {i}"}) + "\n")
    return path


@pytest.fixture(scope="module")
def index_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hnsw-service")
    corpus = _corpus(root / "corpus.jsonl")
    ann = HNSWConfig(m=16, ef_construction=64, ef_search=48, train_size=COUNT)
    return {first_stage: build_index(FakeEncoder("cls"), corpus, root / first_stage,
                                     BuildOptions(progress=False, ann=ann if first_stage == "hnsw" else None,
                                                  target_recall=None))  # the breadth given stays
            for first_stage in ("hnsw", "flat")}


@pytest.fixture(scope="module", params=["hnsw", "flat"])
def served(request, index_dirs):
    directory = index_dirs[request.param]
    settings = ServiceSettings(index=directory, max_k=50, max_wait_ms=1, max_ef_search=512, writes=False)
    with LiveServer(create_app(settings, encoder=FakeEncoder("cls"), index=load_index(directory))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as client:
        yield request.param, directory, client


def test_info_names_the_first_stage_and_the_ef_search_limit(served):
    first_stage, _, client = served
    info = client.get("/info").json()
    assert info["limits"]["max_ef_search"] == 512
    named = {k: v for k, v in info["index"]["first_stage"].items() if v is not None}
    assert named.pop("live_recall")["sample_rate"] == 0.01  # measured on live traffic: tests/test_live_recall.py
    if first_stage == "hnsw":  # the build measured the curve, and kept the breadth it was given
        calibration = named.pop("calibration")
        assert calibration["knob"] == "ef_search" and calibration["target_recall"] is None
        assert [g["name"] for g in calibration["groups"]] == ["in_domain", "other_domain"]
        assert calibration["groups"][0]["source"].startswith("a sentence cut from each of")
        assert calibration["queries"] == sum(g["queries"] for g in calibration["groups"])
        assert calibration["measured_rows"] > 0 and calibration["stale"] is False
        assert [p["breadth"] for p in calibration["curve"]] == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert named == ({"type": "hnsw", "ef_search": 48} if first_stage == "hnsw" else {"type": "flat"})


def _curve(client) -> list[dict]:
    return client.get("/info").json()["index"]["first_stage"]["calibration"]["curve"]


def test_every_answer_names_the_first_stage_the_breadth_it_used_and_its_measured_recall(served):
    first_stage, _, client = served
    default = client.post("/search", json={"query": "graph recall", "k": 5}).json()["index"]["first_stage"]
    wide = client.post("/search", json={"query": "graph recall", "k": 5, "ef_search": 300}).json()
    if first_stage == "hnsw":
        curve = _curve(client)
        measured = {p["breadth"]: p["recall_at_10"] for p in curve}
        # 48 and 300 lie between measured breadths: the recall of the narrower one (a wider walk finds as much)
        assert default == {"type": "hnsw", "ef_search": 48, "recall_at_10": measured[32]}
        assert wide["index"]["first_stage"] == {"type": "hnsw", "ef_search": 300, "recall_at_10": measured[256]}
    else:  # an exact scan has no breadth: the field is accepted and has nothing to change
        assert default == wide["index"]["first_stage"] == {"type": "flat", "recall_at_10": 1.0}


@pytest.mark.parametrize("wanted", [0.5, 0.97, 1.0])
def test_a_request_for_a_recall_gets_the_cheapest_breadth_measured_to_keep_it(served, wanted):
    first_stage, _, client = served
    answer = client.post("/search", json={"query": "graph recall", "k": 5, "recall": wanted}).json()
    if first_stage == "flat":
        assert answer["index"]["first_stage"] == {"type": "flat", "recall_at_10": 1.0, "reached": True}
        return
    curve = _curve(client)
    keeping = [p for p in curve if p["exact_top10"] >= wanted]  # whole top 10s for that share of the queries
    expected = (min(keeping, key=lambda p: p["breadth"]) if keeping
                else max(curve, key=lambda p: (p["recall_at_10"], -p["breadth"])))
    assert answer["index"]["first_stage"] == {"type": "hnsw", "ef_search": expected["breadth"],
                                              "recall_at_10": expected["recall_at_10"], "reached": bool(keeping)}


def test_a_breadth_given_beside_a_recall_wins(served):
    first_stage, _, client = served
    answer = client.post("/search", json={"query": "graph", "recall": 0.99, "ef_search": 64, "nprobe": 3}).json()
    assert answer["index"]["first_stage"]["type"] == first_stage
    if first_stage == "hnsw":
        assert answer["index"]["first_stage"]["ef_search"] == 64


@pytest.mark.parametrize("recall", [0, 1.5, "high", -0.1])
def test_a_recall_out_of_range_is_a_422_and_the_server_stays_up(served, recall):
    _, _, client = served
    response = client.post("/search", json={"query": "graph", "recall": recall})
    assert response.status_code == 422 and "recall" in response.text, response.text
    assert client.post("/search", json={"query": "graph"}).status_code == 200


def test_a_wide_walk_answers_the_exact_top_k(served):
    _, directory, client = served
    query = "vector search latency"
    hits = client.post("/search", json={"query": query, "k": 10, "ef_search": COUNT}).json()["results"]
    index = load_index(directory)
    exact = Searcher(index, engine="torch").search(FakeEncoder("cls").encode([query], "query"), SearchParams(k=10))
    assert [h["id"] for h in hits] == exact.ids[0]
    assert [h["score"] for h in hits] == pytest.approx(exact.scores[0], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("ef_search", [0, 513, "wide", 1.5])
def test_an_ef_search_out_of_bounds_is_a_422_and_the_server_stays_up(served, ef_search):
    _, _, client = served
    response = client.post("/search", json={"query": "graph", "ef_search": ef_search})
    assert response.status_code == 422 and "ef_search" in response.text
    assert client.post("/search", json={"query": "graph"}).status_code == 200


def test_an_answer_past_the_measured_top_10_states_no_recall_and_says_why(served):
    first_stage, _, client = served
    answer = client.post("/search", json={"query": "graph recall", "k": 20}).json()["index"]["first_stage"]
    if first_stage == "hnsw":
        assert answer["recall_at_10"] is None and "recall@10" in answer["recall_note"]
    else:  # an exact scan finds every page exactly
        assert answer == {"type": "flat", "recall_at_10": 1.0}
