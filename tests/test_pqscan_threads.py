"""One query's code scan spread over row shards: the same answers for any number of threads, and no spreading
when other searches keep the cores busy."""

import threading

import faiss
import httpx
import numpy as np
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.building.pqscan import build_pqscan
from densehybrid.index.engines.pqscan_engine import PQScanConfig, PQScanStore, fast_scan
from densehybrid.index.engines import pqscan_shards
from densehybrid.index.engines.pqscan_shards import ShardedScan, default_scan_threads, shard_bounds, split_codes
from densehybrid.index.search.filters import Selection
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from support.fake_encoder import FakeEncoder
from test_hnsw import clustered
from test_live_recall import _corpus

N, DIM = 6000, 32


@pytest.fixture(scope="module")
def xb():
    rows = clustered(N, DIM, seed=40, unit=True)
    rows[N // 2:N // 2 + 40] = rows[:40]  # the same rows twice, in two shards: ties in exact and code scores
    return rows.astype(np.float16)


@pytest.fixture(scope="module")
def codes(xb):
    return build_pqscan(xb, PQScanConfig(train_size=N))[0]


@pytest.fixture(scope="module")
def xq():
    far = np.random.default_rng(42).standard_normal((10, DIM)).astype(np.float32)  # unlike the rows: flatter scores
    return np.concatenate([clustered(20, DIM, seed=41, unit=True), far / np.linalg.norm(far, axis=1, keepdims=True)])


def all_code_scores(codes, xq) -> np.ndarray:
    """(Q, N) every row's code score, by an unsharded scan of every row (independent of the shards' merge)."""
    scores, rows = fast_scan(codes).search(xq, codes.ntotal)
    out = np.full((len(xq), codes.ntotal), np.nan, np.float32)
    np.put_along_axis(out, rows, scores, 1)
    return out


def test_the_shards_are_contiguous_and_cover_every_row():
    for count, shards in [(10, 3), (7, 7), (3, 5), (1000, 4)]:
        bounds = shard_bounds(count, shards)
        assert bounds[0][0] == 0 and bounds[-1][1] == count and len(bounds) == min(count, shards)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1


def test_by_default_a_scan_spreads_over_the_cores_but_not_into_shards_too_small_to_pay(monkeypatch):
    monkeypatch.setattr(pqscan_shards, "available_cores", lambda: 8)
    assert default_scan_threads() == 4  # no size known: the cores, at most 4
    assert default_scan_threads(199_999) == 1  # shards of under 100k rows do not pay
    assert default_scan_threads(200_000) == 2
    assert default_scan_threads(8_800_000) == 4
    monkeypatch.setattr(pqscan_shards, "available_cores", lambda: 1)
    assert default_scan_threads(8_800_000) == 1


@pytest.mark.parametrize("shards", [1, 2, 3, 5])
@pytest.mark.parametrize("k", [1, 37, 500])
def test_a_sharded_top_list_is_every_row_above_the_cut_by_a_full_scan(codes, xq, shards, k):
    everything = all_code_scores(codes, xq)
    scan = ShardedScan(split_codes(codes, shards), cores=64)
    scores, rows = scan.search(xq, k)
    for q in range(len(xq)):
        want = np.sort(everything[q])[::-1]
        np.testing.assert_array_equal(scores[q], want[:k])  # the k best code scores, bit for bit
        tied_at_cut = want[k] == want[k - 1]
        want_rows = np.flatnonzero(everything[q] > want[k - 1] if tied_at_cut else everything[q] >= want[k - 1])
        assert sorted(rows[q][rows[q] >= 0].tolist()) == want_rows.tolist()  # a run tied at the cut: none of it


def selection(mask: np.ndarray) -> Selection:
    return Selection(int(mask.sum()), len(mask), mask=mask)


@pytest.mark.parametrize("shards", [2, 3, 4])
@pytest.mark.parametrize("margin, rescore", [(0.0, 30), (0.0, 7), (0.05, 50), (0.2, 20)])
def test_answers_are_the_same_for_any_number_of_threads(codes, xb, xq, shards, margin, rescore, monkeypatch):
    monkeypatch.setattr("densehybrid.index.engines.hnsw_engine.EXACT_KEPT_ROWS", 100)  # filters take the scan
    mask = np.random.default_rng(43).random(N) < 0.4
    one = PQScanStore(ShardedScan(split_codes(codes, 1)), xb, None, (), rescore, margin)
    many = PQScanStore(ShardedScan(split_codes(codes, shards), cores=64), xb, None, (), rescore, margin)
    assert many.scan_threads == shards and one.scan_threads == 1
    for chosen in (None, selection(mask)):
        for q in xq:  # one query at a time: the spread path
            want_scores, want_rows = one.inner_product(q[None], 10, chosen)
            got_scores, got_rows = many.inner_product(q[None], 10, chosen)
            np.testing.assert_array_equal(got_rows, want_rows)
            np.testing.assert_array_equal(got_scores, want_scores)
        np.testing.assert_array_equal(many.inner_product(xq, 10, chosen)[1], one.inner_product(xq, 10, chosen)[1])


def test_code_rows_map_every_shard_s_codes_to_their_rows(codes, xb, xq):
    order = np.random.default_rng(44).permutation(N)  # code i is row order[i], as while rows are held out
    held = faiss.IndexPQ(DIM, codes.pq.M, codes.pq.nbits, faiss.METRIC_INNER_PRODUCT)
    held.pq, held.is_trained = codes.pq, True
    held.add_sa_codes(faiss.vector_to_array(codes.codes).reshape(N, -1)[order])
    mask = np.random.default_rng(45).random(N) < 0.5
    plain = PQScanStore(ShardedScan(split_codes(codes, 1)), xb, None, (), 40, 0.1)
    for shards in (1, 3):
        mapped = PQScanStore(ShardedScan(split_codes(held, shards), cores=64), xb, None, (), 40, 0.1, code_rows=order)
        for chosen in (None, selection(mask)):
            np.testing.assert_array_equal(mapped.inner_product(xq, 10, chosen)[1], plain.inner_product(xq, 10, chosen)[1])


def recorded(scan: ShardedScan, hold: threading.Event | None = None, started: threading.Event | None = None) -> list:
    """(list number or "all", thread name) of each scan ``scan`` makes from now on; with ``hold``, the first scan
    of list 0 (or of every list) waits for it, after setting ``started``."""
    seen, scan_list, scan_all = [], scan._scan_list, scan._scan_all

    def wait_once():
        if started is not None and not started.is_set():
            started.set()
            hold.wait(10)

    def one(number, *args):
        seen.append((number, threading.current_thread().name))
        if number == 0:
            wait_once()
        return scan_list(number, *args)

    def every(*args):
        seen.append(("all", threading.current_thread().name))
        wait_once()
        return scan_all(*args)

    scan._scan_list, scan._scan_all = one, every
    return seen


def test_a_lone_query_spreads_and_a_batch_or_a_busy_scan_does_not(codes, xq):
    me = threading.current_thread().name
    scan = ShardedScan(split_codes(codes, 2), cores=2)
    seen = recorded(scan)
    scan.search(xq[:1], 10)
    assert len(seen) == 2 and (0, me) in seen  # the caller scans a list too, the pool the other
    assert [name for number, name in seen if number == 1][0].startswith("densehybrid-scan")
    seen.clear()
    scan.search(xq[:5], 10)
    assert seen == [("all", me)]  # Faiss shares a batch out itself
    lone = ShardedScan(split_codes(codes, 2), cores=1)
    seen = recorded(lone)
    lone.search(xq[:1], 10)
    assert seen == [("all", me)]  # no idle core to spread to


def test_a_query_arriving_while_another_is_in_flight_scans_every_list_in_one_search(codes, xq):
    hold, started = threading.Event(), threading.Event()
    scan = ShardedScan(split_codes(codes, 2), cores=2)  # room for one spread query
    seen = recorded(scan, hold, started)
    busy = threading.Thread(target=scan.search, args=(xq[:1], 10), name="first-search")
    busy.start()
    assert started.wait(10)
    want = scan.search(xq[1:2], 10)  # in flight beside the first
    hold.set()
    busy.join(10)
    assert ("all", threading.current_thread().name) in seen and (0, "first-search") in seen
    assert scan._in_flight == 0
    np.testing.assert_array_equal(scan.search(xq[1:2], 10)[0], want[0])  # alone now: spread, the same scores


@pytest.fixture(scope="module")
def pqscan_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan-threads")
    return build_index(FakeEncoder("cls"), _corpus(root / "corpus.jsonl"), root / "pqscan",
                       BuildOptions(progress=False, ann=PQScanConfig(train_size=2000), target_recall=None))


@pytest.mark.parametrize("threads, shown", [(2, 2), (0, None)])
def test_info_shows_the_scan_threads_and_answers_do_not_change(pqscan_index, threads, shown):
    settings = ServiceSettings(index=pqscan_index, max_wait_ms=1, writes=False, recall_sample_rate=0,
                               scan_threads=threads)
    with LiveServer(create_app(settings, encoder=FakeEncoder("cls"), index=load_index(pqscan_index))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as client:
        first_stage = client.get("/info").json()["index"]["first_stage"]
        assert first_stage["scan_threads"] == (shown or 1)  # by default a small index's scan is not spread
        answer = client.post("/search", json={"query": "w1 w2 w3", "k": 5}).json()
        assert "scan_threads" not in answer["index"]["first_stage"] and len(answer["results"]) == 5
