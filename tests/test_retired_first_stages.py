"""Indexes built with a retired first stage (IVF of 8-bit codes, plain IndexPQ) are refused with the command
that rebuilds them, and the flags that built them are gone."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.cli.main import app
from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.index.building import build
from densehybrid.index.errors import IndexLoadError
from densehybrid.index.served.loading import load_index, verify_index
from densehybrid.index.storage.documents import Document

# the manifest entries the retired engines wrote, and the file each kept beside the rows
OLD_FIRST_STAGES = {
    "ivf": ({"type": "ivf", "file": "first_stage.ivf.faiss", "nlist": 16, "nprobe": 4, "encoding": "sq8",
             "train_size": 65536, "seed": 1234, "trained_rows": 300}, "first_stage.ivf.faiss"),
    "pq": ({"type": "pq", "m": 4, "nbits": 8, "train_size": 65536, "seed": 1234}, "first_stage.faiss"),
}


def old_index(tmp_path, kind: str):
    """A flat index made to look as the retired ``kind`` wrote it: its manifest names that first stage and
    lists its file (whose bytes no longer matter: nothing reads them)."""
    spec = EncoderSpec(kind="cls", dim=8, gated_dim=0, lam=1.0, model_id="random", weights_hash="r")
    values = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    docs = [Document(f"d{i}", "", f"text {i}") for i in range(300)]
    out = build.build_from_arrays(tmp_path / kind, spec, Encoded(values, None), docs)
    record, name = OLD_FIRST_STAGES[kind]
    (out / name).write_bytes(b"old codes")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["first_stage"] = record
    manifest["files"][name] = {"bytes": 9, "sha256": "0" * 64}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize("kind", list(OLD_FIRST_STAGES))
def test_an_index_of_a_retired_first_stage_is_refused_with_the_command_that_rebuilds_it(tmp_path, kind):
    out = old_index(tmp_path, kind)
    for opened in (load_index, verify_index):
        with pytest.raises(IndexLoadError) as refused:
            opened(out)
        message = str(refused.value)
        assert str(out / "manifest.json") in message and "no longer served" in message
        assert "densehybrid index build ... --ann pqscan" in message and "densehybrid index import" in message
    verified = CliRunner().invoke(app, ["index", "verify", str(out)])
    assert verified.exit_code != 0 and "--ann pqscan" in " ".join(verified.output.split())


@pytest.mark.parametrize("flags", [["--ann", "ivf"], ["--pq", "8"], ["--ivf-lists", "16"], ["--nprobe", "4"]])
def test_the_flags_of_the_retired_first_stages_are_refused(tmp_path, flags):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "x"}) + "\n")
    result = CliRunner().invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                                      "--model", "fake:cls", *flags])
    assert result.exit_code == 2 and flags[0] in result.output, result.output
    assert not (tmp_path / "i").exists()
