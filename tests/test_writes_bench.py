"""The write-load benchmark runs end to end and reports what it measured (no timing asserts)."""

import pytest

from densehybrid.bench.load import writes as write_load


@pytest.mark.slow
def test_write_load_reports_both_phases_and_the_ratio():
    report = write_load.run(documents=60, seconds=1.5, readers=2, write_batch=4, compact_after=5)
    for phase in ("read_only", "with_writes"):
        assert report[phase]["search_statuses"].get(200, 0) > 0
        assert set(report[phase]["search_statuses"]) == {200}  # every search answered 200
    assert report["with_writes"]["write_statuses"].get(200, 0) > 0
    assert report["p99_ratio"] == round(report["with_writes"]["search_p99_ms"] / report["read_only"]["search_p99_ms"], 2)


@pytest.mark.slow
def test_a_paced_writer_sends_at_most_its_rate():
    report = write_load.run(documents=60, seconds=1.5, readers=1, write_batch=2, compact_after=1000, write_rate=4)
    writes = report["with_writes"]["write_statuses"]
    assert 1 <= writes.get(200, 0) <= 1.5 * 4 + 1 and report["write_rate"] == 4


@pytest.mark.slow
def test_write_load_serves_an_index_of_rows_and_takes_writes_into_it(tmp_path):
    report = write_load.run(documents=0, seconds=1.5, readers=1, write_batch=4, compact_after=3, rows=300,
                            work=tmp_path)
    assert report["documents"] == 300
    assert set(report["with_writes"]["search_statuses"]) == {200}
    assert report["with_writes"]["write_statuses"].get(200, 0) > 0
