"""The per-server backend switch: ``backend=onnx`` serves the same vectors as torch (to 1e-5 of scale)."""

import httpx
import numpy as np
import pytest

from densehybrid.encoder.random_checkpoint import write_random_checkpoint
from densehybrid.encoder.backends.onnx_backend import OnnxBackbone
from densehybrid.encoder.loading import load_encoder
from densehybrid.service.app import create_app
from densehybrid.service.startup import StartupError, load_components
from densehybrid.service.settings import ServiceSettings
from densehybrid.bench.servers.start import LiveServer

TEXTS = ["what is a dense retriever", "gated inner products over densified lexical vectors"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "model", "tiny")


def test_onnx_server_encodes_like_torch(tiny_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("DENSEHYBRID_CACHE_DIR", str(tmp_path))  # the export cache goes under the zoo cache
    settings = ServiceSettings(model=str(tiny_dir), kind="dhr", backend="onnx", device="cpu", port=0, log_json=False)
    encoder, index = load_components(settings)
    assert index is None and isinstance(encoder.backbone, OnnxBackbone)
    expect = load_encoder(str(tiny_dir), kind="dhr", device="cpu").encode(TEXTS, "query")
    with LiveServer(create_app(settings, encoder=encoder)) as server:
        reply = httpx.post(server.url + "/encode", json={"texts": TEXTS, "role": "query"}, timeout=30)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    vectors = np.asarray(body["vectors"], dtype=np.float32)
    assert np.abs(vectors - expect.values).max() <= 1e-5 * np.abs(expect.values).max()
    np.testing.assert_array_equal(np.asarray(body["gates"]), expect.gates)


def test_unknown_backend_is_a_settings_error():
    with pytest.raises(ValueError, match="backend"):
        ServiceSettings(backend="tensorrt")


def test_onnx_backend_failure_is_one_startup_message(tiny_dir, monkeypatch):
    from densehybrid.encoder.backends import onnx_backend

    def broken(*args, **kwargs):
        raise onnx_backend.OnnxBackendError("no provider here")

    monkeypatch.setattr(onnx_backend, "onnx_backbone", broken)
    with pytest.raises(StartupError, match="on onnx: OnnxBackendError: no provider here"):
        load_components(ServiceSettings(model=str(tiny_dir), kind="cls", backend="onnx", device="cpu"))


def test_auto_backend_serves_onnx_on_the_cpu(tiny_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("DENSEHYBRID_CACHE_DIR", str(tmp_path))
    settings = ServiceSettings(model=str(tiny_dir), kind="cls", device="cpu", port=0, log_json=False)
    assert settings.backend == "auto"
    encoder, _ = load_components(settings)
    assert isinstance(encoder.backbone, OnnxBackbone) and encoder.backend == "onnx"
    with LiveServer(create_app(settings, encoder=encoder)) as server:
        info = httpx.get(server.url + "/info", timeout=30).json()
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert info["model"]["backend"] == "onnx"
    assert 'backend="onnx"' in metrics


def test_auto_backend_falls_back_to_torch_when_the_export_fails(tiny_dir, monkeypatch, caplog):
    from densehybrid.encoder.backends import onnx_backend

    def broken(*args, **kwargs):
        raise onnx_backend.OnnxBackendError("no provider here")

    monkeypatch.setattr(onnx_backend, "onnx_backbone", broken)
    encoder, _ = load_components(ServiceSettings(model=str(tiny_dir), kind="cls", device="cpu"))
    assert encoder.backend == "torch" and not isinstance(encoder.backbone, OnnxBackbone)
    assert "serving it with torch" in caplog.text and "no provider here" in caplog.text


def test_auto_backend_keeps_torch_on_a_gpu_and_for_encoders_without_a_graph(tiny_dir):
    import torch

    from support.fake_encoder import FakeEncoder
    from densehybrid.encoder.backends.onnx_backend import onnx_serves

    assert FakeEncoder("cls").backend == "torch"
    assert onnx_serves(torch.device("cpu"))
    assert not onnx_serves(torch.device("cuda"))  # the predicate only; nothing runs on it


def test_models_export_onnx_fills_the_cache_a_read_only_server_needs(tiny_dir, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from densehybrid.cli.main import app
    from densehybrid.encoder.backends.onnx_backend import default_cache_root

    monkeypatch.setenv("DENSEHYBRID_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["models", "export-onnx", "--model", str(tiny_dir), "--kind", "cls"])
    assert result.exit_code == 0, result.output
    assert "ONNX graphs in" in result.output
    exported = sorted(p.relative_to(tmp_path) for p in default_cache_root().rglob("*.onnx"))
    assert exported, list(tmp_path.rglob("*"))
    # a server started afterwards finds them: nothing new is written
    encoder, _ = load_components(ServiceSettings(model=str(tiny_dir), kind="cls", device="cpu"))
    assert encoder.backend == "onnx"
    assert sorted(p.relative_to(tmp_path) for p in default_cache_root().rglob("*.onnx")) == exported


def test_models_export_onnx_ignores_the_servers_listening_checks(tiny_dir, monkeypatch, tmp_path):
    """The image sets DENSEHYBRID_HOST=0.0.0.0 and the Compose setup run has no API key: an offline
    command listens nowhere, so that is no error (serve still refuses it: test_service_limits)."""
    from typer.testing import CliRunner

    from densehybrid.cli.main import app

    monkeypatch.setenv("DENSEHYBRID_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DENSEHYBRID_HOST", "0.0.0.0")
    monkeypatch.delenv("DENSEHYBRID_API_KEY", raising=False)
    monkeypatch.delenv("DENSEHYBRID_ALLOW_OPEN", raising=False)
    result = CliRunner().invoke(app, ["models", "export-onnx", "--model", str(tiny_dir), "--kind", "cls"])
    assert result.exit_code == 0, result.output
    assert "ONNX graphs in" in result.output and "API key" not in result.output


def test_models_export_onnx_wants_a_model_or_an_index():
    from typer.testing import CliRunner

    from densehybrid.cli.main import app

    result = CliRunner().invoke(app, ["models", "export-onnx"])
    assert result.exit_code == 2 and "give --index DIR (its manifest names the model) or --model M" in result.output
