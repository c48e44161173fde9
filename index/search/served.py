"""What the service and the commands need of a served index, whatever holds its rows.

Three classes serve an index: :class:`~densehybrid.index.served.local.IndexFiles` (a local
directory), :class:`~densehybrid.index.served.milvus.MilvusIndex` (a Milvus collection) and
:class:`~densehybrid.index.writes.live.LiveIndex` (either of those plus the writes since). Each
declares :class:`ServedIndex`; the first two also hand the searcher their vector store
(:class:`StoredIndex`). Callers ask ``remote``/``writable`` instead of probing attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.encoder.prompts import Prompts
from densehybrid.index.search.fusion import DEFAULT_DENSE_WEIGHT, DEFAULT_RRF_K

if TYPE_CHECKING:
    from densehybrid.index.storage.documents import Document
    from densehybrid.index.search.filters import Filter, Selection
    from densehybrid.index.search.params import SearchParams
    from densehybrid.index.search.vector_store import VectorStore


@dataclass
class SearchResults:
    """Per query: ids, scores and index rows, best first; ``timing`` in milliseconds.

    For kinds with a lexical and a dense part (``dhr``, ``fusion``) also each hit's exact part scores
    (the gated GIP of the lexical part, the inner product of the dense part with λ applied); None
    for the other kinds."""

    ids: list[list[str]]
    scores: list[list[float]]
    rows: list[list[int]]
    timing: dict[str, float] = field(default_factory=dict)
    lexical_scores: list[list[float]] | None = None
    dense_scores: list[list[float]] | None = None
    selectivity: float | None = None  # the fraction of rows a filter kept (None: no filter)


class ManifestView:
    """The manifest's fields as typed properties: one implementation for every index class."""

    manifest: dict

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    @property
    def lam(self) -> float:
        """The index's default λ for the dense part of ``dhr``/``fusion`` queries."""
        return float(self.manifest["lam"])

    @property
    def fusion_method(self) -> str:
        """How ``dhr``/``fusion`` searches mix the two parts by default (``index.search.fusion``); indexes
        built before the manifest recorded it use the raw λ sum."""
        return str(self.manifest.get("fusion", {}).get("method", "lambda"))

    @property
    def dense_weight(self) -> float:
        """The dense part's weight in the normalised fusion methods."""
        return float(self.manifest.get("fusion", {}).get("dense_weight", DEFAULT_DENSE_WEIGHT))

    @property
    def auto_mix(self) -> tuple[str, float]:
        """(method, dense weight) that ``auto`` searches with: the mix chosen from the corpus at build
        (``index.building.fusion_choice``); an index that made no such choice: ``zscore`` at its dense weight."""
        chosen = self.manifest.get("fusion", {}).get("auto") or {}
        return str(chosen.get("method", "zscore")), float(chosen.get("dense_weight", self.dense_weight))

    @property
    def prompts(self) -> Prompts:
        """The prompts the index's passages were encoded after, and queries must be (none before they existed)."""
        return Prompts.from_dict(self.manifest.get("prompts"))

    @property
    def rrf_k(self) -> float:
        """The constant ``k`` of reciprocal-rank fusion (``rrf``) when a search gives none."""
        return float(self.manifest.get("fusion", {}).get("rrf_k", DEFAULT_RRF_K))

    @property
    def encoded_precision(self) -> str:
        """The precision the passages were encoded in ("fp32" for indexes that predate the record)."""
        return str((self.manifest.get("encoding") or {}).get("precision", "fp32"))

    @property
    def field_types(self) -> dict[str, str]:
        """The payload fields a filter can name, with their types (``index.storage.payload``); {} for none."""
        return dict(self.manifest.get("fields") or {})


class DocumentLookup:
    """Document lookups through a ``docs`` table and the class's own ``row_of``: one implementation for the
    stored indexes (each finds a row its own way: a dict of ids, or a Milvus query)."""

    docs: object
    row_of: Callable[[str], int | None]

    def contains(self, doc_id: str) -> bool:
        return self.row_of(doc_id) is not None

    def rows_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        return np.array([-1 if (row := self.row_of(i)) is None else row for i in doc_ids], np.int64)

    def get(self, doc_id: str) -> Document | None:
        return self.docs.get(doc_id)

    def get_many(self, ids: Sequence[str]) -> list[Document | None]:
        return self.docs.get_many(ids)


@runtime_checkable
class ServedIndex(Protocol):
    """An index as the service serves it: its description, its documents and search."""

    manifest: dict
    spec: EncoderSpec

    @property
    def name(self) -> str: ...

    @property
    def count(self) -> int: ...

    @property
    def lam(self) -> float: ...

    @property
    def fusion_method(self) -> str: ...

    @property
    def dense_weight(self) -> float: ...

    @property
    def auto_mix(self) -> tuple[str, float]: ...

    @property
    def rrf_k(self) -> float: ...

    @property
    def prompts(self) -> Prompts: ...

    @property
    def encoded_precision(self) -> str:
        """The precision the passages were encoded in (``fp32`` or ``int8``)."""

    @property
    def remote(self) -> bool:
        """Whether the rows live in another service (Milvus), not in this process."""

    @property
    def writable(self) -> bool:
        """Whether ``upsert``/``delete`` are accepted."""

    def get(self, doc_id: str) -> Document | None: ...

    def get_many(self, ids: Sequence[str]) -> list[Document | None]:
        """Documents for ``ids`` in the same order; None for unknown ids."""

    def contains(self, doc_id: str) -> bool: ...

    def row_of(self, doc_id: str) -> int | None: ...

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        """Document ids of index rows, in the given order."""

    def search(self, queries: Encoded, params: SearchParams = ...) -> SearchResults:
        """A page of hits per query, as :meth:`~densehybrid.index.search.searcher.Searcher.search` finds it."""

    def healthy(self) -> bool:
        """Whether the index answers now (a local one always does)."""

    @property
    def field_types(self) -> dict[str, str]: ...

    def field_values(self, rows: Sequence[int], names: Sequence[str]) -> list[dict]:
        """{field: value} of each row for ``names`` (absent fields left out)."""


@runtime_checkable
class StoredIndex(ServedIndex, Protocol):
    """A served index whose rows sit in one vector store (no pending writes): what a searcher searches."""

    values: np.ndarray  # (N, dim): row ``i`` as ``values[i]`` (memory-mapped, or fetched from the store)
    gates: np.ndarray | None  # (N, gated_dim) uint8 for gated kinds, row ``i`` as ``gates[i]``; else None

    @property
    def first_stage_kind(self) -> str:
        """``flat_ip``, ``hnsw``, ``pqscan`` or ``milvus``: which search devices can serve it."""

    def vector_store(self, device: str = "cpu", *, float16: bool | None = None,
                     engine: str | None = None, scan_threads: int = 1) -> VectorStore:
        """The store a searcher on ``device`` scans (``engine`` forces ``faiss`` or ``torch``; ``scan_threads``: the
        threads a pqscan first stage may spread one query's code scan over)."""

    def exact_store(self) -> VectorStore:
        """A store whose ``ip`` first stage scans every row exactly: the reference a measured recall is taken
        against (SearchError where the rows live elsewhere)."""

    def select(self, node: Filter) -> Selection:
        """The rows a filter keeps, in the form this index's store takes (``index.search.filters``)."""

    def rows_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        """(n,) int64: the row of each id, -1 for an id the index does not hold (a write's batch in one lookup)."""
