"""The index directory on disk: its layout, the manifest, publishing, and loading with every check.

Layout of a published index::

    manifest.json   format version, encoder spec, count, dims, dtypes, λ, first stage,
                    creation time, where the vectors came from, and size + sha256 of every other file
    vectors.faiss   the one copy of the (N, dim) rows: a flat Faiss index (float16 by default, float32
                    by choice) that the exact first stage and the rerank both memory-map (``index.vectors``)
    gates.npy       (N, gated_dim) uint8, only for gated kinds
    first_stage.faiss   only for a PQ first stage (IndexPQ)
    first_stage.hnsw.faiss  only for an ``hnsw`` first stage: a graph over 8-bit or float16 codes
    first_stage.ivf.faiss   only for an ``ivf`` first stage: inverted lists of 8-bit or float16 codes
    doc_ids.npy     ids in row order (fixed-width UTF-8) and doc_ids.order.npy, the rows in id order
                    (``index.storage.doc_ids``; format 2 and older: doc_ids.json, a JSON list)
    docs.sqlite     table docs(row, id, title, text)
    fields.npz      typed payload columns (``index.payload``), only when the manifest lists ``fields``

Writers put files into a directory (the texts through ``index.documents``) and call :func:`write_manifest` last;
``durable.publish`` renames the finished directory into place. :func:`load_index`
checks everything before anything is served and raises :class:`IndexLoadError`
naming the file and the problem. It checks sizes, shapes and layouts, reading no vector:
the sha256 of every byte is computed when an index is written and checked on demand by
:func:`verify_index` (``densehybrid index verify``).

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
from densehybrid.encoder.prompts import Prompts, PromptError
from densehybrid.index.engines import hnsw_engine, ivf_engine
from densehybrid.index.storage import doc_ids as ids_file
from densehybrid.index.storage.documents import DOCS, DocTable
from densehybrid.index.errors import IndexLoadError
from densehybrid.index.storage.local import IndexFiles
from densehybrid.index.storage.payload import PAYLOAD, Payload, load_payload
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
_OWN_FIRST_STAGE = ("flat_ip", "hnsw", "ivf")  # first stages of format 2 with no first_stage.faiss
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

def _fail(path: Path, problem: str) -> IndexLoadError:
    return IndexLoadError(f"{path}: {problem}")


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise _fail(directory, "no such index directory")
    if not path.is_file():
        raise _fail(path, "missing (not a finished index directory)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"unreadable manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _fail(path, f"not a {FORMAT} manifest")
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise _fail(path, f"format version {manifest.get('format_version')!r} is not supported "
                          f"(this release reads {', '.join(map(str, READABLE_VERSIONS))})")
    missing = {"name", "count", "dim", "gated_dim", "lam", "encoder", "files", "first_stage"} - set(manifest)
    if missing:
        raise _fail(path, f"manifest lacks fields {sorted(missing)}")
    return manifest


def required_files(manifest: dict) -> set[str]:
    if manifest["format_version"] == 1:
        vectors = {VALUES, FIRST_STAGE}
    else:
        vectors = {VECTORS} | ({FIRST_STAGE} if manifest["first_stage"].get("type") not in _OWN_FIRST_STAGE else set())
    ids = {DOC_IDS} if manifest["format_version"] < 3 else {ids_file.IDS, ids_file.ORDER}
    return vectors | ids | {DOCS} | ({GATES} if manifest["gated_dim"] else set())


def verify_files(directory: Path, manifest: dict, *, checksums: bool = False) -> None:
    """Every listed file exists with its size (and, with ``checksums``, its sha256); required files are listed."""
    listed = manifest["files"]
    required = required_files(manifest)
    required |= {PAYLOAD} if manifest.get("fields") else set()
    required |= {hnsw_engine.ANN_FILE} if hnsw_engine.is_hnsw(manifest["first_stage"]) else set()
    required |= {ivf_engine.ANN_FILE} if ivf_engine.is_ivf(manifest["first_stage"]) else set()
    required |= {hnsw_engine.NODE_ROWS} if manifest["first_stage"].get("node_rows") else set()
    missing = sorted(required - set(listed))
    if missing:
        raise _fail(directory / MANIFEST, f"does not list required files {missing}")
    for name, meta in sorted(listed.items()):
        path = directory / name
        if not path.is_file():
            raise _fail(path, "missing")
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise _fail(path, f"size {size} bytes, manifest says {meta['bytes']} (truncated or altered)")
        if checksums and sha256_file(path) != meta["sha256"]:
            raise _fail(path, "sha256 checksum does not match the manifest (file altered or corrupted)")


def _load_array(path: Path, dtype: str, shape: tuple[int, int]) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise _fail(path, f"not a readable .npy array ({exc})") from exc
    if array.dtype != np.dtype(dtype) or array.shape != shape:
        raise _fail(path, f"holds {array.dtype} {array.shape}, expected {dtype} {shape}")
    return array


def _load_faiss(path: Path, count: int, dim: int) -> faiss.Index:
    try:
        index = faiss.read_index(str(path), MMAP)
    except RuntimeError as exc:
        raise _fail(path, f"not a readable Faiss index ({str(exc).splitlines()[0]})") from exc
    if index.ntotal != count or index.d != dim:
        raise _fail(path, f"holds {index.ntotal} vectors of {index.d} dims, expected {count} of {dim}")
    return index


def _load_ann(directory: Path, manifest: dict, count: int, dim: int) -> tuple[faiss.Index | None, np.ndarray | None]:
    """-> (the graph of an hnsw first stage or the lists of an ivf one, searched beside the exact rows, the
    graph's node -> row map or None)."""
    if ivf_engine.is_ivf(manifest["first_stage"]):
        path = directory / ivf_engine.ANN_FILE
        try:
            return ivf_engine.read_ivf(path, count, dim, ivf_engine.IVFConfig.from_dict(manifest["first_stage"])), None
        except (TypeError, ValueError) as exc:
            raise _fail(path, str(exc)) from exc
    path = directory / hnsw_engine.ANN_FILE
    if not hnsw_engine.is_hnsw(manifest["first_stage"]):
        return None, None
    nodes = None
    if manifest["first_stage"].get("node_rows"):  # folds added rows to the graph and dropped some
        nodes = _load_array(directory / hnsw_engine.NODE_ROWS, "int64", (int(manifest["first_stage"]["nodes"]),))
    try:
        hnsw_engine.HNSWConfig.from_dict(manifest["first_stage"])
        return hnsw_engine.read_ann(path, count if nodes is None else len(nodes), dim), nodes
    except (TypeError, ValueError) as exc:
        raise _fail(path, str(exc)) from exc



def _open_docs(path: Path, count: int) -> DocTable:
    try:
        docs = DocTable(path)
        stored = docs.count()
    except sqlite3.Error as exc:
        raise _fail(path, f"not a readable SQLite document store ({exc})") from exc
    if stored != count:
        raise _fail(path, f"holds {stored} documents, expected {count}")
    return docs


def _load_payload(directory: Path, manifest: dict, count: int) -> Payload:
    schema = manifest.get("fields") or {}
    if not isinstance(schema, dict):
        raise _fail(directory / MANIFEST, "'fields' is not an object of field names and types")
    try:
        return load_payload(directory / PAYLOAD, schema, count)
    except (OSError, ValueError) as exc:
        raise _fail(directory / PAYLOAD, f"unreadable payload columns ({exc})") from exc


def _load_vectors(directory: Path, manifest: dict, count: int, dim: int) -> tuple[faiss.Index, np.ndarray]:
    """-> (the first stage, the (count, dim) rows), both memory-mapped."""
    if manifest["format_version"] == 1:
        return _load_faiss(directory / FIRST_STAGE, count, dim), _load_array(directory / VALUES, "float16", (count, dim))
    dtype = manifest.get("dtypes", {}).get("values", "float16")
    try:
        flat, values = open_vectors(directory / VECTORS, count=count, dim=dim, dtype=dtype)
    except (VectorFileError, ValueError) as exc:
        raise _fail(directory / VECTORS, str(exc)) from exc
    if manifest["first_stage"].get("type") in _OWN_FIRST_STAGE:  # a graph or lists are loaded beside (load_ann)
        return flat, values
    return _load_faiss(directory / FIRST_STAGE, count, dim), values


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
        raise _fail(directory / MANIFEST, f"bad encoder description ({exc})") from exc
    try:
        Prompts.from_dict(manifest.get("prompts"))
    except PromptError as exc:
        raise _fail(directory / MANIFEST, f"bad prompts ({exc})") from exc
    verify_files(directory, manifest, checksums=checksums)
    count, dim, gated = int(manifest["count"]), int(manifest["dim"]), int(manifest["gated_dim"])
    if (dim, gated) != (spec.dim, spec.gated_dim):
        raise _fail(directory / MANIFEST, f"dims {dim}/{gated} disagree with the encoder spec {spec.dim}/{spec.gated_dim}")
    first_stage, values = _load_vectors(directory, manifest, count, dim)
    gates = _load_array(directory / GATES, "uint8", (count, gated)) if gated else None
    index = IndexFiles(
        path=directory, manifest=manifest, spec=spec,
        doc_ids=ids_file.load(directory, count, legacy=manifest["format_version"] < 3),
        values=values, gates=gates,
        faiss=first_stage,
        docs=_open_docs(directory / DOCS, count),
        payload=_load_payload(directory, manifest, count),
    )
    index.ann, index.ann_rows = _load_ann(directory, manifest, count, dim)
    log.info("loaded index %s: %d documents, kind %s, dim %d (gated %d)", index.name, count, spec.kind, dim, gated)
    return index
