"""An approximate first stage built without some rows, searched, then completed with them.

A calibration query cut from a passage of the corpus lies on that passage's row: a graph walk that reaches it
reaches its neighbours too, which are its exact top 10, so a structure that holds the row measures a recall no
unseen query gets. :func:`build` therefore builds the graph or the codes without the rows the queries were cut
from (and trains them without those rows), hands back a store that searches that structure as a served search
does (candidates rescored exactly), and ``finish`` adds the held-out rows and writes the file: the graph gets
them as its last nodes (``node_rows`` maps nodes to rows), the codes get them in their places (code i is row i
again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.building import ann, pqscan
from densehybrid.index.building.first_stage import AnnConfig
from densehybrid.index.building.row_chunks import without
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.search.vector_store import VectorStore


@dataclass
class HeldOut:
    """A first stage without the held-out rows: ``store`` searches it, ``record`` is its manifest entry as built,
    ``finish()`` adds the rows, writes the file and returns the final manifest entry."""

    store: VectorStore
    record: dict
    finish: Callable[[], dict]


def build(values: np.ndarray, directory: Path, config: AnnConfig, held: np.ndarray) -> HeldOut:
    """``config``'s first stage of ``values`` (N, dim) without the rows ``held`` (sorted, unique), to be
    written into ``directory`` by ``finish``."""
    kept = without(np.arange(len(values), dtype=np.int64), held)
    if isinstance(config, hnsw_engine.HNSWConfig):
        return _graph(values, directory, config, held, kept)
    return _codes(values, directory, config, held, kept)


def _graph(values, directory, config, held, kept) -> HeldOut:
    index, config = ann.build_hnsw(values, config, skip=held)
    store = hnsw_engine.HnswStore(index, values, None, (), config.ef_search, node_rows=kept)

    def finish() -> dict:
        ann.add_rows(index, values, held, config)
        return ann.save_hnsw(index, directory, config, np.concatenate([kept, held]))

    return HeldOut(store, config.to_dict(), finish)


def _codes(values, directory, config, held, kept) -> HeldOut:
    index, config = pqscan.build_pqscan(values, config, skip=held)
    store = pqscan_engine.PQScanStore(pqscan_engine.code_scan(index), values, None, (), config.rescore, config.margin,
                                      code_rows=kept)

    def finish() -> dict:
        pqscan.insert_rows(index, values, held)
        faiss.write_index(index, str(Path(directory) / pqscan_engine.ANN_FILE))
        return config.to_dict()

    return HeldOut(store, config.to_dict(), finish)
