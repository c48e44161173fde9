"""Vectors -> the files an index searches them with, shared by ``index build``, ``index import`` and compaction.

:func:`write_vectors_and_first_stage` streams the rows once into ``vectors.faiss`` (the one copy,
``index.storage.vectors``) and then builds any approximate first stage from that file's memory map,
in its own file (an HNSW graph in ``first_stage.hnsw.faiss``, ``index.building.ann``, or 4-bit product
codes in ``first_stage.pqscan.faiss``, ``index.building.pqscan``). It returns the manifest's ``first_stage``
entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from densehybrid.index.building.ann import write_ann
from densehybrid.index.building.pqscan import write_pqscan
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.engines.pqscan_engine import PQScanConfig
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.storage.vectors import VECTORS, open_vectors, write_vectors

AnnConfig = HNSWConfig | PQScanConfig  # an approximate first stage beside the exact rows, rescored from them


def write_vectors_and_first_stage(directory: Path, parts: Iterable[np.ndarray], *, count: int, dim: int,
                                  values_dtype: str = "float16", ann: AnnConfig | None = None) -> dict:
    """``parts``: (n, dim) arrays, ``count`` rows in all, in row order -> the manifest's ``first_stage``."""
    write_checked_vectors(directory, parts, count=count, dim=dim, values_dtype=values_dtype)
    return write_first_stage(directory, count=count, dim=dim, values_dtype=values_dtype, ann=ann)


def write_checked_vectors(directory: Path, parts: Iterable[np.ndarray], *, count: int, dim: int,
                          values_dtype: str = "float16") -> str:
    """``vectors.faiss`` alone -> its sha256 (for the manifest); bad rows raise IndexWriteError."""
    try:
        return write_vectors(directory / VECTORS, parts, count=count, dim=dim, dtype=values_dtype)
    except ValueError as exc:
        raise IndexWriteError(f"{directory / VECTORS}: {exc}") from exc


def write_first_stage(directory: Path, *, count: int, dim: int, values_dtype: str = "float16",
                      ann: AnnConfig | None = None) -> dict:
    """The first stage over the written ``vectors.faiss`` -> the manifest's ``first_stage``."""
    if ann is None:
        return {"type": "flat_ip"}
    _, values = open_vectors(directory / VECTORS, count=count, dim=dim, dtype=values_dtype)
    return write_approximate(values, directory, ann)  # built from the stored copy, as the rescoring reads it


def write_approximate(values: np.ndarray, directory: Path, ann: AnnConfig) -> dict:
    """The HNSW graph or the product codes of ``values`` (N, dim) in ``directory`` -> the manifest's
    ``first_stage``."""
    if isinstance(ann, PQScanConfig):
        return write_pqscan(values, directory, ann)
    return write_ann(values, directory, ann)
