"""``/search`` with ``offset``, ``fusion: rrf`` and ``rrf_k``, and each hit's part scores, over HTTP."""

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.index.search.params import SearchParams
from support.fake_encoder import FakeEncoder

MAX_K = 50
QUERY = "gated inner product of term weights"


@pytest.fixture(scope="module")
def fusion_server(toy_index):
    index_dir = toy_index("fusion", count=60)
    app = create_app(ServiceSettings(max_wait_ms=5, max_k=MAX_K), encoder=FakeEncoder("fusion"),
                     index=load_index(index_dir))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        yield client, Searcher(load_index(index_dir)), FakeEncoder("fusion")


def search(client, **body):
    r = client.post("/search", json={"query": QUERY, **body})
    assert r.status_code == 200, r.text
    return r.json()["results"]


@pytest.mark.parametrize("body", [{}, {"fusion": "rrf"}, {"fusion": "zscore"}, {"fusion": "rrf", "rrf_k": 3},
                                  {"lambda": 2.0}, {"rerank": False}, {"fusion": "adaptive", "candidates": 30}])
def test_pages_concatenate_to_the_whole_list_with_ranks_from_the_offset(fusion_server, body):
    client, _, _ = fusion_server
    whole = search(client, k=20, **body)
    pages = search(client, k=10, **body) + search(client, k=10, offset=10, **body)
    assert pages == whole and [h["rank"] for h in whole] == list(range(1, 21))
    assert [h["rank"] for h in search(client, k=5, offset=7, **body)] == list(range(8, 13))


def test_rrf_hits_equal_the_searcher_and_carry_their_part_scores(fusion_server):
    client, searcher, encoder = fusion_server
    for body in ({"fusion": "rrf"}, {"fusion": "rrf", "rrf_k": 1}, {"fusion": "minmax"}, {"fusion": "lambda"},
                 {"fusion": "lexical"}):
        hits = search(client, k=8, offset=4, **body)
        want = searcher.search(encoder.encode([QUERY], "query"), SearchParams(k=8, offset=4, method=body["fusion"],
                               rrf_k=body.get("rrf_k")))
        assert [h["id"] for h in hits] == want.ids[0]
        assert [h["score"] for h in hits] == want.scores[0] == [h["fused_score"] for h in hits]
        assert [h["lexical_score"] for h in hits] == want.lexical_scores[0]
        assert [h["dense_score"] for h in hits] == want.dense_scores[0]
    assert search(client, k=3, fusion="rrf", rrf_k=1) != search(client, k=3, fusion="rrf")


def test_offset_plus_k_over_max_k_is_refused_with_the_limit_in_the_message(fusion_server):
    client, _, _ = fusion_server
    r = client.post("/search", json={"query": QUERY, "k": 30, "offset": 25})
    assert r.status_code == 422
    assert r.json()["error"]["message"] == f"body: offset + k = 55 exceeds max_k = {MAX_K}; lower offset or k"
    for bad in ({"offset": -1}, {"offset": MAX_K}, {"offset": "3"}, {"rrf_k": -1}, {"rrf_k": 1.5},
                {"fusion": "rrf", "rrf_k": "60"}):
        r = client.post("/search", json={"query": QUERY, **bad})
        assert r.status_code == 422 and list(bad)[-1] in r.json()["error"]["message"], (bad, r.text)
    assert len(search(client, k=1, offset=MAX_K - 1)) == 1  # the last allowed page (60 documents)
    assert search(client, k=10, offset=35) == search(client, k=20, offset=30)[5:15]


def test_a_batch_pages_every_query_and_explains_the_page(fusion_server):
    client, _, _ = fusion_server
    r = client.post("/search", json={"queries": [QUERY, "dense"], "k": 1, "offset": 49, "explain": True})
    assert r.status_code == 200
    assert [[h["rank"] for h in hits] for hits in r.json()["results"]] == [[50], [50]]
    assert r.json()["results"][0][0]["id"] == search(client, k=50)[49]["id"]
    assert "explanation" in r.json()["results"][0][0]


def test_kinds_without_two_parts_leave_the_part_scores_out(toy_index):
    index_dir = toy_index("dlr", count=40)
    app = create_app(ServiceSettings(max_wait_ms=5), encoder=FakeEncoder("dlr"), index=load_index(index_dir))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        hits = client.post("/search", json={"query": QUERY, "k": 5, "offset": 2}).json()["results"]
        assert len(hits) == 5 and [h["rank"] for h in hits] == [3, 4, 5, 6, 7]
        assert all(set(h) == {"id", "score", "rank"} for h in hits)
        past = client.post("/search", json={"query": QUERY, "k": 5, "offset": 40})  # 40 documents
        assert past.status_code == 200 and past.json()["results"] == []
        assert len(client.post("/search", json={"query": QUERY, "k": 5, "offset": 37}).json()["results"]) == 3


def test_the_openapi_document_describes_offset_rrf_and_the_part_scores(fusion_server):
    client, _, _ = fusion_server
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    request, hit = schema["SearchRequest"]["properties"], schema["Hit"]["properties"]
    assert request["offset"]["maximum"] == MAX_K - 1 and request["offset"]["minimum"] == 0
    assert f"offset + k must not exceed max_k ({MAX_K})" in request["offset"]["description"]
    assert request["offset"]["examples"] and request["rrf_k"]["examples"] == [60]
    assert request["rrf_k"]["anyOf"][0]["minimum"] == 0 and request["rrf_k"]["anyOf"][0]["maximum"] == 1_000_000
    assert "rrf" in request["fusion"]["anyOf"][0]["enum"] and "rrf_k" in request["fusion"]["description"]
    for name in ("lexical_score", "dense_score", "fused_score"):
        assert "dhr/fusion" in hit[name]["description"] and hit[name]["examples"]
