"""Errors a command meets at start end with exit code 2 and one sentence, never a traceback."""

import json

import pytest
from typer.testing import CliRunner

from densehybrid.bench.servers.toy_index import build_toy_index, write_toy_corpus
from densehybrid.cli.main import app
from densehybrid.service import startup
from densehybrid.service.startup import StartupError, load_components
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder


def _one_sentence_exit_2(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.fixture
def fake_index(tmp_path, fake_models):
    corpus = write_toy_corpus(tmp_path / "corpus.jsonl", 12)
    built = CliRunner().invoke(app, ["index", "build", "--model", "fake:dhr", "--corpus", str(corpus),
                                     "--out", str(tmp_path / "ix"), "--no-progress"])
    assert built.exit_code == 0, built.output
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "dense retrieval"}) + "\n")
    (tmp_path / "qrels.tsv").write_text("q0\tdoc0\t1\n")
    return tmp_path


def test_search_with_lambda_auto_says_to_give_a_number(fake_index):
    result = CliRunner().invoke(app, ["search", "dense retrieval", "--index", str(fake_index / "ix"), "--lambda", "auto"])
    _one_sentence_exit_2(result, "--lambda auto chooses λ from the corpus at 'index build' only; give search a number")


def test_eval_with_lambda_auto_says_to_give_a_number(fake_index):
    result = CliRunner().invoke(app, ["eval", "--index", str(fake_index / "ix"), "--queries",
                                      str(fake_index / "queries.jsonl"), "--qrels", str(fake_index / "qrels.tsv"),
                                      "--lambda", "auto"])
    _one_sentence_exit_2(result, "give eval a number")


def test_search_with_a_number_still_works(fake_index):
    result = CliRunner().invoke(app, ["search", "dense retrieval", "--index", str(fake_index / "ix"), "--lambda", "0.5"])
    assert result.exit_code == 0, result.output


def test_rich_markup_in_an_error_is_printed_as_is(tmp_path):
    missing = tmp_path / "[bold]missing[/bold]"
    result = CliRunner().invoke(app, ["search", "q", "--index", str(missing)])
    assert result.exit_code == 2 and "[bold]missing[/bold]" in result.output


def test_a_gpu_encoder_with_faiss_cpu_serves_and_searches_on_the_cpu(tmp_path, monkeypatch):
    """CUDA torch + faiss-cpu is a normal install: the search device is chosen apart from the encoder's."""
    index_dir = build_toy_index(FakeEncoder("dhr"), tmp_path, count=12)
    on_gpu = FakeEncoder("dhr")
    monkeypatch.setattr(type(on_gpu), "device", property(lambda self: "cuda"))
    monkeypatch.setattr(startup, "_load_encoder", lambda settings, index: on_gpu)
    encoder, index = load_components(ServiceSettings(index=index_dir, warmup=False))
    assert encoder.device == "cuda" and index.count == 12


def test_a_gpu_search_device_without_cuda_is_one_sentence(tmp_path):
    index_dir = build_toy_index(FakeEncoder("dhr"), tmp_path, count=12)
    with pytest.raises(StartupError, match="search device 'cuda' requested but torch sees no CUDA device; use cpu"):
        load_components(ServiceSettings(index=index_dir, search_device="cuda", warmup=False))


@pytest.mark.parametrize("device, expected", [("cuda:99", "'cuda:99'"), ("tpu", "unknown device 'tpu'")])
def test_serve_on_a_device_that_does_not_exist_is_one_sentence(device, expected, minilm_dir, root_logging_restored):
    result = CliRunner().invoke(app, ["serve", "--model", "minilm", "--device", device, "--port", "0"])
    _one_sentence_exit_2(result, expected)


def test_models_fetch_without_names_lists_them_and_fetches_nothing():
    from densehybrid.encoder import zoo

    result = CliRunner().invoke(app, ["models", "fetch"])
    _one_sentence_exit_2(result, "name the models to fetch, one or more of: " + " ".join(zoo.ZOO))
