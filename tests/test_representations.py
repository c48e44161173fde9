"""The representation math (docs/concepts.md) against numpy re-derivations written here, loop by loop."""

import numpy as np
import pytest
import torch

from densehybrid.encoder import representations as R

V = 30522


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def random_batch(rng, B=3, L=9, vocab=V):
    logits = rng.standard_normal((B, L, vocab)).astype(np.float32) * 3
    weights = rng.standard_normal((B, L)).astype(np.float32)  # negative term weights included
    lengths = rng.integers(3, L + 1, size=B)
    lengths[0] = L
    mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(1, vocab, size=(B, L))
    ids[:, 0] = 101
    return logits, weights, mask, ids


def t(x):
    return torch.from_numpy(np.asarray(x))


def test_term_weighted_mlm_matches_numpy():
    rng = np.random.default_rng(0)
    logits, w, mask, _ = random_batch(rng, vocab=500)
    got = R.term_weighted_mlm(t(logits), t(w), t(mask)).numpy()
    for b in range(logits.shape[0]):
        real = [i for i in range(1, logits.shape[1]) if mask[b, i] == 1]
        expect = np.max(np.stack([w[b, i] * np_softmax(logits[b, i].astype(np.float64)) for i in real]), axis=0)
        np.testing.assert_allclose(got[b], expect, rtol=1e-5, atol=1e-7)


def test_skip_mlm_matches_numpy_and_floors_at_zero():
    rng = np.random.default_rng(1)
    _, w, mask, ids = random_batch(rng, vocab=300)
    ids[:, 2] = ids[:, 3]  # a repeated token: the max of its weights wins
    got = R.skip_mlm_lexical(t(ids), t(w), t(mask), 300).numpy()
    for b in range(ids.shape[0]):
        expect = np.zeros(300)
        for i in range(1, ids.shape[1]):
            if mask[b, i]:
                expect[ids[b, i]] = max(expect[ids[b, i]], w[b, i])
        np.testing.assert_allclose(got[b], expect, rtol=0, atol=1e-7)
    assert (got >= 0).all()


def test_splade_matches_numpy_including_cls():
    rng = np.random.default_rng(2)
    logits, _, mask, _ = random_batch(rng, vocab=400)
    logits[0, 0, 7] = 50.0  # only [CLS] fires on term 7: SPLADE keeps it
    got = R.splade_lexical(t(logits), t(mask)).numpy()
    for b in range(logits.shape[0]):
        rows = [np.log1p(np.maximum(logits[b, i], 0)) for i in range(logits.shape[1]) if mask[b, i]]
        np.testing.assert_allclose(got[b], np.max(rows, axis=0), rtol=1e-6, atol=1e-6)
    assert got[0, 7] == pytest.approx(np.log1p(50.0))


@pytest.mark.parametrize("width,expected", [(1280, -198), (640, 442), (768, 570), (256, 58), (128, 58)])
def test_removal_offset(width, expected):
    assert R.removal_offset(V, width) == expected


def np_aggregate_full(v, d_agg):
    n = 2 * d_agg
    r = len(v) % n
    if r > 1000:
        r -= n
    x = v[r:] if r >= 0 else np.concatenate([v, np.zeros(-r, v.dtype)])
    m = np.array([max(x[k * n + j] for k in range(len(x) // n)) for j in range(n)])
    pos, neg = m[0::2], m[1::2]
    return np.array([pos[j] if pos[j] > neg[j] else -neg[j] for j in range(d_agg)])


@pytest.mark.parametrize("d_agg", [640, 128, 100])
def test_aggregate_full_matches_numpy(d_agg):
    rng = np.random.default_rng(3)
    v = rng.standard_normal((2, V)).astype(np.float32)
    got = R.aggregate_full(t(v), d_agg).numpy()
    for b in range(2):
        np.testing.assert_array_equal(got[b], np_aggregate_full(v[b], d_agg))


def test_aggregate_full_640_pads_198_zeros():
    # all-negative input: only the 198 appended zeros can be a row max, at the tail columns
    v = -np.ones((1, V), np.float32) - np.arange(V, dtype=np.float32)[None] * 1e-6
    m_cols_with_zero = set((V + np.arange(198)) % 1280)
    got = R.aggregate_full(t(v), 640).numpy()[0]
    for j in range(640):
        pos_zero, neg_zero = 2 * j in m_cols_with_zero, 2 * j + 1 in m_cols_with_zero
        if pos_zero and neg_zero:
            assert got[j] == 0
    assert len(m_cols_with_zero) == 198
    np.testing.assert_array_equal(got, np_aggregate_full(v[0], 640))


def test_aggregate_semi_matches_numpy():
    rng = np.random.default_rng(4)
    v = rng.standard_normal((2, V)).astype(np.float32)
    got = R.aggregate_semi(t(v), 640).numpy()
    r = V % 640  # 442 <= 1000: drop
    x = v[:, r:].reshape(2, -1, 640)
    np.testing.assert_array_equal(got, x.max(1))


@pytest.mark.parametrize("dim,drop", [(768, 570), (640, 442), (256, 58), (128, 58)])
def test_densify_matches_numpy_and_maps_back_to_vocab(dim, drop):
    rng = np.random.default_rng(dim)
    v = rng.standard_normal((3, V)).astype(np.float32)
    values, index = R.densify(t(v), dim)
    assert values.shape == (3, dim) and index.dtype == torch.uint8
    rows = (V - drop) // dim
    for b in range(3):
        for j in range(0, dim, 37):
            column = [v[b, drop + k * dim + j] for k in range(rows)]
            assert values[b, j].item() == max(column)
            assert index[b, j].item() == int(np.argmax(column))
    ids = R.dlr_term_ids(index, V).numpy()
    np.testing.assert_array_equal(np.take_along_axis(v, ids, axis=1), values.numpy())


def test_densify_on_sparse_vector_recovers_the_terms():
    v = torch.zeros(1, V)
    terms = torch.tensor([2054, 9742, 12850, 29000])
    v[0, terms] = torch.tensor([1.0, 2.5, 0.7, 3.0])
    values, index = R.densify(v, 768)
    ids = R.dlr_term_ids(index, V)[0]
    nonzero = values[0] > 0
    assert sorted(ids[nonzero].tolist()) == sorted(terms.tolist())


def test_densify_refuses_more_than_256_rows():
    with pytest.raises(ValueError, match="256"):
        R.densify(torch.zeros(1, V), 64)


def test_gip_matches_numpy_loop():
    rng = np.random.default_rng(5)
    qv, pv = rng.standard_normal((4, 32)), rng.standard_normal((7, 32))
    qg, pg = rng.integers(0, 3, (4, 32)), rng.integers(0, 3, (7, 32))
    got = R.gated_inner_product(t(qv), t(qg), t(pv), t(pg)).numpy()
    for a in range(4):
        for b in range(7):
            expect = sum(qv[a, j] * pv[b, j] for j in range(32) if qg[a, j] == pg[b, j])
            assert got[a, b] == pytest.approx(expect, rel=1e-5, abs=1e-6)


def test_pooling():
    rng = np.random.default_rng(6)
    h = rng.standard_normal((2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(R.cls_pool(t(h)).numpy(), h[:, 0])
    np.testing.assert_allclose(R.mean_pool(t(h), t(mask)).numpy()[1], h[1, :2].mean(0), rtol=1e-6)
    n = R.l2_normalize(t(h[:, 0])).numpy()
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("fn", ["delade", "skip", "splade", "mean"])
def test_padding_invariance(fn):
    """A row padded with junk beyond its mask gives the same vector as unpadded."""
    rng = np.random.default_rng(7)
    L, extra, vocab = 6, 5, 200
    logits = rng.standard_normal((1, L + extra, vocab)).astype(np.float32)
    w = rng.standard_normal((1, L + extra)).astype(np.float32) - 2  # padding weights would win a max with 0
    ids = rng.integers(0, vocab, (1, L + extra))
    mask_long = np.array([[1] * L + [0] * extra])
    mask_short = np.ones((1, L), np.int64)
    h = rng.standard_normal((1, L + extra, 8)).astype(np.float32)

    def run(sl, mask):
        if fn == "delade":
            return R.term_weighted_mlm(t(logits[:, :sl]), t(w[:, :sl]), t(mask))
        if fn == "skip":
            return R.skip_mlm_lexical(t(ids[:, :sl]), t(w[:, :sl]), t(mask), vocab)
        if fn == "splade":
            return R.splade_lexical(t(logits[:, :sl]), t(mask))
        return R.mean_pool(t(h[:, :sl]), t(mask))

    torch.testing.assert_close(run(L, mask_short), run(L + extra, mask_long), rtol=0, atol=1e-6)


@pytest.mark.parametrize("step", [1, 40_000, R.STEP_ELEMENTS["cuda"]])
def test_term_weighted_mlm_is_the_same_at_every_step_size(step):
    """The GPU step size (one kernel per op for a whole batch) and tiny steps give the CPU default's values."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(3, 9, 500, generator=g) * 4
    weights = torch.randn(3, 9, generator=g)
    weights[2] = -weights[2].abs()  # a row with no positive weight takes the sign-flipped branch
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    expected = R.term_weighted_mlm(logits, weights, mask)
    torch.testing.assert_close(R.term_weighted_mlm(logits, weights, mask, step=step), expected, rtol=1e-6, atol=1e-7)


def test_half_precision_logits_are_upcast_per_step():
    """fp16 logits (CUDA autocast) give the float32 result of the same rounded logits, in float32."""
    g = torch.Generator().manual_seed(12)
    logits = (torch.randn(2, 7, 300, generator=g) * 3).half()
    weights, mask = torch.rand(2, 7, generator=g) + 0.1, torch.ones(2, 7, dtype=torch.long)
    got = R.term_weighted_mlm(logits, weights, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, R.term_weighted_mlm(logits.float(), weights, mask), rtol=1e-6, atol=1e-7)
    splade = R.splade_lexical(logits, mask)
    assert splade.dtype == torch.float32
    torch.testing.assert_close(splade, R.splade_lexical(logits.float(), mask), rtol=0, atol=0)
