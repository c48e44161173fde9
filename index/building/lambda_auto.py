"""Choose λ for ``dhr``/``fusion`` from the corpus alone (no judgements).

Lexical GIP scores and dense (cosine-like) scores live on scales that differ by
an order of magnitude or more, and the ratio changes with the collection. The
dense part should move a ranking about as much as the lexical part does, so λ
equalises their *margins*:

1. sample ``pool`` passages of the index (seeded), and from the first
   ``queries`` of them cut a query-like window of ``window`` consecutive words
   at a seeded position (a pseudo-query whose source passage is known);
2. encode the pseudo-queries as queries and score them against the pool with
   the lexical part (GIP over the gated dims) and the dense part (open dims) separately;
3. per pseudo-query and per part, the margin is the source passage's score
   minus the median score over the pool (how far the part lifts a matching
   passage above a typical one);
4. λ = the median over pseudo-queries of lexical margin / dense margin.

Equal margins mean that, near the top of a ranking, a unit of dense evidence
weighs as much as a unit of lexical evidence. The chosen λ and its statistics
are recorded in the index manifest.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import SCALED_KINDS, Encoder
from densehybrid.index.building.fusion_choice import part_scores
from densehybrid.index.building.pseudo_queries import pseudo_query

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoLambdaConfig:
    pool: int = 1000
    queries: int = 200
    window: int = 8
    seed: int = 0


def margin_ratio(lexical: np.ndarray, dense: np.ndarray, source: np.ndarray) -> tuple[float, int]:
    """Median over queries of (lexical margin / dense margin); margins = score at ``source`` column - median.

    lexical, dense (Q, P); source (Q,) column of each query's own passage -> (λ, queries used).
    """
    q = np.arange(lexical.shape[0])
    lex_margin = lexical[q, source] - np.median(lexical, axis=1)
    dense_margin = dense[q, source] - np.median(dense, axis=1)
    usable = (lex_margin > 0) & (dense_margin > 0)
    if not usable.any():
        raise ValueError("no pseudo-query has a positive margin in both parts; cannot choose λ automatically")
    return float(np.median(lex_margin[usable] / dense_margin[usable])), int(usable.sum())


def choose(encoder: Encoder, texts: Sequence[str], values: np.ndarray, gates: np.ndarray | None,
           config: AutoLambdaConfig = AutoLambdaConfig(), *, query_prompt: str = "") -> tuple[float, dict]:
    """λ for an index of ``texts`` (row order) with passage ``values``/``gates``; -> (λ, manifest record).
    The pseudo-queries are encoded as searches encode queries: after ``query_prompt``."""
    spec = encoder.spec
    if spec.kind not in SCALED_KINDS or gates is None:
        return spec.lam, {"method": "model", "note": f"λ is not used by kind {spec.kind}"}
    rng = np.random.default_rng(config.seed)
    rows = np.sort(rng.choice(len(texts), min(config.pool, len(texts)), replace=False))
    picked = rng.permutation(len(rows))[: min(config.queries, len(rows))]
    queries = [pseudo_query(texts[rows[i]], config.window, rng) for i in picked]
    encoded = encoder.encode(queries, "query", prompt=query_prompt)
    lexical, dense = part_scores(encoded.values, encoded.gates, values, gates, rows)
    lam, used = margin_ratio(lexical, dense, picked)
    log.info("auto λ = %.4g from %d pseudo-queries against %d passages", lam, used, len(rows))
    return lam, {"method": "auto-margin", "pool": int(len(rows)), "queries": len(queries), "used": used,
                 "window": config.window, "seed": config.seed}
