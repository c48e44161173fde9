"""``filter`` and ``fields`` on /search, fields on /documents and /info, on a live loopback server whose
index was built with ``--fields-from-metadata`` (FakeEncoder, a small real index)."""

import json

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.search import filters
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.index.search.params import SearchParams

from support.fake_encoder import FakeEncoder
from support.metrics import scrape

TOPICS = ["retrieval", "ranking", "indexing", "latency"]
COUNT = 300


def metadata(i: int) -> dict:
    out = {"topic": TOPICS[i % 4], "year": 2000 + i % 25, "tags": [f"t{i % 3}", f"u{i % 5}"][: i % 3],
           "draft": i % 7 == 0}
    if i % 10:
        out["score"] = round(i / 10, 1)
    return out


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("filters-service")
    corpus = root / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(COUNT):
            words = " ".join(TOPICS[(i + j) % 4] for j in range(3))
            f.write(json.dumps({"_id": f"D{i}", "text": f"{words} passage {i}", "metadata": metadata(i)}) + "\n")
    return build_index(FakeEncoder("dhr"), corpus, root / "index",
                       BuildOptions(progress=False, batch_size=32, fields_from_metadata=True))


@pytest.fixture(scope="module")
def client(index_dir):
    settings = ServiceSettings(index=index_dir, max_k=100, max_wait_ms=1)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index_dir))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        yield c


def search(client, **body):
    return client.post("/search", json={"query": "retrieval ranking", **body})


def test_info_lists_the_fields_and_their_types(client):
    assert client.get("/info").json()["index"]["fields"] == {
        "topic": "keyword", "year": "integer", "tags": "keyword_list", "draft": "bool", "score": "float"}


@pytest.mark.parametrize("raw", [
    {"field": "topic", "eq": "ranking"},
    {"field": "year", "range": {"gte": 2010, "lt": 2012}},
    {"field": "tags", "in": ["t1", "u4"]},
    {"and": [{"field": "draft", "eq": True}, {"not": {"field": "score", "exists": True}}]},
    {"or": [{"field": "score", "range": {"gt": 29.5}}, {"field": "topic", "in": ["latency"]}]},
])
def test_filtered_hits_are_the_in_process_filtered_search(client, index_dir, raw):
    response = search(client, filter=raw, k=20, fields=["topic", "year", "tags", "draft", "score"])
    assert response.status_code == 200, response.text
    hits = response.json()["results"]
    index = load_index(index_dir)
    node = filters.parse(raw, index.field_types)
    want = Searcher(index).search(FakeEncoder("dhr").encode(["retrieval ranking"], "query"),
                                  SearchParams(k=20, filter=node))
    assert [h["id"] for h in hits] == want.ids[0] and hits
    kept = filters.evaluate(node, index.payload)
    for hit in hits:
        i = int(hit["id"][1:])
        assert kept[i]
        assert hit["fields"] == {k: v for k, v in metadata(i).items() if v != []}


def test_a_filter_that_matches_nothing_is_an_empty_list(client):
    response = search(client, filter={"field": "topic", "eq": "nothing-has-this"})
    assert response.status_code == 200, response.text
    assert response.json()["results"] == []
    batch = client.post("/search", json={"queries": ["a b", "c d"], "filter": {"field": "year", "range": {"gt": 3000}}})
    assert batch.status_code == 200 and batch.json()["results"] == [[], []]


@pytest.mark.parametrize("body, named", [
    ({"filter": {"field": "colour", "eq": "red"}}, "colour"),
    ({"filter": {"field": "topic", "range": {"gt": 1}}}, "topic"),
    ({"filter": {"field": "year", "eq": "2010"}}, "year"),
    ({"filter": {"field": "draft", "in": [1]}}, "draft"),
    ({"filter": {"not": {"field": "score", "eq": "high"}}}, "score"),
    ({"fields": ["topic", "colour"]}, "colour"),
    ({"filter": {"field": "year"}}, "filter"),
    ({"filter": {"field": "year", "eq": 1, "in": [1]}}, "filter"),
    ({"filter": {"and": []}}, "filter"),
    ({"filter": {"field": "year", "range": {"over": 3}}}, "filter"),
])
def test_unknown_fields_and_type_mismatches_are_422_naming_the_field(client, body, named):
    response = search(client, **body)
    assert response.status_code == 422, response.text
    assert named in response.json()["error"]["message"]
    assert search(client).status_code == 200


def test_deep_filters_are_refused_before_validation(client):
    deep = {"field": "year", "eq": 2001}
    for _ in range(filters.MAX_DEPTH + 1):
        deep = {"not": deep}
    response = search(client, filter=deep)
    assert response.status_code == 422 and "deeper" in response.json()["error"]["message"]


def test_the_request_model_parses_the_filter_once_and_holds_its_node(monkeypatch):
    from densehybrid.service.schemas import request_models

    types = {"topic": "keyword", "year": "integer"}
    raw = {"and": [{"field": "topic", "eq": "ranking"}, {"not": {"field": "year", "range": {"gte": 2010}}}]}
    parse, calls = filters.parse, []
    monkeypatch.setattr(filters, "parse", lambda value, schema: calls.append(value) or parse(value, schema))
    body = request_models(ServiceSettings().limits, field_types=types).search(query="q", filter=raw, fields=["year"])
    assert calls == [raw]  # the grammar ran once, and what the handler gets is its node
    assert isinstance(body.filter, filters.And) and body.filter == parse(raw, types)


def test_written_fields_are_kept_as_the_request_model_validated_them():
    from densehybrid.service.documents import document_fields
    from densehybrid.service.schemas import documents_request_model

    types = {"tags": "keyword_list", "score": "float", "year": "integer"}
    body = documents_request_model(ServiceSettings().limits, types)(documents=[
        {"id": "a", "text": "x", "fields": {"tags": [], "score": 3, "year": None}},
        {"id": "b", "text": "y", "fields": {"tags": []}}])
    kept = document_fields(body.documents[0].fields)
    assert kept == {"score": 3.0} and isinstance(kept["score"], float)  # an empty list is no value, as in a build
    assert document_fields(body.documents[1].fields) is None


def test_filtered_searches_are_counted_with_their_selectivity(client):
    def observed():
        return scrape(client, "densehybrid_filter_selectivity_count"), scrape(client, "densehybrid_filter_selectivity_sum")

    count, total = observed()
    assert search(client, filter={"field": "topic", "eq": "ranking"}).status_code == 200
    assert search(client).status_code == 200  # unfiltered: not observed
    new_count, new_total = observed()
    assert new_count == count + 1 and new_total == pytest.approx(total + 0.25)


def test_documents_written_with_fields_are_filtered_and_returned(client):
    doc = {"id": "W1", "text": "retrieval ranking written later", "fields": {"topic": "fresh", "year": 2030,
                                                                            "tags": ["new"], "score": 3}}
    response = client.post("/documents", json={"documents": [doc, {"id": "W2", "text": "retrieval ranking plain"}]})
    assert response.status_code == 200, response.text
    hits = search(client, filter={"field": "topic", "eq": "fresh"}, fields=["year", "score", "tags"]).json()["results"]
    assert [h["id"] for h in hits] == ["W1"]
    assert hits[0]["fields"] == {"year": 2030, "score": 3.0, "tags": ["new"]}
    absent = search(client, filter={"not": {"field": "topic", "exists": True}}, k=50).json()["results"]
    assert [h["id"] for h in absent] == ["W2"]
    for bad, named in (({"year": "soon"}, "year"), ({"colour": "red"}, "colour"), ({"tags": [1]}, "tags")):
        response = client.post("/documents", json={"documents": [{"id": "W3", "text": "x y", "fields": bad}]})
        assert response.status_code == 422 and named in response.json()["error"]["message"], response.text


def test_the_openapi_document_shows_the_grammar_with_examples(client):
    schema = client.get("/openapi.json").json()
    search_body = schema["components"]["schemas"]["SearchRequest"]["properties"]
    examples = search_body["filter"]["examples"]
    assert examples[0] == {"field": "draft", "eq": True} and {"field": "score", "range": {"gte": 0, "lt": 100}} \
        in examples
    for example in examples:  # every example is a valid filter of this index
        assert search(client, filter=example).status_code == 200
    assert "any element" in search_body["filter"]["description"]
    components = schema["components"]["schemas"]
    # the schema states this index's fields: a leaf per field and operator, range on numbers only
    assert {"Eq_topic", "In_tags", "Range_year", "Range_score", "Exists_draft", "AndFilter", "OrFilter",
            "NotFilter"} <= set(components)
    assert "Range_topic" not in components and "Range_draft" not in components
    assert components["Eq_year"]["properties"]["field"]["const"] == "year"
    assert components["Eq_year"]["properties"]["eq"]["type"] == "integer"
    fields_items = search_body["fields"]["anyOf"][0]["items"]
    assert sorted(fields_items["enum"]) == ["draft", "score", "tags", "topic", "year"]
    written = components["DocumentFields"]["properties"]
    assert written["tags"]["anyOf"][0]["type"] == "array" and set(written) == set(fields_items["enum"])


def test_filter_bench_reports_each_selectivity_against_unfiltered():
    from densehybrid.bench.parts import filters as filter_bench

    report = filter_bench.run(rows=1000, requests=2)
    shares = {"unfiltered", *filter_bench.SELECTIVITIES}
    for table in (report["http_request"], report["http_search_stage"], *report["in_process"].values()):
        assert set(table) == shares
        assert table["unfiltered"]["vs_unfiltered"] == 1.0
        assert all(row["p50_ms"] > 0 and row["vs_unfiltered"] > 0 for row in table.values())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_the_schema_states_exactly_which_filters_and_fields_fit(client, mode):
    """Schema-valid filters, field lists and written fields (generated from this index's OpenAPI document) are
    answered 200; schema-violating ones 4xx; none 5xx."""
    import hypothesis
    import schemathesis
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import negative_data_rejection

    generation = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE
    url = str(client.base_url).rstrip("/")
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations() if r.ok().label in ("POST /search", "POST /documents")]
    assert len(ops) == 2
    max_k = client.get("/info").json()["limits"]["max_k"]

    def over_the_page_limit(body) -> bool:  # offset + k <= max_k: a bound on a sum JSON Schema cannot state
        offset, k = (body.get("offset", 0), body.get("k", 10)) if isinstance(body, dict) else (0, 0)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (offset, k))
        return numbers and offset + k > max_k

    for op in ops:
        @hypothesis.settings(max_examples=60, deadline=None, database=None, derandomize=True,
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(case=op.as_strategy(generation_mode=generation))
        def check(case):
            if generation == GenerationMode.POSITIVE and op.label == "POST /search":
                hypothesis.assume(not over_the_page_limit(case.body))
            response = case.call_and_validate(base_url=url, excluded_checks=[negative_data_rejection])
            assert response.status_code < 500, (op.label, case.body, response.text)
            if generation == GenerationMode.NEGATIVE:
                assert 400 <= response.status_code < 500, (op.label, case.body, response.text)

        check()
