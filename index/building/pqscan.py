"""Write the product-code first stage of an index: 4-bit codes of every row, scanned by Faiss's fast scan.

:func:`write_pqscan` takes the index's vectors (the stored copy, ``vectors.faiss`` memory-mapped, or any
(N, dim) float array), trains the codebooks on a seeded sample and encodes every row in chunks into
``first_stage.pqscan.faiss`` beside them (a plain ``IndexPQ``, one code row per index row in row order).

A fold calls :func:`fold_pqscan` instead: the trained codebooks stay, the kept rows' codes are copied
as they are and only the written rows are encoded. Once the rows are more than twice those the codebooks
were trained on, they are trained anew (they describe the rows they were drawn from).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.engines.faiss_engine import train_sample
from densehybrid.index.engines.pqscan_engine import ANN_FILE, NBITS, PQScanConfig, sub_quantizers

log = logging.getLogger(__name__)

_ADD_ROWS = 65_536
# the codebooks describe the rows they were trained on: past this growth the fold trains anew
MAX_GROWTH = 2.0


def new_codes(dim: int, m: int) -> faiss.Index:
    """An empty inner-product IndexPQ of ``m`` 4-bit codes a row."""
    return faiss.IndexPQ(dim, m, NBITS, faiss.METRIC_INNER_PRODUCT)


def _encode_rows(index: faiss.Index, xb: np.ndarray) -> None:
    for s in range(0, len(xb), _ADD_ROWS):
        index.add(np.asarray(xb[s:s + _ADD_ROWS], dtype=np.float32))


def build_pqscan(xb: np.ndarray, config: PQScanConfig) -> tuple[faiss.Index, PQScanConfig]:
    """The codes of ``xb`` (N, dim) float16/float32 (a memory map is fine), and ``config`` as built (its ``m``)."""
    if xb.ndim != 2 or len(xb) == 0:
        raise ValueError(f"a pqscan first stage needs a non-empty (N, dim) array, got shape {xb.shape}")
    m = config.m or sub_quantizers(xb.shape[1])
    if xb.shape[1] % m:
        raise ValueError(f"pqscan needs dim ({xb.shape[1]}) divisible by m ({m})")
    config = replace(config, m=m, trained_rows=len(xb))
    index = new_codes(xb.shape[1], m)
    started = time.perf_counter()
    index.train(np.asarray(xb[train_sample(len(xb), config.train_size, config.seed)], dtype=np.float32))
    log.debug("pqscan: %d codebooks trained (%.0f s)", m, time.perf_counter() - started)
    _encode_rows(index, xb)
    return index, config


def write_pqscan(xb: np.ndarray, directory: str | Path, config: PQScanConfig = PQScanConfig()) -> dict:
    """Build the codes of ``xb`` (N, dim) and write them into ``directory``; returns the manifest's ``first_stage``
    record. Call before ``files.write_manifest``, which checksums the file."""
    started = time.perf_counter()
    index, config = build_pqscan(xb, config)
    path = Path(directory) / ANN_FILE
    faiss.write_index(index, str(path))
    log.info("pqscan first stage of %d rows (%d codes of %d bits a row) written in %.1f s: %.1f MB", len(xb),
             config.m, NBITS, time.perf_counter() - started, path.stat().st_size / 1e6)
    return config.to_dict()


def fold_pqscan(values: np.ndarray, directory: Path, base_directory: Path, keep: np.ndarray, first_added: int,
                config: PQScanConfig) -> dict:
    """The folded generation's codes in ``directory``: the base's (in ``base_directory``) rows ``keep`` copied,
    then ``values[first_added:]`` encoded with the same codebooks (or all trained anew, see the module
    docstring). ``values``: the new (N, dim) rows. Returns the manifest's ``first_stage`` record."""
    if len(values) > MAX_GROWTH * max(config.trained_rows, 1):
        return write_pqscan(values, directory, config)
    started = time.perf_counter()
    base = faiss.read_index(str(Path(base_directory) / ANN_FILE))
    codes = faiss.vector_to_array(base.codes).reshape(base.ntotal, base.code_size)
    index = new_codes(base.d, base.pq.M)
    index.pq = base.pq
    index.is_trained = True
    kept = np.ascontiguousarray(codes[keep])  # copied as they are: the kept rows are not encoded again
    faiss.copy_array_to_vector(kept.reshape(-1), index.codes)
    index.ntotal = len(keep)
    _encode_rows(index, values[first_added:])
    faiss.write_index(index, str(Path(directory) / ANN_FILE))
    log.info("pqscan first stage: %d rows kept, %d encoded in %.1f s", len(keep), len(values) - first_added,
             time.perf_counter() - started)
    return config.to_dict()
