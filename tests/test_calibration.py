"""The recall calibration of an approximate first stage: recall@10 against the exact top 10, the curve, the choice."""

import numpy as np
import pytest

from densehybrid.index.building import calibration
from densehybrid.index.building.calibration import Point, choose, measure, recall_at_k


def test_recall_counts_the_exact_rows_found_whatever_their_order():
    exact = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    found = np.array([[4, 3, 9, 1], [8, 7, 6, 5]])
    np.testing.assert_allclose(recall_at_k(found, exact), [0.75, 1.0])


def test_missing_rows_never_count_as_found():
    np.testing.assert_allclose(recall_at_k(np.array([[-1, -1, 2]]), np.array([[2, 3, 4]])), [1 / 3])


def test_a_search_that_sees_more_rows_as_breadth_grows_is_measured_as_such():
    rng = np.random.default_rng(0)
    rows, queries = rng.standard_normal((500, 8)), rng.standard_normal((20, 8))
    exact = np.argsort(-(queries @ rows.T), axis=1)[:, :calibration.K]

    def search(number: int, breadth: int) -> np.ndarray:  # scans the first ``breadth`` rows only
        scores = queries[number] @ rows[:breadth].T
        return np.argsort(-scores)[:calibration.K]

    points = measure(search, len(queries), exact, [50, 250, 500])
    recalls = [p.recall for p in points]
    assert recalls == sorted(recalls) and recalls[-1] == 1.0 and points[-1].exact_share == 1.0
    assert 0.05 < recalls[0] < 0.2  # a tenth of the rows holds about a tenth of each top 10
    assert all(p.p99_ms >= p.p50_ms > 0 for p in points)


def _points(*triples):
    return [Point(b, r, r, ms, ms) for b, r, ms in triples]


def test_the_narrowest_breadth_that_reaches_the_target_is_chosen():
    points = _points((16, 0.80, 0.3), (64, 0.95, 0.9), (128, 0.97, 1.6), (256, 0.99, 3.0))
    choice = choose(points, 0.95)
    assert choice.reached and choice.point.breadth == 64
    assert choose(points, 0.96).point.breadth == 128
    noisy = _points((16, 0.80, 0.3), (64, 0.95, 0.9), (128, 0.97, 0.5))  # a busy machine timed 128 faster
    assert choose(noisy, 0.95).point.breadth == 64


def test_the_target_holds_for_whole_top10s_not_only_for_the_mean_recall():
    # at 64 the mean recall is 0.97 but only 0.80 of the queries found their whole top 10
    points = [Point(32, 0.90, 0.50, 0.5, 0.5), Point(64, 0.97, 0.80, 0.9, 0.9), Point(128, 0.995, 0.96, 1.6, 1.6)]
    assert choose(points, 0.95).point.breadth == 128


def test_an_unreachable_target_gets_the_best_recall_and_says_so():
    choice = choose(_points((16, 0.80, 0.3), (64, 0.90, 0.9)), 0.99)
    assert not choice.reached and choice.point.breadth == 64 and choice.target == 0.99
