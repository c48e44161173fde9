"""Vectors -> the files an index searches them with, shared by ``index build``, ``index import`` and compaction.

:func:`write_vectors_and_first_stage` streams the rows once into ``vectors.faiss`` (the one copy,
``index.storage.vectors``) and then builds any approximate first stage from that file's memory map,
in its own file. It returns the manifest's ``first_stage`` entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.engines import faiss_engine
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.storage.files import FIRST_STAGE
from densehybrid.index.storage.vectors import VECTORS, open_vectors, write_vectors

_ADD_ROWS = 65_536


def write_vectors_and_first_stage(directory: Path, parts: Iterable[np.ndarray], *, count: int, dim: int,
                                  values_dtype: str = "float16",
                                  pq: faiss_engine.PQConfig | None = None) -> dict:
    """``parts``: (n, dim) arrays, ``count`` rows in all, in row order -> the manifest's ``first_stage``."""
    try:
        write_vectors(directory / VECTORS, parts, count=count, dim=dim, dtype=values_dtype)
    except ValueError as exc:
        raise IndexWriteError(f"{directory / VECTORS}: {exc}") from exc
    if pq is None:
        return {"type": "flat_ip"}
    _, values = open_vectors(directory / VECTORS, count=count, dim=dim, dtype=values_dtype)
    faiss.write_index(_pq_index(values, pq), str(directory / FIRST_STAGE))
    return pq.to_dict()


def _pq_index(values: np.ndarray, pq: faiss_engine.PQConfig) -> faiss.Index:
    index = faiss_engine.new_index(values.shape[1], pq)
    faiss_engine.train(index, np.asarray(values[faiss_engine.train_sample(len(values), pq)], np.float32), pq)
    for s in range(0, len(values), _ADD_ROWS):
        index.add(np.asarray(values[s:s + _ADD_ROWS], dtype=np.float32))
    return index
