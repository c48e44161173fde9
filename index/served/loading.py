"""Opening a local index directory as served: every file checked (``index.storage.files``), then the
approximate first stage its engine reads beside the rows. No vector is read: the arrays are memory maps."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import faiss
import numpy as np

from densehybrid.encoder.base import EncoderSpec
from densehybrid.encoder.prompts import PromptError, Prompts
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.served.local import IndexFiles
from densehybrid.index.storage import doc_ids as ids_file
from densehybrid.index.storage.documents import DOCS
from densehybrid.index.storage.files import (GATES, MANIFEST, load_array, load_failure, load_fields, load_vectors,
                                             open_docs, read_manifest, verify_files)
from densehybrid.index.storage.vectors import MMAP

log = logging.getLogger(__name__)


def _load_ann(directory: Path, manifest: dict, count: int, dim: int) -> tuple[faiss.Index | None, np.ndarray | None]:
    """-> (the graph of an hnsw first stage or the codes of a pqscan one (as written, memory-mapped: each
    searcher repacks them for its scan), searched beside the exact rows, the graph's node -> row map or None)."""
    if pqscan_engine.is_pqscan(manifest["first_stage"]):
        path = directory / pqscan_engine.ANN_FILE
        try:
            return pqscan_engine.read_codes(path, count, dim, pqscan_engine.PQScanConfig.from_dict(
                manifest["first_stage"]), MMAP), None
        except (TypeError, ValueError) as exc:
            raise load_failure(path, str(exc)) from exc
    path = directory / hnsw_engine.ANN_FILE
    if not hnsw_engine.is_hnsw(manifest["first_stage"]):
        return None, None
    nodes = None
    # nodes are not rows: a fold dropped some, or a build added its held-out rows last
    if manifest["first_stage"].get("node_rows"):
        nodes = load_array(directory / hnsw_engine.NODE_ROWS, "int64", (int(manifest["first_stage"]["nodes"]),))
    try:
        hnsw_engine.HNSWConfig.from_dict(manifest["first_stage"])
        return hnsw_engine.read_ann(path, count if nodes is None else len(nodes), dim), nodes
    except (TypeError, ValueError) as exc:
        raise load_failure(path, str(exc)) from exc


def verify_index(path: str | os.PathLike) -> dict:
    """The full check: every file's sha256 against the manifest (reads every byte), then a load -> manifest."""
    directory = Path(path)
    manifest = read_manifest(directory)
    verify_files(directory, manifest, checksums=True)
    index = load_index(directory)
    ids_file.check(directory, index.doc_ids)
    hnsw_engine.check_node_rows(directory / hnsw_engine.NODE_ROWS, index.ann_rows, index.count)
    return manifest


def load_index(path: str | os.PathLike, *, checksums: bool = False) -> IndexFiles:
    """Open an index directory, checking manifest, file sizes, shapes, counts and layouts.

    No vector is read: the arrays are memory maps. ``checksums=True`` also hashes every file
    (as :func:`verify_index` does), which reads the whole index.
    """
    directory = Path(path)
    manifest = read_manifest(directory)
    try:
        spec = EncoderSpec.from_dict(manifest["encoder"])
    except (TypeError, ValueError) as exc:
        raise load_failure(directory / MANIFEST, f"bad encoder description ({exc})") from exc
    try:
        Prompts.from_dict(manifest.get("prompts"))
    except PromptError as exc:
        raise load_failure(directory / MANIFEST, f"bad prompts ({exc})") from exc
    verify_files(directory, manifest, checksums=checksums)
    count, dim, gated = int(manifest["count"]), int(manifest["dim"]), int(manifest["gated_dim"])
    if (dim, gated) != (spec.dim, spec.gated_dim):
        raise load_failure(directory / MANIFEST, f"dims {dim}/{gated} disagree with the encoder spec {spec.dim}/{spec.gated_dim}")
    first_stage, values = load_vectors(directory, manifest, count, dim)
    gates = load_array(directory / GATES, "uint8", (count, gated)) if gated else None
    index = IndexFiles(
        path=directory, manifest=manifest, spec=spec,
        doc_ids=ids_file.load(directory, count, legacy=manifest["format_version"] < 3),
        values=values, gates=gates,
        faiss=first_stage,
        docs=open_docs(directory / DOCS, count),
        payload=load_fields(directory, manifest, count),
    )
    index.ann, index.ann_rows = _load_ann(directory, manifest, count, dim)
    log.info("loaded index %s: %d documents, kind %s, dim %d (gated %d)", index.name, count, spec.kind, dim, gated)
    return index
