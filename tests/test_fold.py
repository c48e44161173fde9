"""The fold copies in bulk (vector blocks, SQLite table to table, id slices, payload columns): its generation
must equal a fresh build of the same documents, file by file, for every kind of row it copies."""

import numpy as np
import pytest

from densehybrid.index.building.build import build_from_arrays, encode_passages, passage_text
from densehybrid.index.storage.documents import Document, DocTable, write_docs, write_docs_folded
from densehybrid.index.storage import files
from densehybrid.index.served.loading import load_index
from densehybrid.index.storage.payload import Payload
from densehybrid.index.storage.payload_fold import folded_payload
from densehybrid.index.writes import compaction
from densehybrid.index.writes.delta import Delta, delete, upsert

from support.fake_encoder import FakeEncoder

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
SCHEMA = {"lang": "keyword", "tags": "keyword_list", "year": "integer", "score": "float", "ok": "bool"}


def fields_of(rng: np.random.Generator, i: int) -> dict | None:
    if i % 7 == 3:
        return None  # a document without fields
    out = {"lang": str(rng.choice(["en", "fr", "de", f"x{i}"])), "year": int(1990 + i % 30),
           "score": float(rng.random()), "ok": bool(i % 2)}
    if i % 5:
        out["tags"] = [str(t) for t in rng.choice(WORDS, 1 + i % 3, replace=False)]
    if i % 4 == 0:
        del out["lang"]
    return out


def corpus(prefix: str, n: int, seed: int) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [Document(f"{prefix}{i}", f"t{i}", " ".join(rng.choice(WORDS, 5)), fields_of(rng, i)) for i in range(n)]


def build(encoder, docs, out):
    encoded = encode_passages(encoder, [passage_text(d) for d in docs], 16)
    payload = Payload.from_rows(SCHEMA, [d.fields for d in docs])
    return load_index(build_from_arrays(out, encoder.spec, encoded, docs, payload=payload)), encoded


@pytest.mark.parametrize("kind", ["dhr", "cls"])
def test_a_fold_writes_what_a_fresh_build_of_the_live_documents_writes(tmp_path, kind):
    encoder = FakeEncoder(kind)
    base_docs = corpus("b", 40, 1)
    base, _ = build(encoder, base_docs, tmp_path / "index")
    added = corpus("n", 9, 2)
    replaced = [Document(d.id, "new", d.text + " kappa", {"lang": "it", "tags": ["zeta"]}) for d in base_docs[5:8]]
    delta = Delta()
    for docs in (added, replaced):
        encoded = encode_passages(encoder, [passage_text(d) for d in docs], 16)
        delta = upsert(delta, base, docs, encoded.values, encoded.gates)
    for doc_id in ("b0", "b39", "b20", "n4", "b6"):  # first and last rows, a middle one, a written one, a replaced one
        delta = delete(delta, base, doc_id)

    folded = load_index(compaction.fold(base, delta, tmp_path / "index", applied_seq=7))

    final = {d.id: d for d in base_docs}
    final.update({d.id: d for d in added + replaced})
    for doc_id in ("b0", "b39", "b20", "n4", "b6"):
        del final[doc_id]
    kept = [d.id for d in base_docs if d.id in final and d.id not in {r.id for r in replaced}]
    order = kept + [d.id for d in added + replaced if d.id in final]  # base rows, then the delta's live rows
    reference, _ = build(encoder, [final[i] for i in order], tmp_path / "reference")

    assert folded.doc_ids == reference.doc_ids == order
    assert folded.manifest["writes"] == {"applied_seq": 7} and folded.count == reference.count
    np.testing.assert_array_equal(folded.values, reference.values)
    if kind == "dhr":
        np.testing.assert_array_equal(folded.gates, reference.gates)
    assert list(folded.docs.iter_rows()) == list(reference.docs.iter_rows())
    rows = range(folded.count)
    assert folded.field_values(rows, list(SCHEMA)) == reference.field_values(rows, list(SCHEMA))
    for name in SCHEMA:  # the same columns, vocabularies included (only the words some row holds)
        got, want = folded.payload.columns[name], reference.payload.columns[name]
        for part in ("present", "data", "vocab", "offsets"):
            if getattr(want, part) is None:
                assert getattr(got, part) is None
            else:
                np.testing.assert_array_equal(getattr(got, part), getattr(want, part))
    assert folded.row_of("n0") == order.index("n0") and folded.row_of("b0") is None


def test_a_fold_of_nothing_but_deletes_and_of_everything_deleted(tmp_path):
    encoder = FakeEncoder("cls")
    base_docs = corpus("b", 6, 3)
    base, _ = build(encoder, base_docs, tmp_path / "index")
    delta = Delta()
    for d in base_docs[1:]:
        delta = delete(delta, base, d.id)
    folded = load_index(compaction.fold(base, delta, tmp_path / "index", applied_seq=5))
    assert folded.doc_ids == ["b0"] and list(folded.docs.iter_rows()) == [base_docs[0]]
    assert folded.field_values([0], list(SCHEMA)) == [{k: v for k, v in (base_docs[0].fields or {}).items()}]

    emptied = load_index(compaction.fold(folded, delete(Delta(), folded, "b0"), tmp_path / "index", applied_seq=6))
    assert emptied.count == 0 and emptied.doc_ids == [] and emptied.values.shape == (0, encoder.spec.dim)


def test_kept_runs_are_the_rows_between_the_dropped_ones():
    rng = np.random.default_rng(0)
    for count in (0, 1, 5, 50):
        dropped = np.sort(rng.choice(count, size=rng.integers(0, count + 1), replace=False)).astype(np.int64)
        runs = compaction.kept_runs(count, dropped)
        rows = [r for a, b in runs for r in range(a, b)]
        assert rows == [r for r in range(count) if r not in set(dropped.tolist())]
        assert all(b > a for a, b in runs)


def test_the_folded_document_table_drops_renumbers_and_appends(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    docs = [Document(f"d{i}", f"t{i}", f"text {i}") for i in range(10)]
    write_docs(tmp_path / "a", docs)
    added = [Document("x", "tx", "text x"), Document("y", "", "")]
    write_docs_folded(tmp_path / "b", tmp_path / "a" / "docs.sqlite", [0, 4, 5, 9], added)
    table = DocTable(tmp_path / "b" / "docs.sqlite")
    want = [d for i, d in enumerate(docs) if i not in (0, 4, 5, 9)] + added
    assert list(table.iter_rows()) == want
    rows = table._rows("SELECT row FROM docs ORDER BY row", ())
    assert [r[0] for r in rows] == list(range(len(want)))


def test_folded_payload_equals_the_columns_built_from_rows():
    rng = np.random.default_rng(4)
    base_rows = [fields_of(rng, i) for i in range(30)]
    added_rows = [fields_of(rng, 100 + i) for i in range(7)] + [None]
    keep = np.array([i for i in range(30) if i % 4], dtype=np.int64)
    got = folded_payload(SCHEMA, Payload.from_rows(SCHEMA, base_rows), keep, Payload.from_rows(SCHEMA, added_rows))
    want = Payload.from_rows(SCHEMA, [base_rows[i] for i in keep] + added_rows)
    assert got.count == want.count
    assert got.rows(range(want.count)) == want.rows(range(want.count))
    for name in SCHEMA:
        np.testing.assert_array_equal(got.columns[name].present, want.columns[name].present)
        np.testing.assert_array_equal(got.columns[name].data, want.columns[name].data)


def test_a_format_1_index_folds_into_a_format_2_generation_of_its_kept_and_written_rows(tmp_path):
    from test_index_format_v1 import write_format_1

    xb = write_format_1(tmp_path / "old", count=30)
    base = load_index(tmp_path / "old")
    encoder = FakeEncoder("cls")
    added = [Document("new", "", "alpha beta")]
    values = encode_passages(encoder, [passage_text(d) for d in added], 16).values
    delta = upsert(delete(delete(Delta(), base, "d3"), base, "d29"), base, added, values, None)

    folded = load_index(compaction.fold(base, delta, tmp_path / "old", applied_seq=3))
    kept = [i for i in range(30) if i not in (3, 29)]
    assert folded.manifest["format_version"] == files.FORMAT_VERSION and folded.doc_ids == [f"d{i}" for i in kept] + ["new"]
    np.testing.assert_array_equal(folded.values, np.concatenate([xb[kept], values]).astype(np.float16))
    assert [d.id for d in folded.docs.iter_rows()] == folded.doc_ids


def test_the_id_lookup_finds_every_id_and_only_those(tmp_path):
    encoder = FakeEncoder("cls")
    rng = np.random.default_rng(9)
    ids = [f"id-{rng.integers(10**6)}-{i}" for i in range(50)] + ["a", "a\x00", "é", "b"]
    docs = [Document(i, "", f"text {n}") for n, i in enumerate(ids)]
    index = load_index(build_from_arrays(tmp_path / "ids", encoder.spec,
                                         encode_passages(encoder, [d.text for d in docs], 16), docs))
    assert [index.row_of(i) for i in ids] == list(range(len(ids)))  # "a\x00" is not "a", though numpy says so
    assert index.row_of("missing") is None and index.row_of("") is None and index.row_of("zzz") is None
    np.testing.assert_array_equal(index.doc_ids.rows_of(["b", "nope", ids[7]]), [len(ids) - 1, -1, 7])
    assert index.doc_ids.rows_of([]).shape == (0,)
