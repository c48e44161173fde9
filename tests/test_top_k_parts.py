"""The first stage's top-k in parts (the split a CUDA graph capture may choose) against a numpy sort.

Exact whatever the split: a row among the top k of all is among the top k of its own part. The cases
cover splits that leave columns past the last part, splits too narrow for k (one top-k then), several
chunks with their own row numbers, masks, and runs of equal scores.
"""

import numpy as np
import pytest
import torch

from densehybrid.encoder.cuda_graph import capture
from densehybrid.index.engines.torch_graphs import top_k_in_parts, top_k_over_chunks


def _sorted_top(values: torch.Tensor, columns: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(values, columns) ordered by value descending, then column: comparable with a stable numpy sort."""
    v, c = values.numpy(), columns.numpy()
    order = np.lexsort((c, -v), axis=1)
    return np.take_along_axis(v, order, 1), np.take_along_axis(c, order, 1)


def _numpy_top(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    columns = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, columns, 1), columns


@pytest.mark.parametrize("n,parts,k", [(10_000, 4, 100), (10_003, 16, 10), (10_007, 64, 150), (999, 8, 125),
                                       (999, 8, 200), (5_000, 1, 50), (64, 64, 1)])
def test_the_top_k_in_parts_is_the_top_k(n, parts, k):
    scores = np.random.default_rng(n + parts).standard_normal((3, n)).astype(np.float32)
    values, columns = _sorted_top(*top_k_in_parts(torch.from_numpy(scores), k, parts))
    want_values, want_columns = _numpy_top(scores, k)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(columns, want_columns)


def test_a_tied_run_through_the_cut_keeps_k_distinct_columns_of_the_top_score():
    scores = torch.zeros((2, 1_000))
    scores[:, 500:] = 1.0  # 500 columns tie at the top, across several parts
    values, columns = top_k_in_parts(scores, 300, parts=8)
    assert (values == 1.0).all()
    assert all(len(set(row.tolist())) == 300 and min(row.tolist()) >= 500 for row in columns)


def test_columns_past_the_last_part_are_found():
    scores = torch.zeros((1, 1_003))
    scores[0, 1_001] = 5.0  # 1,003 = 8 parts of 125 and 3 columns past them
    values, columns = top_k_in_parts(scores, 1, parts=8)
    assert columns.tolist() == [[1_001]] and values.tolist() == [[5.0]]


@pytest.mark.parametrize("parts", [1, 4])
def test_top_k_over_chunks_numbers_rows_globally_and_honours_masks(parts):
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((2_500, 8)).astype(np.float32)
    queries = rng.standard_normal((2, 8)).astype(np.float32)
    starts = [0, 1_000, 2_000]
    chunks = [torch.from_numpy(rows[s:s + 1_000]) for s in starts]
    keep = rng.random(2_500) < 0.3
    masks = [torch.from_numpy(keep[s:s + 1_000]) for s in starts]
    for chosen in (None, masks):
        values, found = _sorted_top(*top_k_over_chunks(torch.from_numpy(queries), chunks, starts, 40, parts=parts,
                                                       masks=chosen))
        scores = queries @ rows.T
        if chosen is not None:
            scores = np.where(keep, scores, -np.inf)
        want_values, want_rows = _numpy_top(scores, 40)
        np.testing.assert_allclose(values, want_values, rtol=1e-6)
        np.testing.assert_array_equal(found, want_rows)


def test_a_capture_off_cuda_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        capture(lambda: None, torch.device("cpu"))
