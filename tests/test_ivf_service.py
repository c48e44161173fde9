"""An IVF index served over HTTP: ``nprobe`` per request, bounded by a setting, and the first stage named
in /info and in every answer (FakeEncoder, a loopback server)."""

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.engines.ivf_engine import IVFConfig
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder
from test_hnsw_service import _corpus

LISTS = 8


@pytest.fixture(scope="module")
def index_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivf-service")
    corpus = _corpus(root / "corpus.jsonl")
    ann = IVFConfig(nlist=LISTS, nprobe=2)
    return {first_stage: build_index(FakeEncoder("cls"), corpus, root / first_stage,
                                     BuildOptions(progress=False, ann=ann if first_stage == "ivf" else None,
                                                  target_recall=None))  # the lists given stay
            for first_stage in ("ivf", "flat")}


@pytest.fixture(scope="module", params=["ivf", "flat"])
def served(request, index_dirs):
    directory = index_dirs[request.param]
    settings = ServiceSettings(index=directory, max_k=50, max_wait_ms=1, max_nprobe=64, writes=False)
    with LiveServer(create_app(settings, encoder=FakeEncoder("cls"), index=load_index(directory))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as client:
        yield request.param, directory, client


def test_info_names_the_first_stage_and_the_nprobe_limit(served):
    first_stage, _, client = served
    info = client.get("/info").json()
    assert info["limits"]["max_nprobe"] == 64
    named = {k: v for k, v in info["index"]["first_stage"].items() if v is not None}
    assert named.pop("live_recall")["sample_rate"] == 0.01  # measured on live traffic: tests/test_live_recall.py
    if first_stage == "ivf":  # the build measured every number of lists up to all of them
        assert [p["breadth"] for p in named.pop("calibration")["curve"]] == [1, 2, 4, LISTS]
    assert named == ({"type": "ivf", "nprobe": 2} if first_stage == "ivf" else {"type": "flat"})


def test_every_answer_names_the_first_stage_and_the_lists_it_scanned(served):
    first_stage, _, client = served
    default = client.post("/search", json={"query": "graph recall", "k": 5}).json()["index"]["first_stage"]
    wide = client.post("/search", json={"query": "graph recall", "k": 5, "nprobe": 6}).json()
    if first_stage == "ivf":
        curve = {p["breadth"]: p["recall_at_10"] for p in
                 client.get("/info").json()["index"]["first_stage"]["calibration"]["curve"]}
        assert default == {"type": "ivf", "nprobe": 2, "recall_at_10": curve[2]}
        assert wide["index"]["first_stage"] == {"type": "ivf", "nprobe": 6, "recall_at_10": curve[4]}
    else:  # an exact scan has no lists: the field is accepted and has nothing to change
        assert default == wide["index"]["first_stage"] == {"type": "flat", "recall_at_10": 1.0}


def test_scanning_every_list_answers_the_exact_top_k(served):
    _, directory, client = served
    query = "vector search latency"
    hits = client.post("/search", json={"query": query, "k": 10, "nprobe": LISTS}).json()["results"]
    exact = Searcher(load_index(directory), engine="torch").search(FakeEncoder("cls").encode([query], "query"),
                                                                   SearchParams(k=10))
    assert [h["id"] for h in hits] == exact.ids[0]
    assert [h["score"] for h in hits] == pytest.approx(exact.scores[0], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("nprobe", [0, 65, "all", 1.5])
def test_an_nprobe_out_of_bounds_is_a_422_and_the_server_stays_up(served, nprobe):
    _, _, client = served
    response = client.post("/search", json={"query": "graph", "nprobe": nprobe})
    assert response.status_code == 422 and "nprobe" in response.text
    assert client.post("/search", json={"query": "graph"}).status_code == 200
