"""The index directory on disk: its layout, the manifest, and the checked readers of its files.

Layout of a published index::

    manifest.json   format version, encoder spec, count, dims, dtypes, λ, first stage,
                    creation time, where the vectors came from, and size + sha256 of every other file
    vectors.faiss   the one copy of the (N, dim) rows: a flat Faiss index (float16 by default, float32
                    by choice) that the exact first stage and the rerank both memory-map (``index.storage.vectors``)
    gates.npy       (N, gated_dim) uint8, only for gated kinds
    first_stage.hnsw.faiss  only for an ``hnsw`` first stage: a graph over 8-bit or float16 codes
    first_stage.pqscan.faiss  only for a ``pqscan`` first stage: 4-bit product codes of every row, in row order
    first_stage.hnsw.rows.npy  only once a fold has dropped rows from the graph: its node -> row map
    doc_ids.npy     ids in row order (fixed-width UTF-8) and doc_ids.order.npy, the rows in id order
                    (``index.storage.doc_ids``; format 2 and older: doc_ids.json, a JSON list)
    docs.sqlite     table docs(row, id, title, text)
    fields.npz      typed payload columns (``index.storage.payload``), only when the manifest lists ``fields``

Writers put files into a directory (the texts through ``index.storage.documents``) and call
:func:`write_manifest` last; ``durable.publish`` renames the finished directory into place.
``index.served.loading.load_index`` checks everything with the readers here before anything is served
and raises :class:`IndexLoadError` naming the file and the problem. It checks sizes, shapes and
layouts, reading no vector: the sha256 of every byte is computed when an index is written and checked
on demand by ``index.served.loading.verify_index`` (``densehybrid index verify``).

Format version 1 (``values.npy`` float16 beside a float32 ``first_stage.faiss``) still loads,
both files memory-mapped; rebuild or re-import it to drop the second copy. Versions 1 and 2 store
the ids as ``doc_ids.json``; version 3 as memory-mapped arrays (a fold rewrites them so).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import sqlite3
from pathlib import Path

import faiss
import numpy as np

from densehybrid.encoder.base import EncoderSpec
from densehybrid.encoder.checksums import sha256_file
from densehybrid.index.storage import doc_ids as ids_file
from densehybrid.index.storage.documents import DOCS, DocTable
from densehybrid.index.errors import IndexLoadError
from densehybrid.index.storage.payload import PAYLOAD, Payload, load_payload
from densehybrid.index.storage.retired import retired_first_stage
from densehybrid.index.storage.vectors import MMAP, VECTORS, VectorFileError, open_vectors

log = logging.getLogger(__name__)

FORMAT = "densehybrid-index"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
VALUES = "values.npy"
GATES = "gates.npy"
FIRST_STAGE = "first_stage.faiss"
DOC_IDS = ids_file.LEGACY_JSON  # formats 1 and 2
HNSW_GRAPH = "first_stage.hnsw.faiss"  # read by ``index.engines.hnsw_engine``
HNSW_NODE_ROWS = "first_stage.hnsw.rows.npy"  # its node -> row map, once a fold has dropped rows from the graph
PQSCAN_CODES = "first_stage.pqscan.faiss"  # read by ``index.engines.pqscan_engine``
ANN_FILES = {"hnsw": HNSW_GRAPH, "pqscan": PQSCAN_CODES}  # the approximate first stage's file, by the manifest's type
# -- writing -----------------------------------------------------------------------------

write_doc_ids = ids_file.write  # the ids in row order: str, or stored keys (a fold copies them as they are)


# the entries write_manifest computes itself; every other entry (lambda, build, fusion, prompts, ...) is the
# builder's, and a rewrite of the same index (compaction) carries it over unchanged
COMPUTED_MANIFEST_KEYS = frozenset({"format", "format_version", "name", "created", "count", "dim", "gated_dim",
                                    "dtypes", "lam", "first_stage", "encoder", "files"})


def write_manifest(directory: Path, *, name: str, spec: EncoderSpec, count: int, lam: float,
                   first_stage: dict, extra: dict | None = None, values_dtype: str = "float16",
                   digests: dict[str, str] | None = None) -> dict:
    """Checksum every other file in ``directory`` and write the manifest (last).

    ``digests``: the sha256 of files already hashed while they were written (a fold's vectors), which
    are not read again."""
    files = sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)
    known = digests or {}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": name,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "count": count,
        "dim": spec.dim,
        "gated_dim": spec.gated_dim,
        "dtypes": {"values": values_dtype, **({"gates": "uint8"} if spec.gated_dim else {})},
        "lam": float(lam),
        "first_stage": first_stage,
        "encoder": spec.to_dict(),
        **(extra or {}),
        "files": {f: {"bytes": (directory / f).stat().st_size, "sha256": known.get(f) or sha256_file(directory / f)}
                  for f in files},
    }
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, directory / MANIFEST)
    return manifest


# -- loading -----------------------------------------------------------------------------

def load_failure(path: Path, problem: str) -> IndexLoadError:
    return IndexLoadError(f"{path}: {problem}")


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise load_failure(directory, "no such index directory")
    if not path.is_file():
        raise load_failure(path, "missing (not a finished index directory)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise load_failure(path, f"unreadable manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise load_failure(path, f"not a {FORMAT} manifest")
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise load_failure(path, f"format version {manifest.get('format_version')!r} is not supported "
                          f"(this release reads {', '.join(map(str, READABLE_VERSIONS))})")
    missing = {"name", "count", "dim", "gated_dim", "lam", "encoder", "files", "first_stage"} - set(manifest)
    if missing:
        raise load_failure(path, f"manifest lacks fields {sorted(missing)}")
    retired = retired_first_stage(manifest["first_stage"])
    if retired:
        raise load_failure(path, retired)
    return manifest


def required_files(manifest: dict) -> set[str]:
    if manifest["format_version"] == 1:
        vectors = {VALUES, FIRST_STAGE}
    else:
        vectors = {VECTORS}
    ids = {DOC_IDS} if manifest["format_version"] < 3 else {ids_file.IDS, ids_file.ORDER}
    return vectors | ids | {DOCS} | ({GATES} if manifest["gated_dim"] else set())


def verify_files(directory: Path, manifest: dict, *, checksums: bool = False) -> None:
    """Every listed file exists with its size (and, with ``checksums``, its sha256); required files are listed."""
    listed = manifest["files"]
    required = required_files(manifest)
    required |= {PAYLOAD} if manifest.get("fields") else set()
    ann = ANN_FILES.get(manifest["first_stage"].get("type"))
    required |= {ann} if ann else set()
    required |= {HNSW_NODE_ROWS} if manifest["first_stage"].get("node_rows") else set()
    missing = sorted(required - set(listed))
    if missing:
        raise load_failure(directory / MANIFEST, f"does not list required files {missing}")
    for name, meta in sorted(listed.items()):
        path = directory / name
        if not path.is_file():
            raise load_failure(path, "missing")
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise load_failure(path, f"size {size} bytes, manifest says {meta['bytes']} (truncated or altered)")
        if checksums and sha256_file(path) != meta["sha256"]:
            raise load_failure(path, "sha256 checksum does not match the manifest (file altered or corrupted)")


def load_array(path: Path, dtype: str, shape: tuple[int, int]) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise load_failure(path, f"not a readable .npy array ({exc})") from exc
    if array.dtype != np.dtype(dtype) or array.shape != shape:
        raise load_failure(path, f"holds {array.dtype} {array.shape}, expected {dtype} {shape}")
    return array


def _load_faiss(path: Path, count: int, dim: int) -> faiss.Index:
    try:
        index = faiss.read_index(str(path), MMAP)
    except RuntimeError as exc:
        raise load_failure(path, f"not a readable Faiss index ({str(exc).splitlines()[0]})") from exc
    if index.ntotal != count or index.d != dim:
        raise load_failure(path, f"holds {index.ntotal} vectors of {index.d} dims, expected {count} of {dim}")
    return index


def open_docs(path: Path, count: int) -> DocTable:
    try:
        docs = DocTable(path)
        stored = docs.count()
    except sqlite3.Error as exc:
        raise load_failure(path, f"not a readable SQLite document store ({exc})") from exc
    if stored != count:
        raise load_failure(path, f"holds {stored} documents, expected {count}")
    return docs


def load_fields(directory: Path, manifest: dict, count: int) -> Payload:
    schema = manifest.get("fields") or {}
    if not isinstance(schema, dict):
        raise load_failure(directory / MANIFEST, "'fields' is not an object of field names and types")
    try:
        return load_payload(directory / PAYLOAD, schema, count)
    except (OSError, ValueError) as exc:
        raise load_failure(directory / PAYLOAD, f"unreadable payload columns ({exc})") from exc


def load_vectors(directory: Path, manifest: dict, count: int, dim: int) -> tuple[faiss.Index, np.ndarray]:
    """-> (the first stage, the (count, dim) rows), both memory-mapped."""
    if manifest["format_version"] == 1:
        return _load_faiss(directory / FIRST_STAGE, count, dim), load_array(directory / VALUES, "float16", (count, dim))
    dtype = manifest.get("dtypes", {}).get("values", "float16")
    try:
        flat, values = open_vectors(directory / VECTORS, count=count, dim=dim, dtype=dtype)
    except (VectorFileError, ValueError) as exc:
        raise load_failure(directory / VECTORS, str(exc)) from exc
    return flat, values  # a graph or codes are loaded beside (``index.served.loading``)
