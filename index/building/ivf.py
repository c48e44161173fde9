"""Write the inverted-list first stage of an index: a Faiss IVF over scalar-quantized codes.

:func:`write_ivf` takes the index's vectors (the stored copy, ``vectors.faiss`` memory-mapped, or any
(N, dim) float array), trains the lists' k-means centres and the codes on a seeded sample, adds
every row with its row number as id, and writes ``first_stage.ivf.faiss`` beside them. The vectors
are read in chunks, so the only copy in memory is the IVF's codes.

A fold calls :func:`fold_ivf` instead: the trained centres stay, the dropped rows leave their lists,
the kept rows' ids are renumbered in place to their new rows and the written rows are added to the
lists of their nearest centres. That costs a pass over the ids and the written rows' assignment,
not the assignment of every row. Once the rows are more than twice those the centres were trained
on, the lists are trained and filled anew (their centres describe the rows they were drawn from).
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
from densehybrid.index.engines.hnsw_engine import ENCODINGS
from densehybrid.index.engines.ivf_engine import ANN_FILE, IVFConfig, lists_for

log = logging.getLogger(__name__)

_ADD_ROWS = 65_536
# the centres describe the rows they were trained on: past this growth the fold trains anew
MAX_GROWTH = 2.0
# k-means needs tens of rows a centre (Faiss warns below 39), so many lists widen the sample past train_size
MIN_SAMPLE_PER_LIST = 64


def new_ivf(dim: int, config: IVFConfig) -> faiss.Index:
    """An empty inner-product IVF of ``dim`` dims in ``config.nlist`` lists over ``config.encoding`` codes."""
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFScalarQuantizer(quantizer, dim, config.nlist, ENCODINGS[config.encoding],
                                          faiss.METRIC_INNER_PRODUCT)
    index.own_fields = True
    quantizer.this.disown()  # the IVF frees its quantizer
    index.cp.seed = config.seed
    index.nprobe = config.nprobe
    return index


def _add_rows(index: faiss.Index, xb: np.ndarray, first_row: int, skip: np.ndarray | None = None) -> None:
    """Add ``xb`` (n, dim) in chunks, ids ``first_row`` onwards, the rows ``skip`` (sorted ids) left out."""
    for rows, part in chunks(xb, None if skip is None else skip - first_row, _ADD_ROWS):
        index.add_with_ids(part, rows + first_row)


def add_rows(index: faiss.Index, xb: np.ndarray, rows: np.ndarray) -> None:
    """Add ``xb[rows]`` to the lists of ``index`` with their rows as ids (the rows a calibration held out)."""
    for s in range(0, len(rows), _ADD_ROWS):
        index.add_with_ids(np.asarray(xb[rows[s:s + _ADD_ROWS]], dtype=np.float32), rows[s:s + _ADD_ROWS])


def build_ivf(xb: np.ndarray, config: IVFConfig, skip: np.ndarray | None = None) -> tuple[faiss.Index, IVFConfig]:
    """The IVF of ``xb`` (N, dim) float16/float32 (a memory map is fine), and ``config`` as built: with
    ``trained_rows``, ``nlist`` chosen from the rows when it is 0 (``lists_for``), and lowered to the training
    sample's size when the rows are fewer. With ``skip`` (sorted rows) those rows are left out of the lists and
    of the training (a calibration's held-out rows)."""
    if xb.ndim != 2 or len(xb) == 0:
        raise ValueError(f"an IVF first stage needs a non-empty (N, dim) array, got shape {xb.shape}")
    config = replace(config, nlist=config.nlist or lists_for(len(xb)))
    sample = without(train_sample(len(xb), max(config.train_size, MIN_SAMPLE_PER_LIST * config.nlist), config.seed),
                     skip)
    if len(sample) < config.nlist:
        log.warning("ivf: %d rows, fewer than the %d lists asked for: %d lists", len(xb), config.nlist, len(sample))
    config = replace(config, nlist=min(config.nlist, len(sample)), trained_rows=len(xb))
    index = new_ivf(xb.shape[1], config)
    started = time.perf_counter()
    index.train(np.asarray(xb[sample], dtype=np.float32))
    log.debug("ivf: %d lists trained on %d rows (%.0f s)", config.nlist, len(sample), time.perf_counter() - started)
    _add_rows(index, xb, 0, skip)
    return index, config


def must_retrain(rows: int, config: IVFConfig) -> bool:
    """Whether a fold to ``rows`` rows trains the lists anew (past ``MAX_GROWTH`` times the rows trained on)."""
    return rows > MAX_GROWTH * max(config.trained_rows, 1)


def write_ivf(xb: np.ndarray, directory: str | Path, config: IVFConfig = IVFConfig()) -> dict:
    """Build the IVF of ``xb`` (N, dim) and write it into ``directory``; returns the manifest's
    ``first_stage`` record. Call before ``files.write_manifest``, which checksums the file."""
    started = time.perf_counter()
    index, config = build_ivf(xb, config)
    path = Path(directory) / ANN_FILE
    faiss.write_index(index, str(path))
    log.info("ivf first stage of %d rows (%d lists, %s codes) written in %.1f s: %.1f MB", len(xb), config.nlist,
             config.encoding, time.perf_counter() - started, path.stat().st_size / 1e6)
    return config.to_dict()


def renumber(index: faiss.Index, new_row_of: np.ndarray) -> None:
    """Drop the rows ``new_row_of`` maps to -1 from ``index``'s lists and give the others their new rows
    (``new_row_of``: old row -> new row), in place."""
    dropped = np.flatnonzero(new_row_of < 0)
    if len(dropped):
        index.remove_ids(faiss.IDSelectorBatch(len(dropped), faiss.swig_ptr(dropped)))
    lists = index.invlists
    for number in range(index.nlist):
        size = lists.list_size(number)
        if size:  # a view of the list's ids, written through
            ids = faiss.rev_swig_ptr(lists.get_ids(number), size)
            ids[:] = new_row_of[ids]


def fold_ivf(values: np.ndarray, directory: Path, base_directory: Path, new_row_of: np.ndarray, first_added: int,
             config: IVFConfig) -> dict:
    """The folded generation's IVF in ``directory``: the base's (in ``base_directory``) renumbered by
    ``new_row_of`` (base row -> new row, -1 dropped) with the rows ``values[first_added:]`` added, or
    built anew (see the module docstring). ``values``: the new (N, dim) rows. Returns the manifest's
    ``first_stage`` record."""
    if must_retrain(len(values), config):
        return write_ivf(values, directory, config)
    started = time.perf_counter()
    index = faiss.read_index(str(Path(base_directory) / ANN_FILE))  # read in whole: its lists change
    renumber(index, new_row_of)
    _add_rows(index, values[first_added:], first_added)
    faiss.write_index(index, str(Path(directory) / ANN_FILE))
    log.info("ivf first stage: %d rows dropped, %d added to the %d lists in %.1f s",
             int(np.sum(new_row_of < 0)), len(values) - first_added, config.nlist, time.perf_counter() - started)
    return config.to_dict()
