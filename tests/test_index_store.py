"""Index directory: loading checks sizes and layouts, verifying hashes every byte; damaged or foreign
indexes are refused by name."""

import dataclasses
import json

import numpy as np
import pytest

from densehybrid.index.building import build

from densehybrid.index import errors

from densehybrid.index.storage import durable, files
from densehybrid.index.storage.documents import Document
from densehybrid.index.errors import IndexLoadError, IndexMismatchError
from densehybrid.index.storage.compatibility import check_compatible
from densehybrid.index.served.loading import load_index, verify_index

from support.fake_encoder import FakeEncoder


@pytest.fixture()
def built(tmp_path):
    encoder = FakeEncoder("fusion")
    texts = [f"passage number {i} about topic {i % 7}" for i in range(40)]
    docs = [Document(f"id-{i}", f"title {i}" if i % 2 else "", t) for i, t in enumerate(texts)]
    return build.build_from_arrays(tmp_path / "ix", encoder.spec, encoder.encode(texts, "passage"), docs, lam=2.5)


def test_load_exposes_everything(built):
    index = load_index(built)
    assert index.count == 40 and index.name == "ix" and index.lam == 2.5
    assert index.spec == FakeEncoder("fusion").spec
    assert index.values.dtype == np.float16 and isinstance(index.values, np.memmap)
    assert index.gates.shape == (40, 768) and index.gates.dtype == np.uint8
    assert index.faiss.ntotal == 40 and index.doc_ids[3] == "id-3"
    assert index.row_of("id-17") == 17 and index.row_of("nope") is None
    assert index.docs.get("id-3") == Document("id-3", "title 3", "passage number 3 about topic 3")
    assert index.docs.get("missing") is None
    assert index.docs.get_many(["id-2", "missing", "id-1"]) == [index.docs.get("id-2"), None, index.docs.get("id-1")]
    assert index.contains("id-39") and not index.contains("nope") and index.ids_of([39, 2]) == ["id-39", "id-2"]
    assert [d.id for d in index.docs.iter_rows(batch=7)] == index.doc_ids
    manifest = index.manifest
    assert manifest["format_version"] == files.FORMAT_VERSION and manifest["encoder"]["kind"] == "fusion"
    assert set(manifest["files"]) == {"vectors.faiss", "gates.npy", "doc_ids.npy", "doc_ids.order.npy",
                                      "docs.sqlite"}


@pytest.mark.parametrize("name", ["vectors.faiss", "gates.npy"])
def test_flipped_byte_is_found_by_verify_not_at_load(built, name):
    path = built / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    load_index(built)  # start-up reads no vector: sizes and layouts are intact, a flipped bit inside is not seen
    with pytest.raises(IndexLoadError, match=f"{name}.*checksum"):
        verify_index(built)
    with pytest.raises(IndexLoadError, match=f"{name}.*checksum"):
        load_index(built, checksums=True)


def test_verify_passes_an_intact_index(built):
    assert verify_index(built)["count"] == 40


@pytest.mark.parametrize("name", ["vectors.faiss", "docs.sqlite"])
def test_truncated_file_is_refused(built, name):
    path = built / name
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(IndexLoadError, match=f"{name}.*truncated"):
        load_index(built)


def test_truncated_file_is_refused_without_checksums(built):
    (built / "gates.npy").write_bytes((built / "gates.npy").read_bytes()[:100])
    with pytest.raises(IndexLoadError, match="gates.npy"):
        load_index(built, checksums=False)


@pytest.mark.parametrize("name", ["vectors.faiss", "docs.sqlite", "manifest.json"])
def test_missing_file_is_refused(built, name):
    (built / name).unlink()
    with pytest.raises(IndexLoadError, match=f"{name}.*missing"):
        load_index(built)


def test_missing_directory_and_foreign_manifest(built, tmp_path):
    with pytest.raises(IndexLoadError, match="no such index directory"):
        load_index(tmp_path / "nowhere")
    manifest = json.loads((built / "manifest.json").read_text())
    (built / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(IndexLoadError, match="format version 99"):
        load_index(built)
    (built / "manifest.json").write_text("{not json")
    with pytest.raises(IndexLoadError, match="manifest.json.*unreadable"):
        load_index(built)


def test_manifest_count_that_lies_is_refused(built):
    manifest = json.loads((built / "manifest.json").read_text())
    (built / "manifest.json").write_text(json.dumps({**manifest, "count": 41}))
    with pytest.raises(IndexLoadError, match="vectors.faiss.*41 rows of 896 float16"):
        load_index(built)


@pytest.mark.parametrize("field,value", [
    ("kind", "dhr"), ("dim", 900), ("gated_dim", 640), ("skip_mlm", True), ("weights_hash", "other"),
    ("vocab_size", 30000), ("lexical", "delade"),
])
def test_model_mismatch_names_the_field(field, value):
    spec = FakeEncoder("fusion").spec
    with pytest.raises(IndexMismatchError, match=field):
        check_compatible(spec, dataclasses.replace(spec, **{field: value}))


def test_compatible_model_passes_even_with_other_lambda_and_lengths():
    spec = FakeEncoder("fusion").spec
    check_compatible(spec, dataclasses.replace(spec, lam=3.0, max_query_length=64, model_id="/elsewhere/model"))


def test_publish_refuses_to_clobber(built, tmp_path):
    staged = tmp_path / "staged"
    staged.mkdir()
    with pytest.raises(errors.IndexWriteError, match="already exists"):
        durable.publish(staged, built)
    durable.publish(staged, built, overwrite=True)
    assert not (built / "manifest.json").exists() and not staged.exists()
