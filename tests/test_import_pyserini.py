"""``index import``: a Pyserini Faiss index directory (``index`` + ``docid``) served without re-encoding.

The source is written here as Pyserini writes it: ``faiss.write_index`` of an IndexFlatIP, one id a line."""

import json
import os

import faiss
import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from support.fake_encoder import FakeEncoder
from densehybrid.bench.servers.start import LiveServer
from densehybrid.cli.main import app
from densehybrid.index.building.importing import ImportOptions, import_pyserini
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.served.loading import load_index, verify_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

COUNT = 300


def write_pyserini(directory, count=COUNT, dim=None, seed=7):
    """A seeded Pyserini-layout directory -> its float32 (count, dim) vectors."""
    dim = dim or FakeEncoder("cls").spec.dim
    xb = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    directory.mkdir(parents=True)
    index = faiss.IndexFlatIP(dim)
    index.add(xb)
    faiss.write_index(index, str(directory / "index"))
    (directory / "docid").write_text("".join(f"msmarco-{i * 3}\n" for i in range(count)))
    return xb


def brute_topk_agrees(xq, xb, rows, k=10, tol=5e-3):
    """``rows`` are a top-k of xq . xb by brute force in float64, up to float16 ties (scores within ``tol``)."""
    scores = xq.astype(np.float64) @ xb.astype(np.float64).T
    for q, got in enumerate(rows):
        want = np.argsort(-scores[q], kind="stable")[:k]
        assert len(got) == k
        kth = scores[q, want[-1]]
        assert all(scores[q, r] >= kth - tol for r in got), (q, got, want)
        assert len(set(got) & set(want)) >= k - 1  # at most a tie swapped at the boundary
    return True


@pytest.fixture()
def source(tmp_path):
    xb = write_pyserini(tmp_path / "pyserini")
    return tmp_path / "pyserini", xb


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_imported_index_searches_like_brute_force_over_the_vectors(tmp_path, source, dtype):
    directory, xb = source
    spec = FakeEncoder("cls").spec
    out = import_pyserini(directory, tmp_path / "ix", spec, ImportOptions(values_dtype=dtype))
    index = load_index(out)
    assert index.count == COUNT and index.doc_ids[:2] == ["msmarco-0", "msmarco-3"]
    assert index.values.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(index.values, xb.astype(dtype))
    xq = np.random.default_rng(1).standard_normal((6, spec.dim)).astype(np.float32)
    from densehybrid.encoder.base import Encoded
    from densehybrid.index.search.params import SearchParams
    found = index.search(Encoded(xq, None), SearchParams(k=10))
    assert brute_topk_agrees(xq, xb, [np.array(r) for r in found.rows])
    source_record = index.manifest["source"]
    assert source_record["format"] == "pyserini-faiss" and source_record["count"] == COUNT
    assert source_record["path"] == str(directory.resolve())
    assert set(source_record["files"]) == {"index", "docid"}
    assert verify_index(out)["count"] == COUNT


def test_float32_import_copies_nothing_when_it_can_link(tmp_path, source):
    directory, _ = source
    out = import_pyserini(directory, tmp_path / "ix", FakeEncoder("cls").spec, ImportOptions(values_dtype="float32"))
    assert (out / "vectors.faiss").read_bytes() == (directory / "index").read_bytes()
    assert os.stat(out / "vectors.faiss").st_ino == os.stat(directory / "index").st_ino  # same file system here
    float16 = import_pyserini(directory, tmp_path / "ix16", FakeEncoder("cls").spec)
    assert (float16 / "vectors.faiss").stat().st_size < 0.51 * (directory / "index").stat().st_size + 200


def test_search_over_http_returns_the_brute_force_top10(tmp_path, source):
    directory, xb = source
    encoder = FakeEncoder("cls")
    out = import_pyserini(directory, tmp_path / "ix", encoder.spec)
    with LiveServer(create_app(ServiceSettings(index=out), encoder=encoder, index=load_index(out))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as client:
        for text in ["dense retrieval at scale", "passage ranking", "memory maps"]:
            response = client.post("/search", json={"query": text, "k": 10})
            assert response.status_code == 200, response.text
            ids = [hit["id"] for hit in response.json()["results"]]
            xq = encoder.encode([text], "query").values.astype(np.float32)
            rows = np.array([int(i.split("-")[1]) // 3 for i in ids])
            assert brute_topk_agrees(xq, xb, [rows])


def test_corpus_gives_texts_by_id_in_any_order(tmp_path, source):
    directory, _ = source
    ids = [line for line in (directory / "docid").read_text().splitlines()]
    lines = [{"_id": i, "title": f"title of {i}", "text": f"text of {i}", "metadata": {"n": int(i.split("-")[1])}}
             for i in reversed(ids)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    index = load_index(import_pyserini(directory, tmp_path / "ix", FakeEncoder("cls").spec, ImportOptions(corpus=corpus)))
    doc = index.docs.get("msmarco-30")
    assert (doc.title, doc.text) == ("title of msmarco-30", "text of msmarco-30")
    assert [d.id for d in index.docs.iter_rows()] == ids  # rows in docid order
    with pytest.raises(IndexWriteError, match="order of the docid file"):
        import_pyserini(directory, tmp_path / "ix2", FakeEncoder("cls").spec,
                        ImportOptions(corpus=corpus, fields_from_metadata=True))
    assert not (tmp_path / "ix2").exists()
    corpus.write_text(corpus.read_text() + json.dumps(lines[0]) + "\n")
    with pytest.raises(IndexWriteError, match="occurs more than once"):
        import_pyserini(directory, tmp_path / "ix3", FakeEncoder("cls").spec, ImportOptions(corpus=corpus))
    assert not (tmp_path / "ix3").exists() and not (tmp_path / "ix3.partial").exists()


def _truncate_index(d):
    (d / "index").write_bytes((d / "index").read_bytes()[:5000])


def _drop_docids(d):
    (d / "docid").write_text("".join((d / "docid").read_text().splitlines(keepends=True)[:-3]))


def _duplicate_docid(d):
    lines = (d / "docid").read_text().splitlines(keepends=True)
    (d / "docid").write_text("".join(lines[:5] + lines[:1] + lines[6:]))


def _l2_index(d):
    index = faiss.IndexFlatL2(FakeEncoder("cls").spec.dim)
    index.add(np.zeros((COUNT, index.d), np.float32))
    faiss.write_index(index, str(d / "index"))


@pytest.mark.parametrize("damage,words", [
    (_truncate_index, ["index", "truncated"]),
    (lambda d: (d / "docid").unlink(), ["'docid' is missing"]),
    (_drop_docids, ["lists 297 ids", "300 vectors"]),
    (_duplicate_docid, ["more than once"]),
    (_l2_index, ["IndexFlatL2", "IndexFlatIP"]),
])
def test_a_damaged_source_is_one_clear_error_and_nothing_is_published(tmp_path, source, damage, words):
    directory, _ = source
    damage(directory)
    with pytest.raises(IndexWriteError) as caught:
        import_pyserini(directory, tmp_path / "ix", FakeEncoder("cls").spec)
    for word in words:
        assert word in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pyserini"]  # no ix, no ix.partial


def test_cli_refuses_dims_that_disagree_with_the_model(tmp_path, fake_models):
    write_pyserini(tmp_path / "pyserini", dim=FakeEncoder("cls").spec.dim + 8)
    result = CliRunner().invoke(app, ["index", "import", str(tmp_path / "pyserini"), "--out", str(tmp_path / "ix"),
                                      "--model", "fake:cls"])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and "dims" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "ix").exists() and not (tmp_path / "ix.partial").exists()


def test_cli_import_then_verify(tmp_path, fake_models):
    write_pyserini(tmp_path / "pyserini")
    result = CliRunner().invoke(app, ["index", "import", str(tmp_path / "pyserini"), "--out", str(tmp_path / "ix"),
                                      "--model", "fake:cls"])
    assert result.exit_code == 0, result.output
    assert f"{COUNT} passages" in " ".join(result.output.split())  # Rich wraps long paths
    verified = CliRunner().invoke(app, ["index", "verify", str(tmp_path / "ix")])
    assert verified.exit_code == 0 and "every sha256 matches" in " ".join(verified.output.split()), verified.output
    data = bytearray((tmp_path / "ix" / "vectors.faiss").read_bytes())
    data[-7] ^= 0x40
    (tmp_path / "ix" / "vectors.faiss").write_bytes(bytes(data))
    damaged = CliRunner().invoke(app, ["index", "verify", str(tmp_path / "ix")])
    assert damaged.exit_code == 2 and "checksum" in " ".join(damaged.output.split()), damaged.output
