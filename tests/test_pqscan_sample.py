"""A lone query's candidates by one range search, its radius placed by a sample of the codes: every row above the
radius, and the same candidates (so the same answers) as the top-list scan, for any number of threads."""

import faiss
import numpy as np
import pytest

from densehybrid.encoder.base import Encoded
from densehybrid.index.engines import pqscan_sample
from densehybrid.index.engines.pqscan_engine import PQScanConfig, PQScanStore, code_scan
from densehybrid.index.engines.pqscan_sample import CodeSample
from densehybrid.index.engines.pqscan_shards import ShardedScan, split_codes
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from test_hnsw import clustered, make_index
from test_pqscan_threads import N, all_code_scores, codes, selection, xb, xq  # noqa: F401 (fixtures)


def taken(store: PQScanStore) -> list:
    """What each lone query's range search answered from now on (None: it left the query to the top-list scan)."""
    answers, candidates_above = [], store._candidates_above

    def spy(*args):
        answers.append(candidates_above(*args))
        return answers[-1]

    store._candidates_above = spy
    return answers


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_above_returns_every_code_score_above_the_radius_and_no_other(codes, xq, shards):
    everything = all_code_scores(codes, xq)
    scan = ShardedScan(split_codes(codes, shards), cores=64)
    for q in range(len(xq)):
        distinct = np.unique(everything[q])[::-1]
        for position in (0, 9, 100, len(distinct) // 2):  # midway between two scores: clear of rounding
            radius = float(distinct[position] + distinct[position + 1]) / 2
            scores, ids = scan.above(xq[q:q + 1], radius)
            want = np.flatnonzero(everything[q] > radius)
            assert sorted(ids.tolist()) == want.tolist()
            np.testing.assert_array_equal(scores[np.argsort(ids)], everything[q][want])


def test_the_sample_is_one_row_in_stride_drawn_at_random_and_its_radius_is_its_rank_th_best(codes, xq):
    sample = CodeSample(codes, stride=8)
    rows = sample_rows(sample)
    assert sample.rows == len(rows) == -(-N // 8) and len(set(rows.tolist())) == len(rows)
    assert not np.array_equal(rows, np.arange(0, N, 8))  # not every 8th row
    np.testing.assert_array_equal(sample_rows(CodeSample(codes, stride=8)), rows)  # the same draw each time
    everything = all_code_scores(codes, xq)
    for q in range(len(xq)):
        radius = sample.radius(xq[q:q + 1], 10, 0.0)
        in_sample = np.sort(everything[q][rows])[::-1]
        assert radius == in_sample[sample.rank(10) - 1]  # the sample's rank-th best, no margin given
        assert radius <= np.sort(everything[q])[::-1][sample.rank(10) - 1]  # at most the whole's rank-th best
    assert sample.radius(xq[:1], 10, 0.25) == pytest.approx(sample.radius(xq[:1], 10, 0.0) - 0.25)


def sample_rows(sample: CodeSample) -> np.ndarray:
    """The rows a sample holds, as its scan returns them (every row of a sample as small as the tests')."""
    _, ids = sample.scan.search(np.ones((1, sample.scan.d), np.float32), sample.rows,
                                params=faiss.SearchParametersIVF(nprobe=1))
    return np.sort(ids[0])


def test_the_rank_grows_with_the_depth_past_its_expected_count_in_the_sample():
    sample = CodeSample.__new__(CodeSample)
    sample.stride = 32
    ranks = [sample.rank(depth) for depth in (1, 10, 100, 1000)]
    assert ranks == sorted(ranks) and ranks[0] >= 2
    assert all(rank > depth / 32 for rank, depth in zip(ranks, (1, 10, 100, 1000)))


def test_a_sample_too_small_or_expecting_too_many_rows_leaves_the_query_to_the_top_list(codes, xq, monkeypatch):
    sample = CodeSample(codes, stride=N)  # one row
    assert sample.radius(xq[:1], 10, 0.1) is None
    sample = CodeSample(codes, stride=8)
    assert sample.radius(xq[:1], 10, 0.1) is not None
    monkeypatch.setattr(pqscan_sample, "MAX_ABOVE", 8)  # one sample row above the radius is too many
    assert sample.radius(xq[:1], 10, 0.1) is None


@pytest.mark.parametrize("shards", [1, 2, 3])
@pytest.mark.parametrize("margin, rescore, depth", [(0.05, 50, 10), (0.2, 20, 10), (0.1, 40, 40), (0.05, 7, 3)])
def test_the_range_search_finds_the_top_list_s_candidates(codes, xb, xq, shards, margin, rescore, depth):
    top_list = PQScanStore(ShardedScan(split_codes(codes, 1)), xb, None, (), rescore, margin)
    ranged = PQScanStore(code_scan(codes, shards, cores=64), xb, None, (), rescore, margin)
    answers = taken(ranged)
    for q in xq:
        width = margin * np.linalg.norm(q[None], axis=1)
        want = top_list._candidates(q[None], depth, max(rescore, depth), width, 2000, None)[0]
        got = ranged._candidates(q[None], depth, max(rescore, depth), width, 2000, None)[0]
        assert sorted(got[got >= 0].tolist()) == sorted(want[want >= 0].tolist())
        np.testing.assert_array_equal(ranged.inner_product(q[None], depth)[1], top_list.inner_product(q[None], depth)[1])
    if max(rescore, depth) > depth:  # the range search did the work
        assert len(answers) == 2 * len(xq) and sum(answer is not None for answer in answers) >= len(answers) * 0.8
    else:  # no more best codes than the depth: the top list
        assert answers == []


def test_a_radius_above_the_floor_falls_back_to_the_top_list_with_the_same_answers(codes, xb, xq, monkeypatch):
    top_list = PQScanStore(ShardedScan(split_codes(codes, 1)), xb, None, (), 50, 0.1)
    ranged = PQScanStore(code_scan(codes, 2, cores=64), xb, None, (), 50, 0.1)
    answers = taken(ranged)
    everything = all_code_scores(codes, xq)
    for q in range(len(xq)):
        for rank in (3, 30):  # a radius at the 3rd best code score leaves out the rest of the best 50
            radius = float(np.sort(everything[q])[::-1][rank])
            monkeypatch.setattr(ranged.scan.sample, "radius", lambda *_: radius)
            np.testing.assert_array_equal(ranged.inner_product(xq[q:q + 1], 10)[1],
                                          top_list.inner_product(xq[q:q + 1], 10)[1])
    assert answers and all(answer is None for answer in answers)


def test_filtered_batched_and_marginless_searches_keep_the_top_list(codes, xb, xq):
    ranged = PQScanStore(code_scan(codes, 2, cores=64), xb, None, (), 50, 0.1)
    answers = taken(ranged)
    mask = np.random.default_rng(46).random(N) < 0.3
    ranged.inner_product(xq[:1], 10, selection(mask))
    ranged.inner_product(xq[:4], 10)
    ranged.inner_product(xq[:1], 10, margin=0.0)
    assert answers == []
    ranged.inner_product(xq[:1], 10)
    assert len(answers) == 1 and answers[0] is not None


def test_a_served_top_10_takes_the_range_search_and_answers_as_the_top_list(tmp_path):
    index = make_index(tmp_path, n=3000, ann=PQScanConfig(rescore=50, margin=0.1, train_size=3000))
    searcher = Searcher(index)
    answers = taken(searcher.store)
    queries = clustered(12, 16, seed=9)
    got = [searcher.search(Encoded(q[None], None), SearchParams(k=10)).rows for q in queries]  # one at a time
    assert len(answers) == len(queries) and sum(answer is not None for answer in answers) >= 10
    searcher.store.scan.sample = None  # every query a top list
    assert [searcher.search(Encoded(q[None], None), SearchParams(k=10)).rows for q in queries] == got
