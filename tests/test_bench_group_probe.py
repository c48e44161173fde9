"""``python -m densehybrid.bench.scale.group_probe``: pqscan's codes in groups, probed until a slack rule stops or
the flat scan takes over, checked against the flat scan it is timed beside."""

import numpy as np
import pytest
from densehybrid.bench.scale import group_bounds, group_probe
from densehybrid.index.engines.pqscan_engine import PQScanConfig, PQScanStore, code_scan
from densehybrid.index.building.pqscan import build_pqscan
from densehybrid.index.engines.pqscan_shards import code_rows_of
from support.index_files import built_stdlib_index, write_queries

MARGIN = 1.0


@pytest.fixture(scope="module")
def probed():
    rng = np.random.default_rng(5)
    clusters = rng.standard_normal((16, 32))  # rows that cluster loosely, queries from anywhere
    values = (clusters[rng.integers(0, 16, 3000)] + rng.standard_normal((3000, 32))).astype(np.float32)
    xq = rng.standard_normal((12, 32)).astype(np.float32)
    codes, _ = build_pqscan(values, PQScanConfig(m=16, train_size=3000))
    flat = PQScanStore(code_scan(codes, 1), values, None, (), 50, MARGIN)
    grouped_codes = group_probe.GroupedCodes(codes, *group_bounds.grouped(values, 64))
    exact = np.argsort(-(xq @ values.T), axis=1, kind="stable")[:, :10]
    return values, xq, flat, grouped_codes, exact


def searched(probed, slack, fallback):
    values, xq, flat, grouped_codes, _ = probed
    return [group_probe.probed_search(q[None], grouped_codes, flat, values, slack, fallback, MARGIN) for q in xq]


def test_the_groups_hold_every_code_once(probed):
    values, _, _, grouped_codes, _ = probed
    assert grouped_codes.sizes.sum() == grouped_codes.rows == grouped_codes.scan.ntotal == len(values)


def test_with_no_stop_every_group_is_probed_and_the_top_10_is_the_flat_scans(probed):
    _, xq, flat, _, _ = probed
    for (rows, share, fell), q in zip(searched(probed, 1000.0, 1.0), xq):
        assert share == 1.0 and not fell
        np.testing.assert_array_equal(rows, flat.inner_product(q[None], 10)[1][0])


def test_a_tight_rule_probes_few_groups_and_loses_rows_that_a_wide_one_keeps(probed):
    _, _, _, _, exact = probed
    tight, wide = searched(probed, 0.0, 1.0), searched(probed, 3.0, 1.0)
    assert max(share for _, share, _ in tight) < 0.2 < min(share for _, share, _ in wide)
    recall = {name: np.mean([np.isin(t, rows).mean() for (rows, _, _), t in zip(runs, exact)])
              for name, runs in (("tight", tight), ("wide", wide))}
    assert recall["tight"] < recall["wide"]


def test_past_the_fallback_share_a_query_is_searched_by_the_flat_scan(probed):
    _, xq, flat, _, _ = probed
    for (rows, share, fell), q in zip(searched(probed, 1000.0, 0.05), xq):
        assert fell and share > 1.0  # the first groups probed, then the flat scan
        np.testing.assert_array_equal(rows, flat.inner_product(q[None], 10)[1][0])


def test_the_first_rows_codes_score_as_the_whole_codes_do(probed):
    values, xq, _, _, _ = probed
    codes, _ = build_pqscan(values, PQScanConfig(m=16, train_size=3000))
    first = group_probe.first_codes(codes, 500)
    assert first.ntotal == 500 and group_probe.first_codes(codes, 3000) is codes
    np.testing.assert_array_equal(code_rows_of(first), code_rows_of(codes)[:500])
    every_scores, every_rows = codes.search(xq, 3000)
    first_scores, first_rows = first.search(xq, 5)
    for scores, rows, want_scores, want_rows in zip(every_scores, every_rows, first_scores, first_rows):
        np.testing.assert_allclose(scores[rows < 500][:5], want_scores, rtol=1e-5)
    assert [group_probe.groups_for(0, n) for n in (1, 400, 827_284)] == [1, 20, 910]
    assert group_probe.groups_for(64, 827_284) == 64


def test_a_run_reports_each_size_and_slack_per_query_set_beside_flat_pqscan(tmp_path, fake_models):
    index, _ = built_stdlib_index(tmp_path, 400, options=("--ann", "pqscan"))
    write_queries(tmp_path / "q.jsonl", [f"query {i} about {t}" for i, t in enumerate(["files", "dates", "sockets"])])
    out = group_probe.run(index, [f"few={tmp_path / 'q.jsonl'}:2", f"all={tmp_path / 'q.jsonl'}"], [200, 0], 0,
                          [0.1, 10.0], 1.0, 1)
    assert out["queries"] == {"few": 2, "all": 3}
    assert [(s["rows"], s["groups"]) for s in out["sizes"]] == [(200, 14), (400, 20)]
    for size in out["sizes"]:
        assert set(size["slack"]) == {"0.1", "10"}
        assert size["slack"]["10"]["all"]["share_p50"] == 1.0 and size["slack"]["10"]["all"]["fell_back"] == 0.0
        assert set(size["p50_ms"]["all"]) == {"flat pqscan", "slack 0.1", "slack 10"}
    assert set(out["p50_exponents"]["few"]) == {"flat pqscan", "slack 0.1", "slack 10"}
    assert "| | 20 groups, slack 10 |" in group_probe.markdown(out)


def test_an_index_without_product_codes_is_refused_by_name(tmp_path, fake_models):
    index, _ = built_stdlib_index(tmp_path, 50)
    write_queries(tmp_path / "q.jsonl", ["a query"])
    with pytest.raises(SystemExit, match="a pqscan first stage is needed, this index has flat_ip"):
        group_probe.run(index, [f"q={tmp_path / 'q.jsonl'}"], [0], 4, [0.4], 0.4, 1)
