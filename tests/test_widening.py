"""Stored float16 rows widened to float32: the same values numpy's cast gives, in any shape and size."""

import warnings

import numpy as np
import pytest

from densehybrid.index.search.widening import SERIAL_ELEMENTS, as_float32


@pytest.mark.parametrize("shape", [(0, 384), (1, 7), (290, 384), (3, SERIAL_ELEMENTS + 5), (2, 3, 4)])
def test_float16_rows_widen_to_exactly_numpy_s_values(shape):
    rows = np.random.default_rng(7).standard_normal(shape).astype(np.float16)
    got = as_float32(rows)
    assert got.dtype == np.float32 and got.shape == rows.shape
    assert np.array_equal(got, rows.astype(np.float32))


def test_every_float16_value_widens_as_numpy_widens_it():
    every = np.arange(2 ** 16, dtype=np.uint16).view(np.float16)  # zeros, subnormals, infinities, NaNs
    got, want = as_float32(every), every.astype(np.float32)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_a_strided_view_and_other_types_are_widened_too():
    rows = np.arange(60, dtype=np.float16).reshape(6, 10)
    assert np.array_equal(as_float32(rows[::2, 3:]), rows[::2, 3:].astype(np.float32))
    already = np.ones((2, 3), np.float32)
    assert as_float32(already) is already  # no copy
    assert np.array_equal(as_float32(np.arange(4, dtype=np.int64)), np.arange(4, dtype=np.float32))


def test_rows_of_a_read_only_map_widen_without_a_warning(tmp_path):
    path = tmp_path / "rows.f16"
    np.arange(800, dtype=np.float16).reshape(100, 8).tofile(path)
    rows = np.memmap(path, np.float16, "r", shape=(100, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(as_float32(rows[10:20]), np.asarray(rows[10:20], np.float32))
