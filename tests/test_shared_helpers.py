"""The shared readers and helpers: one JSONL reader (corpora, queries) and one sha256."""

import json

import pytest

from densehybrid.index.build import read_corpus
from densehybrid.index.evaluate import EvalInputError, read_queries
from densehybrid.index.jsonl import read_jsonl
from densehybrid.index.store import IndexWriteError


def test_rows_in_order_blank_lines_skipped(tmp_path):
    rows = [{"_id": "b", "text": "two"}, {"_id": 1, "text": "one", "extra": [1]}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows[:1]) + "\n\n   \n" + json.dumps(rows[1]) + "\n")
    assert list(read_jsonl(path, required=("_id",), what="a row")) == rows
    assert read_queries(path) == {"b": "two", "1": "one"}
    assert [(d.id, d.text) for d in read_corpus(path)] == [("b", "two"), ("1", "one")]


@pytest.mark.parametrize("bad_line, reason", [("{not json", "JSONDecodeError"), ('["_id", "text"]', "TypeError"),
                                              ('{"text": "no id"}', "KeyError")])
def test_bad_line_is_named_by_path_and_number(tmp_path, bad_line, reason):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"_id": "a", "text": "fine"}\n' + bad_line + "\n")
    with pytest.raises(EvalInputError, match=rf"rows.jsonl:2: not a query line with _id and text \({reason}"):
        read_queries(path)
    with pytest.raises(IndexWriteError, match=r"rows.jsonl:2: not a corpus line"):
        list(read_corpus(path))


def test_one_sha256_helper_matches_hashlib(tmp_path):
    import hashlib

    from densehybrid.encoder.checksums import sha256_file

    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 5000)
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()
