"""``index build --ray``: a Ray Data build of a real corpus is the plain build's index, and resumes.

One local Ray session (ray.init takes ~12 s on the 2-core test machine) serves every build here; it is
always shut down, so no Ray agent outlives the test.
"""

from __future__ import annotations

import json
import os
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray Data is the optional [ray] extra: pip install -e '.[ray]'")

from densehybrid.encoder.config import EncoderConfig  # noqa: E402
from densehybrid.encoder.loading import load_encoder  # noqa: E402
from densehybrid.index.building.build import BuildOptions, build_index, encode_passages, passage_text, read_corpus  # noqa: E402
from densehybrid.index.served.loading import load_index  # noqa: E402
from densehybrid.index.building.ray_build import RayOptions, RayShardEncoder  # noqa: E402
from densehybrid.index.search.searcher import Searcher  # noqa: E402
from densehybrid.index.search.params import SearchParams

pytestmark = pytest.mark.slow

DATA = Path("/work/shared/data/msmarco-dl-5k")
QUERIES = ["what is the fahrenheit scale", "symptoms of the flu", "how do plants make food", "largest ocean on earth"]


class Killed(RuntimeError):
    pass


@pytest.fixture
def corpus(tmp_path) -> Path:
    if not (DATA / "corpus.jsonl").is_file():
        pytest.skip(f"{DATA} (the real evaluation set) is not on this machine")
    path = tmp_path / "corpus.jsonl"
    with open(DATA / "corpus.jsonl", encoding="utf-8") as f:
        path.write_text("".join(islice(f, 120)), encoding="utf-8")
    return path


def _assert_same_index(ray_dir: Path, plain_dir: Path, encoder) -> None:
    built, plain = load_index(ray_dir), load_index(plain_dir)
    assert built.doc_ids == plain.doc_ids
    # stored as float16: a 1e-5 difference before rounding may move a value by one float16 step (2**-10 relative)
    np.testing.assert_allclose(np.asarray(built.values, dtype=np.float32), np.asarray(plain.values, dtype=np.float32),
                               atol=1e-5, rtol=2 ** -10)
    np.testing.assert_array_equal(np.asarray(built.gates), np.asarray(plain.gates))
    queries = encoder.encode(QUERIES, "query")
    assert Searcher(built).search(queries,
                                  SearchParams(k=10)).ids == Searcher(plain).search(queries, SearchParams(k=10)).ids


def test_ray_build_equals_plain_build_and_resumes(splade_tiny_dir, corpus, tmp_path):
    config = EncoderConfig(str(splade_tiny_dir), kind="dlr")
    encoder = load_encoder(config, device="cpu")
    options = BuildOptions(batch_size=8, shard_size=40, progress=False)
    build_index(encoder, corpus, tmp_path / "plain", options)

    ray_options = RayOptions("local", batch_size=16)
    with RayShardEncoder(encoder, config, "cpu", options.batch_size, ray_options) as encode_shard:
        build_index(encoder, corpus, tmp_path / "ray", options, encode_shard=encode_shard, engine=encode_shard.record())

        texts = [passage_text(d) for d in read_corpus(corpus)][:50]
        on_ray, in_process = encode_shard(texts, lambda n: None), encode_passages(encoder, texts, options.batch_size)
        np.testing.assert_allclose(on_ray.values, in_process.values, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(on_ray.gates, in_process.gates)

        shards_done = []

        def killed_after_one_shard(texts, on_batch):
            if shards_done:
                raise Killed
            shards_done.append(len(texts))
            return encode_shard(texts, on_batch)

        with pytest.raises(Killed):
            build_index(encoder, corpus, tmp_path / "resumed", options, encode_shard=killed_after_one_shard)
        assert (tmp_path / "resumed.partial" / "shards" / "00000").is_dir()
        assert not (tmp_path / "resumed.partial" / "shards" / "00001").exists()
        build_index(encoder, corpus, tmp_path / "resumed", BuildOptions(**{**options.__dict__, "resume": True}),
                    encode_shard=encode_shard, engine=encode_shard.record())
    assert not ray.is_initialized()

    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert manifest["build"]["engine"] == "ray"
    cpu_actors = (os.cpu_count() or 1) - 1  # one CPU stays free for Ray Data's reads
    assert manifest["build"]["ray"] == {"address": "local", "actors": torch.cuda.device_count() or cpu_actors,
                                        "batch_size": 16}
    assert json.loads((tmp_path / "plain" / "manifest.json").read_text())["build"]["engine"] == "local"
    _assert_same_index(tmp_path / "ray", tmp_path / "plain", encoder)
    _assert_same_index(tmp_path / "resumed", tmp_path / "plain", encoder)
    assert not (tmp_path / "resumed.partial").exists()


def test_cli_ray_local_build_is_recorded_as_ray(splade_tiny_dir, corpus, tmp_path):
    from typer.testing import CliRunner

    from densehybrid.cli.main import app

    small = tmp_path / "small.jsonl"
    small.write_text("".join(corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:40]), encoding="utf-8")
    args = ["index", "build", "--corpus", str(small), "--model", str(splade_tiny_dir), "--kind", "dlr",
            "--device", "cpu", "--batch-size", "8", "--no-progress"]
    try:
        built = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "ray"), "--ray", "local", "--ray-batch-size", "20"])
    finally:
        ray.shutdown()
    assert built.exit_code == 0, built.output
    assert not ray.is_initialized()
    plain = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    build = json.loads((tmp_path / "ray" / "manifest.json").read_text())["build"]
    assert build["engine"] == "ray" and build["ray"]["address"] == "local" and build["ray"]["batch_size"] == 16
    assert load_index(tmp_path / "ray").doc_ids == load_index(tmp_path / "plain").doc_ids


def test_ray_batch_size_without_ray_is_refused(tmp_path):
    from typer.testing import CliRunner

    from densehybrid.cli.main import app

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "1", "text": "one passage"}\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "ix"),
                                      "--model", "splade-tiny", "--ray-batch-size", "8"])
    assert result.exit_code == 2 and "--ray-batch-size needs --ray" in result.output
    assert not (tmp_path / "ix").exists() and not (tmp_path / "ix.partial").exists()
