"""An index held in Milvus, served as a :class:`ServedIndex` (its export: ``index.served.milvus_export``).

The collection holds the index's rows and, beside it, its manifest, so that a collection alone is
enough to serve: model identity, λ and dims travel with it.

The client and the vector store are :mod:`densehybrid.index.engines.milvus_engine`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np

from densehybrid.encoder.base import EncoderSpec
from densehybrid.index.search import filters
from densehybrid.index.storage.documents import Document
from densehybrid.index.engines.milvus_engine import FETCH_SLICE, READ_CONSISTENCY, MilvusStore, call, connect
from densehybrid.index.errors import IndexLoadError, SearchError
from densehybrid.index.served.milvus_export import read_meta
from densehybrid.index.search.searcher import CpuSearch
from densehybrid.index.search.served import DocumentLookup, ManifestView, StoredIndex
from densehybrid.index.search.vector_store import VectorStore

log = logging.getLogger(__name__)


class MilvusDocs:
    """Passage texts from the collection, read as ``index.storage.documents.DocTable`` reads a local index's."""

    def __init__(self, store: MilvusStore):
        self.store = store

    def _by_ids(self, ids: Sequence[str], fields: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        unique = list(dict.fromkeys(ids))
        for s in range(0, len(unique), FETCH_SLICE):
            chunk = unique[s:s + FETCH_SLICE]
            expression = "doc_id in [" + ", ".join(json.dumps(i) for i in chunk) + "]"
            got = call(self.store.uri, "query", self.store.client.query, self.store.collection,
                        filter=expression, output_fields=["doc_id", *fields], consistency_level=READ_CONSISTENCY)
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


class MilvusIndex(CpuSearch, ManifestView, DocumentLookup, StoredIndex):
    """A served collection: what the searcher, the service and the commands read of an index."""

    remote = True
    writable = False
    first_stage_kind = "milvus"

    def __init__(self, uri: str, collection: str, manifest: dict, spec: EncoderSpec, store: MilvusStore):
        self.path = f"{uri}#{collection}"
        self.manifest, self.spec = manifest, spec
        self.store = store
        self.docs = MilvusDocs(store)
        self.values = _RowView(store, 0)
        self.gates = _RowView(store, 1) if spec.gated_dim else None

    def row_of(self, doc_id: str) -> int | None:
        return self.docs.row_of(doc_id)

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        return self.store.ids_of(rows)

    def healthy(self) -> bool:
        return self.store.healthy()

    def exact_store(self) -> VectorStore:
        """None here: the rows live in Milvus, and reading every one of them to measure a recall is Milvus's job."""
        raise SearchError("a Milvus collection's recall is not measured here: its rows live in Milvus")

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
                     engine: str | None = None, scan_threads: int = 1) -> VectorStore:
        """The collection itself: Milvus searches, whatever the search device."""
        if engine not in (None, "faiss"):
            raise SearchError(f"the {engine} search engine needs a local index; a Milvus collection searches in Milvus")
        return self.store


def open_collection(uri: str, collection: str, *, timeout_s: float = 10.0, client=None) -> MilvusIndex:
    """Connect, read the manifest stored with ``collection`` and check the collection against it.

    Raises :class:`MilvusUnavailableError` (cannot connect) or :class:`IndexLoadError`
    (no such collection, unfinished export, dims or row count not those of the manifest).
    """
    client = client or connect(uri, timeout_s=timeout_s)
    where = f"{uri} collection {collection!r}"
    record = read_meta(client, uri, collection)
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
    # as long as it takes (a large collection loads for minutes); every other call is bounded by timeout_s
    call(uri, "load_collection", client.load_collection, collection, timeout=None)
    # count(*), not the collection's stats: a server's stats go on counting deleted rows until compaction
    rows = call(uri, "query", client.query, collection, filter="", output_fields=["count(*)"])[0]["count(*)"]
    if int(rows) != int(manifest["count"]):
        raise IndexLoadError(f"{where}: holds {rows} rows, the manifest says {manifest['count']}")
    log.info("opened Milvus collection %s at %s: %s rows, kind %s", collection, uri, manifest["count"], spec.kind)
    described = call(uri, "describe_index", client.describe_index, collection, "vector")
    store = MilvusStore(client, uri, collection, spec.dim, spec.gated_dim, index_type=described["index_type"],
                        ef_search=int(manifest["first_stage"].get("ef_search", 128)),
                        nprobe=int(manifest["first_stage"].get("nprobe", 16)))
    return MilvusIndex(uri, collection, manifest, spec, store)
