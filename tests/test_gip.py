"""densehybrid.index.search.gip against independent numpy brute force on seeded random data."""

import numpy as np
import pytest

from densehybrid.index.search import gip


def random_rows(n, dim, gated, *, seed, gate_values=3, dtype=np.float16):
    """Values in [0, 2) (dense part signed) and gates from a small alphabet so that gates often agree."""
    rng = np.random.default_rng(seed)
    values = rng.random((n, dim), dtype=np.float32) * 2
    values[:, gated:] -= 1.0
    values[rng.random((n, dim)) < 0.3] = 0.0  # sparse lexical dims, like a DLR
    gates = rng.integers(0, gate_values, (n, gated), dtype=np.uint8) if gated else None
    return values.astype(dtype), gates


def numpy_gip(xq, gq, values, gates):
    """float64 reference: sum_j q_j p_j [gate match] over gated dims + open inner product."""
    q, p = xq.astype(np.float64), values.astype(np.float64)
    gated = 0 if gates is None else gates.shape[1]
    out = q[:, gated:] @ p[:, gated:].T
    if gated:
        match = gq[:, None, :] == gates[None, :, :]
        out += np.einsum("qj,nj,qnj->qn", q[:, :gated], p[:, :gated], match)
    return out


def numpy_topk(scores, k):
    """Score descending, row ascending on ties."""
    order = np.lexsort((np.broadcast_to(np.arange(scores.shape[1]), scores.shape), -scores), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, 1), order


@pytest.mark.parametrize("gated", [0, 24, 32])
def test_exhaustive_equals_numpy(gated):
    values, gates = random_rows(300, 32 + 8 * (gated > 0) if gated else 40, gated, seed=1)
    xq, gq = random_rows(7, values.shape[1], gated, seed=2, dtype=np.float32)
    got = gip.exhaustive(xq, gq, values, gates)
    np.testing.assert_allclose(got, numpy_gip(xq, gq, values, gates), rtol=1e-5, atol=1e-5)


def test_gates_matter():
    values, gates = random_rows(50, 16, 16, seed=3)
    xq, gq = random_rows(4, 16, 16, seed=4, dtype=np.float32)
    plain = xq.astype(np.float64) @ values.astype(np.float64).T
    assert not np.allclose(gip.exhaustive(xq, gq, values, gates), plain, atol=1e-3)


def test_scale_queries_scales_only_open_dims():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = gip.scale_queries(x, 4, 3.0)
    np.testing.assert_array_equal(out[:, :4], x[:, :4])
    np.testing.assert_array_equal(out[:, 4:], 3 * x[:, 4:])
    assert out is not x and x[0, 5] == 5  # input untouched


def test_rerank_of_every_row_equals_exhaustive_topk():
    values, gates = random_rows(400, 40, 32, seed=5)
    xq, gq = random_rows(5, 40, 32, seed=6, dtype=np.float32)
    # candidates in a scrambled order, as a first stage would return them
    rows = np.stack([np.random.default_rng(i).permutation(400) for i in range(5)])
    scores, got_rows = gip.rerank(xq, gq, values, gates, rows, 400)
    want_scores, want_rows = numpy_topk(gip.exhaustive(xq, gq, values, gates), 400)
    np.testing.assert_array_equal(got_rows, want_rows)
    np.testing.assert_array_equal(scores, want_scores)
    np.testing.assert_allclose(scores, numpy_topk(numpy_gip(xq, gq, values, gates), 400)[0], rtol=1e-5, atol=1e-5)


def test_rerank_ties_ordered_by_row_whatever_the_candidate_order():
    values, gates = random_rows(10, 8, 6, seed=7)
    values[[2, 5, 8]] = values[0]  # four identical rows -> exactly tied scores
    gates[[2, 5, 8]] = gates[0]
    xq, gq = values[:1].astype(np.float32), gates[:1]
    results = []
    for seed in range(5):
        rows = np.random.default_rng(seed).permutation(10)[None, :]
        results.append(gip.rerank(xq, gq, values, gates, rows, 10)[1])
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    tied = [row for row in results[0][0] if row in (0, 2, 5, 8)]
    assert tied == [0, 2, 5, 8]


def test_rerank_drops_padding_rows():
    values, gates = random_rows(5, 8, 4, seed=8)
    xq, gq = random_rows(1, 8, 4, seed=9, dtype=np.float32)
    scores, rows = gip.rerank(xq, gq, values, gates, np.array([[3, 1, -1, -1]]), 4)
    assert rows[0, :2].tolist() == sorted([3, 1], key=lambda r: -numpy_gip(xq, gq, values, gates)[0, r])
    assert (rows[0, 2:] == -1).all() and np.isneginf(scores[0, 2:]).all()


def test_approx_with_theta_below_every_value_equals_exhaustive():
    values, gates = random_rows(700, 48, 32, seed=10)
    xq, gq = random_rows(3, 48, 32, seed=11, dtype=np.float32)
    scores, rows = gip.approx_topk(xq, gq, values, gates, theta=-1e9, k=50)
    want_scores, want_rows = numpy_topk(numpy_gip(xq, gq, values, gates), 50)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rows, want_rows)


def test_approx_uses_only_query_dims_above_theta_plus_open_dims(monkeypatch):
    monkeypatch.setattr(gip, "_ROWS_PER_SCAN_CHUNK", 64)  # several chunks, so the running top-k merge is exercised
    values, gates = random_rows(300, 40, 32, seed=12)
    xq, gq = random_rows(4, 40, 32, seed=13, dtype=np.float32)
    theta = 1.0
    pruned = xq.copy()
    pruned[:, :32][pruned[:, :32] <= theta] = 0.0
    want_scores, want_rows = numpy_topk(numpy_gip(pruned, gq, values, gates), 20)
    scores, rows = gip.approx_topk(xq, gq, values, gates, theta=theta, k=20)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rows, want_rows)


def test_approx_without_gates_is_inner_product():
    values, _ = random_rows(200, 16, 0, seed=14)
    xq, _ = random_rows(2, 16, 0, seed=15, dtype=np.float32)
    scores, rows = gip.approx_topk(xq, None, values, None, theta=0.5, k=10)
    want_scores, want_rows = numpy_topk(xq.astype(np.float64) @ values.astype(np.float64).T, 10)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def test_score_rows_chunks_large_batches(monkeypatch):
    monkeypatch.setattr(gip, "_MAX_GATHER_ELEMENTS", 100)  # forces one query per step
    values, gates = random_rows(60, 12, 8, seed=16)
    xq, gq = random_rows(6, 12, 8, seed=17, dtype=np.float32)
    rows = np.stack([np.random.default_rng(i).choice(60, 9, replace=False) for i in range(6)])
    got = gip.score_rows(xq, gq, values, gates, rows)
    np.testing.assert_allclose(got, np.take_along_axis(numpy_gip(xq, gq, values, gates), rows, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q", [1, 3])
def test_sparse_queries_skip_zero_dims_exactly(q):
    values, gates = random_rows(80, 40, 32, seed=18)
    xq, gq = random_rows(q, 40, 32, seed=19, dtype=np.float32)
    xq[:, :32][np.random.default_rng(20).random((q, 32)) < 0.85] = 0.0  # a sparse DLR query
    cols, gated = gip.active_dims(xq, 32)
    assert gated < 32 and list(cols[gated:]) == list(range(32, 40))
    rows = np.stack([np.random.default_rng(i).choice(80, 30, replace=False) for i in range(q)])
    got = gip.score_rows(xq, gq, values, gates, rows)
    np.testing.assert_allclose(got, np.take_along_axis(numpy_gip(xq, gq, values, gates), rows, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [1, 3, 10, 40, 400])
def test_sort_by_score_selecting_first_equals_the_full_sort(k):
    """The top k chosen by a partition then a small sort is the full sort's top k: ties at the cut go to
    the lower row, padding (-1) sorts last, on scores with many ties."""
    rng = np.random.default_rng(k)
    scores = rng.integers(0, 6, (5, 400)).astype(np.float32)  # six values: ties everywhere, also at the cut
    rows = np.stack([rng.permutation(10_000)[:400] for _ in range(5)])
    rows[1, ::7] = -1
    scores[2, :] = -np.inf
    full_scores = np.where(rows < 0, -np.inf, scores)
    full = np.lexsort((np.where(rows < 0, np.iinfo(np.int64).max, rows), -full_scores.astype(np.float64)), axis=-1)
    expected = np.take_along_axis(rows, full[:, :k], 1), np.take_along_axis(full_scores, full[:, :k], 1)
    got_scores, got_rows = gip.sort_by_score(scores, rows, k)
    np.testing.assert_array_equal(got_rows, expected[0])
    np.testing.assert_array_equal(got_scores, expected[1])
