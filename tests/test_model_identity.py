"""The model lock covers tokenizer and config files, not only the weights."""

import json
import logging
import shutil

import pytest

from densehybrid.encoder.config import EncoderConfig
from densehybrid.encoder.model_dir import identity_files
from densehybrid.index.building import commands
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.errors import IndexMismatchError
from densehybrid.index.storage.compatibility import check_compatible
from densehybrid.index.storage.files import MANIFEST
from densehybrid.index.served.loading import load_index


@pytest.fixture()
def model_and_index(tmp_path, tiny_bert_dir):
    model = shutil.copytree(tiny_bert_dir, tmp_path / "model")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"passage number {i} about tides"}) + "\n"
                              for i in range(6)))
    encoder = commands.load_model(EncoderConfig(str(model), kind="dhr"))
    build_index(encoder, corpus, tmp_path / "ix", BuildOptions(batch_size=3, progress=False))
    return model, tmp_path / "ix"


def _swap_two_tokens(model_dir) -> str:
    """Edit the tokenizer the way a re-exported vocabulary would: two ids trade places."""
    name = "tokenizer.json" if (model_dir / "tokenizer.json").is_file() else "vocab.txt"
    path = model_dir / name
    if name == "tokenizer.json":
        data = json.loads(path.read_text())
        vocab = data["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[-2:]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        path.write_text(json.dumps(data))
    else:
        lines = path.read_text().splitlines()
        lines[-1], lines[-2] = lines[-2], lines[-1]
        path.write_text("\n".join(lines) + "\n")
    return name


def test_identity_covers_tokenizer_and_config(tiny_bert_dir):
    names = set(identity_files([tiny_bert_dir]))
    assert "config.json" in names and names & {"tokenizer.json", "vocab.txt"}
    assert not any(name.endswith((".safetensors", ".bin", ".pt")) for name in names)  # weights have their own hash


def test_the_index_records_the_digests(model_and_index):
    model, ix = model_and_index
    assert load_index(ix).spec.identity_files == identity_files([model])


def test_a_changed_tokenizer_is_refused_with_the_file_named(model_and_index):
    model, ix = model_and_index
    index = load_index(ix)
    commands.encoder_for_index(index)  # unchanged: accepted
    changed = _swap_two_tokens(model)
    with pytest.raises(IndexMismatchError, match=rf"tokenizer/config file {changed} changed"):
        commands.encoder_for_index(index)


def test_a_changed_config_is_refused(model_and_index):
    model, ix = model_and_index
    index = load_index(ix)
    config = json.loads((model / "config.json").read_text())
    config["layer_norm_eps"] = config.get("layer_norm_eps", 1e-12) * 10
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(IndexMismatchError, match="config.json changed"):
        commands.encoder_for_index(index)


def test_an_index_from_before_the_lock_still_loads_with_a_warning(model_and_index, caplog):
    model, ix = model_and_index
    manifest = json.loads((ix / MANIFEST).read_text())
    del manifest["encoder"]["identity_files"]
    (ix / MANIFEST).write_text(json.dumps(manifest))
    index = load_index(ix)
    assert index.spec.identity_files == {}
    with caplog.at_level(logging.WARNING, logger="densehybrid.index.storage.files"):
        commands.encoder_for_index(index)
    assert "rebuild the index to lock them" in caplog.text


def test_missing_and_new_files_are_named():
    with pytest.raises(IndexMismatchError, match="vocab.txt is missing from the model"):
        check_identity({"vocab.txt": "a", "config.json": "b"}, {"config.json": "b"})
    with pytest.raises(IndexMismatchError, match="merges.txt is new in the model"):
        check_identity({"config.json": "b"}, {"config.json": "b", "merges.txt": "c"})


def check_identity(index_files, model_files):
    from dataclasses import replace

    from densehybrid.encoder.base import EncoderSpec

    spec = EncoderSpec(kind="cls", dim=4)
    check_compatible(replace(spec, identity_files=index_files), replace(spec, identity_files=model_files))
