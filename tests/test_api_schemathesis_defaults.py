"""``schemathesis run --checks all`` against a live server on **default** settings, in the default test run.

tests/test_api_schemathesis.py lowers the limits so that generated requests reach them; this run keeps
every limit at its default (max_k, max_explain_hits, ...), on an index with payload fields (so that the
filter and fields schemas are exercised) and more documents than ``max_explain_hits`` (so that a request
the schema allows but the defaults would cap shows up). The default run keeps to the examples and a
bounded fuzzing phase with a fixed seed; the coverage phase sends every boundary case of every field
(thousands of requests, most of them to /search) and runs in the slow tier.
"""

import json

import httpx
import pytest

from support.fake_encoder import FakeEncoder
from support.schemathesis_run import all_operations_tested, run_schemathesis
from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

SEED = 20261126
EXAMPLES = 8
DOCUMENTS = 150  # over the default max_explain_hits (100)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("st-defaults")
    corpus = root / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(DOCUMENTS):
            metadata = {"topic": ["retrieval", "ranking"][i % 2], "year": 2000 + i % 25, "tags": [f"t{i % 3}"],
                        "draft": i % 7 == 0, "score": i / 10}
            f.write(json.dumps({"_id": f"D{i}", "text": f"passage {i} on retrieval", "metadata": metadata}) + "\n")
    index_dir = build_index(FakeEncoder("dlr"), corpus, root / "index",
                            BuildOptions(progress=False, batch_size=64, fields_from_metadata=True))
    settings = ServiceSettings(index=index_dir)
    assert settings.limits == ServiceSettings().limits  # the index is the only setting given
    app = create_app(settings, encoder=FakeEncoder("dlr"), index=load_index(index_dir))
    with LiveServer(app) as server:
        yield server


@pytest.mark.parametrize("phases", [
    "examples,fuzzing", pytest.param("coverage", marks=pytest.mark.slow)])
def test_schemathesis_all_checks_pass_on_default_settings(live, tmp_path, phases):
    done = run_schemathesis(live.url, SEED, tmp_path, EXAMPLES, phases)
    report = done.stdout[-8000:] + done.stderr[-2000:]
    assert done.returncode == 0, f"schemathesis failed with seed {SEED} (replay: --seed {SEED}):\n{report}"
    assert all_operations_tested(done.stdout), report


def test_the_two_requests_found_outside_the_contract_are_answered(live):
    # schema-valid on default settings, once answered 422: a page of k=361 (explained, over 100 documents)
    # and 11 explained queries x k=10 (110 hits over max_explain_hits=100)
    with httpx.Client(base_url=live.url, timeout=60) as c:
        documents = c.get("/info").json()["index"]["documents"]  # 150, and what schemathesis wrote
        page = c.get("/", params={"q": "retrieval", "k": 361})
        assert page.status_code == 200 and page.text.count('class="hit"') == min(361, documents)
        batch = c.post("/search", json={"queries": [f"retrieval {i}" for i in range(11)], "k": 10, "explain": True})
        assert batch.status_code == 200, batch.text
        assert batch.json()["explained"] == {"hits": 100, "unexplained": 10, "max_explain_hits": 100}
        explained = ["explanation" in hit for hits in batch.json()["results"] for hit in hits]
        assert explained == [True] * 100 + [False] * 10
