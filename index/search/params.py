"""The parameters of one search, built once (from a request, a command line or a test) and handed down.

Every layer that searches takes the same object: the service's search batcher (which groups
concurrent searches by it, so it is frozen and hashable), a served index (``index.served.local``,
``index.served.milvus``, ``index.writes.live``), the delta merge and the searcher itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from densehybrid.index.search.filters import Filter

# the breadth of each approximate first stage, by its type: the field of SearchParams (and of a request) that
# sets it, the manifest entry that holds its default, and the knob its recall calibration measures
BREADTH = {"hnsw": "ef_search", "ivf": "nprobe", "pqscan": "margin"}
# every search field a first stage takes: its breadth, and for pqscan the least candidates it rescores
SEARCH_FIELDS = {"hnsw": ("ef_search",), "ivf": ("nprobe",), "pqscan": ("margin", "rescore")}


@dataclass(frozen=True, kw_only=True)
class SearchParams:
    """Hits ``offset`` to ``offset + k`` per query, found with ``candidates`` (K1) first-stage rows.

    ``first_stage``: ``ip`` or ``approx_gip`` (with ``theta``); ``rerank``: exact GIP of the candidates
    (gated kinds); ``lam`` the dense part's weight (None: the index's); ``method`` the fusion of
    ``dhr``/``fusion`` (``index.search.fusion``; None: the index's, or the raw λ sum when ``lam`` is
    given), with ``dense_weight`` and ``rrf_k`` (None: the index's); ``filter`` an
    ``index.search.filters`` node (hashable: equal filters search together); ``ef_search`` the graph
    breadth of an ``hnsw`` first stage, ``nprobe`` the lists a Milvus IVF collection scans, ``margin`` how far below
    the k-th best code score a ``pqscan`` one still rescores and ``rescore`` the least it rescores (None: the
    index's; other first stages ignore them);
    ``row_limit``
    searches rows ``0 .. row_limit - 1`` of the stored index only (None: all): the start-up warm-up's
    search, which must not read every row of a memory-mapped index."""

    k: int = 10
    offset: int = 0
    first_stage: str = "ip"
    candidates: int = 1000
    theta: float = 0.1
    rerank: bool = True
    lam: float | None = None
    method: str | None = None
    dense_weight: float | None = None
    rrf_k: float | None = None
    filter: Filter | None = None
    ef_search: int | None = None
    nprobe: int | None = None
    margin: float | None = None
    rescore: int | None = None
    row_limit: int | None = None

    def but(self, **changes) -> SearchParams:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)
