"""``python -m densehybrid.bench.scale.group_bounds`` and its stopping rules (``group_stops``): the share of the rows
a partitioned scan must probe to hold each query's exact top 10, by probing order and by stopping rule, checked
against loops over the rows."""

import numpy as np
import pytest
from densehybrid.bench.scale import group_bounds, group_stops
from support.index_files import built_stdlib_index, write_queries

K = group_stops.K


@pytest.fixture
def grouped_rows(monkeypatch):
    for module in (group_bounds, group_stops):  # statistics merged across many chunks
        monkeypatch.setattr(module, "CHUNK_ROWS", 37)
    rng = np.random.default_rng(3)
    clusters = rng.standard_normal((12, 16))  # rows that cluster loosely, queries from anywhere
    values = (clusters[rng.integers(0, 12, 600)] + rng.standard_normal((600, 16))).astype(np.float16)
    xq = rng.standard_normal((7, 16)).astype(np.float32)
    centres, assignment = group_bounds.grouped(values, 12)
    rows = values.astype(np.float32)
    top = np.argsort(-(xq @ rows.T), axis=1, kind="stable")[:, :K]
    return xq, values, rows, centres, assignment, top


def test_the_group_statistics_match_a_loop_over_each_groups_rows(grouped_rows):
    xq, values, rows, centres, assignment, _ = grouped_rows
    stats = group_bounds.group_statistics(xq, values, centres, assignment)
    for g in range(len(centres)):
        members = rows[assignment == g]
        assert stats["count"][g] == len(members)
        np.testing.assert_allclose(stats["radius"][g], np.linalg.norm(members - centres[g], axis=1).max(), rtol=1e-5)
        scores = xq @ members.T
        np.testing.assert_allclose(stats["mean"][:, g], scores.mean(1), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(stats["sd"][:, g], scores.std(1), rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(stats["max"][:, g], scores.max(1), rtol=1e-5, atol=1e-5)


def test_each_groups_top_scores_are_its_best_rows_in_order(grouped_rows):
    xq, values, rows, centres, assignment, _ = grouped_rows
    tops = group_stops.group_tops(xq, values, assignment, len(centres), queries_at_once=3)
    for g in range(len(centres)):
        best = -np.sort(-(xq @ rows[assignment == g].T), axis=1)[:, :K]
        np.testing.assert_allclose(tops[:, g, :best.shape[1]], best, rtol=1e-5, atol=1e-5)
        assert np.all(np.isneginf(tops[:, g, best.shape[1]:]))


def test_arrivals_are_the_rows_probed_when_each_top_rows_group_is_done(grouped_rows):
    xq, values, _, centres, assignment, top = grouped_rows
    count = np.bincount(assignment, minlength=len(centres))
    score = xq @ centres.T
    arrivals = group_bounds.arrival_shares(score, count, assignment, top)
    for q in range(len(xq)):
        probed, done = 0, {}
        for g in sorted(range(len(centres)), key=lambda g: -score[q, g]):
            probed += count[g]
            done[g] = probed / len(values)
        np.testing.assert_allclose(arrivals[q], [done[assignment[row]] for row in top[q]])


def test_no_order_holds_the_whole_top_10_sooner_than_the_groups_own_best_scores(grouped_rows):
    xq, values, _, centres, assignment, top = grouped_rows
    stats = group_bounds.group_statistics(xq, values, centres, assignment)
    rules = group_bounds.rule_scores(xq, centres, stats, [0.5, 1.0])
    whole = {name: group_bounds.arrival_shares(score, stats["count"], assignment, top).max(1)
             for name, score in rules.items()}
    least = whole.pop("group max (oracle)")
    for name, share in whole.items():
        assert np.all(least <= share + 1e-12), name
    assert np.all(least < 1.0)  # the top 10 of 600 rows in 12 groups are not in every group


def test_one_group_is_the_whole_scan():
    xq = np.eye(4, dtype=np.float32)
    assignment = np.zeros(50, np.int64)
    top = np.tile(np.arange(K), (4, 1))
    arrivals = group_bounds.arrival_shares(np.zeros((4, 1)), np.array([50]), assignment, top)
    np.testing.assert_array_equal(arrivals, np.ones((4, K)))


def test_a_stopping_rule_is_what_a_search_probing_group_by_group_would_do(grouped_rows):
    xq, values, rows, centres, assignment, top = grouped_rows
    count = np.bincount(assignment, minlength=len(centres))
    tops = group_stops.group_tops(xq, values, assignment, len(centres))
    sets = {"a": xq[:4], "b": xq[4:]}
    out = group_stops.stopping_rules(xq, centres, count, assignment, top, tops, [1, 2, 1000], [1.5, 2.0, 1000.0],
                                      sets)
    for name in ("patience 1000", "slack 1000"):  # never stops early: every group probed
        assert out[name] == {s: {"recall_at_10": 1.0, "share_p50": 1.0, "share_p90": 1.0} for s in sets}

    def searched(q, patience=None, slack=None):
        """The loop a search runs: probe by centre score, keep the best K rows, stop by the rule."""
        found, since_rise, probed = [], 0, 0  # (score, row) of every row probed
        for g in sorted(range(len(centres)), key=lambda g: -(xq[q] @ centres[g])):
            kth = sorted(found, reverse=True)[K - 1][0] if len(found) >= K else -np.inf
            if slack is not None and found and xq[q] @ centres[g] + slack * np.linalg.norm(xq[q]) < kth:
                break
            members = np.flatnonzero(assignment == g)
            scores = xq[q] @ rows[members].T
            rose = bool(np.any(scores > kth))
            found += list(zip(scores, members))
            probed += len(members)
            since_rise = 0 if rose else since_rise + 1
            if patience is not None and since_rise == patience:
                break
        best_rows = [row for _, row in sorted(found, reverse=True)[:K]]
        return probed / len(values), np.isin(top[q], best_rows).mean()

    for name, rule in (("patience 1", {"patience": 1}), ("patience 2", {"patience": 2}), ("slack 1.5", {"slack": 1.5}),
                       ("slack 2", {"slack": 2.0})):
        shares, recalls = zip(*(searched(q, **rule) for q in range(len(xq))))
        assert 0 < min(shares) and min(recalls) < 1  # rules that stop early, and lose rows by it
        assert out[name]["a"]["share_p50"] == pytest.approx(np.median(shares[:4]), abs=1e-4)
        assert out[name]["b"]["share_p90"] == pytest.approx(np.percentile(shares[4:], 90), abs=1e-4)
        assert out[name]["a"]["recall_at_10"] == pytest.approx(np.mean(recalls[:4]), abs=1e-4)
        assert out[name]["b"]["recall_at_10"] == pytest.approx(np.mean(recalls[4:]), abs=1e-4)


def test_a_run_over_a_built_index_reports_every_rule_per_query_set(tmp_path, fake_models):
    index, _ = built_stdlib_index(tmp_path, 300)
    write_queries(tmp_path / "q.jsonl", [f"query {i} about {t}" for i, t in enumerate(["files", "dates", "sockets"])])
    out = group_bounds.run(index, [f"few={tmp_path / 'q.jsonl'}:2", f"all={tmp_path / 'q.jsonl'}"], [1, 8],
                           [1.0], [2], [0.1, 1000.0], target=0.95)
    assert out["rows"] == 300 and out["queries"] == {"few": 2, "all": 3}
    one, eight = out["groupings"]
    for per_set in one["rules"].values():  # a single group is the whole scan whatever the order
        assert per_set["all"] == {"whole_top10_p50": 1.0, "whole_top10_p90": 1.0, "share_for_mean_recall_0.95": 1.0}
    assert set(eight["rules"]) == {"centre", "centre + 1·|q|·radius", "mean + 3 sd (oracle)", "group max (oracle)"}
    assert set(eight["stopped"]) == {"patience 2", "slack 0.1", "slack 1000"}
    assert eight["calibrated"]["slack"] in (0.1, 1000.0)
    assert set(eight["calibrated"]["calibration"]["slack 0.1"]) == {"in_domain", "other_domain"}
    assert "| 8 | group max (oracle) |" in group_bounds.markdown(out)
    assert "8 groups, calibrated to 0.95: slack" in group_bounds.markdown(out)
    with pytest.raises(SystemExit, match="301 groups asked of 300 rows"):
        group_bounds.run(index, [f"q={tmp_path / 'q.jsonl'}"], [301], [1.0], [2], [0.1])


def test_a_querys_own_row_is_left_out_of_its_groups_best_scores(grouped_rows):
    xq, values, rows, centres, assignment, _ = grouped_rows
    own = np.array([5, -1, 17, -1, -1, -1, 599])
    tops = group_stops.group_tops(xq, values, assignment, len(centres), own_rows=own)
    for q, row in enumerate(own):
        g = assignment[row] if row >= 0 else assignment[0]
        members = np.flatnonzero(assignment == g)
        members = members[members != row]
        best = -np.sort(-(xq[q] @ rows[members].T))[:K]
        np.testing.assert_allclose(tops[q, g, :len(best)], best, rtol=1e-5, atol=1e-5)


def test_the_calibrated_slack_is_the_least_at_which_every_calibration_group_reaches_the_target(grouped_rows):
    from densehybrid.index.building.calibration_queries import CalibrationQueries, Group

    xq, values, _, centres, assignment, _ = grouped_rows
    count = np.bincount(assignment, minlength=len(centres))
    queries = CalibrationQueries((Group("in_domain", values[[3, 40, 90]].astype(np.float32), np.array([3, 40, 90]), ""),
                                  Group("other_domain", xq, np.full(len(xq), -1), "")))
    slacks = [0.5, 1.0, 1.5, 2.0, 3.0, 1000.0]
    chosen = group_stops.calibrated_slack(queries, values, centres, count, assignment, slacks, 0.9)
    reached = [s for s in slacks if min(g["recall_at_10"] for g in chosen["calibration"][f"slack {s:g}"].values()) >= 0.9]
    assert chosen["slack"] == reached[0] and chosen["slack"] < 1000.0
    assert set(chosen["calibration"][f"slack {reached[0]:g}"]) == {"in_domain", "other_domain"}
    assert group_stops.calibrated_slack(queries, values, centres, count, assignment, [0.0], 1.0)["slack"] is None
