"""Property-based run of the OpenAPI schema against a live server (schemathesis, bounded).

Every operation gets schema-valid (positive) and schema-violating (negative)
requests; no response may be a 5xx, and every response must conform to the
documented status codes, content types and response schemas.
"""

import hypothesis
import pytest
import schemathesis
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection

from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.bench.servers.start import LiveServer

from support.fake_encoder import FakeEncoder

pytestmark = pytest.mark.slow  # schemathesis generates hundreds of requests

EXAMPLES = 40
MAX_K = 100


def over_the_page_limit(body) -> bool:
    """``offset + k`` over ``max_k``: a bound on a sum of two fields, stated in the fields' descriptions
    since JSON Schema cannot state it (tests/test_search_paging_api.py tests its 422)."""
    if not isinstance(body, dict):
        return False
    offset, k = body.get("offset", 0), body.get("k", 10)
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (offset, k)) and offset + k > MAX_K


@pytest.fixture(scope="module")
def live(toy_index):
    index_dir = toy_index("dhr", count=60)
    # limits the schema cannot express stay out of reach of schema-valid requests: the 1 MiB body limit
    # (generated bodies stay far below it) and the explained-hits cap (queries x k, set to its maximum)
    settings = ServiceSettings(max_k=MAX_K, max_request_texts=8, max_explain_hits=800, api_key="k3y")
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(index_dir))) as server:
        yield server


def operations(url):
    schema = schemathesis.openapi.from_url(url + "/openapi.json", headers={"Authorization": "Bearer k3y"})
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_openapi_schema_holds_and_nothing_is_5xx(live, mode):
    ops = operations(live.url)
    assert {op.label for op in ops} >= {"POST /search", "POST /encode", "POST /explain", "GET /health",
                                        "GET /ready", "GET /info", "GET /metrics"}
    for op in ops:
        if mode == GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # GET routes take no input, so there is nothing to violate
        @hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(case=op.as_strategy(generation_mode=mode))
        def check(case):
            # the schema declares the bearer scheme, so a negative case may break the Authorization header
            # itself: send it as generated (expecting a 401) instead of overriding it with the key
            broken_auth = any(location.value == "header" and info.mode == GenerationMode.NEGATIVE
                              for location, info in case.meta.components.items())
            auth = {} if broken_auth else {"Authorization": "Bearer k3y"}
            if mode == GenerationMode.POSITIVE and op.label == "POST /search":
                hypothesis.assume(not over_the_page_limit(case.body))
            excluded = [negative_data_rejection]
            response = case.call_and_validate(base_url=live.url, headers=auth, excluded_checks=excluded)
            assert response.status_code < 500, (op.label, case.body, response.text)
            if mode == GenerationMode.NEGATIVE:  # rejected, with 413 allowed for batches over the limit
                assert 400 <= response.status_code < 500, (op.label, case.body, response.text)

        check()
