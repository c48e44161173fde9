"""``densehybrid encode``: texts in, an npz with the right keys, shapes and dtypes out."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from densehybrid.encoder.loading import load_encoder
from densehybrid.cli.main import app

TEXTS = ["what is a dense retriever", "", "the cat sat on the mat"]


def test_encode_writes_vectors_and_gates(tiny_bert_dir, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out" / "vectors.npz"
    args = ["encode", "--model", str(tiny_bert_dir), "--kind", "dhr", "--lambda", "0.5", "--role", "query",
            "--input", str(source), "--output", str(out), "--batch-size", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with np.load(out) as z:
        assert set(z.files) == {"vectors", "gates", "spec"}
        assert z["vectors"].shape == (3, 768 + 16) and z["vectors"].dtype == np.float32
        assert z["gates"].shape == (3, 768) and z["gates"].dtype == np.uint8
        spec = json.loads(str(z["spec"]))
        expected = load_encoder(str(tiny_bert_dir), kind="dhr").encode(TEXTS, "query")
        np.testing.assert_allclose(z["vectors"], expected.values, atol=1e-5)
        np.testing.assert_array_equal(z["gates"], expected.gates)
    assert (spec["kind"], spec["lam"], spec["gated_dim"]) == ("dhr", 0.5, 768)
    assert "3 texts" in result.output


def test_encode_from_stdin_without_gates(tiny_distilbert_dir, tmp_path):
    out = tmp_path / "cls.npz"
    args = ["encode", "-m", str(tiny_distilbert_dir), "--kind", "cls", "--pooling", "mean", "--normalize",
            "--role", "passage", "--input", "-", "--output", str(out)]
    result = CliRunner().invoke(app, args, input="\n".join(TEXTS[:2]) + "\n")
    assert result.exit_code == 0, result.output
    with np.load(out) as z:
        assert set(z.files) == {"vectors", "spec"}
        assert z["vectors"].shape == (2, 32) and z["vectors"].dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(z["vectors"], axis=1), 1.0, atol=1e-5)


def test_encode_prints_json_lines_without_output(tiny_bert_dir):
    args = ["encode", "-m", str(tiny_bert_dir), "--kind", "dlr", "--role", "query"]
    result = CliRunner().invoke(app, args, input="dense retrieval\n")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(row["vector"]) == 768 and len(row["gate"]) == 768


def test_encode_reports_a_missing_kind(tiny_bert_dir, tmp_path):
    args = ["encode", "-m", str(tiny_bert_dir), "--role", "query", "--output", str(tmp_path / "x.npz")]
    result = CliRunner().invoke(app, args, input="x\n")
    assert result.exit_code == 2
    assert "records the kind" in result.output
    assert not (tmp_path / "x.npz").exists()


def test_encode_reports_a_missing_input_file(tiny_bert_dir, tmp_path):
    args = ["encode", "-m", str(tiny_bert_dir), "--kind", "dlr", "--role", "query", "--input", str(tmp_path / "no.txt")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "no.txt" in result.output
