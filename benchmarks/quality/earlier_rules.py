"""The rules ``--fusion auto`` used before, kept only so that the comparison can score them again.

Arrays in, arrays out: each takes the pseudo-queries' gains (W, Q) at each dense weight of
:data:`fusion_choice.WEIGHTS` (:class:`fusion_choice.Evidence`) and returns a weight.

- :func:`paraphrases_alone` (the rule two builds back, "auto before"): the weight nearest ½ whose
  paraphrase gain is within one standard error of the best, within 0.2–0.8; when a part fails the
  paraphrases (under half the other's gain), nearest the other part alone within 0–1.
- :func:`least_worst_regret` ("auto now" until the current rule): the weight within 0.2–0.8 whose larger
  share lost to the best, over the paraphrase and the keyword styles, is the smallest (of equal ones
  the nearest ½); the paraphrase fallback above when a part fails them.
"""

from __future__ import annotations

import numpy as np

from densehybrid.index.building.fusion_choice import WEIGHTS, relative_regret

BOUNDS = (0.2, 0.8)
PRIOR = 0.5
USELESS_SHARE = 0.5


def one_part_fails(gains: np.ndarray, share: float = USELESS_SHARE) -> bool:
    """Whether one part alone (the first and last rows of ``gains``: dense weight 0 and 1) finds less
    than ``share`` of what the other part alone finds, in mean gain."""
    lexical, dense = float(gains[0].mean()), float(gains[-1].mean())
    return min(lexical, dense) < share * max(lexical, dense)


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


def least_worst_regret(paraphrase: np.ndarray, keyword: np.ndarray) -> float:
    if one_part_fails(paraphrase):
        return paraphrases_alone(paraphrase)
    worst = np.max([relative_regret(g) for g in (paraphrase, keyword)], axis=0)
    inside = [i for i, w in enumerate(WEIGHTS) if BOUNDS[0] - 1e-9 <= w <= BOUNDS[1] + 1e-9]
    return float(WEIGHTS[min(inside, key=lambda i: (round(float(worst[i]), 12), abs(WEIGHTS[i] - PRIOR)))])
