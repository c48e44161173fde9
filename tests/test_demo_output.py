"""The demo says where it keeps its index and prints its curl examples only once the server answered."""

import logging

import pytest
from typer.testing import CliRunner

from densehybrid.cli import demo
from densehybrid.cli.main import app

ANSWER = {"results": [{"rank": 1, "id": "argparse", "score": 3.5, "text": "Command-line parsing library"}],
          "timing": {"encode_ms": 1.0, "total_ms": 2.0}}


@pytest.fixture
def demo_without_work(monkeypatch, tmp_path):
    """The demo command with its slow parts replaced: no build, no server; ``answers`` decides if one comes."""
    import densehybrid.service.serve as serve_module

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.setattr(demo, "prepare", lambda home, passages, rebuild: home / "index")
    monkeypatch.setattr(serve_module, "serve", lambda settings: None)
    answers = []
    monkeypatch.setattr(demo, "query_when_ready", lambda url, show: [show(a) for a in answers])
    yield answers
    root.handlers[:] = handlers
    root.setLevel(level)


def test_demo_names_its_directory_and_prints_curl_after_the_answer(demo_without_work, tmp_path):
    demo_without_work.append(ANSWER)
    output = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path), "--port", "8123"],
                                env={"COLUMNS": "200"}).output
    assert f"keeps its corpus and index in {tmp_path}" in " ".join(output.split())
    assert output.index("keeps its corpus") < output.index("argparse") < output.index("curl -s http://127.0.0.1:8123")


def test_no_curl_examples_before_the_server_is_ready(demo_without_work, tmp_path):
    output = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path)]).output
    assert "curl -s" not in output and "keeps its corpus and index" in output
