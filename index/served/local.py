"""A loaded local index directory as served: memory-mapped rows, a Faiss first stage, SQLite texts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from densehybrid.encoder.base import EncoderSpec
from densehybrid.index.storage.doc_ids import DocIds
from densehybrid.index.storage.documents import DocTable
from densehybrid.index.engines import faiss_engine, hnsw_engine, pqscan_engine
from densehybrid.index.engines.torch_engine import TorchStore, search_devices
from densehybrid.index.search.filters import Filter, Selection, select_rows
from densehybrid.index.storage.payload import Payload
from densehybrid.index.search.searcher import CpuSearch
from densehybrid.index.search.served import DocumentLookup, ManifestView, StoredIndex
from densehybrid.index.search.vector_store import VectorStore


@dataclass(eq=False)
class IndexFiles(CpuSearch, ManifestView, DocumentLookup, StoredIndex):
    """A loaded, verified index (``index.served.loading.load_index``). ``values`` and ``gates`` are read-only memory maps."""

    path: Path
    manifest: dict
    spec: EncoderSpec
    doc_ids: DocIds  # reads like a list of str; the id lookup searches its stored order
    values: np.ndarray
    gates: np.ndarray | None
    faiss: faiss.Index  # the exact flat scan of the stored rows
    docs: DocTable
    payload: Payload  # the filterable field columns (none for an index without fields)
    ann: faiss.Index | None = None  # the approximate first stage (``hnsw_engine``'s graph, ``pqscan_engine``'s codes)
    ann_rows: np.ndarray | None = None  # its node -> row map, once a fold has dropped rows from it

    remote = False
    writable = False  # a published generation never changes; writes go through ``index.writes.live.LiveIndex``

    @property
    def first_stage_kind(self) -> str:
        if self.ann is not None:
            return self.manifest["first_stage"]["type"]  # hnsw or pqscan
        return "flat_ip"

    def rows_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self.doc_ids.rows_of(doc_ids)

    def row_of(self, doc_id: str) -> int | None:
        row = int(self.rows_of([doc_id])[0])
        return None if row < 0 else row

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        return [self.doc_ids[r] for r in rows]

    def healthy(self) -> bool:
        return True

    def select(self, node: Filter) -> Selection:
        """The rows ``node`` keeps (a mask over the payload columns)."""
        return select_rows(node, self.payload)

    def field_values(self, rows: Sequence[int], names: Sequence[str]) -> list[dict]:
        return self.payload.rows(rows, names)

    def exact_store(self) -> VectorStore:
        """Faiss's exact scan of ``vectors.faiss``."""
        return faiss_engine.FaissStore(self.faiss, self.values, self.gates, self.doc_ids)

    def vector_store(self, device: str = "cpu", *, float16: bool | None = None,
                     engine: str | None = None, scan_threads: int = 1) -> VectorStore:
        """Faiss on the CPU (its HNSW graph or product codes when the index has one, the codes' scan of one
        query spread over ``scan_threads``); the exact torch engine on a CUDA device (or on the CPU when asked)."""
        on_gpu = device.startswith("cuda")
        if (engine or ("torch" if on_gpu else "faiss")) == "faiss":
            flat = self.faiss  # the approximate stages' exact scans
            if pqscan_engine.is_pqscan(self.manifest["first_stage"]):
                config = pqscan_engine.PQScanConfig.from_dict(self.manifest["first_stage"])
                scan = pqscan_engine.code_scan(self.ann, scan_threads)
                return pqscan_engine.PQScanStore(scan, self.values, self.gates, self.doc_ids, config.rescore,
                                                 config.margin, flat)
            if self.ann is not None:
                ef_search = hnsw_engine.HNSWConfig.from_dict(self.manifest["first_stage"]).ef_search
                return hnsw_engine.HnswStore(self.ann, self.values, self.gates, self.doc_ids, ef_search,
                                             self.ann_rows, flat)
            return faiss_engine.FaissStore(self.faiss, self.values, self.gates, self.doc_ids)
        half = on_gpu if float16 is None else float16
        return TorchStore(self.values, self.gates, self.doc_ids, search_devices(device), float16=half)
