"""The shared readers and helpers: one JSONL reader (corpora, queries), one sha256, one wait for a server process."""

import json

import pytest

from densehybrid.index.building.build import read_corpus
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.evaluate import EvalInputError, read_queries
from densehybrid.index.jsonl import read_jsonl


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


def test_json_log_lines_keep_the_request_fields():
    import logging
    import sys

    from densehybrid.service.logging import ACCESS_LOGGER, JsonFormatter

    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "%s %s %d", ("POST", "/search", 200), None)
    record.fields = {"request_id": "r-1", "route": "/search", "status": 200, "timing": {"encode_ms": 1.5}}
    line = json.loads(JsonFormatter().format(record))
    assert {k: line[k] for k in ("level", "logger", "message")} == {
        "level": "info", "logger": ACCESS_LOGGER, "message": "POST /search 200"}
    assert {k: line[k] for k in record.fields} == record.fields and "fields" not in line and "ts" in line
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "RuntimeError: boom" in json.loads(JsonFormatter().format(failed))["exception"]


def test_waiting_for_a_server_that_exits_says_so_with_its_stderr():
    import subprocess
    import sys

    from densehybrid.bench.servers.start import ServerNotReady, free_port, wait_for_process_ready

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no index here')"], stderr=subprocess.PIPE)
    with pytest.raises(ServerNotReady, match=r"exited with 1 before .*answered:\nno index here"):
        wait_for_process_ready(f"http://127.0.0.1:{free_port()}", proc, timeout_s=30)


def test_waiting_for_a_server_that_never_answers_stops_it():
    import subprocess
    import sys

    from densehybrid.bench.servers.start import ServerNotReady, free_port, wait_for_process_ready

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(ServerNotReady, match="did not answer 200 within 0.5 s"):
        wait_for_process_ready(f"http://127.0.0.1:{free_port()}", proc, timeout_s=0.5)
    assert proc.poll() is not None
