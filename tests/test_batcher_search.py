"""Concurrent searches share Faiss calls (service.search_batcher) and get what they would get alone."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.params import SearchParams
from densehybrid.service.search_batcher import SearchBatcher
from densehybrid.bench.servers.toy_index import TOPICS

from support.fake_encoder import FakeEncoder


class SlowSearcher:
    """The real searcher, slowed down so that requests pile up behind a running search; counts calls."""

    def __init__(self, searcher, fail_k=None):
        self.searcher, self.fail_k, self.calls = searcher, fail_k, []

    @property
    def name(self):
        return self.searcher.name

    def search(self, queries, params):
        self.calls.append((len(queries), params.k))
        time.sleep(0.05)
        if params.k == self.fail_k:
            raise RuntimeError("injected search failure")
        return self.searcher.search(queries, params)


@pytest.fixture(scope="module")
def searcher(toy_index):
    return Searcher(load_index(toy_index("dhr", count=60)))


async def search(batcher, queries, params):
    return await asyncio.wrap_future(batcher.submit(queries, params))


def run_concurrently(batcher, requests):
    async def main():
        return await asyncio.gather(*(search(batcher, q, p) for q, p in requests), return_exceptions=True)

    return asyncio.run(main())


def test_concurrent_searches_share_calls_and_match_single_searches(searcher):
    encoder = FakeEncoder("dhr")
    queries = [f"{a} {b}" for a in TOPICS for b in TOPICS[:2]][:16]
    params = [SearchParams(k=5, first_stage="ip", candidates=20, theta=0.1, rerank=True),
              SearchParams(k=3, first_stage="approx_gip", candidates=30, theta=0.2, rerank=True, lam=2.0)]
    requests = [(encoder.encode([q], "query"), params[i % 2]) for i, q in enumerate(queries)]
    slow, groups = SlowSearcher(searcher), []
    with ThreadPoolExecutor(1) as pool:
        on_group = lambda first_stage, queries, search_s, rerank_s: groups.append(queries)  # noqa: E731
        outcomes = run_concurrently(SearchBatcher(slow, pool, on_group), requests)
    assert len(slow.calls) < len(requests) and sum(n for n, _ in slow.calls) == len(requests)
    assert groups == [n for n, _ in slow.calls]
    assert {k for _, k in slow.calls} == {5, 3}  # groups never mix parameters
    for (q, p), outcome in zip(requests, outcomes):
        alone = searcher.search(q, SearchParams(k=p.k, first_stage=p.first_stage, candidates=p.candidates,
                                                theta=p.theta, rerank=p.rerank, lam=p.lam))
        assert outcome.ids == alone.ids
        np.testing.assert_allclose(outcome.scores, alone.scores, rtol=1e-5, atol=1e-5)
        assert outcome.group_queries >= 1 and outcome.search_ms >= 0


def test_a_failing_group_fails_only_its_requests(searcher):
    encoder = FakeEncoder("dhr")
    good, bad = SearchParams(k=4, candidates=10), SearchParams(k=3, candidates=10)
    requests = [(encoder.encode([t], "query"), good if i % 2 else bad) for i, t in enumerate(TOPICS)]
    with ThreadPoolExecutor(1) as pool:
        outcomes = run_concurrently(SearchBatcher(SlowSearcher(searcher, fail_k=3), pool), requests)
        after = asyncio.run(search(SearchBatcher(searcher, pool), requests[1][0], good))
    for (_, p), outcome in zip(requests, outcomes):
        if p is bad:
            assert isinstance(outcome, RuntimeError)
        else:
            assert len(outcome.ids[0]) == 4
    assert len(after.ids[0]) == 4


def test_a_search_queued_after_the_search_threads_stopped_fails_at_once():
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    batcher = SearchBatcher(object(), pool)
    queries = FakeEncoder("cls").encode(["late query"], "query")
    late = batcher.submit(queries, SearchParams(k=3, first_stage="ip", candidates=10, theta=0.1, rerank=True))
    with pytest.raises(RuntimeError, match="shutdown"):
        late.result(timeout=0)


def test_one_encode_batch_handed_on_searches_as_one_group(searcher):
    """The encoder worker hands a whole batch on under the search batcher's hold: one search, not one per
    query racing the worker (a search thread started by the first query would find only it queued)."""
    from densehybrid.service.batcher import Batcher

    encoder = FakeEncoder("dhr")
    params = SearchParams(k=5, first_stage="ip", candidates=20, theta=0.1, rerank=True)
    groups = []
    with ThreadPoolExecutor(2) as pool:
        search_batcher = SearchBatcher(searcher, pool, lambda first_stage, queries, s, r: groups.append(queries))
        batcher = Batcher(encoder, max_batch_size=8, max_wait_s=0.5, hand_on=search_batcher.held)

        def then(outcome, future):
            search_batcher.submit(outcome.encoded, params, future=future)

        batcher.start()
        try:
            futures = [batcher.submit(encoder.tokenize([f"{t} query"], "query"), "query", then=then)
                       for t in TOPICS[:8]]
            outcomes = [f.result(timeout=30) for f in futures]
        finally:
            batcher.stop()
    assert groups == [8]
    for topic, outcome in zip(TOPICS[:8], outcomes):
        alone = searcher.search(encoder.encode([f"{topic} query"], "query"), SearchParams(k=5, candidates=20))
        assert outcome.ids == alone.ids
