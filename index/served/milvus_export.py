"""Export a built index to Milvus: one entity per row, and the manifest beside it.

A collection ``NAME`` holds one entity per index row: ``row`` (INT64 primary key),
``doc_id``, ``title``, ``text``, ``vector`` (FLOAT_VECTOR, the exact float32 values of
the local FlatIP first stage, indexed FLAT with metric IP, or Milvus's HNSW when the local
index has an ``hnsw`` first stage) and, for gated kinds,
``gates`` (INT16 array). A companion collection ``NAME__meta`` holds the index manifest
and the export's progress as JSON, so that a collection alone is enough to serve
(model identity, λ and dims travel with it; the local directory may be gone). An export
that stops part way resumes where it stopped. Serving the collection: ``index.served.milvus``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from densehybrid.index.search import filters
from densehybrid.index.storage import payload
from densehybrid.index.engines.milvus_engine import call, connect, load_pymilvus, vector_index
from densehybrid.index.errors import IndexAccessError
from densehybrid.index.served.local import IndexFiles

log = logging.getLogger(__name__)

META_SUFFIX = "__meta"
MANIFEST_KEY = "manifest"
TEXT_MAX = 65_535
ID_MAX = 512
KEYWORD_BYTES = 4 * payload.MAX_KEYWORD_CHARS  # VARCHAR lengths are in bytes; UTF-8 takes up to 4 a character
CALL_TIMEOUT_S = 120.0  # one batch's upsert, or the last flush, on a busy server; a server that stopped answering fails the export


def _meta_schema(client, pymilvus):
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("key", pymilvus.DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("json", pymilvus.DataType.VARCHAR, max_length=TEXT_MAX)
    schema.add_field("unused", pymilvus.DataType.FLOAT_VECTOR, dim=2)  # Milvus requires a vector field
    params = client.prepare_index_params()
    params.add_index(field_name="unused", index_type="FLAT", metric_type="IP")
    return schema, params


def _add_payload_fields(schema, pymilvus, field_types: dict[str, str], list_capacity: int) -> None:
    """A typed scalar field per payload field, and a BOOL saying whether the row has a value (Milvus
    has no absent value for every type, so an absent one is stored as the type's zero and ``has_`` false)."""
    t = pymilvus.DataType
    for name, kind in field_types.items():
        column = filters.milvus_field(name)
        if kind == "keyword":
            schema.add_field(column, t.VARCHAR, max_length=KEYWORD_BYTES)
        elif kind == "keyword_list":
            schema.add_field(column, t.ARRAY, element_type=t.VARCHAR, max_capacity=max(1, list_capacity),
                             max_length=KEYWORD_BYTES)
        else:
            schema.add_field(column, {"integer": t.INT64, "float": t.DOUBLE, "bool": t.BOOL}[kind])
        schema.add_field(filters.milvus_present(name), t.BOOL)


_ZERO = {"keyword": "", "keyword_list": [], "integer": 0, "float": 0.0, "bool": False}


def _list_capacity(index: IndexFiles) -> int:
    """The longest keyword list of the index (a Milvus ARRAY field declares its capacity)."""
    return max((int(np.diff(c.offsets).max(initial=0)) for c in index.payload.columns.values()
                if c.kind == "keyword_list"), default=0)


def _rows_schema(client, pymilvus, dim: int, gated_dim: int, field_types: dict[str, str] | None = None,
                 list_capacity: int = 0, first_stage: dict | None = None):
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("row", pymilvus.DataType.INT64, is_primary=True)
    schema.add_field("doc_id", pymilvus.DataType.VARCHAR, max_length=ID_MAX)
    schema.add_field("title", pymilvus.DataType.VARCHAR, max_length=TEXT_MAX)
    schema.add_field("text", pymilvus.DataType.VARCHAR, max_length=TEXT_MAX)
    schema.add_field("vector", pymilvus.DataType.FLOAT_VECTOR, dim=dim)
    if gated_dim:
        schema.add_field("gates", pymilvus.DataType.ARRAY, element_type=pymilvus.DataType.INT16, max_capacity=gated_dim)
    _add_payload_fields(schema, pymilvus, field_types or {}, list_capacity)
    params = client.prepare_index_params()
    params.add_index(field_name="vector", **vector_index(first_stage or {}))
    return schema, params


def read_meta(client, uri: str, collection: str) -> dict | None:
    meta = collection + META_SUFFIX
    if not call(uri, "has_collection", client.has_collection, meta):
        return None
    call(uri, "load_collection", client.load_collection, meta)
    got = call(uri, "get", client.get, meta, ids=[MANIFEST_KEY], output_fields=["json"])
    return json.loads(got[0]["json"]) if got else None


def write_meta(client, uri: str, collection: str, record: dict) -> None:
    call(uri, "upsert", client.upsert, collection + META_SUFFIX,
          [{"key": MANIFEST_KEY, "json": json.dumps(record, sort_keys=True), "unused": [0.0, 0.0]}])


def _entities(index: IndexFiles, start: int, stop: int) -> list[dict]:
    vectors = np.asarray(index.values[start:stop], dtype=np.float32)  # the exact rows the flat first stage scores
    docs = index.docs.get_many(index.doc_ids[start:stop])
    field_types = index.field_types
    payload = index.field_values(range(start, stop), list(field_types)) if field_types else [{}] * (stop - start)
    out = []
    for offset, (doc, vector, fields) in enumerate(zip(docs, vectors, payload)):
        row = start + offset
        entity = {"row": row, "doc_id": index.doc_ids[row], "title": doc.title if doc else "",
                  "text": doc.text if doc else "", "vector": vector.tolist()}
        if index.gates is not None:
            entity["gates"] = [int(g) for g in index.gates[row]]
        for name, kind in field_types.items():
            entity[filters.milvus_field(name)] = fields.get(name, _ZERO[kind])
            entity[filters.milvus_present(name)] = name in fields
        out.append(entity)
    return out


@dataclass
class ExportReport:
    collection: str
    rows: int
    resumed_from: int
    batches: int


def export_index(index: IndexFiles, uri: str, collection: str, *, batch_size: int = 1000,
                 progress: Callable[[int], None] | None = None, client=None) -> ExportReport:
    """Copy a loaded index into ``collection`` at ``uri``: resumable and idempotent.

    Rows are upserted by primary key (the index row), so a re-run never duplicates
    and a crash loses no row: the meta record stores how many rows are known to be in
    and the export continues from there. The record is marked complete last; loading
    refuses a collection whose export has not finished.
    """
    pymilvus = load_pymilvus()
    client = client or connect(uri, call_timeout_s=CALL_TIMEOUT_S)
    # what makes a re-run an export of the same index: its files' checksums
    source = {name: meta["sha256"] for name, meta in sorted(index.manifest["files"].items())}
    record = read_meta(client, uri, collection)
    if record is not None and record.get("source") != source:
        raise IndexAccessError(f"collection {collection!r} at {uri} holds another index ({record['manifest']['name']!r}); "
                              "drop it or choose another --collection")
    if record is None:
        for name, (schema, params) in ((collection + META_SUFFIX, _meta_schema(client, pymilvus)),
                                       (collection, _rows_schema(client, pymilvus, index.spec.dim, index.spec.gated_dim,
                                                                 index.field_types, _list_capacity(index),
                                                                 index.manifest["first_stage"]))):
            if call(uri, "has_collection", client.has_collection, name):
                call(uri, "drop_collection", client.drop_collection, name)  # left by an export killed at creation
            # Strong: a reader (a resumed export, a server starting) sees every finished write
            call(uri, "create_collection", client.create_collection, name, schema=schema, index_params=params,
                  consistency_level="Strong")
        record = {"manifest": index.manifest, "source": source, "exported": 0, "complete": False}
        write_meta(client, uri, collection, record)
    resumed_from = done = int(record["exported"])
    batches = 0
    while done < index.count:
        stop = min(index.count, done + batch_size)
        call(uri, "upsert", client.upsert, collection, _entities(index, done, stop))
        batches += 1
        if progress is not None:
            progress(stop - done)
        done = stop
        record["exported"] = done
        write_meta(client, uri, collection, record)
    call(uri, "flush", client.flush, collection)
    record["complete"] = True
    write_meta(client, uri, collection, record)
    log.info("exported %s to %s/%s: %d rows (resumed from %d)", index.name, uri, collection, done, resumed_from)
    return ExportReport(collection, done, resumed_from, batches)
