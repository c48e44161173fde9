"""The rules ``--fusion auto`` used before, kept only so that the comparison can score them again.

Arrays in, arrays out: each takes the pseudo-queries' gains (W, Q) at each dense weight of
:data:`fusion_choice.WEIGHTS` (:class:`fusion_choice.Evidence`) and returns a weight.

- :func:`paraphrases_alone` (the first rule): the weight nearest ½ whose paraphrase gain is within one
  standard error of the best, within 0.2–0.8; when a part fails the paraphrases (under half the other's
  gain), nearest the other part alone within 0–1.
- :func:`keyword_bounded` (the rule for one release, shaped on msmarco-dl-5k, stdlib, sympy and torch):
  of the weights within 0.2–0.8 that keep the keyword queries within 8 % of their best, the paraphrases'
  favourite; of those the paraphrases cannot tell apart, the one nearest the stronger part; any weight
  when a part fails the paraphrases.
"""

from __future__ import annotations

import numpy as np

from densehybrid.index.building.fusion_choice import (WEIGHTS, nearest_within_error, one_part_fails,
                                                      relative_regret, stronger_end)

BOUNDS = (0.2, 0.8)
PRIOR = 0.5
KEYWORD_LOSS = 0.08


def within_one_error(gains: np.ndarray, prior: float = PRIOR, bounds: tuple[float, float] = (0.0, 1.0)) -> float:
    """The weight nearest ``prior`` whose mean gain is within one standard error (of the paired per-query
    difference) of the best's, then clipped to ``bounds``."""
    means = gains.mean(axis=1)
    best = int(np.argmax(means))
    diff = gains[best] - gains
    stderr = diff.std(axis=1, ddof=1) / np.sqrt(gains.shape[1]) if gains.shape[1] > 1 else np.zeros(len(WEIGHTS))
    near = np.flatnonzero(diff.mean(axis=1) <= stderr + 1e-12)
    distance = np.abs(np.asarray(WEIGHTS)[near] - prior)
    pick = float(WEIGHTS[near[np.lexsort((-means[near], distance))[0]]])
    inside = [w for w in WEIGHTS if bounds[0] - 1e-9 <= w <= bounds[1] + 1e-9]
    return min(inside, key=lambda w: abs(w - pick))


def paraphrases_alone(paraphrase: np.ndarray) -> float:
    if not one_part_fails(paraphrase):
        return within_one_error(paraphrase, PRIOR, BOUNDS)
    survivor = 1.0 if paraphrase[-1].mean() > paraphrase[0].mean() else 0.0
    return within_one_error(paraphrase, survivor, (0.0, 1.0))


def keyword_bounded(paraphrase: np.ndarray, keyword: np.ndarray) -> float:
    inside = [i for i, w in enumerate(WEIGHTS) if BOUNDS[0] - 1e-9 <= w <= BOUNDS[1] + 1e-9]
    if one_part_fails(paraphrase):
        allowed = list(range(len(WEIGHTS)))
    else:
        lost = relative_regret(keyword)
        allowed = [i for i in inside if lost[i] <= KEYWORD_LOSS + 1e-12] or [min(inside, key=lambda i: lost[i])]
    return float(WEIGHTS[nearest_within_error(paraphrase, allowed, stronger_end(paraphrase))])
