"""Vectors -> the files an index searches them with, shared by ``index build``, ``index import`` and compaction.

:func:`write_vectors_and_first_stage` streams the rows once into ``vectors.faiss`` (the one copy,
``index.storage.vectors``) and then builds any approximate first stage from that file's memory map,
in its own file (IndexPQ in ``first_stage.faiss``, or with ``ann`` an HNSW graph in
``first_stage.hnsw.faiss``, ``index.building.ann``, inverted lists in ``first_stage.ivf.faiss``,
``index.building.ivf``, or 4-bit product codes in ``first_stage.pqscan.faiss``, ``index.building.pqscan``). It returns the manifest's ``first_stage`` entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.building.ann import write_ann
from densehybrid.index.building.ivf import write_ivf
from densehybrid.index.building.pqscan import write_pqscan
from densehybrid.index.engines import faiss_engine
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.engines.ivf_engine import IVFConfig
from densehybrid.index.engines.pqscan_engine import PQScanConfig
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.storage.files import FIRST_STAGE
from densehybrid.index.storage.vectors import VECTORS, open_vectors, write_vectors

_ADD_ROWS = 65_536
AnnConfig = HNSWConfig | IVFConfig | PQScanConfig  # an approximate first stage beside the exact rows, rescored from them


def write_vectors_and_first_stage(directory: Path, parts: Iterable[np.ndarray], *, count: int, dim: int,
                                  values_dtype: str = "float16",
                                  pq: faiss_engine.PQConfig | None = None, ann: AnnConfig | None = None) -> dict:
    """``parts``: (n, dim) arrays, ``count`` rows in all, in row order -> the manifest's ``first_stage``."""
    check_first_stage(pq, ann)
    write_checked_vectors(directory, parts, count=count, dim=dim, values_dtype=values_dtype)
    return write_first_stage(directory, count=count, dim=dim, values_dtype=values_dtype, pq=pq, ann=ann)


def write_checked_vectors(directory: Path, parts: Iterable[np.ndarray], *, count: int, dim: int,
                          values_dtype: str = "float16") -> str:
    """``vectors.faiss`` alone -> its sha256 (for the manifest); bad rows raise IndexWriteError."""
    try:
        return write_vectors(directory / VECTORS, parts, count=count, dim=dim, dtype=values_dtype)
    except ValueError as exc:
        raise IndexWriteError(f"{directory / VECTORS}: {exc}") from exc


def write_first_stage(directory: Path, *, count: int, dim: int, values_dtype: str = "float16",
                      pq: faiss_engine.PQConfig | None = None, ann: AnnConfig | None = None) -> dict:
    """The first stage over the written ``vectors.faiss`` -> the manifest's ``first_stage``."""
    check_first_stage(pq, ann)
    if pq is None and ann is None:
        return {"type": "flat_ip"}
    _, values = open_vectors(directory / VECTORS, count=count, dim=dim, dtype=values_dtype)
    if ann is not None:  # built from the stored copy (as the searches' exact rescoring reads it)
        return write_approximate(values, directory, ann)
    faiss.write_index(_pq_index(values, pq), str(directory / FIRST_STAGE))
    return pq.to_dict()


def write_approximate(values: np.ndarray, directory: Path, ann: AnnConfig) -> dict:
    """The HNSW graph, the IVF or the product codes of ``values`` (N, dim) in ``directory`` -> the manifest's
    ``first_stage``."""
    if isinstance(ann, PQScanConfig):
        return write_pqscan(values, directory, ann)
    return write_ivf(values, directory, ann) if isinstance(ann, IVFConfig) else write_ann(values, directory, ann)


def check_first_stage(pq: faiss_engine.PQConfig | None, ann: AnnConfig | None) -> None:
    if pq is not None and ann is not None:
        raise ValueError("PQ and an approximate first stage are two first stages: choose one (--pq with "
                         "--ann flat, or --ann hnsw/ivf)")


def _pq_index(values: np.ndarray, pq: faiss_engine.PQConfig) -> faiss.Index:
    index = faiss_engine.new_index(values.shape[1], pq)
    faiss_engine.train(index, np.asarray(values[faiss_engine.train_sample(len(values), pq.train_size, pq.seed)], np.float32), pq)
    for s in range(0, len(values), _ADD_ROWS):
        index.add(np.asarray(values[s:s + _ADD_ROWS], dtype=np.float32))
    return index
