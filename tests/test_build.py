"""Index build: round trip, determinism, crash + resume, refusals, CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from support.index_files import index_files
from densehybrid.index.building import shards
from densehybrid.index.building.build import BuildOptions, build_index, build_state, encode_passages, read_corpus
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher

import support
from support.fake_encoder import FakeEncoder

REPO = Path(__file__).resolve().parents[1]
WORDS = [f"w{i}" for i in range(400)]


def write_corpus(path, n, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            text = " ".join(rng.choice(WORDS, int(rng.integers(3, 30))))
            f.write(json.dumps({"_id": f"p{i}", "title": "T" if i % 5 == 0 else "", "text": text}) + "\n")
    return path




def test_round_trip_fake_encoder(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 60)
    encoder = FakeEncoder("fusion")
    build_index(encoder, corpus, tmp_path / "ix", BuildOptions(batch_size=7, shard_size=16, progress=False))
    index = load_index(tmp_path / "ix")
    docs = list(read_corpus(corpus))
    assert index.doc_ids == [d.id for d in docs] and index.docs.get("p5") == docs[5]
    assert not shards.work_dir(tmp_path / "ix").exists()
    # the stored rows are the encoder's vectors of "title text" (float16)
    want = encoder.encode([f"{d.title} {d.text}" if d.title else d.text for d in docs], "passage")
    np.testing.assert_allclose(index.values, want.values.astype(np.float16))
    np.testing.assert_array_equal(index.gates, want.gates)
    # a passage's own text as query finds the passage first
    hits = Searcher(index).search(encoder.encode([docs[9].text], "query"), SearchParams(k=3))
    assert hits.ids[0][0] == "p9"


def test_length_sorted_batches_return_input_order():
    encoder = FakeEncoder("dlr")
    texts = ["a b c d e f", "x", "m n o", "q r s t", "z y"]
    batched = encode_passages(encoder, texts, batch_size=2)
    np.testing.assert_array_equal(batched.values, encoder.encode(texts, "passage").values)
    assert encoder.batch_sizes[-2:] != [5]  # really batched


def test_build_is_deterministic(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 50)
    options = BuildOptions(batch_size=8, shard_size=16, progress=False, name="same", lam="auto")
    build_index(FakeEncoder("fusion"), corpus, tmp_path / "a", options)
    build_index(FakeEncoder("fusion"), corpus, tmp_path / "b", options)
    assert index_files(tmp_path / "a") == index_files(tmp_path / "b")


def test_auto_lambda_is_recorded(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 80)
    build_index(FakeEncoder("fusion"), corpus, tmp_path / "ix", BuildOptions(progress=False, lam="auto"))
    index = load_index(tmp_path / "ix")
    assert index.manifest["lambda"]["method"] == "auto-margin" and index.lam > 0 and index.lam != 1.0


BUILD_SCRIPT = """
import sys
from support.fake_encoder import FakeEncoder
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.search.params import SearchParams
build_index(FakeEncoder("fusion", delay_s=0.05), sys.argv[1], sys.argv[2],
            BuildOptions(batch_size=4, shard_size=8, progress=False, name="same", resume=True))
"""


@pytest.mark.slow  # a build process, killed and resumed
def test_killed_build_resumes_to_identical_files(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 200)
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(corpus), str(out)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": support.PYTHONPATH})
    work = shards.work_dir(out)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (work / "shards").is_dir() and shards.completed(work) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "build finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    done = shards.completed(work)
    assert 3 <= done < 25 and not out.exists()
    with pytest.raises(IndexWriteError, match="--resume"):
        build_index(FakeEncoder("fusion"), corpus, out, BuildOptions(batch_size=4, shard_size=8, progress=False))
    build_index(FakeEncoder("fusion"), corpus, out,
                BuildOptions(batch_size=4, shard_size=8, progress=False, name="same", resume=True))
    build_index(FakeEncoder("fusion"), corpus, tmp_path / "whole",
                BuildOptions(batch_size=4, shard_size=8, progress=False, name="same"))
    assert index_files(out) == index_files(tmp_path / "whole")
    assert load_index(out).count == 200 and not work.exists()


def test_resume_with_another_model_is_refused(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 20)
    work = shards.work_dir(tmp_path / "ix")
    options = BuildOptions(resume=True, progress=False)
    shards.start(work, build_state(FakeEncoder("dhr"), corpus, options), resume=False)
    with pytest.raises(IndexWriteError, match="encoder differs"):
        build_index(FakeEncoder("fusion"), corpus, tmp_path / "ix", options)
    with pytest.raises(IndexWriteError, match="batch_size differs"):
        build_index(FakeEncoder("dhr"), corpus, tmp_path / "ix", BuildOptions(resume=True, progress=False, batch_size=3))


def test_existing_index_is_not_overwritten_unless_asked(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 10)
    build_index(FakeEncoder("cls"), corpus, tmp_path / "ix", BuildOptions(progress=False))
    with pytest.raises(IndexWriteError, match="already exists"):
        build_index(FakeEncoder("cls"), corpus, tmp_path / "ix", BuildOptions(progress=False))
    build_index(FakeEncoder("dlr"), corpus, tmp_path / "ix", BuildOptions(progress=False, overwrite=True))
    assert load_index(tmp_path / "ix").spec.kind == "dlr"


@pytest.mark.parametrize("line,problem", [
    ("{not json", "corpus.jsonl:2"), (json.dumps({"text": "no id"}), "corpus.jsonl:2"),
])
def test_bad_corpus_line_is_named(tmp_path, line, problem):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "fine"}) + "\n" + line + "\n")
    with pytest.raises(IndexWriteError, match=problem):
        build_index(FakeEncoder("cls"), corpus, tmp_path / "ix", BuildOptions(progress=False))


def test_duplicate_ids_are_refused(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": i, "text": f"t {n}"}) + "\n" for n, i in enumerate("abca")))
    with pytest.raises(IndexWriteError, match="'a' occurs more than once"):
        build_index(FakeEncoder("cls"), corpus, tmp_path / "ix", BuildOptions(progress=False))


def test_cli_build_search_eval_with_fake_model(tmp_path, fake_models):
    from densehybrid.cli.main import app

    corpus = write_corpus(tmp_path / "corpus.jsonl", 40)
    docs = list(read_corpus(corpus))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": docs[i].text}) + "\n" for i in range(5)))
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tp{i}\t1\n" for i in range(5)))
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--model", "fake:fusion", "--corpus", str(corpus),
                                "--out", str(tmp_path / "ix"), "--no-progress", "--auto-lambda"])
    assert built.exit_code == 0, built.output
    assert "40 passages" in " ".join(built.output.split()) and "passages/s" in built.output
    found = runner.invoke(app, ["search", "--index", str(tmp_path / "ix"), docs[3].text, "-k", "3"])
    assert found.exit_code == 0, found.output
    assert "p3" in found.output and "search_ms" in found.output
    evaluated = runner.invoke(app, ["eval", "--index", str(tmp_path / "ix"), "--queries", str(tmp_path / "queries.jsonl"),
                                    "--qrels", str(tmp_path / "qrels.tsv"), "--json", "--run", str(tmp_path / "run.txt")])
    assert evaluated.exit_code == 0, evaluated.output
    metrics = json.loads(evaluated.output.strip().splitlines()[-1])
    assert list(metrics) == ["nDCG@10", "MRR@10", "R@100", "R@1000"] and metrics["MRR@10"] == 1.0
    first_stage_only = runner.invoke(app, ["eval", "--index", str(tmp_path / "ix"), "--queries", str(tmp_path / "queries.jsonl"),
                                           "--qrels", str(tmp_path / "qrels.tsv"), "--no-rerank", "--bm25"])
    assert first_stage_only.exit_code == 0 and "BM25" in first_stage_only.output
    first = (tmp_path / "run.txt").read_text().splitlines()[0].split()
    assert first[:4] == ["q0", "Q0", "p0", "1"]
    broken = runner.invoke(app, ["search", "--index", str(tmp_path / "nowhere"), "x"])
    assert broken.exit_code == 2 and "no such index directory" in " ".join(broken.output.split())
    mismatch = runner.invoke(app, ["search", "--index", str(tmp_path / "ix"), "--model", "fake:dhr", "x"])
    assert mismatch.exit_code == 2 and "does not match the index" in " ".join(mismatch.output.split())


def test_progress_is_reported_per_batch():
    seen = []
    encode_passages(FakeEncoder("cls"), [f"text {i}" for i in range(10)], 4, seen.append)
    assert seen == [4, 4, 2]


@pytest.mark.parametrize("flag,method", [(["--lambda", "auto"], "auto-margin"), (["--lambda", "2.5"], "fixed"),
                                         (["--auto-lambda"], "auto-margin")])
def test_cli_lambda_number_or_auto(tmp_path, flag, method, fake_models):
    from densehybrid.cli.main import app

    corpus = write_corpus(tmp_path / "corpus.jsonl", 12)
    built = CliRunner().invoke(app, ["index", "build", "--model", "fake:fusion", "--corpus", str(corpus),
                                     "--out", str(tmp_path / "ix"), "--no-progress", *flag])
    assert built.exit_code == 0, built.output
    manifest = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    assert manifest["lambda"]["method"] == method
    if method == "fixed":
        assert manifest["lam"] == 2.5


def test_cli_lambda_rejects_words_other_than_auto(tmp_path, fake_models):
    from densehybrid.cli.main import app

    corpus = write_corpus(tmp_path / "corpus.jsonl", 3)
    built = CliRunner().invoke(app, ["index", "build", "--model", "fake:fusion", "--corpus", str(corpus),
                                     "--out", str(tmp_path / "ix"), "--lambda", "nope"])
    assert built.exit_code == 2 and "neither a number nor 'auto'" in built.output


def test_fake_model_ids_are_unknown_models_in_production(tmp_path):
    """Without the test fixture, ``fake:KIND`` is an ordinary unknown model: exit 2, one sentence."""
    from densehybrid.cli.main import app

    corpus = write_corpus(tmp_path / "corpus.jsonl", 3)
    built = CliRunner().invoke(app, ["index", "build", "--model", "fake:dhr", "--corpus", str(corpus),
                                     "--out", str(tmp_path / "ix"), "--no-progress"])
    assert built.exit_code == 2, built.output
    assert "fake:dhr" in built.output and "Traceback" not in built.output
    assert not (tmp_path / "ix").exists()
