"""``vectors.faiss``: written in a stream, a valid Faiss flat index, and its codes are the numpy rows."""

import faiss
import numpy as np
import pytest

from densehybrid.index.storage.vectors import VectorFileError, new_flat, open_vectors, write_vectors


def rows(n=500, d=24, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def test_float32_file_is_what_faiss_writes(tmp_path):
    xb = rows()
    write_vectors(tmp_path / "v", [xb[:123], xb[123:]], count=len(xb), dim=24, dtype="float32")
    flat = new_flat(24, "float32")
    flat.add(xb)
    faiss.write_index(flat, str(tmp_path / "ref"))
    assert (tmp_path / "v").read_bytes() == (tmp_path / "ref").read_bytes()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_faiss_and_numpy_read_the_same_rows(tmp_path, dtype):
    xb = rows()
    write_vectors(tmp_path / "v", [xb], count=len(xb), dim=24, dtype=dtype)
    index, values = open_vectors(tmp_path / "v", count=len(xb), dim=24, dtype=dtype)
    np.testing.assert_array_equal(values, xb.astype(dtype))
    np.testing.assert_array_equal(index.reconstruct_n(0, len(xb)), xb.astype(dtype).astype(np.float32))
    xq = rows(3, seed=1)
    scores, found = index.search(xq, 5)
    brute = xq.astype(np.float64) @ values.astype(np.float64).T
    np.testing.assert_allclose(scores, np.sort(brute, axis=1)[:, ::-1][:, :5], rtol=1e-5, atol=1e-5)


def test_wrong_counts_layouts_and_overflow_are_refused(tmp_path):
    xb = rows()
    with pytest.raises(ValueError, match="wrote 500 rows, expected 600"):
        write_vectors(tmp_path / "v", [xb], count=600, dim=24)
    with pytest.raises(ValueError, match="cannot represent"):
        write_vectors(tmp_path / "big", [xb * 1e6], count=500, dim=24, dtype="float16")
    write_vectors(tmp_path / "v", [xb], count=500, dim=24)
    with pytest.raises(VectorFileError, match="cannot hold"):
        open_vectors(tmp_path / "v", count=600, dim=24)
    with pytest.raises(VectorFileError, match="do not hold"):
        open_vectors(tmp_path / "v", count=501, dim=24)
    with pytest.raises(VectorFileError, match="do not hold"):
        open_vectors(tmp_path / "v", count=499, dim=24)
    with pytest.raises(VectorFileError):
        open_vectors(tmp_path / "v", count=250, dim=24, dtype="float32")  # same bytes, another layout
