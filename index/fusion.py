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
"""

from __future__ import annotations

from typing import Literal

import numpy as np

FusionMethod = Literal["lambda", "zscore", "minmax", "lexical", "dense"]
FUSION_METHODS: tuple[str, ...] = ("lambda", "zscore", "minmax", "lexical", "dense")
NORMALISED_METHODS: tuple[str, ...] = ("zscore", "minmax")
DEFAULT_METHOD = "zscore"
DEFAULT_DENSE_WEIGHT = 0.5


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


def fuse(lexical: np.ndarray, dense: np.ndarray, method: str, *, lam: float = 1.0,
         dense_weight: float = DEFAULT_DENSE_WEIGHT, valid: np.ndarray | None = None) -> np.ndarray:
    """Fused scores (Q, K) float32 of the two parts' raw scores (Q, K) over the same candidates.

    ``lam`` is used by ``lambda`` only (lexical + λ·dense); ``dense_weight`` in [0, 1] by the
    normalised methods. ``valid`` (Q, K) marks real candidates (padding is excluded from the
    normalisation statistics and scores -inf).
    """
    if method == "lambda":
        fused = np.asarray(lexical, dtype=np.float64) + lam * np.asarray(dense, dtype=np.float64)
    elif method == "lexical":
        fused = np.asarray(lexical, dtype=np.float64)
    elif method == "dense":
        fused = np.asarray(dense, dtype=np.float64)
    elif method in NORMALISED_METHODS:
        if not 0.0 <= dense_weight <= 1.0:
            raise ValueError(f"dense weight must be in [0, 1], got {dense_weight}")
        fused = ((1.0 - dense_weight) * normalise(lexical, method, valid)
                 + dense_weight * normalise(dense, method, valid))
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
