"""Write the approximate first stage of an index: a Faiss HNSW graph over scalar-quantized codes.

:func:`write_ann` takes the index's vectors (the stored copy, ``vectors.faiss`` memory-mapped, or any
(N, dim) float array) and writes ``first_stage.hnsw.faiss`` beside them; the build, an import and a
compaction call it the same way (through ``index.building.first_stage``). The vectors are read in chunks, so the only copy in memory is the
graph itself. A fold calls :func:`fold_ann` instead: it adds the written rows to the base's graph,
and the base rows the fold drops stay in the graph as dead nodes (``first_stage.hnsw.rows.npy`` maps
each node to its row, -1 for a dead one, and searches never return those), until they pass
``MAX_DEAD_FRACTION`` of the nodes or (in a graph linked by L2 over augmented rows, as graphs were
written before) a written row is longer than the augmentation allows: then the graph is built anew. The
graph's links depend on the order threads insert rows, so two builds of the same vectors give graphs that
differ slightly (their searches agree on all but a few candidates).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import faiss
import numpy as np

from dataclasses import replace

from densehybrid.index.building.row_chunks import chunks, without
from densehybrid.index.engines.faiss_engine import train_sample
from densehybrid.index.engines.hnsw_engine import (ANN_FILE, ENCODINGS, L2_AUGMENTED, METRICS, NODE_ROWS,
                                                   HNSWConfig, graph_rows, graph_width)

log = logging.getLogger(__name__)

_ADD_ROWS = 65_536
# dead nodes are still walked through (only never returned): past this share a walk does that much
# more work for the same candidates, and the graph is rebuilt (an estimate, not measured)
MAX_DEAD_FRACTION = 0.2


def new_hnsw(dim: int, config: HNSWConfig) -> faiss.Index:
    """An empty HNSW index of ``graph_width`` dims over ``config.encoding`` codes, linked by ``config.metric``."""
    index = faiss.IndexHNSWSQ(graph_width(dim, config.metric), ENCODINGS[config.encoding], config.m,
                              METRICS[config.metric])
    index.hnsw.efConstruction = config.ef_construction
    index.hnsw.efSearch = config.ef_search
    return index


def max_norm2(xb: np.ndarray) -> float:
    """The largest squared norm of the rows of ``xb``, read in chunks."""
    return max(float(np.einsum("ij,ij->i", part, part).max())
               for part in (np.asarray(xb[s:s + _ADD_ROWS], dtype=np.float32) for s in range(0, len(xb), _ADD_ROWS)))


def build_hnsw(xb: np.ndarray, config: HNSWConfig, skip: np.ndarray | None = None) -> tuple[faiss.Index, HNSWConfig]:
    """The graph of ``xb`` (N, dim) float16/float32 (a memory map is fine), rows added in chunks, and
    ``config`` (``l2_augmented``: with the rows' ``max_norm2``). With ``skip`` (sorted rows) those rows are left
    out of the graph and of its training (a calibration's held-out rows): node i is then the i-th row not skipped."""
    if xb.ndim != 2 or len(xb) == 0:
        raise ValueError(f"an HNSW first stage needs a non-empty (N, dim) array, got shape {xb.shape}")
    config = replace(config, max_norm2=max_norm2(xb) if config.metric == L2_AUGMENTED else 0.0)
    index = new_hnsw(xb.shape[1], config)
    index.train(graph_rows(xb[without(train_sample(len(xb), config.train_size, config.seed), skip)], config))
    started = time.perf_counter()
    for rows, part in chunks(xb, skip, _ADD_ROWS):
        index.add(graph_rows(part, config))
        log.debug("hnsw: %d of %d rows added (%.0f s)", rows[-1] + 1, len(xb), time.perf_counter() - started)
    return index, config


def add_rows(index: faiss.Index, xb: np.ndarray, rows: np.ndarray, config: HNSWConfig) -> None:
    """Add ``xb[rows]`` to the graph ``index`` as its next nodes (the rows a calibration held out)."""
    for s in range(0, len(rows), _ADD_ROWS):
        index.add(graph_rows(xb[rows[s:s + _ADD_ROWS]], config, index.d))


def save_hnsw(index: faiss.Index, directory: str | Path, config: HNSWConfig, nodes: np.ndarray) -> dict:
    """Write the graph ``index`` and, when its nodes are not the rows in order, ``nodes`` (node -> row) into
    ``directory``; returns the manifest's ``first_stage`` record."""
    faiss.write_index(index, str(Path(directory) / ANN_FILE))
    if np.array_equal(nodes, np.arange(len(nodes))):
        return config.to_dict()
    np.save(Path(directory) / NODE_ROWS, nodes, allow_pickle=False)
    return {**config.to_dict(), "node_rows": NODE_ROWS, "nodes": len(nodes)}


def write_ann(xb: np.ndarray, directory: str | Path, config: HNSWConfig = HNSWConfig()) -> dict:
    """Build the graph of ``xb`` (N, dim) and write it into ``directory``; returns the manifest's
    ``first_stage`` record. Call before ``files.write_manifest``, which checksums the file."""
    started = time.perf_counter()
    index, config = build_hnsw(xb, config)
    path = Path(directory) / ANN_FILE
    faiss.write_index(index, str(path))
    log.info("hnsw first stage of %d rows (m=%d, %s codes) written in %.1f s: %.1f MB", len(xb), config.m,
             config.encoding, time.perf_counter() - started, path.stat().st_size / 1e6)
    return config.to_dict()


def folded_nodes(base_nodes: np.ndarray, new_row_of: np.ndarray, count: int) -> np.ndarray:
    """(nodes,) int64: the base graph's nodes (``base_nodes``: node -> base row, -1 dead) mapped through
    ``new_row_of`` (base row -> new row, -1 dropped), then one node for each added row up to ``count``."""
    kept = np.where(base_nodes >= 0, new_row_of[np.maximum(base_nodes, 0)], -1)
    return np.concatenate([kept, np.arange(int((new_row_of >= 0).sum()), count, dtype=np.int64)])


def must_rebuild(nodes: np.ndarray, added: np.ndarray, config: HNSWConfig) -> bool:
    """Whether a fold builds the graph anew rather than adding ``added`` (n, dim) to it: past
    ``MAX_DEAD_FRACTION`` dead ``nodes``, or (``l2_augmented``) an added row longer than its augmentation allows."""
    too_long = config.metric == L2_AUGMENTED and len(added) and max_norm2(added) > config.max_norm2
    return bool(np.mean(nodes < 0) > MAX_DEAD_FRACTION or too_long)


def fold_ann(values: np.ndarray, directory: Path, base_directory: Path, nodes: np.ndarray, first_added: int,
             config: HNSWConfig) -> dict:
    """The folded generation's graph in ``directory``: the base's (in ``base_directory``) with the rows
    ``values[first_added:]`` added, or built anew (see the module docstring). ``values``: the new (N, dim)
    rows; ``nodes``: :func:`folded_nodes`. Returns the manifest's ``first_stage`` record."""
    added = values[first_added:]
    if must_rebuild(nodes, added, config):
        return write_ann(values, directory, config)
    started = time.perf_counter()
    index = faiss.read_index(str(Path(base_directory) / ANN_FILE))  # read in whole: rows are added to it
    for s in range(0, len(added), _ADD_ROWS):
        index.add(graph_rows(added[s:s + _ADD_ROWS], config, index.d))  # the base graph's width
    log.info("hnsw first stage: %d rows added to the graph of %d nodes (%d dead) in %.1f s", len(added),
             len(nodes) - len(added), int(np.sum(nodes < 0)), time.perf_counter() - started)
    return save_hnsw(index, directory, config, nodes)
