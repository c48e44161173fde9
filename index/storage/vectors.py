"""The one copy of an index's vectors: a flat Faiss file whose codes numpy maps as the (N, dim) rows.

A Faiss flat index stores its rows last in the file, as they are: ``IndexScalarQuantizer``
(``QT_fp16``) as float16, ``IndexFlatIP`` as float32. So one file serves both readers: Faiss
memory-maps it (``IO_FLAG_MMAP_IFC``) for the exact first stage, and ``np.memmap`` opens the same
bytes as the ``(N, dim)`` array the rerank, explain and export read. Nothing is read into RAM
at open: pages come from disk as the scans touch them, and the kernel may drop them again.

The file is written in a stream (header, then the rows part by part), so building or importing
never holds the vectors in memory; :func:`open_vectors` checks the layout before serving it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.storage.streams import HashingWriter

VECTORS = "vectors.faiss"
# maps the codes of a flat index (IndexFlatCodes: flat, scalar quantizer, PQ) instead of reading them;
# plain IO_FLAG_MMAP still reads them into memory (faiss 1.15)
MMAP = faiss.IO_FLAG_MMAP_IFC
DTYPES = ("float16", "float32")
_NTOTAL = struct.Struct("<q")  # a Faiss index header: fourcc (4 bytes), d (int32), ntotal (int64), ...
_CODES_SIZE = struct.Struct("<Q")  # the length written just before the codes vector


def _stated_length(count: int, dim: int, dtype: str) -> int:
    """What Faiss writes before the codes: their bytes (scalar quantizer), their floats (IndexFlat)."""
    return count * dim * (np.dtype(dtype).itemsize if dtype == "float16" else 1)


class VectorFileError(ValueError):
    """The vectors file is not the flat Faiss index the manifest describes."""


def new_flat(dim: int, dtype: str = "float16") -> faiss.Index:
    """An empty exact inner-product index whose codes are rows of ``dtype``."""
    if dtype == "float16":
        return faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    if dtype == "float32":
        return faiss.IndexFlatIP(dim)
    raise ValueError(f"unknown vector dtype {dtype!r}; use one of {', '.join(DTYPES)}")


_FLOAT16_EXPONENT = np.uint16(0x7C00)  # all ones: infinity or NaN


def _all_finite(rows: np.ndarray) -> bool:
    if rows.dtype == np.float16:  # numpy computes float16 isfinite elementwise in software; its bits say it ~3x faster
        return not np.any((rows.view(np.uint16) & _FLOAT16_EXPONENT) == _FLOAT16_EXPONENT)
    return bool(np.isfinite(rows).all())


def write_vectors(path: Path, parts: Iterable[np.ndarray], *, count: int, dim: int, dtype: str = "float16") -> str:
    """Stream ``parts`` ((n, dim) arrays, ``count`` rows in all) into a flat Faiss file at ``path``
    -> its sha256, computed while written (``streams.HashingWriter``).

    Raises ValueError when the parts hold another number of rows, or values that ``dtype`` cannot
    hold (float16 overflows beyond ±65504)."""
    header = bytearray(faiss.serialize_index(new_flat(dim, dtype)).tobytes())
    _NTOTAL.pack_into(header, 8, count)
    _CODES_SIZE.pack_into(header, len(header) - _CODES_SIZE.size, _stated_length(count, dim, dtype))
    written = 0
    with HashingWriter(path) as f:
        f.write(header)
        for part in parts:
            with np.errstate(over="ignore"):  # an overflow is reported below, by row numbers
                rows = np.ascontiguousarray(part, dtype=dtype)
            if rows.ndim != 2 or rows.shape[1] != dim:
                raise ValueError(f"a part of shape {rows.shape}, expected (n, {dim})")
            if not _all_finite(rows):
                raise ValueError(f"rows {written}..{written + len(rows)} hold values {dtype} cannot represent "
                                 "(overflow beyond ±65504 or NaN); choose float32")
            f.write(rows.data)
            written += len(rows)
    if written != count:
        raise ValueError(f"wrote {written} rows, expected {count}")
    return f.sha256


def open_vectors(path: Path, *, count: int, dim: int, dtype: str = "float16") -> tuple[faiss.Index, np.ndarray]:
    """-> (the memory-mapped flat Faiss index, its rows as a read-only (count, dim) ``dtype`` memmap)."""
    row_bytes = count * dim * np.dtype(dtype).itemsize
    size = path.stat().st_size
    offset = size - row_bytes
    if offset < _CODES_SIZE.size:
        raise VectorFileError(f"{size} bytes cannot hold {count} rows of {dim} {dtype} (truncated?)")
    with open(path, "rb") as f:
        f.seek(offset - _CODES_SIZE.size)
        (stated,) = _CODES_SIZE.unpack(f.read(_CODES_SIZE.size))
    if stated != _stated_length(count, dim, dtype):
        raise VectorFileError(f"its codes do not hold {count} x {dim} {dtype} rows (truncated or another layout)")
    try:
        index = faiss.read_index(str(path), MMAP)
    except RuntimeError as exc:
        raise VectorFileError(f"not a readable Faiss index ({str(exc).splitlines()[0]})") from exc
    expected = type(new_flat(dim, dtype))
    if type(index) is not expected or index.ntotal != count or index.d != dim:
        raise VectorFileError(f"holds a {type(index).__name__} of {index.ntotal} x {index.d}, "
                              f"expected a {expected.__name__} of {count} x {dim}")
    rows = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count, dim)) if count else \
        np.zeros((0, dim), dtype)
    return index, rows
