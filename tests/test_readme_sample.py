"""The README's sample /search answer is a real one: the documented request against the demo's index."""

import json
import re
from pathlib import Path

import httpx
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
REQUEST = '{"query": "parse command line arguments", "k": 3, "return_text": true}'


def readme_sample() -> tuple[dict, dict]:
    """(request, answer) as the README's API section shows them."""
    text = README.read_text()
    request = re.search(r"curl -s localhost:8000/search .*?\n\s+-d '(\{.*?\})'\n((?:# .*\n)+)", text)
    assert request, "the README's /search example (curl, then the answer as '# ' lines) is missing"
    answer = "".join(line[2:] for line in request.group(2).splitlines())
    return json.loads(request.group(1)), json.loads(answer)


def shortened(text: str) -> str:
    return text.removesuffix(" ...")


def test_the_readme_sample_parses_and_uses_the_documented_request():
    request, answer = readme_sample()
    assert request == json.loads(REQUEST)
    assert len(answer["results"]) == request["k"] and [hit["rank"] for hit in answer["results"]] == [1, 2, 3]


@pytest.mark.slow  # builds the demo's 2000-passage fusion index with the real offline models
def test_the_readme_sample_is_what_the_demo_index_answers(tmp_path_factory, splade_tiny_dir, minilm_dir):
    from densehybrid.bench.servers import LiveServer
    from densehybrid.cli import demo
    from densehybrid.service.app import create_app
    from densehybrid.service.runtime import load_components
    from densehybrid.service.settings import ServiceSettings

    request, documented = readme_sample()
    index_dir = demo.prepare(tmp_path_factory.mktemp("demo"), 2000)
    settings = ServiceSettings(index=index_dir, warmup=False, device="cpu")
    encoder, index = load_components(settings)
    with LiveServer(create_app(settings, encoder=encoder, index=index)) as live:
        real = httpx.post(live.url + "/search", json=request, timeout=60).json()
    assert real["index"] == documented["index"]
    assert set(real["timing"]) == set(documented["timing"])
    for got, shown in zip(real["results"], documented["results"], strict=True):
        assert (got["id"], got["rank"], got.get("title")) == (shown["id"], shown["rank"], shown.get("title"))
        assert round(got["score"], 2) == pytest.approx(shown["score"], abs=0.011)
        assert got["text"].startswith(shortened(shown["text"]))
