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

from densehybrid.index.building.row_chunks import chunks, without
from densehybrid.index.engines.faiss_engine import train_sample
from densehybrid.index.engines.pqscan_engine import ANN_FILE, NBITS, PQScanConfig, sub_quantizers

log = logging.getLogger(__name__)

_ADD_ROWS = 65_536
# the codebooks describe the rows they were trained on: past this growth the fold trains anew
MAX_GROWTH = 2.0


def new_codes(dim: int, m: int) -> faiss.Index:
    """An empty inner-product IndexPQ of ``m`` 4-bit codes a row."""
    return faiss.IndexPQ(dim, m, NBITS, faiss.METRIC_INNER_PRODUCT)


def _encode_rows(index: faiss.Index, xb: np.ndarray, skip: np.ndarray | None = None) -> None:
    for _, part in chunks(xb, skip, _ADD_ROWS):
        index.add(part)


def build_pqscan(xb: np.ndarray, config: PQScanConfig, skip: np.ndarray | None = None
                 ) -> tuple[faiss.Index, PQScanConfig]:
    """The codes of ``xb`` (N, dim) float16/float32 (a memory map is fine), and ``config`` as built (its ``m``).
    With ``skip`` (sorted rows) those rows are left out of the codes and of the codebooks' training (a
    calibration's held-out rows): code i is then the i-th row not skipped, until :func:`insert_rows`."""
    if xb.ndim != 2 or len(xb) == 0:
        raise ValueError(f"a pqscan first stage needs a non-empty (N, dim) array, got shape {xb.shape}")
    m = config.m or sub_quantizers(xb.shape[1])
    if xb.shape[1] % m:
        raise ValueError(f"pqscan needs dim ({xb.shape[1]}) divisible by m ({m})")
    config = replace(config, m=m, trained_rows=len(xb))
    index = new_codes(xb.shape[1], m)
    started = time.perf_counter()
    index.train(np.asarray(xb[without(train_sample(len(xb), config.train_size, config.seed), skip)], dtype=np.float32))
    log.debug("pqscan: %d codebooks trained (%.0f s)", m, time.perf_counter() - started)
    _encode_rows(index, xb, skip)
    return index, config


def set_codes(index: faiss.Index, codes: np.ndarray) -> None:
    """Replace the codes of ``index`` (an IndexPQ) by ``codes`` (N, code_size) uint8."""
    faiss.copy_array_to_vector(np.ascontiguousarray(codes).reshape(-1), index.codes)
    index.ntotal = len(codes)


def insert_rows(index: faiss.Index, xb: np.ndarray, rows: np.ndarray) -> None:
    """Encode ``xb[rows]`` (sorted rows that :func:`build_pqscan` skipped) with the trained codebooks and put
    their codes in their places, so that code i is row i again."""
    kept = faiss.vector_to_array(index.codes).reshape(index.ntotal, index.code_size)
    codes = np.empty((len(kept) + len(rows), index.code_size), np.uint8)
    codes[rows] = index.pq.compute_codes(np.asarray(xb[rows], dtype=np.float32))
    codes[np.setdiff1d(np.arange(len(codes)), rows)] = kept
    set_codes(index, codes)


def must_retrain(rows: int, config: PQScanConfig) -> bool:
    """Whether a fold to ``rows`` rows trains the codebooks anew (past ``MAX_GROWTH`` times the rows trained on)."""
    return rows > MAX_GROWTH * max(config.trained_rows, 1)


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
    if must_retrain(len(values), config):
        return write_pqscan(values, directory, config)
    started = time.perf_counter()
    base = faiss.read_index(str(Path(base_directory) / ANN_FILE))
    codes = faiss.vector_to_array(base.codes).reshape(base.ntotal, base.code_size)
    index = new_codes(base.d, base.pq.M)
    index.pq = base.pq
    index.is_trained = True
    set_codes(index, codes[keep])  # copied as they are: the kept rows are not encoded again
    _encode_rows(index, values[first_added:])
    faiss.write_index(index, str(Path(directory) / ANN_FILE))
    log.info("pqscan first stage: %d rows kept, %d encoded in %.1f s", len(keep), len(values) - first_added,
             time.perf_counter() - started)
    return config.to_dict()
