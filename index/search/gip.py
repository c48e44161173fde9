"""Gated inner product over index rows (docs/concepts.md): arrays in, arrays out.

Row layout (see ``encoder.base``): ``values (N, dim)`` = ``[gated (G) ; open (dim - G)]``,
``gates (N, G)`` uint8. The score of a query row ``q`` against an index row ``p`` is

    sum_{j < G} q[j] * p[j] * [q.gate[j] == p.gate[j]]  +  sum_{j >= G} q[j] * p[j]

Queries arrive already scaled (λ on their open part, see ``scale_queries``), so
the open part is a plain inner product here. ``G == 0`` is a plain inner product.

Index values may be float16 memory maps; they are upcast to float32 after the
gather. Ties are broken by row number (lower first), so the order of equal
scores never depends on the first stage or on the run.
"""

from __future__ import annotations

import numpy as np
import torch

from densehybrid.index.search.widening import as_float32

# bound on gathered elements per scoring step (rows x columns of a block; capped at 1024 rows in _block_rows)
_MAX_GATHER_ELEMENTS = 16_000_000
_ROWS_PER_SCAN_CHUNK = 65_536


def scale_queries(values: np.ndarray, gated_dim: int, lam: float) -> np.ndarray:
    """(Q, dim) -> (Q, dim) float32 copy with the open dims ``[:, gated_dim:]`` times ``lam``."""
    out = np.array(values, dtype=np.float32, copy=True)
    out[:, gated_dim:] *= np.float32(lam)
    return out


def active_dims(xq: np.ndarray, gated_dim: int) -> tuple[np.ndarray, int]:
    """Columns that can contribute to a score: gated dims where some query is non-zero, then every
    open dim. -> (column numbers, how many of them are gated). A DLR query is sparse, so this
    usually keeps a small fraction of the gated dims, and skipping the rest is exact."""
    gated = np.flatnonzero((xq[:, :gated_dim] != 0).any(axis=0))
    return np.concatenate([gated, np.arange(gated_dim, xq.shape[1])]), len(gated)


def _block_rows(dim: int) -> int:
    """Candidate rows scored per step: ~1024 keeps the float32 copy of a block in L2 cache."""
    return max(1, min(1024, _MAX_GATHER_ELEMENTS // max(1, dim)))


def _sparse_query_block(x: np.ndarray, g: np.ndarray, dims: np.ndarray, values: np.ndarray, gates: np.ndarray, block: np.ndarray) -> np.ndarray:
    """GIP over the gated dims ``dims`` only (the query's non-zero ones): gathers len(block) x len(dims) cells."""
    pv = as_float32(values[block[:, None], dims])
    pv *= gates[block[:, None], dims] == g[dims]
    return pv @ x[dims]


def _dense_query_block(x: torch.Tensor, g: np.ndarray, values: np.ndarray, gates: np.ndarray | None, block: np.ndarray, gated_dim: int) -> np.ndarray:
    """Full score (gated + open dims) of whole candidate rows, gathered once and masked in place."""
    # torch's pool casts here, not ``as_float32`` on the calling thread: a block is large (1,024 rows of 768
    # dims: 40 us on the pool of two threads, 119 us serially) and its product runs on the pool anyway
    pv = torch.from_numpy(values[block]).float()
    if gated_dim:
        pv[:, :gated_dim].mul_(torch.from_numpy(gates[block] == g))
    return (pv @ x).numpy()


def score_rows(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """Exact GIP of each query with its own candidate rows.

    xq (Q, dim) float32 (already λ-scaled), gq (Q, G) uint8 or None,
    values (N, dim) float16/float32 (may be a memory map), gates (N, G) uint8 or None,
    rows (Q, K) int64 of valid row numbers -> (Q, K) float32.

    Candidates are scored in cache-sized blocks of rows gathered once. A query whose
    gated part is sparse (SPLADE-style DLR: most dims exactly 0, which contribute
    nothing) gathers only its non-zero gated dims plus the open part; a dense one
    (DeLADE) gathers whole rows and masks mismatched gates in place.
    """
    gated_dim = 0 if gates is None else gates.shape[1]
    xq = np.ascontiguousarray(xq, dtype=np.float32)
    out = np.empty(rows.shape, dtype=np.float32)
    step = _block_rows(values.shape[1])
    with torch.inference_mode():
        for q in range(rows.shape[0]):
            x, g = xq[q], None if gq is None else np.asarray(gq[q])
            dims = np.flatnonzero(x[:gated_dim])
            sparse = dims.size * 4 < gated_dim
            open_x = x[gated_dim:] if sparse else None
            x_t = None if sparse else torch.from_numpy(x)
            for s in range(0, rows.shape[1], step):
                block = rows[q, s:s + step]
                if not sparse:
                    out[q, s:s + step] = _dense_query_block(x_t, g, values, gates, block, gated_dim)
                    continue
                score = as_float32(values[block, gated_dim:]) @ open_x
                if dims.size:
                    score += _sparse_query_block(x, g, dims, values, gates, block)
                out[q, s:s + step] = score
    return out


# below 1/8 of the candidates kept, select the top k first (linear) and sort only those; a full sort of
# 10,000 candidates for a top 10 took ~1.2 ms, most of an exact rerank's time on a GPU
PARTITION_BELOW = 8


def sort_by_score(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the top ``k`` of (scores, rows) by score descending, ties by row ascending.

    scores (Q, K) float32, rows (Q, K) int64 -> (Q, min(k, K)) each. Rows < 0 (padding) sort last
    with score -inf.
    """
    scores, order = score_order(scores, rows, k)
    return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)


def score_order(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The column order of :func:`sort_by_score` (Q, min(k, K)), for arrays that travel with the scores,
    and the scores as it sorts them (padding at -inf, float32; (Q, K))."""
    scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
    tie_rows = np.where(rows < 0, np.iinfo(np.int64).max, rows)
    kept = min(k, scores.shape[1])
    if kept * PARTITION_BELOW >= scores.shape[1]:
        return scores, np.lexsort((tie_rows, -scores.astype(np.float64)), axis=-1)[:, :kept]
    order = np.empty((scores.shape[0], kept), dtype=np.int64)
    for q in range(scores.shape[0]):  # a few queries per call; each step is O(K) before the small sort
        row = scores[q]
        kth = np.partition(row, row.size - kept)[row.size - kept]  # the k-th best score
        near = np.flatnonzero(row >= kth)  # every column that can make the top k, ties at the cut included
        order[q] = near[np.lexsort((tie_rows[q, near], -row[near].astype(np.float64)))[:kept]]
    return scores, order


def rerank(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact GIP of the candidate rows (Q, K) (-1 = none), top ``k`` -> (scores, rows) (Q, min(k, K))."""
    valid = rows >= 0
    scores = score_rows(xq, gq, values, gates, np.where(valid, rows, 0))
    return sort_by_score(scores, np.where(valid, rows, -1), k)


def exhaustive(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None) -> np.ndarray:
    """Exact GIP of every query with every index row: (Q, dim) -> (Q, N) float32. For tests and small indexes."""
    rows = np.broadcast_to(np.arange(values.shape[0], dtype=np.int64), (xq.shape[0], values.shape[0]))
    return score_rows(xq, gq, values, gates, np.ascontiguousarray(rows))


def _approx_chunk(qv: torch.Tensor, qg: torch.Tensor | None, pv: torch.Tensor, pg: torch.Tensor | None, theta: float, gated_dim: int) -> torch.Tensor:
    """Approximate GIP of all queries against one chunk of rows: -> (Q, C)."""
    scores = (pv[:, gated_dim:] @ qv[:, gated_dim:].T).T.contiguous()
    for i in range(qv.shape[0]):
        dims = torch.nonzero(qv[i, :gated_dim] > theta).squeeze(1)
        if dims.numel():
            match = pg[:, dims] == qg[i, dims]
            scores[i] += torch.where(match, pv[:, dims], torch.zeros((), dtype=pv.dtype)) @ qv[i, dims]
    return scores


def approx_topk(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None, theta: float, k: int,
                mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Approximate-GIP first stage over the whole index (docs/concepts.md).

    Only gated query dims with ``q[j] > theta`` take part (each still gated); the open
    ([CLS]/dense) dims always take part. Scans ``values`` in row chunks.
    xq (Q, dim) float32, gq (Q, G) -> (scores, rows) (Q, min(k, N)), sorted as ``sort_by_score``
    (rows tied exactly at the k-th score are kept by ``torch.topk``, deterministically).
    ``mask`` (N,) bool: only those rows compete (the others score -inf and come back as row -1).
    """
    gated_dim = 0 if gates is None else gates.shape[1]
    n = values.shape[0]
    k = min(k, n)
    # only the columns some query uses (gated dims above θ, every open dim) are read and
    # converted from float16: a few dozen of the gated ones instead of all of them
    cols, used = active_dims(np.where(xq[:, :gated_dim] > theta, 1.0, 0.0), gated_dim) if gated_dim else \
        (np.arange(xq.shape[1]), 0)
    cols = np.concatenate([cols[:used], np.arange(gated_dim, xq.shape[1])])
    qv = torch.from_numpy(np.ascontiguousarray(xq[:, cols], dtype=np.float32))
    qg = None if gq is None else torch.from_numpy(np.ascontiguousarray(gq[:, cols[:used]]))
    best_scores = torch.full((xq.shape[0], 0), float("-inf"))
    best_rows = torch.zeros((xq.shape[0], 0), dtype=torch.int64)
    with torch.inference_mode():
        for s in range(0, n, _ROWS_PER_SCAN_CHUNK):
            # copies: the index arrays are read-only memory maps
            pv = torch.from_numpy(values[s:s + _ROWS_PER_SCAN_CHUNK, cols].astype(np.float32))
            pg = None if gates is None else torch.from_numpy(gates[s:s + _ROWS_PER_SCAN_CHUNK, cols[:used]])
            chunk = _approx_chunk(qv, qg, pv, pg, theta, used)
            if mask is not None:
                chunk.masked_fill_(~torch.from_numpy(np.array(mask[s:s + pv.shape[0]])), float("-inf"))
            chunk_rows = torch.arange(s, s + pv.shape[0]).expand(xq.shape[0], -1)
            merged = torch.cat([best_scores, chunk], 1)
            merged_rows = torch.cat([best_rows, chunk_rows], 1)
            top = torch.topk(merged, min(merged.shape[1], k), dim=1, sorted=False)
            best_scores, best_rows = top.values, torch.gather(merged_rows, 1, top.indices)
    scores = best_scores.numpy()
    return sort_by_score(scores, np.where(np.isneginf(scores), -1, best_rows.numpy()), k)


def hit_part_scores(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each query's hit ``rows`` (Q, K) (-1 = none, scored 0) -> their (gated part, open part) scores,
    (Q, K) float32 each, summed in float64.

    Every hit is summed on its own, in one fixed order, so a row's scores are the same whichever rows
    are asked with it (a BLAS product of a block of rows can differ in the last bit with the block's
    size): a page of hits reports exactly what the longer page holding it reports.
    """
    gated_dim = 0 if gates is None else gates.shape[1]
    lexical = np.zeros(rows.shape, dtype=np.float32)
    dense = np.zeros(rows.shape, dtype=np.float32)
    for q in range(rows.shape[0]):
        keep = rows[q] >= 0
        if not keep.any():
            continue
        hit_rows = rows[q][keep]
        x = np.asarray(xq[q], dtype=np.float64)
        dims = np.flatnonzero(x[:gated_dim])
        if dims.size:
            weights = np.asarray(values[hit_rows[:, None], dims], dtype=np.float64)
            weights *= np.asarray(gates[hit_rows[:, None], dims]) == np.asarray(gq[q])[dims]
            lexical[q, keep] = np.einsum("md,d->m", weights, x[dims])
        open_part = np.asarray(values[hit_rows, gated_dim:], dtype=np.float64)
        dense[q, keep] = np.einsum("md,d->m", open_part, x[gated_dim:])
    return lexical, dense
