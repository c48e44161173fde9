"""The device top-k by blocks and the device ordering against torch.topk, numpy and the host order."""

import numpy as np
import pytest
import torch

from densehybrid.index.engines import torch_topk
from densehybrid.index.engines.torch_topk import order_by_score, top_k
from densehybrid.index.search.gip import sort_by_score


def scores_with(kind: str, rows: int, n: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if kind == "distinct":
        return torch.from_numpy(rng.standard_normal((rows, n), dtype=np.float32))
    if kind == "ties":  # a handful of values: every cut runs through a long run of equal scores
        return torch.from_numpy(rng.integers(0, 7, (rows, n)).astype(np.float32))
    if kind == "float16":  # the GPU's storage dtype: many scores share a value
        return torch.from_numpy(rng.standard_normal((rows, n), dtype=np.float32)).half()
    if kind == "masked":  # a filter: most rows at -inf, fewer kept than some k
        out = torch.from_numpy(rng.standard_normal((rows, n), dtype=np.float32))
        out[:, rng.random(n) > 0.01] = float("-inf")
        return out
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["distinct", "ties", "float16", "masked"])
@pytest.mark.parametrize("n,k", [(64_000, 1000), (64_007, 1000), (20_000, 10), (20_013, 1), (5_000, 100)])
def test_top_k_keeps_the_values_of_a_full_top_k(kind, n, k):
    scores = scores_with(kind, 3, n, seed=n + k)
    values, columns = top_k(scores, k, blocks=True)
    want = torch.topk(scores, k, dim=1).values
    torch.testing.assert_close(values.sort(dim=1, descending=True).values, want, rtol=0, atol=0)
    torch.testing.assert_close(scores.gather(1, columns), values, rtol=0, atol=0)  # each column holds its value
    assert all(len(set(row.tolist())) == k for row in columns)


def test_top_k_takes_the_block_path_where_it_pays(monkeypatch):
    """A million scores and k = 1,000: the top-k reads 62,500 maxima and 16,000 candidates, not a million
    (on a GPU, where that pays)."""
    seen = []
    real_topk = torch.topk

    def spy(tensor, k, **kwargs):
        seen.append(tensor.shape[-1])
        return real_topk(tensor, k, **kwargs)

    monkeypatch.setattr(torch, "topk", spy)
    top_k(torch.randn(1, 1_000_000), 1000, blocks=True)
    top_k(torch.randn(1, 30_000), 1000, blocks=True)  # too few scores for blocks to pay
    top_k(torch.randn(1, 1_000_000), 1000)  # on the CPU, by default: one linear pass
    blocks = 1_000_000 // torch_topk.BLOCK
    assert seen == [blocks, 1000 * torch_topk.BLOCK, 30_000, 1_000_000]


@pytest.mark.parametrize("k", [1, 7, 40, 200])
def test_order_by_score_is_the_host_order(k):
    rng = np.random.default_rng(k)
    scores = rng.integers(0, 5, (4, 120)).astype(np.float32)  # ties everywhere, at the cut too
    rows = rng.permutation(10_000)[:480].reshape(4, 120).astype(np.int64)
    rows[2, 90:] = -1  # padding: last, whatever its score
    scores[2, 95] = 99.0
    got_scores, got_rows = order_by_score(torch.from_numpy(scores), torch.from_numpy(rows), k)
    want_scores, want_rows = sort_by_score(scores, rows, k)
    np.testing.assert_array_equal(got_rows.numpy(), want_rows)
    np.testing.assert_array_equal(got_scores.numpy(), want_scores)


# -- on a CUDA machine (skipped here; the tests above are its CPU twins) ---------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("k", [11, 1000, 10_000])
def test_gpu_top_k_and_order_give_the_cpu_answer(k):
    """A million float16 scores on the GPU, by blocks, then ordered there: the values and order of the host path."""
    scores = scores_with("float16", 2, 1_000_000, seed=k)
    values, columns = top_k(scores.cuda(), k)
    got_scores, got_rows = order_by_score(values, columns, k)
    want_scores, want_rows = sort_by_score(scores.float().numpy(), np.tile(np.arange(1_000_000), (2, 1)), k)
    np.testing.assert_array_equal(got_scores.float().cpu().numpy(), want_scores)
    cut = want_scores[:, -1:]  # which rows tied at the cut are kept may differ; the rest may not
    above = want_scores > cut
    np.testing.assert_array_equal(got_rows.cpu().numpy()[above], want_rows[above])
