"""An index held in Milvus: export a built index, and serve the collection as a :class:`ServedIndex`.

A collection ``NAME`` holds one entity per index row: ``row`` (INT64 primary key),
``doc_id``, ``title``, ``text``, ``vector`` (FLOAT_VECTOR, the exact float32 values of
the local FlatIP first stage, indexed FLAT with metric IP, or HNSW when the local index has an
``hnsw`` first stage) and, for gated kinds,
``gates`` (INT16 array). A companion collection ``NAME__meta`` holds the index manifest
and the export's progress as JSON, so that a collection alone is enough to serve
(model identity, λ and dims travel with it; the local directory may be gone).

The client and the vector store are :mod:`densehybrid.index.engines.milvus_engine`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.index.search import filters
from densehybrid.index.storage import payload
from densehybrid.index.storage.documents import Document
from densehybrid.index.engines.milvus_engine import (FETCH_SLICE, MilvusStore, call, connect, load_pymilvus,
                                                     vector_index)
from densehybrid.index.errors import IndexAccessError, IndexLoadError, SearchError
from densehybrid.index.storage.local import IndexFiles
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.served import DocumentLookup, ManifestView, SearchResults, StoredIndex
from densehybrid.index.search.vector_store import VectorStore

log = logging.getLogger(__name__)

META_SUFFIX = "__meta"
MANIFEST_KEY = "manifest"
TEXT_MAX = 65_535
ID_MAX = 512
KEYWORD_BYTES = 4 * payload.MAX_KEYWORD_CHARS  # VARCHAR lengths are in bytes; UTF-8 takes up to 4 a character


# -- export ----------------------------------------------------------------------------

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
    columns = index.payload.columns if index.payload is not None else {}
    return max((int(np.diff(c.offsets).max(initial=0)) for c in columns.values() if c.kind == "keyword_list"),
               default=0)


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


def _read_meta(client, uri: str, collection: str) -> dict | None:
    meta = collection + META_SUFFIX
    if not call(uri, "has_collection", client.has_collection, meta):
        return None
    call(uri, "load_collection", client.load_collection, meta)
    got = call(uri, "get", client.get, meta, ids=[MANIFEST_KEY], output_fields=["json"])
    return json.loads(got[0]["json"]) if got else None


def _write_meta(client, uri: str, collection: str, record: dict) -> None:
    call(uri, "upsert", client.upsert, collection + META_SUFFIX,
          [{"key": MANIFEST_KEY, "json": json.dumps(record, sort_keys=True), "unused": [0.0, 0.0]}])


def _source_identity(index: IndexFiles) -> dict:
    """What makes a re-run an export of the same index: its files' checksums."""
    return {name: meta["sha256"] for name, meta in sorted(index.manifest["files"].items())}


def _exact_vectors(index: IndexFiles, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the first stage as float32 (the exact vectors the local FlatIP scores)."""
    return np.asarray(index.faiss.reconstruct_n(start, stop - start), dtype=np.float32)


def _entities(index: IndexFiles, start: int, stop: int) -> list[dict]:
    vectors = _exact_vectors(index, start, stop)
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
    if type(index.faiss).__name__ != "IndexFlatIP":
        raise IndexAccessError(f"{index.path}: export needs the exact flat_ip first stage (this index has "
                              f"{index.manifest['first_stage']}); build without --pq")
    pymilvus = load_pymilvus()
    client = client or connect(uri)
    source = _source_identity(index)
    record = _read_meta(client, uri, collection)
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
        _write_meta(client, uri, collection, record)
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
        _write_meta(client, uri, collection, record)
    call(uri, "flush", client.flush, collection)
    record["complete"] = True
    _write_meta(client, uri, collection, record)
    log.info("exported %s to %s/%s: %d rows (resumed from %d)", index.name, uri, collection, done, resumed_from)
    return ExportReport(collection, done, resumed_from, batches)


# -- serving -------------------------------------------------------------------------

class MilvusDocs:
    """Passage texts from the collection, read as ``index.documents.DocTable`` reads a local index's."""

    def __init__(self, store: MilvusStore):
        self.store = store

    def _by_ids(self, ids: Sequence[str], fields: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        unique = list(dict.fromkeys(ids))
        for s in range(0, len(unique), FETCH_SLICE):
            chunk = unique[s:s + FETCH_SLICE]
            expression = "doc_id in [" + ", ".join(json.dumps(i) for i in chunk) + "]"
            got = call(self.store.uri, "query", self.store.client.query, self.store.collection,
                        filter=expression, output_fields=["doc_id", *fields])
            found.update((e["doc_id"], e) for e in got)
        return found

    def get_many(self, ids: Sequence[str]) -> list[Document | None]:
        found = self._by_ids(ids, ["title", "text"])
        return [Document(i, found[i]["title"], found[i]["text"]) if i in found else None for i in ids]

    def get(self, doc_id: str) -> Document | None:
        return self.get_many([doc_id])[0]

    def row_of(self, doc_id: str) -> int | None:
        found = self._by_ids([doc_id], ["row"])
        return int(found[doc_id]["row"]) if doc_id in found else None


class _RowView:
    """``values[row]`` / ``gates[row]`` of single rows, fetched on demand (for /explain)."""

    def __init__(self, store: MilvusStore, which: int):
        self.store, self.which = store, which

    def __getitem__(self, row: int) -> np.ndarray:
        fetched = self.store.vectors([int(row)])
        return fetched[1 + self.which][0]


class MilvusIndex(ManifestView, DocumentLookup, StoredIndex):
    """A served collection: what the searcher, the service and the commands read of an index."""

    remote = True
    writable = False
    first_stage_kind = "milvus"

    def __init__(self, uri: str, collection: str, manifest: dict, spec: EncoderSpec, store: MilvusStore):
        self.path = f"{uri}#{collection}"
        self.uri, self.collection = uri, collection
        self.manifest, self.spec = manifest, spec
        self.store = store
        self.docs = MilvusDocs(store)
        self.values = _RowView(store, 0)
        self.gates = _RowView(store, 1) if spec.gated_dim else None
        self._searcher: Searcher | None = None

    def row_of(self, doc_id: str) -> int | None:
        return self.docs.row_of(doc_id)

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        return self.store.ids_of(rows)

    def healthy(self) -> bool:
        return self.store.healthy()

    def select(self, node: filters.Filter) -> filters.Selection:
        """The filter as a Milvus expression over the exported scalar fields, and how many rows match."""
        expression = filters.to_milvus(node, self.field_types)
        return filters.Selection(self.store.count(expression), self.count, expression=expression)

    def field_values(self, rows: Sequence[int], names: Sequence[str]) -> list[dict]:
        columns = [c for n in names for c in (filters.milvus_field(n), filters.milvus_present(n))]
        entities = self.store.fetch(rows, columns)
        kinds = self.field_types

        def plain(name: str, value):  # the client's array type -> a JSON list
            return [str(v) for v in value] if kinds[name] == "keyword_list" else value

        return [{n: plain(n, entities[int(r)][filters.milvus_field(n)]) for n in names
                 if entities[int(r)][filters.milvus_present(n)]} for r in rows]

    def vector_store(self, device: str = "cpu", *, float16: bool | None = None,
                     engine: str | None = None) -> VectorStore:
        """The collection itself: Milvus searches, whatever the search device."""
        if engine not in (None, "faiss"):
            raise SearchError(f"the {engine} search engine needs a local index; a Milvus collection searches in Milvus")
        return self.store

    def search(self, queries: Encoded, **params) -> SearchResults:
        if self._searcher is None:
            self._searcher = Searcher(self)
        return self._searcher.search(queries, **params)


def open_collection(uri: str, collection: str, *, timeout_s: float = 10.0, client=None) -> MilvusIndex:
    """Connect, read the manifest stored with ``collection`` and check the collection against it.

    Raises :class:`MilvusUnavailableError` (cannot connect) or :class:`IndexLoadError`
    (no such collection, unfinished export, dims or row count not those of the manifest).
    """
    client = client or connect(uri, timeout_s=timeout_s)
    where = f"{uri} collection {collection!r}"
    record = _read_meta(client, uri, collection)
    if record is None or not call(uri, "has_collection", client.has_collection, collection):
        raise IndexLoadError(f"{where}: no such densehybrid collection (export one with `densehybrid index export`)")
    if not record.get("complete"):
        raise IndexLoadError(f"{where}: export unfinished ({record.get('exported')} of {record['manifest']['count']} rows); "
                             "run `densehybrid index export` again to finish it")
    manifest = record["manifest"]
    try:
        spec = EncoderSpec.from_dict(manifest["encoder"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexLoadError(f"{where}: bad encoder description in the stored manifest ({exc})") from exc
    if (int(manifest["dim"]), int(manifest["gated_dim"])) != (spec.dim, spec.gated_dim):
        raise IndexLoadError(f"{where}: manifest dims {manifest['dim']}/{manifest['gated_dim']} disagree with its "
                             f"encoder spec {spec.dim}/{spec.gated_dim}")
    described = call(uri, "describe_collection", client.describe_collection, collection)
    dims = {f["name"]: f.get("params", {}).get("dim") for f in described["fields"]}
    if int(dims.get("vector") or 0) != spec.dim or ("gates" in dims) != bool(spec.gated_dim):
        raise IndexLoadError(f"{where}: vector field of dim {dims.get('vector')} (gates: {'gates' in dims}), "
                             f"the manifest says dim {spec.dim} (gated {spec.gated_dim})")
    call(uri, "load_collection", client.load_collection, collection)
    stats = call(uri, "get_collection_stats", client.get_collection_stats, collection)
    if int(stats.get("row_count", -1)) != int(manifest["count"]):
        raise IndexLoadError(f"{where}: holds {stats.get('row_count')} rows, the manifest says {manifest['count']}")
    log.info("opened Milvus collection %s at %s: %s rows, kind %s", collection, uri, manifest["count"], spec.kind)
    described = call(uri, "describe_index", client.describe_index, collection, "vector")
    store = MilvusStore(client, uri, collection, spec.dim, spec.gated_dim, index_type=described["index_type"],
                        ef_search=int(manifest["first_stage"].get("ef_search", 128)))
    return MilvusIndex(uri, collection, manifest, spec, store)
