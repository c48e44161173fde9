"""Indexes of format 1 (float16 ``values.npy`` beside a float32 ``first_stage.faiss``) still load and search,
both files memory-mapped."""

import json

import faiss
import numpy as np

from support.fake_encoder import FakeEncoder
from densehybrid.encoder.base import Encoded
from densehybrid.index.search.params import SearchParams
from densehybrid.index.storage import files
from densehybrid.index.storage.documents import Document, write_docs
from densehybrid.index.served.loading import load_index, verify_index


def write_format_1(directory, count=120, seed=5):
    spec = FakeEncoder("cls").spec
    xb = np.random.default_rng(seed).standard_normal((count, spec.dim)).astype(np.float32)
    directory.mkdir()
    np.save(directory / "values.npy", xb.astype(np.float16))
    flat = faiss.IndexFlatIP(spec.dim)
    flat.add(xb)
    faiss.write_index(flat, str(directory / "first_stage.faiss"))
    (directory / "doc_ids.json").write_text(json.dumps([f"d{i}" for i in range(count)]))
    write_docs(directory, [Document(f"d{i}", "", f"text {i}") for i in range(count)])
    files.write_manifest(directory, name="old", spec=spec, count=count, lam=1.0, first_stage={"type": "flat_ip"})
    manifest = json.loads((directory / "manifest.json").read_text())
    (directory / "manifest.json").write_text(json.dumps({**manifest, "format_version": 1}))
    return xb


def test_a_format_1_index_loads_and_searches_its_float32_first_stage(tmp_path):
    xb = write_format_1(tmp_path / "old")
    index = load_index(tmp_path / "old")
    assert index.manifest["format_version"] == 1 and index.first_stage_kind == "flat_ip"
    assert isinstance(index.faiss, faiss.IndexFlatIP) and index.values.dtype == np.float16
    xq = np.random.default_rng(2).standard_normal((3, xb.shape[1])).astype(np.float32)
    found = index.search(Encoded(xq, None), SearchParams(k=5, rerank=False))
    want = np.argsort(-(xq.astype(np.float64) @ xb.astype(np.float64).T), axis=1, kind="stable")[:, :5]
    assert [list(r) for r in found.rows] == want.tolist()
    assert verify_index(tmp_path / "old")["format_version"] == 1
