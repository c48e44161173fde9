"""int8 encoding (ONNX Runtime dynamic quantization): cached beside the float32 graph, recorded in the
manifest, /info and the metrics, refused where quality was not shown to hold, and close to float32.

Stated bound: on a tiny random BERT, int8 [CLS] vectors keep a cosine of at least 0.95 to the float32
ones (int8 weights with one scale per output channel; per-batch activation scales).
"""

import json
import os

import httpx
import numpy as np
import pytest

from densehybrid.encoder.backends.onnx_quantize import quantized_name
from densehybrid.encoder.loading import load_encoder
from densehybrid.encoder.precision import INT8_ADMITTED, PrecisionError, check_precision
from densehybrid.encoder.random_checkpoint import write_random_checkpoint
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.service.startup import StartupError, load_components, query_precision
from densehybrid.bench.servers.start import LiveServer

TEXTS = ["what is a dense retriever", "gated inner products over densified lexical vectors",
         "photosynthesis converts light energy into chemical energy stored in glucose", "hi"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "model", "tiny")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DENSEHYBRID_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "onnx"


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_int8_graph_is_made_once_beside_the_float32_one(tiny_dir, cache):
    encoder = load_encoder(str(tiny_dir), kind="cls", backend="onnx", precision="int8", device="cpu")
    (export,) = [p.parent for p in cache.rglob("backbone.onnx")]
    int8 = export / quantized_name("backbone.onnx")
    assert int8.is_file() and encoder.precision == "int8" and encoder.backend == "onnx"
    assert int8.stat().st_size < (export / "backbone.onnx").stat().st_size  # int8 weights: a smaller file
    made = int8.stat().st_mtime_ns
    again = load_encoder(str(tiny_dir), kind="cls", backend="onnx", precision="int8", device="cpu")
    assert int8.stat().st_mtime_ns == made and again.precision == "int8"
    assert sorted(p.name for p in export.glob("*.onnx")) == ["backbone.int8.onnx", "backbone.onnx"]


def test_int8_vectors_stay_close_to_float32(tiny_dir, cache):
    fp32 = load_encoder(str(tiny_dir), kind="cls", backend="onnx", device="cpu").encode(TEXTS, "passage").values
    int8 = load_encoder(str(tiny_dir), kind="cls", backend="onnx", precision="int8", device="cpu")
    got = int8.encode(TEXTS, "passage").values
    cos = row_cosines(got, fp32)
    assert cos.min() >= 0.95, cos
    assert not np.array_equal(got, fp32)  # the quantized graph ran, not the float32 one


def test_kinds_not_admitted_are_refused_with_the_reason(tiny_dir, cache):
    refused = [kind for kind in ("aggretriever", "dhr", "dlr", "fusion") if kind not in INT8_ADMITTED]
    assert refused
    for kind in refused:
        with pytest.raises(PrecisionError, match=f"int8 is not admitted for {kind} models .*use precision fp32"):
            check_precision(kind, "int8")
    with pytest.raises(PrecisionError, match=f"int8 is not admitted for {refused[0]}"):
        load_encoder(str(tiny_dir), kind=refused[0], backend="onnx", precision="int8", device="cpu")
    with pytest.raises(PrecisionError, match="unknown precision 'int4'"):
        check_precision("cls", "int4")


def test_int8_is_refused_on_torch(tiny_dir):
    with pytest.raises(PrecisionError, match="int8 runs on ONNX Runtime"):
        load_encoder(str(tiny_dir), kind="cls", backend="torch", precision="int8", device="cpu")


def test_the_manifest_records_the_precision_and_serve_follows_it(tiny_dir, cache, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    encoder = load_encoder(str(tiny_dir), kind="cls", backend="onnx", precision="int8", device="cpu")
    out = build_index(encoder, corpus, tmp_path / "idx", BuildOptions(progress=False))
    index = load_index(out)
    assert index.manifest["encoding"] == {"backend": "onnx", "precision": "int8"}
    assert index.encoded_precision == "int8"
    settings = ServiceSettings(index=out, device="cpu", port=0, log_json=False, writes=False)
    served, _ = load_components(settings)
    assert served.precision == "int8"  # no flag: the index's precision
    with LiveServer(create_app(settings, encoder=served, index=load_index(out))) as server:
        info = httpx.get(server.url + "/info", timeout=30).json()
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert info["model"]["precision"] == "int8" and info["index"]["precision"] == "int8"
    assert 'precision="int8"' in metrics and 'index_precision="int8"' in metrics


class _Index:
    def __init__(self, precision):
        self.encoded_precision = precision


@pytest.mark.parametrize("given, recorded, allow, expect", [
    (None, "int8", False, "int8"), (None, "fp32", False, "fp32"), (None, None, False, "fp32"),
    ("int8", None, False, "int8"), ("fp32", "fp32", False, "fp32"), ("fp32", "int8", True, "fp32"),
])
def test_query_precision_follows_the_index_unless_told(given, recorded, allow, expect):
    settings = ServiceSettings(precision=given, allow_precision_mismatch=allow)
    assert query_precision(settings, None if recorded is None else _Index(recorded)) == expect


def test_a_precision_other_than_the_index_is_refused_without_the_flag():
    with pytest.raises(StartupError, match="--precision int8 differs from the index, whose passages were encoded in "
                                           "fp32.*--allow-precision-mismatch"):
        query_precision(ServiceSettings(precision="int8"), _Index("fp32"))


def test_precision_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("DENSEHYBRID_PRECISION", "int8")
    assert ServiceSettings().precision == "int8"
    monkeypatch.setenv("DENSEHYBRID_PRECISION", "fp16")
    with pytest.raises(ValueError, match="precision"):
        ServiceSettings()


def test_a_refused_kind_is_one_startup_message(tiny_dir):
    kind = next(k for k in ("dlr", "dhr", "aggretriever") if k not in INT8_ADMITTED)
    with pytest.raises(StartupError, match=f"in int8: int8 is not admitted for {kind} models"):
        load_components(ServiceSettings(model=str(tiny_dir), kind=kind, precision="int8", device="cpu"))


def test_index_build_flags_take_precision_and_backend(tiny_dir, cache, tmp_path):
    from typer.testing import CliRunner

    from densehybrid.cli.main import app

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--model", str(tiny_dir), "--kind", "cls", "--corpus", str(corpus),
                                "--out", str(tmp_path / "int8"), "--precision", "int8", "--no-progress"])
    assert built.exit_code == 0, built.output
    assert load_index(tmp_path / "int8").manifest["encoding"] == {"backend": "onnx", "precision": "int8"}
    built = runner.invoke(app, ["index", "build", "--model", str(tiny_dir), "--kind", "cls", "--corpus", str(corpus),
                                "--out", str(tmp_path / "fp32"), "--no-progress"])
    assert built.exit_code == 0, built.output
    assert load_index(tmp_path / "fp32").manifest["encoding"] == {"backend": "torch", "precision": "fp32"}
    refused = runner.invoke(app, ["index", "build", "--model", str(tiny_dir), "--kind", "cls", "--corpus", str(corpus),
                                  "--out", str(tmp_path / "x"), "--precision", "int8", "--backend", "torch"])
    assert refused.exit_code != 0 and "int8 runs on ONNX Runtime" in refused.output
    assert not os.path.exists(tmp_path / "x")


def test_index_import_records_the_precision_it_was_told_and_calibrates_in_it(tiny_dir, cache, tmp_path):
    from typer.testing import CliRunner

    from densehybrid.bench.scale.pyserini_layout import write_pyserini_dir
    from densehybrid.cli.main import app

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    built = build_index(load_encoder(str(tiny_dir), kind="cls", backend="onnx", precision="int8", device="cpu"),
                        corpus, tmp_path / "built", BuildOptions(progress=False))
    index = load_index(built)
    write_pyserini_dir(tmp_path / "pyserini", np.asarray(index.values, np.float32), [str(d) for d in index.doc_ids])
    runner = CliRunner()
    for flags, encoding in ((["--precision", "int8"], {"backend": "onnx", "precision": "int8"}),
                            ([], {"backend": "torch", "precision": "fp32"})):
        out = tmp_path / f"imported-{encoding['precision']}"
        result = runner.invoke(app, ["index", "import", str(tmp_path / "pyserini"), "--model", str(tiny_dir),
                                     "--kind", "cls", "--out", str(out), *flags])
        assert result.exit_code == 0, result.output
        assert load_index(out).manifest["encoding"] == encoding
        assert load_index(out).encoded_precision == encoding["precision"]


def test_gate_agreement_against_a_count_entry_by_entry():
    from densehybrid.bench.parts.int8_gate import gate_agreement

    rng = np.random.default_rng(0)
    va, vb = rng.random((20, 12)) * (rng.random((20, 12)) < 0.3), rng.random((20, 12)) * (rng.random((20, 12)) < 0.3)
    ga, gb = rng.integers(0, 3, (20, 12)), rng.integers(0, 3, (20, 12))
    agree = either = either_agree = 0
    for i in range(20):
        for j in range(12):
            a_on, b_on = va[i, j] != 0, vb[i, j] != 0
            same = (not a_on and not b_on) or (a_on and b_on and ga[i, j] == gb[i, j])
            agree += same
            if a_on or b_on:
                either += 1
                either_agree += same
    assert gate_agreement(va, ga, vb, gb) == pytest.approx((agree / 240, either_agree / either))
    assert gate_agreement(va, ga, va, ga) == (1.0, 1.0)
