"""The fast paths of the encoder and the rerank, against brute-force numpy on seeded data.

- ``representations.term_weighted_mlm``: the logsumexp/running-max form, including rows
  whose term weights are all negative, zero weights, and a row with no real token;
- ``index.search.gip.score_rows``: both the sparse-query branch (only non-zero gated dims
  gathered) and the dense-query branch (whole rows masked in place), several blocks.
"""

import numpy as np
import pytest
import torch

from densehybrid.encoder import representations as R
from densehybrid.index.search import gip


def numpy_term_weighted(logits, w, mask):
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.full((z.shape[0], z.shape[2]), -np.inf)
    for b in range(z.shape[0]):
        for i in range(1, z.shape[1]):
            if mask[b, i]:
                out[b] = np.maximum(out[b], w[b, i] * p[b, i])
    return out


def test_term_weighted_mlm_all_sign_cases_match_numpy():
    rng = np.random.default_rng(0)
    B, L, V = 5, 9, 300
    logits = (rng.standard_normal((B, L, V)) * 4).astype(np.float32)
    w = rng.standard_normal((B, L)).astype(np.float32)
    w[1] = -np.abs(w[1])            # every weight negative: the max is -min |w| p
    w[2, 3] = 0.0                   # a zero weight among positive ones
    w[3] = -np.abs(w[3])
    w[3, 4] = 0.0                   # all non-positive with one zero: the max is 0
    mask = np.ones((B, L), dtype=np.int64)
    mask[4, 1:] = 0                 # only [CLS]: no real token -> -inf
    mask[0, 6:] = 0
    got = R.term_weighted_mlm(torch.from_numpy(logits), torch.from_numpy(w), torch.from_numpy(mask)).numpy()
    want = numpy_term_weighted(logits, w, mask)
    assert np.isneginf(got[4]).all() and np.isneginf(want[4]).all()
    np.testing.assert_allclose(got[:4], want[:4], rtol=1e-5, atol=1e-12)
    assert (got[1] < 0).all() and np.all(got[3] == 0)


def test_term_weighted_mlm_is_padding_invariant():
    rng = np.random.default_rng(1)
    logits = torch.from_numpy((rng.standard_normal((2, 12, 200)) * 3).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((2, 12)).astype(np.float32))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, 5:] = 0
    alone = R.term_weighted_mlm(logits[:1, :5], w[:1, :5], mask[:1, :5])
    batched = R.term_weighted_mlm(logits, w, mask)[:1]
    np.testing.assert_allclose(batched.numpy(), alone.numpy(), rtol=1e-6, atol=0)


def numpy_gip(xq, gq, values, gates, rows):
    G = gates.shape[1]
    out = np.zeros(rows.shape)
    for q in range(rows.shape[0]):
        for k, r in enumerate(rows[q]):
            p = values[r].astype(np.float64)
            out[q, k] = np.sum(xq[q, :G] * p[:G] * (gq[q] == gates[r])) + xq[q, G:] @ p[G:]
    return out


@pytest.mark.parametrize("query", ["sparse", "dense"])
def test_score_rows_both_branches_match_numpy(query, monkeypatch):
    monkeypatch.setattr(gip, "_MAX_GATHER_ELEMENTS", 7 * 40)  # blocks of 7 rows: many blocks, a ragged last one
    rng = np.random.default_rng(2)
    N, G, D = 300, 32, 8
    values = rng.random((N, G + D)).astype(np.float16)
    gates = rng.integers(0, 3, (N, G), dtype=np.uint8)
    xq = rng.random((3, G + D)).astype(np.float32)
    if query == "sparse":
        xq[:, :G] *= rng.random((3, G)) < 0.1  # a few non-zero gated dims (fewer than G/4)
        xq[2, :G] = 0.0                        # and a query with none at all
    gq = rng.integers(0, 3, (3, G), dtype=np.uint8)
    rows = np.stack([rng.choice(N, 50, replace=False) for _ in range(3)])
    got = gip.score_rows(xq, gq, values, gates, rows)
    np.testing.assert_allclose(got, numpy_gip(xq, gq, values, gates, rows), rtol=1e-5, atol=1e-5)


def test_first_stage_parts_time_every_part_on_the_cpu():
    from densehybrid.bench.parts.first_stage import parts

    result = parts(torch.device("cpu"), 3000)
    assert result["rows"] == 3000 and result["share_of_search"]["search"] == 1.0
    assert {"q @ V.T", "V @ q.T", "mv", "copy of the rows", "search"} <= set(result["ms"])
    assert all(ms > 0 for ms in result["ms"].values())
