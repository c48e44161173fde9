"""Which ``zscore`` dense weight suits a collection, judged on pseudo-queries with a known answer.

Arrays in, arrays out. Each pseudo-query (Q of them) has one matching passage, the ``source``
column of its row in the part scores (Q, P) against a pool of P passages. Every candidate weight
``w`` mixes the parts as a search does (:func:`densehybrid.index.search.fusion.fuse`, ``zscore``
over the union of each part's own top ``depth``) and is scored by the nDCG@10 of the one source
(``1 / log2(1 + rank)`` within the top 10, else 0).

The rule (:func:`choose_weight`) keeps the weight of the a-priori equal mix (``prior``, ½) unless the
pseudo-queries show it to be worse: it takes the weight nearest the prior whose mean gain is within
one standard error (of the paired per-query difference) of the best weight's, the "one standard
error" rule of model selection. A part that is much weaker on the collection pulls the best weight,
and so the choice, towards the other part; parts of equal use leave it at the prior.

Pseudo-queries are not the users' queries, so how far they may pull is bounded: the choice stays
within ``BOUNDS`` (each part keeps at least a fifth of the mix) unless one part alone finds less
than ``USELESS_SHARE`` of what the other alone finds (:func:`one_part_fails`). Such a part is
dropped: the rule then starts from the other part alone instead of the equal mix, and keeps a mix
only where one is better by more than a standard error.
"""

from __future__ import annotations

import numpy as np

from densehybrid.index.search import fusion

WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))  # 0 = lexical alone ... 1 = dense alone
CUTOFF = 10
BOUNDS = (0.2, 0.8)
# a part alone below this share of the other part alone's pseudo-query nDCG@10 lifts BOUNDS
USELESS_SHARE = 0.5


def candidates(lexical: np.ndarray, dense: np.ndarray, depth: int) -> np.ndarray:
    """(Q, P) bool: each row's union of the lexical part's and the dense part's top ``depth`` columns."""
    depth = min(depth, lexical.shape[1])
    valid = np.zeros(lexical.shape, dtype=bool)
    rows = np.arange(lexical.shape[0])[:, None]
    for part in (lexical, dense):
        valid[rows, np.argsort(-part, axis=1, kind="stable")[:, :depth]] = True
    return valid


def source_gain(fused: np.ndarray, source: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """nDCG@10 (Q,) of each row's one relevant column ``source`` under ``fused`` (Q, P) over ``valid``.

    Rank = 1 + valid columns scored above the source + half those tied with it (no order of arrival
    decides a tie); a source outside ``valid`` was never a candidate and gains 0.
    """
    q = np.arange(fused.shape[0])
    own = fused[q, source][:, None]
    above = ((fused > own) & valid).sum(axis=1)
    tied = ((fused == own) & valid).sum(axis=1) - 1
    rank = 1.0 + above + 0.5 * np.maximum(tied, 0)
    gain = np.where(rank <= CUTOFF, 1.0 / np.log2(1.0 + rank), 0.0)
    return np.where(valid[q, source], gain, 0.0)


def weight_gains(lexical: np.ndarray, dense: np.ndarray, source: np.ndarray, depth: int,
                 weights: tuple[float, ...] = WEIGHTS) -> np.ndarray:
    """(W, Q) nDCG@10 of each pseudo-query's source under ``zscore`` with each dense weight."""
    valid = candidates(lexical, dense, depth)
    return np.stack([source_gain(fusion.fuse(lexical, dense, "zscore", dense_weight=w, valid=valid), source, valid)
                     for w in weights])


def one_part_fails(gains: np.ndarray, share: float = USELESS_SHARE) -> bool:
    """Whether one part alone (the first and last rows of ``gains`` (W, Q): dense weight 0 and 1)
    finds less than ``share`` of what the other part alone finds, in mean gain."""
    lexical, dense = float(gains[0].mean()), float(gains[-1].mean())
    return min(lexical, dense) < share * max(lexical, dense)


def choose_weight(gains: np.ndarray, weights: tuple[float, ...] = WEIGHTS,
                  prior: float = fusion.DEFAULT_DENSE_WEIGHT,
                  bounds: tuple[float, float] = (0.0, 1.0)) -> float:
    """The weight nearest ``prior`` whose mean gain is within one standard error of the best's.

    ``gains`` (W, Q) per weight and pseudo-query; the standard error is that of the paired
    per-query difference to the best weight (0 differences: only equally good weights qualify).
    The choice is then clipped to ``bounds`` (the nearest weight of ``weights`` inside them).
    """
    means = gains.mean(axis=1)
    best = int(np.argmax(means))
    diff = gains[best] - gains
    stderr = diff.std(axis=1, ddof=1) / np.sqrt(gains.shape[1]) if gains.shape[1] > 1 else np.zeros(len(weights))
    near = np.flatnonzero(diff.mean(axis=1) <= stderr + 1e-12)
    distance = np.abs(np.asarray(weights)[near] - prior)
    # nearest the prior; of two equally near, the better one
    pick = float(weights[near[np.lexsort((-means[near], distance))[0]]])
    low, high = bounds
    inside = [w for w in weights if low - 1e-9 <= w <= high + 1e-9]
    return min(inside, key=lambda w: abs(w - pick))


def bounded_choice(gains: np.ndarray, weights: tuple[float, ...] = WEIGHTS,
                   prior: float = fusion.DEFAULT_DENSE_WEIGHT) -> tuple[float, tuple[float, float]]:
    """(weight, bounds it was chosen within): :func:`choose_weight` within ``BOUNDS``; when
    :func:`one_part_fails`, within [0, 1] and nearest the other part alone instead of ``prior``
    (a mix with the failed part must be clearly better to be kept)."""
    if not one_part_fails(gains):
        return choose_weight(gains, weights, prior, BOUNDS), BOUNDS
    survivor = 1.0 if gains[-1].mean() > gains[0].mean() else 0.0
    return choose_weight(gains, weights, survivor, (0.0, 1.0)), (0.0, 1.0)
