"""An index held in Milvus (issue 16): export a built index, and search it as a :class:`VectorStore`.

A collection ``NAME`` holds one entity per index row: ``row`` (INT64 primary key),
``doc_id``, ``title``, ``text``, ``vector`` (FLOAT_VECTOR, the exact float32 values of
the local FlatIP first stage, indexed FLAT with metric IP) and, for gated kinds,
``gates`` (INT16 array). A companion collection ``NAME__meta`` holds the index manifest
and the export's progress as JSON, so that a collection alone is enough to serve
(model identity, λ and dims travel with it; the local directory may be gone).

The same code talks to Milvus Lite (a URI ending in ``.db``), a standalone server and
a cluster (``http://host:19530``). ``pymilvus`` is imported lazily: without the
``[milvus]`` extra only these commands fail, with the install line to run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import EncoderSpec
from densehybrid.index.first_stage import rerank_fetched, score_fetched
from densehybrid.index.fusion import DEFAULT_DENSE_WEIGHT
from densehybrid.index.store import Document, IndexFiles, IndexLoadError, IndexStoreError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'densehybrid[milvus]'"
META_SUFFIX = "__meta"
MANIFEST_KEY = "manifest"
TEXT_MAX = 65_535
ID_MAX = 512
# Milvus caps one search's limit (topk) at 16 384 and one request's size; fetch in slices below both
FETCH_SLICE = 1_000
HEALTH_TIMEOUT_S = 2.0


class MilvusUnavailableError(IndexStoreError):
    """Milvus cannot be reached or answered with an error; the message names the URI and the cause."""


def _pymilvus():
    try:
        import pymilvus
    except ImportError as exc:
        raise IndexStoreError(f"Milvus support is not installed: {INSTALL_HINT}") from exc
    return pymilvus


def connect(uri: str, *, timeout_s: float = 10.0):
    """A ``MilvusClient`` for ``uri``; :class:`MilvusUnavailableError` naming the URI and cause."""
    pymilvus = _pymilvus()
    try:
        client = pymilvus.MilvusClient(uri=uri, timeout=timeout_s)
        client.list_collections()
    except Exception as exc:  # noqa: BLE001 - any client failure is "unreachable", with its cause
        raise MilvusUnavailableError(f"cannot reach Milvus at {uri}: {type(exc).__name__}: {exc}") from exc
    return client


def _call(uri: str, what: str, fn: Callable, *args, **kwargs):
    """Run one client call; connection and server errors become :class:`MilvusUnavailableError`."""
    try:
        return fn(*args, **kwargs)
    except IndexStoreError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise MilvusUnavailableError(f"Milvus at {uri}: {what} failed: {type(exc).__name__}: {exc}") from exc


# -- export ----------------------------------------------------------------------------

def _meta_schema(client, pymilvus):
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("key", pymilvus.DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("json", pymilvus.DataType.VARCHAR, max_length=TEXT_MAX)
    schema.add_field("unused", pymilvus.DataType.FLOAT_VECTOR, dim=2)  # Milvus requires a vector field
    params = client.prepare_index_params()
    params.add_index(field_name="unused", index_type="FLAT", metric_type="IP")
    return schema, params


def _rows_schema(client, pymilvus, dim: int, gated_dim: int):
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("row", pymilvus.DataType.INT64, is_primary=True)
    schema.add_field("doc_id", pymilvus.DataType.VARCHAR, max_length=ID_MAX)
    schema.add_field("title", pymilvus.DataType.VARCHAR, max_length=TEXT_MAX)
    schema.add_field("text", pymilvus.DataType.VARCHAR, max_length=TEXT_MAX)
    schema.add_field("vector", pymilvus.DataType.FLOAT_VECTOR, dim=dim)
    if gated_dim:
        schema.add_field("gates", pymilvus.DataType.ARRAY, element_type=pymilvus.DataType.INT16, max_capacity=gated_dim)
    params = client.prepare_index_params()
    params.add_index(field_name="vector", index_type="FLAT", metric_type="IP")
    return schema, params


def _read_meta(client, uri: str, collection: str) -> dict | None:
    meta = collection + META_SUFFIX
    if not _call(uri, "has_collection", client.has_collection, meta):
        return None
    _call(uri, "load_collection", client.load_collection, meta)
    got = _call(uri, "get", client.get, meta, ids=[MANIFEST_KEY], output_fields=["json"])
    return json.loads(got[0]["json"]) if got else None


def _write_meta(client, uri: str, collection: str, record: dict) -> None:
    _call(uri, "upsert", client.upsert, collection + META_SUFFIX,
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
    out = []
    for offset, (doc, vector) in enumerate(zip(docs, vectors)):
        row = start + offset
        entity = {"row": row, "doc_id": index.doc_ids[row], "title": doc.title if doc else "",
                  "text": doc.text if doc else "", "vector": vector.tolist()}
        if index.gates is not None:
            entity["gates"] = [int(g) for g in index.gates[row]]
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
        raise IndexStoreError(f"{index.path}: export needs the exact flat_ip first stage (this index has "
                              f"{index.manifest['first_stage']}); build without --pq")
    pymilvus = _pymilvus()
    client = client or connect(uri)
    source = _source_identity(index)
    record = _read_meta(client, uri, collection)
    if record is not None and record.get("source") != source:
        raise IndexStoreError(f"collection {collection!r} at {uri} holds another index ({record['manifest']['name']!r}); "
                              "drop it or choose another --collection")
    if record is None:
        for name, (schema, params) in ((collection + META_SUFFIX, _meta_schema(client, pymilvus)),
                                       (collection, _rows_schema(client, pymilvus, index.spec.dim, index.spec.gated_dim))):
            if _call(uri, "has_collection", client.has_collection, name):
                _call(uri, "drop_collection", client.drop_collection, name)  # left by an export killed at creation
            # Strong: a reader (a resumed export, a server starting) sees every finished write
            _call(uri, "create_collection", client.create_collection, name, schema=schema, index_params=params,
                  consistency_level="Strong")
        record = {"manifest": index.manifest, "source": source, "exported": 0, "complete": False}
        _write_meta(client, uri, collection, record)
    resumed_from = done = int(record["exported"])
    batches = 0
    while done < index.count:
        stop = min(index.count, done + batch_size)
        _call(uri, "upsert", client.upsert, collection, _entities(index, done, stop))
        batches += 1
        if progress is not None:
            progress(stop - done)
        done = stop
        record["exported"] = done
        _write_meta(client, uri, collection, record)
    _call(uri, "flush", client.flush, collection)
    record["complete"] = True
    _write_meta(client, uri, collection, record)
    log.info("exported %s to %s/%s: %d rows (resumed from %d)", index.name, uri, collection, done, resumed_from)
    return ExportReport(collection, done, resumed_from, batches)


# -- serving -------------------------------------------------------------------------

class MilvusStore:
    """The :class:`~densehybrid.index.first_stage.VectorStore` of a collection: FLAT/IP search, rerank on fetched vectors."""

    def __init__(self, client, uri: str, collection: str, dim: int, gated_dim: int):
        self.client, self.uri, self.collection = client, uri, collection
        self.dim, self.gated_dim = dim, gated_dim

    def inner_product(self, xq: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        found = _call(self.uri, "search", self.client.search, self.collection, data=[q.tolist() for q in xq],
                      anns_field="vector", limit=depth, search_params={"metric_type": "IP"}, output_fields=["row"])
        scores = np.full((len(xq), depth), -np.inf, dtype=np.float32)
        rows = np.full((len(xq), depth), -1, dtype=np.int64)
        for q, hits in enumerate(found):
            for j, hit in enumerate(hits):
                rows[q, j], scores[q, j] = int(hit["row"]), float(hit["distance"])
        from densehybrid.index import gip

        return gip.sort_by_score(scores, rows, depth)

    def fetch(self, rows: Sequence[int], fields: list[str]) -> dict[int, dict]:
        """{row: entity with ``fields``} for the given rows (missing rows are absent)."""
        unique = sorted({int(r) for r in rows})
        out: dict[int, dict] = {}
        for s in range(0, len(unique), FETCH_SLICE):
            got = _call(self.uri, "get", self.client.get, self.collection, ids=unique[s:s + FETCH_SLICE],
                        output_fields=["row", *fields])
            out.update((int(e["row"]), e) for e in got)
        return out

    def vectors(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(rows (U,), values (U, dim) float16 as the local index stores them, gates (U, G) uint8 or None)."""
        fields = ["vector"] + (["gates"] if self.gated_dim else [])
        entities = self.fetch(rows, fields)
        fetched = np.array(sorted(entities), dtype=np.int64)
        values = np.array([entities[r]["vector"] for r in fetched], dtype=np.float32).reshape(-1, self.dim).astype(np.float16)
        gates = (np.array([entities[r]["gates"] for r in fetched], dtype=np.uint8).reshape(-1, self.gated_dim)
                 if self.gated_dim else None)
        return fetched, values, gates

    def rerank(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        fetched, values, gates = self.vectors(rows[rows >= 0])
        return rerank_fetched(xq, gq, rows, k, fetched, values, gates)

    def score_rows(self, xqs: Sequence[np.ndarray], gq: np.ndarray | None, rows: np.ndarray) -> list[np.ndarray]:
        """Exact GIP of candidate ``rows`` for each of ``xqs``, from one fetch of their vectors."""
        fetched, values, gates = self.vectors(rows[rows >= 0])
        return score_fetched(xqs, gq, rows, fetched, values, gates)

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        entities = self.fetch(rows, ["doc_id"])
        return [entities[int(r)]["doc_id"] for r in rows]

    def healthy(self) -> bool:
        try:
            # bounded: a server that went away must not hold /ready (the client retries otherwise)
            self.client.get_load_state(self.collection, timeout=HEALTH_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - any failure means "not serving now"
            return False
        return True


class MilvusDocs:
    """Passage texts from the collection, with the :class:`~densehybrid.index.store.DocStore` read methods the service uses."""

    def __init__(self, store: MilvusStore):
        self.store = store

    def _by_ids(self, ids: Sequence[str], fields: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        unique = list(dict.fromkeys(ids))
        for s in range(0, len(unique), FETCH_SLICE):
            chunk = unique[s:s + FETCH_SLICE]
            expression = "doc_id in [" + ", ".join(json.dumps(i) for i in chunk) + "]"
            got = _call(self.store.uri, "query", self.store.client.query, self.store.collection,
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


class MilvusIndex:
    """A served collection: what the searcher, the service and the commands read of an index."""

    def __init__(self, uri: str, collection: str, manifest: dict, spec: EncoderSpec, store: MilvusStore):
        self.path = f"{uri}#{collection}"
        self.uri, self.collection = uri, collection
        self.manifest, self.spec = manifest, spec
        self.vector_store = store
        self.docs = MilvusDocs(store)
        self.values = _RowView(store, 0)
        self.gates = _RowView(store, 1) if spec.gated_dim else None

    name = property(lambda self: self.manifest["name"])
    count = property(lambda self: int(self.manifest["count"]))
    lam = property(lambda self: float(self.manifest["lam"]))
    # normalised fusion (index.fusion) works on a collection too: the searcher scores both parts of the
    # candidates from one fetch of their vectors (MilvusStore.score_rows)
    fusion_method = property(lambda self: str(self.manifest.get("fusion", {}).get("method", "lambda")))
    dense_weight = property(lambda self: float(self.manifest.get("fusion", {}).get("dense_weight", DEFAULT_DENSE_WEIGHT)))

    def row_of(self, doc_id: str) -> int | None:
        return self.docs.row_of(doc_id)

    def healthy(self) -> bool:
        return self.vector_store.healthy()


def open_collection(uri: str, collection: str, *, timeout_s: float = 10.0, client=None) -> MilvusIndex:
    """Connect, read the manifest stored with ``collection`` and check the collection against it.

    Raises :class:`MilvusUnavailableError` (cannot connect) or :class:`IndexLoadError`
    (no such collection, unfinished export, dims or row count not those of the manifest).
    """
    client = client or connect(uri, timeout_s=timeout_s)
    where = f"{uri} collection {collection!r}"
    record = _read_meta(client, uri, collection)
    if record is None or not _call(uri, "has_collection", client.has_collection, collection):
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
    described = _call(uri, "describe_collection", client.describe_collection, collection)
    dims = {f["name"]: f.get("params", {}).get("dim") for f in described["fields"]}
    if int(dims.get("vector") or 0) != spec.dim or ("gates" in dims) != bool(spec.gated_dim):
        raise IndexLoadError(f"{where}: vector field of dim {dims.get('vector')} (gates: {'gates' in dims}), "
                             f"the manifest says dim {spec.dim} (gated {spec.gated_dim})")
    _call(uri, "load_collection", client.load_collection, collection)
    stats = _call(uri, "get_collection_stats", client.get_collection_stats, collection)
    if int(stats.get("row_count", -1)) != int(manifest["count"]):
        raise IndexLoadError(f"{where}: holds {stats.get('row_count')} rows, the manifest says {manifest['count']}")
    log.info("opened Milvus collection %s at %s: %s rows, kind %s", collection, uri, manifest["count"], spec.kind)
    return MilvusIndex(uri, collection, manifest, spec, MilvusStore(client, uri, collection, spec.dim, spec.gated_dim))
