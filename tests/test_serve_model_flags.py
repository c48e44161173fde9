"""`serve` takes the model flags of `index build`: a plain MiniLM directory served encode-only with mean pooling."""

import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from densehybrid.bench.servers.start import free_port, stop_process

TEXTS = ["what is a gated inner product", "Faiss keeps the first stage on one GPU"]


def _mean_pooled_normalised(model_dir, texts):
    """sentence-transformers' recipe for all-MiniLM-L6-v2, written out with transformers alone."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.fixture
def minilm_server(minilm_dir, tmp_path):
    assert not (minilm_dir / "densehybrid.json").exists(), "the fixture must be a plain Hugging Face directory"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "densehybrid", "serve", "--model", str(minilm_dir), "--kind", "cls",
                             "--pooling", "mean", "--normalize", "--device", "cpu", "--port", str(port),
                             "--no-warmup", "--log-plain"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail(f"serve did not become ready: {proc.stdout.read() if proc.poll() is not None else 'timeout'}")
        yield url
    finally:
        stop_process(proc)


@pytest.mark.slow  # a server subprocess loading torch and the real model: tens of seconds here
def test_minilm_directory_served_encode_only_with_mean_pooling(minilm_server, minilm_dir):
    info = httpx.get(minilm_server + "/info").json()
    assert info["index"] is None and info["model"]["kind"] == "cls"
    answer = httpx.post(minilm_server + "/encode", json={"texts": TEXTS, "role": "query"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["kind"], body["dim"], body["gates"]) == ("cls", 384, None)
    vectors = np.array(body["vectors"], dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors, _mean_pooled_normalised(minilm_dir, TEXTS), atol=1e-5)
