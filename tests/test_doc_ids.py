"""The stored id arrays: exact round trips, a lookup that agrees with a dict, indexes of format 2
(``doc_ids.json``) still opening and verifying, and the full check finding a damaged order."""

import json

import numpy as np
import pytest

from densehybrid.index.building.build import build_from_arrays, encode_passages
from densehybrid.index.errors import IndexLoadError
from densehybrid.index.storage import doc_ids, files
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index, verify_index
from densehybrid.index.writes import compaction
from densehybrid.index.writes.delta import Delta, delete
from support.fake_encoder import FakeEncoder

# ids numpy would confuse or cut: trailing NULs, multi-byte UTF-8, the empty id, one much longer than the rest
ODD = ["a", "a\x00", "a\x00\x00", "é", "日本", "", "x" * 300, "ab", "b"]


def seeded_ids(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{rng.choice(['msmarco', 'doc', 'é'])}-{int(v)}" for v in rng.permutation(10 * n)[:n]] + ODD


def test_ids_round_trip_exactly_and_the_lookup_agrees_with_a_dict(tmp_path):
    ids = seeded_ids(2_000, seed=3)
    doc_ids.write(tmp_path, ids)
    stored = doc_ids.load(tmp_path, len(ids))
    assert isinstance(stored.keys, np.memmap) and isinstance(stored.order, np.memmap)
    assert list(stored) == ids and stored == ids and stored[5] == ids[5] and stored[-3:] == ids[-3:]
    row = {d: r for r, d in enumerate(ids)}
    wanted = ids[::7] + ["a\x00\x00\x00", "missing", "x" * 301, "x" * 299, "é-", "\ud800"]
    np.testing.assert_array_equal(stored.rows_of(wanted), [row.get(d, -1) for d in wanted])
    assert stored.rows_of([]).shape == (0,)
    doc_ids.check(tmp_path, stored)


def test_an_empty_id_list_round_trips(tmp_path):
    doc_ids.write(tmp_path, [])
    stored = doc_ids.load(tmp_path, 0)
    assert stored == [] and stored.rows_of(["a"]).tolist() == [-1]


def _index(tmp_path, ids):
    encoder = FakeEncoder("cls")
    docs = [Document(d, "", f"text {n}") for n, d in enumerate(ids)]
    return build_from_arrays(tmp_path, encoder.spec, encode_passages(encoder, [d.text for d in docs], 16), docs)


def as_format_2(directory, ids):
    """Rewrite a built index as format 2 wrote it: the ids as one JSON list."""
    for name in (doc_ids.IDS, doc_ids.ORDER):
        (directory / name).unlink()
    (directory / "doc_ids.json").write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
    manifest = json.loads((directory / "manifest.json").read_text())
    files.write_manifest(directory, name=manifest["name"], spec=FakeEncoder("cls").spec, count=len(ids),
                         lam=manifest["lam"], first_stage=manifest["first_stage"])
    manifest = json.loads((directory / "manifest.json").read_text())
    (directory / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2}))


def test_new_indexes_store_the_arrays_and_format_2_still_opens_verifies_and_folds(tmp_path):
    ids = seeded_ids(40, seed=4)
    new = load_index(_index(tmp_path / "new", ids))
    assert {doc_ids.IDS, doc_ids.ORDER} <= set(new.manifest["files"]) and "doc_ids.json" not in new.manifest["files"]
    old_dir = _index(tmp_path / "old", ids)
    as_format_2(old_dir, ids)
    old = load_index(old_dir)
    assert old.manifest["format_version"] == 2 and old.doc_ids == ids
    assert [old.row_of(d) for d in ids] == list(range(len(ids))) and old.row_of("missing") is None
    assert verify_index(old_dir)["format_version"] == 2
    folded = load_index(compaction.fold(old, delete(Delta(), old, ids[0]), old_dir, applied_seq=1))
    assert folded.manifest["format_version"] == files.FORMAT_VERSION and folded.doc_ids == ids[1:]
    assert doc_ids.IDS in folded.manifest["files"] and not (old_dir / "doc_ids.json").exists()


def test_verify_finds_an_order_that_is_not_the_ids_order_and_load_names_a_bad_file(tmp_path):
    ids = seeded_ids(30, seed=5)
    directory = _index(tmp_path / "ix", ids)
    manifest = json.loads((directory / "manifest.json").read_text())
    np.save(directory / doc_ids.ORDER, np.arange(len(ids), dtype=np.int64))  # rows, not the ids' order
    files.write_manifest(directory, name="ix", spec=FakeEncoder("cls").spec, count=len(ids), lam=manifest["lam"],
                         first_stage=manifest["first_stage"])
    assert load_index(directory).count == len(ids)  # opening reads no id
    with pytest.raises(IndexLoadError, match="doc_ids.order.npy: ids not in sorted order"):
        verify_index(directory)
    np.save(directory / doc_ids.IDS, np.zeros((len(ids), 2), "S4"))
    files.write_manifest(directory, name="ix", spec=FakeEncoder("cls").spec, count=len(ids), lam=manifest["lam"],
                         first_stage=manifest["first_stage"])
    with pytest.raises(IndexLoadError, match=rf"doc_ids.npy: holds \|S4 \({len(ids)}, 2\)"):
        load_index(directory)
