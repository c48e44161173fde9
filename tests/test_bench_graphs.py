"""``bench.peers.graphs``: our HNSW graph beside the graph libraries, on a sample of an index's rows."""

import pytest
from support.index_files import built_stdlib_index, write_queries

from densehybrid.bench.peers import graphs


@pytest.fixture
def index_and_queries(tmp_path, fake_models):
    index, texts = built_stdlib_index(tmp_path, 500)
    return index, f"near={write_queries(tmp_path / 'q.jsonl', texts[:8])}"


def test_a_walk_wider_than_the_rows_finds_the_exact_top_10_filtered_or_not(index_and_queries):
    index, queries = index_and_queries
    out = graphs.run(index, [queries], rows=300, added=40, engines=["faiss"])
    assert (out["rows"], out["added"], out["queries"]) == (300, 40, {"near": 8})
    row, = out["graphs"]
    assert row["bytes_per_row"] > 0 and row["add_s"] >= 0 and row["build_s"] >= 0
    for kept in graphs.KEPT:
        assert row[f"{kept} ef 1024"]["near"] == 1.0  # ef above the rows: every kept row is a candidate
        assert 0 <= row[f"{kept} ef 256"]["near"] <= 1 and row[f"{kept} ef 256"]["p50_ms"] > 0
    assert "| faiss (ours: M 32, sq8) |" in graphs.markdown(out)


@pytest.mark.parametrize("peer", ["hnswlib", "usearch"])
def test_a_peer_is_measured_the_same_way(index_and_queries, peer):
    index, queries = index_and_queries
    row, = graphs.run(index, [queries], rows=300, added=40, engines=[peer])["graphs"]
    assert row["none ef 1024"]["near"] >= 0.9 and row["bytes_per_row"] > 0  # usearch: not every node is reached
