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
                                     BuildOptions(progress=False, ann=ann if first_stage == "hnsw" else None))
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
    assert {k: v for k, v in info["index"]["first_stage"].items() if v is not None} == ({"type": "hnsw", "ef_search": 48} if first_stage == "hnsw"
                                            else {"type": "flat"})


def test_every_answer_names_the_first_stage_and_the_breadth_it_used(served):
    first_stage, _, client = served
    default = client.post("/search", json={"query": "graph recall", "k": 5}).json()["index"]["first_stage"]
    wide = client.post("/search", json={"query": "graph recall", "k": 5, "ef_search": 300}).json()
    if first_stage == "hnsw":
        assert default == {"type": "hnsw", "ef_search": 48}
        assert wide["index"]["first_stage"] == {"type": "hnsw", "ef_search": 300}
    else:  # an exact scan has no breadth: the field is accepted and has nothing to change
        assert default == wide["index"]["first_stage"] == {"type": "flat"}


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
