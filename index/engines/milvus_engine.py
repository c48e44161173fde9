"""The Milvus engine: a client that names its server in every error, and :class:`MilvusStore`.

``pymilvus`` is imported lazily: without the ``[milvus]`` extra only Milvus commands fail,
with the install line to run. The same code talks to Milvus Lite (a URI ending in ``.db``),
a standalone server and a cluster (``http://host:19530``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import numpy as np

from densehybrid.index.search import fusion, gip
from densehybrid.index.errors import IndexAccessError, MilvusUnavailableError, SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.vector_store import VectorStore

INSTALL_HINT = "pip install 'densehybrid[milvus]'"
# Milvus caps one search's limit (topk) at 16 384 and one request's size; fetch in slices below both
FETCH_SLICE = 1_000
HEALTH_TIMEOUT_S = 2.0
# A served collection is complete and takes no writes: its reads need not wait for the server's newest writes.
# Strong consistency (the collection's own level, for the export) costs a server 200-400 ms a call (until its
# next time tick); Bounded about 2 ms. Milvus Lite answers both alike.
READ_CONSISTENCY = "Bounded"


def load_pymilvus():
    try:
        import pymilvus
    except ImportError as exc:
        raise IndexAccessError(f"Milvus support is not installed: {INSTALL_HINT}") from exc
    return pymilvus


class TimedClient:
    """A ``MilvusClient`` whose every call that takes a ``timeout`` gets one (``timeout_s``) unless given.

    The client's own ``timeout`` bounds connecting only: a call without one waits on a server that stopped
    answering (frozen, or its packets dropped) for as long as the connection lasts, holding a search thread."""

    def __init__(self, client, timeout_s: float):
        self._client, self.timeout_s = client, timeout_s

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if not callable(attribute) or "timeout" not in _parameters(attribute):
            return attribute

        @functools.wraps(attribute)
        def bounded(*args, **kwargs):
            kwargs.setdefault("timeout", self.timeout_s)
            return attribute(*args, **kwargs)
        return bounded


def _parameters(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def connect(uri: str, *, timeout_s: float = 10.0, call_timeout_s: float | None = None) -> TimedClient:
    """A client of ``uri`` that connects within ``timeout_s`` and bounds each call by ``call_timeout_s``
    (default: ``timeout_s``); :class:`MilvusUnavailableError` naming the URI and cause."""
    pymilvus = load_pymilvus()
    try:
        client = TimedClient(pymilvus.MilvusClient(uri=uri, timeout=timeout_s), call_timeout_s or timeout_s)
        client.list_collections()
    except Exception as exc:  # noqa: BLE001 - any client failure is "unreachable", with its cause
        raise MilvusUnavailableError(f"cannot reach Milvus at {uri}: {type(exc).__name__}: {exc}") from exc
    return client


def call(uri: str, what: str, fn: Callable, *args, **kwargs):
    """Run one client call; connection and server errors become :class:`MilvusUnavailableError`."""
    try:
        return fn(*args, **kwargs)
    except IndexAccessError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise MilvusUnavailableError(f"Milvus at {uri}: {what} failed: {type(exc).__name__}: {exc}") from exc



def vector_index(first_stage: dict) -> dict:
    """``add_index`` arguments of a collection's vectors for a local index's first stage: Milvus's own HNSW
    with the graph's ``M`` and ``efConstruction`` for an ``hnsw`` index, else FLAT (exact: also for ``pqscan``,
    a scan of every row, which Milvus answers exactly); metric IP. Collections exported with Milvus's IVF
    earlier still serve (:class:`MilvusStore`)."""
    if first_stage.get("type") == "hnsw":
        return {"index_type": "HNSW", "metric_type": "IP",
                "params": {"M": int(first_stage["m"]), "efConstruction": int(first_stage["ef_construction"])}}
    return {"index_type": "FLAT", "metric_type": "IP"}


# -- searching ---------------------------------------------------------------------

class MilvusStore(VectorStore):
    """A collection as a :class:`~densehybrid.index.search.vector_store.VectorStore`: IP search in Milvus (its
    FLAT, HNSW or IVF index, ``index_type``), the exact rerank in numpy on the candidates' vectors, fetched
    once per search. ``ef_search``: an HNSW collection's default breadth (Milvus's ``ef``); ``nprobe``: an
    IVF collection's default lists scanned."""

    def __init__(self, client, uri: str, collection: str, dim: int, gated_dim: int, *, index_type: str = "FLAT",
                 ef_search: int = 128, nprobe: int = 16):
        self.client, self.uri, self.collection = client, uri, collection
        self.dim, self.gated_dim = dim, gated_dim
        self.index_type, self.ef_search, self.nprobe = index_type, ef_search, nprobe
        self.first_stage = ("hnsw" if index_type.startswith("HNSW") else
                            "ivf" if index_type.startswith("IVF") else "flat")

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None, *,
                      ef_search: int | None = None, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        # a filter goes to Milvus as its boolean expression: FLAT search scans the matching rows only
        kept = {} if selection is None else {"filter": selection.expression}
        params = {"metric_type": "IP"}
        if self.first_stage == "hnsw":  # Milvus wants ef >= the limit
            params["params"] = {"ef": max(ef_search or self.ef_search, depth)}
        if self.first_stage == "ivf":
            params["params"] = {"nprobe": nprobe or self.nprobe}
        found = call(self.uri, "search", self.client.search, self.collection, data=[q.tolist() for q in xq],
                      anns_field="vector", limit=depth, search_params=params, output_fields=["row"],
                      consistency_level=READ_CONSISTENCY, **kept)
        scores = np.full((len(xq), depth), -np.inf, dtype=np.float32)
        rows = np.full((len(xq), depth), -1, dtype=np.int64)
        for q, hits in enumerate(found):
            for j, hit in enumerate(hits):
                rows[q, j], scores[q, j] = int(hit["row"]), float(hit["distance"])
        return gip.sort_by_score(scores, rows, depth)

    def fetch(self, rows: Sequence[int], fields: list[str]) -> dict[int, dict]:
        """{row: entity with ``fields``} for the given rows (missing rows are absent)."""
        unique = sorted({int(r) for r in rows})
        out: dict[int, dict] = {}
        for s in range(0, len(unique), FETCH_SLICE):
            got = call(self.uri, "get", self.client.get, self.collection, ids=unique[s:s + FETCH_SLICE],
                        output_fields=["row", *fields], consistency_level=READ_CONSISTENCY)
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

    def approx_gip(self, xq: np.ndarray, gq: np.ndarray | None, theta: float, depth: int,
                   selection: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        raise SearchError("first stage approx_gip needs a local index; a Milvus collection serves ip")

    def part_scores(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Both parts of the candidates from one fetch of their vectors."""
        fetched, values, gates = self.vectors(rows[rows >= 0])
        lexical, dense = score_fetched(list(fusion.split_query(xq, self.gated_dim)), gq, rows, fetched, values, gates)
        return lexical, dense

    def hit_parts(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fetched, values, gates = self.vectors(rows[rows >= 0])
        local = np.where(rows >= 0, np.searchsorted(fetched, np.where(rows >= 0, rows, 0)), -1)  # fetched is sorted
        return gip.hit_part_scores(xq, gq, values, gates, local)

    def ids_of(self, rows: Sequence[int]) -> list[str]:
        entities = self.fetch(rows, ["doc_id"])
        return [entities[int(r)]["doc_id"] for r in rows]

    def count(self, expression: str) -> int:
        """Rows matching a boolean expression."""
        got = call(self.uri, "query", self.client.query, self.collection, filter=expression,
                    output_fields=["count(*)"], consistency_level=READ_CONSISTENCY)
        return int(got[0]["count(*)"])

    def healthy(self) -> bool:
        """Whether a search would be answered now: the server holds the collection loaded and reads a row of it
        within ``HEALTH_TIMEOUT_S``. A restarted server answers before it has loaded the collection again (and
        fails searches meanwhile), and its reads then wait for its clock to move on (tens of seconds after a
        restart). A collection found released is loaded again."""
        try:
            # bounded: a server that went away must not hold /ready (the client retries otherwise)
            state = self.client.get_load_state(self.collection, timeout=HEALTH_TIMEOUT_S)["state"]
            if getattr(state, "name", state) == "NotLoad":
                self.client.load_collection(self.collection, timeout=HEALTH_TIMEOUT_S)  # goes on in the server
                state = self.client.get_load_state(self.collection, timeout=HEALTH_TIMEOUT_S)["state"]
            if getattr(state, "name", state) != "Loaded":
                return False
            self.client.query(self.collection, filter="row >= 0", limit=1, output_fields=["row"],
                              consistency_level=READ_CONSISTENCY, timeout=HEALTH_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - any failure means "not serving now"
            return False
        return True


def rerank_fetched(xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int, fetched_rows: np.ndarray,
                   values: np.ndarray, gates: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gip.rerank` over vectors fetched for ``fetched_rows`` (U,) only, e.g. from a remote store.

    ``values`` (U, dim) and ``gates`` (U, G) are the stored vectors of ``fetched_rows``;
    ``rows`` (Q, K) are index rows (-1 = none), every one of them in ``fetched_rows``.
    """
    valid = rows >= 0
    scores = score_fetched([xq], gq, rows, fetched_rows, values, gates)[0]
    return gip.sort_by_score(scores, np.where(valid, rows, -1), k)


def score_fetched(xqs: Sequence[np.ndarray], gq: np.ndarray | None, rows: np.ndarray, fetched_rows: np.ndarray,
                  values: np.ndarray, gates: np.ndarray | None) -> list[np.ndarray]:
    """:func:`gip.score_rows` for each of ``xqs`` over vectors fetched for ``fetched_rows`` only."""
    order = np.argsort(fetched_rows, kind="stable")
    valid = rows >= 0
    position = np.searchsorted(fetched_rows[order], np.where(valid, rows, fetched_rows.min(initial=0)))
    local = order[np.minimum(position, max(len(order) - 1, 0))] if len(order) else np.zeros_like(rows)
    safe = np.where(valid, local, 0)
    return [gip.score_rows(xq, gq, values, gates, safe) for xq in xqs]
