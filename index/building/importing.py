"""A Pyserini Faiss index directory -> a published densehybrid index, without re-encoding.

Pyserini's prebuilt dense indexes (e.g. ``msmarco-v1-passage.aggretriever-cocondenser``) are a
directory holding ``index``, a Faiss ``IndexFlatIP`` over the passage vectors, and ``docid``, one
passage id per line in row order. The import reads the vectors through a memory map, checks them
against the query encoder's spec, and writes them once (``index.storage.vectors``): converted to
float16 by default, or, for float32, the source file itself (hard-linked where the file system
allows, else copied). Texts and fields come from an optional BEIR ``corpus.jsonl``.

Everything is written in ``<out>.partial/`` and published by rename: a failed import leaves
nothing at ``out``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from densehybrid.encoder.base import Encoder, EncoderSpec
from densehybrid.encoder.checksums import sha256_file
from densehybrid.index.building import calibrate, calibration_queries, shards
from densehybrid.index.building.calibration import DEFAULT_TARGET
from densehybrid.index.building.build import read_corpus, read_payload
from densehybrid.index.building.first_stage import AnnConfig, write_vectors_and_first_stage
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.served import loading
from densehybrid.index.storage import durable, files
from densehybrid.index.storage.documents import Document, write_docs_at
from densehybrid.index.storage.payload import Payload
from densehybrid.index.storage.vectors import MMAP, VECTORS, VectorFileError, open_vectors

log = logging.getLogger(__name__)

PYSERINI_INDEX, PYSERINI_DOCID = "index", "docid"
_CHUNK_ROWS = 65_536


@dataclass(frozen=True)
class ImportOptions:
    corpus: Path | None = None
    values_dtype: str = "float16"
    ann: AnnConfig | None = None  # an HNSW graph or product codes (index.building.ann, .pqscan), rescored exactly
    name: str | None = None
    overwrite: bool = False
    fields: tuple[str, ...] = ()
    fields_from_metadata: bool = False
    # with ``ann``: the recall@10 its default breadth keeps (None: the breadth given stays, measured all the same),
    # measured on ``calibration_queries``, or sentences cut from the corpus's passages, or stored rows
    target_recall: float | None = DEFAULT_TARGET
    calibration_queries: Path | None = None


@dataclass(frozen=True)
class PyseriniIndex:
    """The source: its flat index file, its (N, dim) float32 rows (a memory map) and ids in row order."""

    directory: Path
    rows: np.ndarray
    doc_ids: list[str]

    @property
    def index_file(self) -> Path:
        return self.directory / PYSERINI_INDEX


def _bad(path: Path, problem: str) -> IndexWriteError:
    return IndexWriteError(f"{path}: {problem}")


def read_pyserini(directory: str | os.PathLike) -> PyseriniIndex:
    """Open a Pyserini Faiss index directory, checking that its two files agree."""
    directory = Path(directory)
    for name in (PYSERINI_INDEX, PYSERINI_DOCID):
        if not (directory / name).is_file():
            raise _bad(directory, f"not a Pyserini Faiss index directory: '{name}' is missing "
                                  f"(expected '{PYSERINI_INDEX}' and '{PYSERINI_DOCID}')")
    try:
        index = faiss.read_index(str(directory / PYSERINI_INDEX), MMAP)
    except RuntimeError as exc:
        raise _bad(directory / PYSERINI_INDEX, f"not a readable Faiss index, truncated or damaged "
                                               f"({str(exc).splitlines()[0]})") from exc
    if type(index) is not faiss.IndexFlatIP:
        raise _bad(directory / PYSERINI_INDEX, f"a {type(index).__name__}; the import reads a flat inner-product "
                                               "index (IndexFlatIP), as Pyserini's prebuilt dense indexes are")
    try:
        _, rows = open_vectors(directory / PYSERINI_INDEX, count=index.ntotal, dim=index.d, dtype="float32")
    except VectorFileError as exc:
        raise _bad(directory / PYSERINI_INDEX, str(exc)) from exc
    doc_ids = _read_docids(directory / PYSERINI_DOCID)
    if len(doc_ids) != len(rows):
        raise _bad(directory, f"'{PYSERINI_DOCID}' lists {len(doc_ids)} ids but '{PYSERINI_INDEX}' holds "
                              f"{len(rows)} vectors (truncated or mismatched files)")
    return PyseriniIndex(directory, rows, doc_ids)


def _read_docids(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        doc_ids = [line.rstrip("\n") for line in f]
    if any(not d.strip() for d in doc_ids):
        raise _bad(path, f"line {next(i for i, d in enumerate(doc_ids) if not d.strip()) + 1} is empty")
    if len(set(doc_ids)) != len(doc_ids):
        raise _bad(path, "holds an id more than once")
    return doc_ids


def check_dims(source: PyseriniIndex, spec: EncoderSpec) -> None:
    """The query encoder must produce what the vectors were made by: same dims, no gated part."""
    dim = source.rows.shape[1]
    if spec.gated_dim:
        raise _bad(source.index_file, f"kind {spec.kind} has a gated part of {spec.gated_dim} dims that a Faiss "
                                      "flat index does not store; import with a dense kind (cls, aggretriever, ...)")
    if dim != spec.dim:
        raise _bad(source.index_file, f"holds vectors of {dim} dims, but the model ({spec.kind}, {spec.model_id}) "
                                      f"gives {spec.dim}; pass the model the vectors were encoded with")


def _source_record(source: PyseriniIndex) -> dict:
    return {"format": "pyserini-faiss", "path": str(source.directory.resolve()), "count": len(source.rows),
            "dim": int(source.rows.shape[1]),
            "imported": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "files": {name: {"bytes": (source.directory / name).stat().st_size,
                             "sha256": sha256_file(source.directory / name)}
                      for name in (PYSERINI_INDEX, PYSERINI_DOCID)}}


def _write_vectors(source: PyseriniIndex, staged: Path, options: ImportOptions) -> dict:
    """The one copy of the vectors: the source file itself for float32, else converted in a stream."""
    if options.values_dtype == "float32":
        try:
            os.link(source.index_file, staged / VECTORS)
        except OSError:
            shutil.copyfile(source.index_file, staged / VECTORS)
        return {"type": "flat_ip"}
    parts = (source.rows[s:s + _CHUNK_ROWS] for s in range(0, len(source.rows), _CHUNK_ROWS))
    # an approximate first stage is built once the texts are staged (its calibration cuts queries from them)
    return write_vectors_and_first_stage(staged, parts, count=len(source.rows), dim=source.rows.shape[1],
                                         values_dtype=options.values_dtype)


def _documents(source: PyseriniIndex, corpus: Path | None) -> Iterator[tuple[int, Document]]:
    """(row, document) pairs: the corpus's texts placed by id, or ids alone without a corpus."""
    if corpus is None:
        yield from ((row, Document(doc_id, "", "")) for row, doc_id in enumerate(source.doc_ids))
        return
    ids = np.asarray(source.doc_ids)
    order = np.argsort(ids, kind="stable")
    seen = np.zeros(len(ids), bool)
    for doc in read_corpus(corpus):
        at = int(np.searchsorted(ids, doc.id, sorter=order))
        row = int(order[at]) if at < len(ids) else -1
        if row < 0 or ids[row] != doc.id:
            raise _bad(corpus, f"passage {doc.id!r} is not among the ids of {source.directory / PYSERINI_DOCID}")
        if seen[row]:
            raise _bad(corpus, f"passage {doc.id!r} occurs more than once")
        seen[row] = True
        yield row, doc
    if not seen.all():
        missing = source.doc_ids[int(np.flatnonzero(~seen)[0])]
        raise _bad(corpus, f"lacks {int((~seen).sum())} of the imported passages (first: {missing!r})")


def _payload(source: PyseriniIndex, options: ImportOptions) -> Payload | None:
    if not (options.fields or options.fields_from_metadata):
        return None
    if options.corpus is None:
        raise IndexWriteError("fields come from the corpus: pass --corpus with --field or --fields-from-metadata")
    payload = read_payload(options.corpus, None if options.fields_from_metadata else options.fields)
    if [doc.id for doc in read_corpus(options.corpus)] != source.doc_ids:
        raise _bad(options.corpus, "fields need the corpus in the order of the docid file")
    return payload


def import_pyserini(directory: str | os.PathLike, out: str | os.PathLike, spec: EncoderSpec,
                    options: ImportOptions = ImportOptions(), *, encoder: Encoder | None = None) -> Path:
    """Publish the Pyserini index at ``directory`` as a densehybrid index at ``out`` for the encoder ``spec``
    (``encoder``, when given, encodes the calibration queries of an approximate first stage; without it the
    calibration searches a sample of the stored rows)."""
    out = Path(out)
    if out.exists() and not options.overwrite:
        raise IndexWriteError(f"{out}: already exists (use --overwrite to replace it)")
    source = read_pyserini(directory)
    check_dims(source, spec)
    work = shards.work_dir(out)
    shutil.rmtree(work, ignore_errors=True)
    staged = work / "index"
    staged.mkdir(parents=True)
    try:
        payload = _payload(source, options)
        first_stage = _write_vectors(source, staged, options)
        files.write_doc_ids(staged, source.doc_ids)
        write_docs_at(staged, _documents(source, options.corpus))
        if options.ann is not None:
            _, values = open_vectors(staged / VECTORS, count=len(source.rows), dim=source.rows.shape[1],
                                     dtype=options.values_dtype)
            queries = calibration_queries.queries_for(encoder, staged, values, file=options.calibration_queries)
            first_stage = calibrate.write_calibrated(values, staged, options.ann, queries, options.target_recall)
        # no fusion entry: a gated (fused) kind cannot be imported
        extra = {"lambda": {"method": "model"}, "source": _source_record(source)}
        if encoder is not None:  # the precision the vectors were stated to be encoded in, which serve expects
            extra["encoding"] = {"backend": encoder.backend, "precision": encoder.precision}
        if payload is not None:
            extra |= payload.write(staged)
        files.write_manifest(staged, name=options.name or out.name, spec=spec, count=len(source.doc_ids), lam=spec.lam,
                             first_stage=first_stage, values_dtype=options.values_dtype, extra=extra)
        loading.load_index(staged)  # the published index opens, or nothing is published
        durable.publish(staged, out, overwrite=options.overwrite)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("imported %d passages of %s into %s", len(source.doc_ids), source.directory, out)
    return out
