"""Which ``zscore`` dense weight suits a collection, judged on pseudo-queries with a known answer.

Arrays in, arrays out. Each pseudo-query (Q of them) has one matching passage, the ``source``
column of its row in the part scores (Q, P) against a pool of P passages. Every candidate weight
``w`` mixes the parts as a search does (:func:`densehybrid.index.search.fusion.fuse`, ``zscore``
over the union of each part's own top ``depth``) and is scored by the nDCG@10 of the one source
(``1 / log2(1 + rank)`` within the top 10, else 0).

Two styles of pseudo-query bracket the users' queries, whose style the corpus cannot tell: a
*keyword* query (a window of the passage's own words, the passage its answer: every word matches, so
the lexical part looks as strong as it can) and a *paraphrase* (a sentence cut out of its passage:
no word is left to match verbatim, so the lexical part looks as weak as it can). The rule
(:func:`style_choice`) takes the weight whose worse relative regret over the two styles is the
smallest (:func:`hedged_weight`): the mix that loses least, in shares of each style's best,
whichever style the users' queries are closer to. It stays within ``BOUNDS`` (each part keeps at
least a fifth of the mix).

A part that fails the paraphrases (alone under ``USELESS_SHARE`` of what the other part alone finds,
:func:`one_part_fails`) is dropped unless keeping it is clearly better (:func:`bounded_choice`): the
one-standard-error rule (:func:`choose_weight`) starting from the other part alone, within [0, 1],
keeps a mix only where one beats that part alone by more than a standard error of the paired
per-query difference.
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


def relative_regret(gains: np.ndarray) -> np.ndarray:
    """(W,) the share of the best weight's mean gain that each weight's mean gain falls short of, over
    ``gains`` (W, Q); all 0 when no weight gains anything."""
    means = gains.mean(axis=1)
    best = float(means.max())
    return (best - means) / best if best > 0 else np.zeros_like(means)


def hedged_weight(styles: tuple[np.ndarray, ...], weights: tuple[float, ...] = WEIGHTS,
                  prior: float = fusion.DEFAULT_DENSE_WEIGHT, bounds: tuple[float, float] = BOUNDS) -> float:
    """The weight within ``bounds`` whose largest :func:`relative_regret` over ``styles`` (each (W, Q),
    its own queries) is the smallest; of equal ones, the nearest ``prior``."""
    worst = np.max([relative_regret(g) for g in styles], axis=0)
    inside = [i for i, w in enumerate(weights) if bounds[0] - 1e-9 <= w <= bounds[1] + 1e-9]
    return float(weights[min(inside, key=lambda i: (round(float(worst[i]), 12), abs(weights[i] - prior)))])


def style_choice(paraphrase: np.ndarray, keyword: np.ndarray, weights: tuple[float, ...] = WEIGHTS
                 ) -> tuple[float, tuple[float, float], str]:
    """(weight, bounds, rule) from the gains (W, Q) of the paraphrase and the keyword pseudo-queries:
    :func:`hedged_weight` over both within ``BOUNDS``; when a part fails the paraphrases
    (:func:`one_part_fails`), :func:`bounded_choice` on them alone (the failed part is dropped unless
    keeping it is clearly better)."""
    if one_part_fails(paraphrase):
        weight, bounds = bounded_choice(paraphrase, weights)
        return weight, bounds, "a part fails the paraphrases: one standard error from the other part alone"
    return hedged_weight((paraphrase, keyword), weights), BOUNDS, "least worst regret over keyword and paraphrase queries"
