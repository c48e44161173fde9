"""Gated inner product over index rows (DESIGN §2.5-2.6): arrays in, arrays out.

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

# bound on gathered elements per scoring step (Q_chunk * K * dim), ~64 MB of float32
_MAX_GATHER_ELEMENTS = 16_000_000
_ROWS_PER_SCAN_CHUNK = 65_536


def scale_queries(values: np.ndarray, gated_dim: int, lam: float) -> np.ndarray:
    """(Q, dim) -> (Q, dim) float32 copy with the open dims ``[:, gated_dim:]`` times ``lam``."""
    out = np.array(values, dtype=np.float32, copy=True)
    out[:, gated_dim:] *= np.float32(lam)
    return out


def _score_gathered(qv: torch.Tensor, qg: torch.Tensor | None, pv: torch.Tensor, pg: torch.Tensor | None, gated_dim: int) -> torch.Tensor:
    """qv (B, dim), qg (B, G), pv (B, K, dim) float32, pg (B, K, G) -> (B, K) scores."""
    dense = torch.bmm(pv[..., gated_dim:], qv[:, gated_dim:, None]).squeeze(-1)
    if gated_dim == 0:
        return dense
    gated = torch.where(pg == qg[:, None, :], pv[..., :gated_dim], torch.zeros((), dtype=pv.dtype))
    return torch.bmm(gated, qv[:, :gated_dim, None]).squeeze(-1) + dense


def score_rows(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """Exact GIP of each query with its own candidate rows.

    xq (Q, dim) float32 (already λ-scaled), gq (Q, G) uint8 or None,
    values (N, dim) float16/float32 (may be a memory map), gates (N, G) uint8 or None,
    rows (Q, K) int64 of valid row numbers -> (Q, K) float32.
    Distinct rows are gathered once for the whole batch (the gather dominates).
    """
    gated_dim = 0 if gates is None else gates.shape[1]
    q_count, k = rows.shape
    unique, inverse = np.unique(rows, return_inverse=True)
    inverse = torch.from_numpy(inverse.reshape(q_count, k))
    pv_all = torch.from_numpy(np.ascontiguousarray(values[unique])).float()
    pg_all = None if gates is None else torch.from_numpy(np.ascontiguousarray(gates[unique]))
    qv = torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32))
    qg = None if gq is None else torch.from_numpy(np.ascontiguousarray(gq))
    step = max(1, _MAX_GATHER_ELEMENTS // max(1, k * values.shape[1]))
    out = torch.empty(q_count, k, dtype=torch.float32)
    with torch.inference_mode():
        for s in range(0, q_count, step):
            idx = inverse[s:s + step]
            pg = None if pg_all is None else pg_all[idx]
            out[s:s + step] = _score_gathered(qv[s:s + step], None if qg is None else qg[s:s + step], pv_all[idx], pg, gated_dim)
    return out.numpy()


def sort_by_score(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the top ``k`` of (scores, rows) by score descending, ties by row ascending.

    scores (Q, K) float32, rows (Q, K) int64 -> (Q, min(k, K)) each. Rows < 0 (padding) sort last
    with score -inf.
    """
    scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
    order = np.lexsort((np.where(rows < 0, np.iinfo(np.int64).max, rows), -scores.astype(np.float64)), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)


def rerank(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact GIP of the candidate rows (Q, K) (-1 = none), top ``k`` -> (scores, rows) (Q, min(k, K))."""
    valid = rows >= 0
    safe_rows = np.where(valid, rows, 0)
    scores = score_rows(xq, gq, values, gates, safe_rows)
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


def approx_topk(xq: np.ndarray, gq: np.ndarray | None, values: np.ndarray, gates: np.ndarray | None, theta: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Approximate-GIP first stage over the whole index (DESIGN §2.6).

    Only gated query dims with ``q[j] > theta`` take part (each still gated); the open
    ([CLS]/dense) dims always take part. Scans ``values`` in row chunks.
    xq (Q, dim) float32, gq (Q, G) -> (scores, rows) (Q, min(k, N)), sorted as ``sort_by_score``
    (rows tied exactly at the k-th score are kept by ``torch.topk``, deterministically).
    """
    gated_dim = 0 if gates is None else gates.shape[1]
    n = values.shape[0]
    k = min(k, n)
    qv = torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32))
    qg = None if gq is None else torch.from_numpy(np.ascontiguousarray(gq))
    best_scores = torch.full((xq.shape[0], 0), float("-inf"))
    best_rows = torch.zeros((xq.shape[0], 0), dtype=torch.int64)
    with torch.inference_mode():
        for s in range(0, n, _ROWS_PER_SCAN_CHUNK):
            # copies: the index arrays are read-only memory maps
            pv = torch.from_numpy(np.array(values[s:s + _ROWS_PER_SCAN_CHUNK], dtype=np.float32))
            pg = None if gates is None else torch.from_numpy(np.array(gates[s:s + _ROWS_PER_SCAN_CHUNK]))
            chunk = _approx_chunk(qv, qg, pv, pg, theta, gated_dim)
            chunk_rows = torch.arange(s, s + pv.shape[0]).expand(xq.shape[0], -1)
            merged = torch.cat([best_scores, chunk], 1)
            merged_rows = torch.cat([best_rows, chunk_rows], 1)
            top = torch.topk(merged, min(merged.shape[1], k), dim=1, sorted=False)
            best_scores, best_rows = top.values, torch.gather(merged_rows, 1, top.indices)
    return sort_by_score(best_scores.numpy(), best_rows.numpy(), k)
