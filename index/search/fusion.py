"""How a fused index (``dhr``, ``fusion``) mixes its lexical and dense parts: arrays in, arrays out.

The raw sum ``lexical + λ·dense`` needs a λ that matches the two parts' score scales,
and those scales move with the collection: a λ fitted on one corpus (``lambda_auto``)
does not transfer. The normalised methods remove the scales per query instead:

- ``zscore``: each part's scores over the query's first-stage candidates minus their
  mean, divided by their standard deviation;
- ``minmax``: each part mapped onto [0, 1] over the candidates;

then ``(1 - w)·lexical' + w·dense'`` with a fixed dense weight ``w`` (0.5: no part is
preferred a priori). Both are invariant to multiplying either part by a positive
constant, so nothing has to be fitted per collection. ``lexical`` and ``dense`` rank
by one part alone (for comparisons); ``lambda`` is the raw sum.

``adaptive`` is ``zscore`` with the dense weight chosen per query, from the scores alone
(no labels): a part whose best candidates stand clear of the rest of its head is trusted
more than one whose head is flat (:func:`head_confidence`, :func:`adaptive_weight`).

``auto`` is the mix the index chose from its own corpus at build (``index.building.fusion_choice``):
``zscore`` with the dense weight recorded in the manifest. The searcher resolves it before mixing.

``rrf`` (reciprocal-rank fusion) uses only each part's order over the same candidates:
``1 / (k_rrf + rank_lexical) + 1 / (k_rrf + rank_dense)``, ``k_rrf`` 60 by default. Equal scores
share a rank (the best of their positions, :func:`part_ranks`), so a part that cannot tell its
candidates apart (a lexical part with no term in the query) adds the same to each of them and the
other part decides alone.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

FusionMethod = Literal["auto", "lambda", "zscore", "minmax", "adaptive", "rrf", "lexical", "dense"]
FUSION_METHODS: tuple[str, ...] = get_args(FusionMethod)
# methods that normalise both parts' exact scores over candidates taken from each part
NORMALISED_METHODS: tuple[str, ...] = ("zscore", "minmax", "adaptive")
# methods whose score of a row depends on the query's other candidates (taken from each part)
PER_QUERY_METHODS: tuple[str, ...] = NORMALISED_METHODS + ("rrf",)
DEFAULT_METHOD = "auto"  # of new builds; the searcher resolves it to the mix the build chose
DEFAULT_DENSE_WEIGHT = 0.5
DEFAULT_RRF_K = 60  # as in Cormack, Clarke and Büttcher (2009), and the default of OpenSearch and Elasticsearch
# head_confidence: the top ``HEAD_TOP`` against the top ``HEAD_DEPTH`` of a part's candidates
HEAD_TOP = 10
HEAD_DEPTH = 100


def normalise(scores: np.ndarray, method: str, valid: np.ndarray | None = None) -> np.ndarray:
    """Per row (query) of ``scores`` (Q, K): z-score or min-max over the ``valid`` cells (all if None).

    A row whose valid scores are all equal maps to 0 (the part then cannot reorder it).
    Invalid cells come back as 0. -> (Q, K) float64.
    """
    scores = np.asarray(scores, dtype=np.float64)
    valid = np.ones(scores.shape, dtype=bool) if valid is None else valid
    count = np.maximum(valid.sum(axis=1, keepdims=True), 1)
    masked = np.where(valid, scores, 0.0)
    if method == "zscore":
        centre = masked.sum(axis=1, keepdims=True) / count
        spread = np.sqrt((np.where(valid, scores - centre, 0.0) ** 2).sum(axis=1, keepdims=True) / count)
    elif method == "minmax":
        centre = np.where(valid, scores, np.inf).min(axis=1, keepdims=True)
        spread = np.where(valid, scores, -np.inf).max(axis=1, keepdims=True) - centre
        centre = np.where(np.isfinite(centre), centre, 0.0)
        spread = np.where(np.isfinite(spread), spread, 0.0)
    else:
        raise ValueError(f"unknown normalisation {method!r}; use one of {', '.join(NORMALISED_METHODS)}")
    # relative threshold: float32 rounding noise in a constant row must not be blown up to unit spread
    flat = spread <= 1e-6 * np.maximum(np.abs(centre), 1e-30)
    out = np.where(flat, 0.0, (scores - centre) / np.where(flat, 1.0, spread))
    return np.where(valid, out, 0.0)


def head_confidence(scores: np.ndarray, valid: np.ndarray | None = None, *, top: int = HEAD_TOP,
                    depth: int = HEAD_DEPTH) -> np.ndarray:
    """How clearly a part separates its best candidates, per query: ``(s_1 - s_top) / (s_1 - s_depth)``.

    ``scores`` (Q, K) one part's scores over the query's candidates, ``valid`` (Q, K) the real ones;
    ``s_i`` is the i-th largest valid score (``top`` and ``depth`` capped at the valid count). The share
    of the head's range used up within the first ``top``: near 1 when a few candidates stand far above
    the rest, near 0 when the head is flat. Unchanged by any positive scale and shift of the part.
    A row with a flat head (or one valid cell) gets 0. -> (Q,) float64 in [0, 1].
    """
    scores = np.asarray(scores, dtype=np.float64)
    valid = np.ones(scores.shape, dtype=bool) if valid is None else valid
    ranked = -np.sort(-np.where(valid, scores, -np.inf), axis=1)  # descending, padding last
    count = valid.sum(axis=1)
    rows = np.arange(len(scores))
    first = ranked[rows, 0]
    at_top = ranked[rows, np.clip(np.minimum(top, count) - 1, 0, None)]
    at_depth = ranked[rows, np.clip(np.minimum(depth, count) - 1, 0, None)]
    span = first - at_depth
    flat = ~(span > 1e-6 * np.maximum(np.abs(first), 1e-30))  # also catches rows with no valid cell
    return np.where(flat, 0.0, (first - at_top) / np.where(flat, 1.0, span))


def adaptive_weight(lexical: np.ndarray, dense: np.ndarray, valid: np.ndarray | None = None,
                    prior: float = DEFAULT_DENSE_WEIGHT) -> np.ndarray:
    """Per-query dense weight (Q,) in [0, 1]: the ``prior`` weight tilted by each part's head confidence.

    ``w = prior·c_dense / (prior·c_dense + (1 - prior)·c_lexical)`` with ``c`` from
    :func:`head_confidence` over the same (Q, K) candidates; ``prior`` where both are 0.
    """
    c_lex = head_confidence(lexical, valid)
    c_dense = head_confidence(dense, valid)
    num, den = prior * c_dense, prior * c_dense + (1.0 - prior) * c_lex
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), prior)


def part_ranks(scores: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """Per row (query) of ``scores`` (Q, K): each cell's rank among the row's ``valid`` cells, 1 = best.

    Equal scores share the best rank of their group (1, 2, 2, 4: "competition" ranking), so the
    rank never depends on the order the candidates arrive in. Invalid cells get rank 0. -> (Q, K) int64.
    """
    scores = np.asarray(scores, dtype=np.float64)
    valid = np.ones(scores.shape, dtype=bool) if valid is None else valid
    ascending = np.sort(np.where(valid, scores, -np.inf), axis=1)
    ranks = np.zeros(scores.shape, dtype=np.int64)
    for q in range(len(scores)):
        # 1 + how many valid cells score strictly more (padding, at -inf, never does)
        above = scores.shape[1] - np.searchsorted(ascending[q], scores[q], side="right")
        ranks[q] = np.where(valid[q], 1 + above, 0)
    return ranks


def reciprocal_rank(lexical: np.ndarray, dense: np.ndarray, valid: np.ndarray | None = None,
                    rrf_k: float = DEFAULT_RRF_K) -> np.ndarray:
    """``1 / (rrf_k + rank_lexical) + 1 / (rrf_k + rank_dense)`` per cell, ranks by :func:`part_ranks`
    over the same (Q, K) candidates. -> (Q, K) float64 (invalid cells 0)."""
    if not (np.isfinite(rrf_k) and rrf_k >= 0):
        raise ValueError(f"rrf k must be a finite number >= 0, got {rrf_k}")
    valid = np.ones(np.shape(lexical), dtype=bool) if valid is None else valid
    total = np.zeros(np.shape(lexical), dtype=np.float64)
    for part in (lexical, dense):
        total += 1.0 / (rrf_k + np.maximum(part_ranks(part, valid), 1))
    return np.where(valid, total, 0.0)


def fuse(lexical: np.ndarray, dense: np.ndarray, method: str, *, lam: float = 1.0,
         dense_weight: float = DEFAULT_DENSE_WEIGHT, rrf_k: float = DEFAULT_RRF_K,
         valid: np.ndarray | None = None) -> np.ndarray:
    """Fused scores (Q, K) float32 of the two parts' raw scores (Q, K) over the same candidates.

    ``lam`` is used by ``lambda`` only (lexical + λ·dense); ``dense_weight`` in [0, 1] by the
    normalised methods (for ``adaptive`` the prior of the per-query weight); ``rrf_k`` by ``rrf``.
    ``valid`` (Q, K) marks real candidates (padding is excluded from the normalisation statistics
    and the ranks, and scores -inf).
    """
    if method == "rrf":
        fused = reciprocal_rank(lexical, dense, valid, rrf_k)
    elif method == "lambda":
        fused = np.asarray(lexical, dtype=np.float64) + lam * np.asarray(dense, dtype=np.float64)
    elif method in ("lexical", "dense"):
        fused = np.asarray(lexical if method == "lexical" else dense, dtype=np.float64)
    elif method in NORMALISED_METHODS:
        if not 0.0 <= dense_weight <= 1.0:
            raise ValueError(f"dense weight must be in [0, 1], got {dense_weight}")
        weight = dense_weight
        if method == "adaptive":  # z-scores, the weight per query (the given one is its prior)
            weight = adaptive_weight(lexical, dense, valid, dense_weight)[:, None]
            method = "zscore"
        fused = (1.0 - weight) * normalise(lexical, method, valid) + weight * normalise(dense, method, valid)
    elif method == "auto":
        raise ValueError("fusion 'auto' names the index's chosen mix: resolve it (ServedIndex.auto_mix) first")
    else:
        raise ValueError(f"unknown fusion method {method!r}; use one of {', '.join(FUSION_METHODS)}")
    if valid is not None:
        fused = np.where(valid, fused, -np.inf)
    return fused.astype(np.float32)


def split_query(xq: np.ndarray, gated_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q, dim) query rows -> (lexical-only, dense-only) copies: the other part's dims set to 0."""
    lexical = np.array(xq, dtype=np.float32, copy=True)
    dense = np.array(xq, dtype=np.float32, copy=True)
    lexical[:, gated_dim:] = 0.0
    dense[:, :gated_dim] = 0.0
    return lexical, dense


def union_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per query, the distinct rows of ``a`` (Q, Ka) and ``b`` (Q, Kb) (-1 = none) -> (Q, Ka + Kb) int64,
    ascending, each row once, -1 padding last."""
    both = np.sort(np.concatenate([a, b], axis=1).astype(np.int64), axis=1)
    repeat = np.zeros(both.shape, dtype=bool)
    repeat[:, 1:] = both[:, 1:] == both[:, :-1]
    both = np.where(repeat | (both < 0), np.iinfo(np.int64).max, both)
    both = np.sort(both, axis=1)
    return np.where(both == np.iinfo(np.int64).max, -1, both)
