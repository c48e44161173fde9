"""Choose how a fused index mixes its parts (``--fusion auto``) from the corpus alone, no judgements.

The evidence (:func:`gather`): pseudo-queries with a known answer cut from a seeded sample of the
passages (:mod:`densehybrid.index.building.pseudo_queries`), of two styles that bracket the users'
queries, whose style the corpus cannot tell:

- *paraphrases*: a sentence (or title, or window) taken out of its passage; the rest, encoded as a
  passage, takes its source's place in the pool, so no word of the query is left there to match
  verbatim and the lexical part looks as weak as it can;
- *keyword* queries: a window of the passage's own words, left in it: every word matches, so the
  lexical part looks as strong as it can.

Each candidate dense weight ``w`` mixes the parts as a search does (:func:`fusion.fuse`, ``zscore`` over
the union of each part's own top ``depth``) and is scored by the nDCG@10 of the one source
(:func:`weight_gains`).

The rule (:func:`pick`):

1. Each weight within ``BOUNDS`` is charged its *worse regret*: the larger, over the two styles, of the
   share of that style's best nDCG@10 it gives up (:func:`worst_regret`). Neither kind of user is
   given up for the other: the weight whose worse regret is least is chosen.
2. Of weights charged alike, the one nearest the stronger part (the one that finds more of the
   paraphrases' answers alone), not the one nearest ½: a weak part mixed in at half lets its noise
   displace the strong part's hits.
3. When a part fails the paraphrases (alone under ``USELESS_SHARE`` of the other alone), the bounds
   go: of the weights within one standard error (of the paired per-query difference) of the
   paraphrases' best, the one nearest the other part alone.

Its *confidence* (:func:`choose_weight`) is the share of bootstrap resamples of the pseudo-queries for
which the rule picks the same weight. The choice, the evidence (:func:`summary`) and the confidence go
into the manifest's ``fusion`` entry (``GET /info`` shows it); searches that ask for no method use it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import Encoder
from densehybrid.encoder.batches import encode_all
from densehybrid.index.building.pseudo_queries import WORDS_PER_TOKEN, cut, keyword_query
from densehybrid.index.search import fusion, gip
from densehybrid.index.storage.documents import Document

log = logging.getLogger(__name__)

WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))  # 0 = lexical alone ... 1 = dense alone
CUTOFF = 10
BOUNDS = (0.2, 0.8)  # each part keeps a fifth of the mix at least, unless a part fails
# a part alone under this share of the other alone on the paraphrases has failed on the corpus
USELESS_SHARE = 0.5
RESAMPLES = 200


@dataclass(frozen=True)
class AutoFusionConfig:
    pool: int = 1000
    queries: int = 200
    window: int = 8
    seed: int = 0
    # candidates per part at search time: the pool keeps the same share of the collection per part
    candidates: int = 1000
    batch_size: int = 32
    # fewer pseudo-queries than this cannot tell the mixes apart: the equal mix is kept
    min_queries: int = 20


@dataclass(frozen=True)
class Evidence:
    """The gains (W, Q) of each style's pseudo-queries at each of ``WEIGHTS``, and how they were drawn."""

    paraphrase: np.ndarray
    keyword: np.ndarray
    kinds: tuple[str, ...]  # each paraphrase's cut: "sentence", "title" or "window"
    pool: int
    depth: int


def part_scores(xq: np.ndarray, gq: np.ndarray, values: np.ndarray, gates: np.ndarray, rows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Lexical and dense scores (Q, P) of queries against index ``rows`` (P,), unscaled."""
    pool = np.ascontiguousarray(np.broadcast_to(rows, (xq.shape[0], rows.shape[0])))
    lexical_q, dense_q = fusion.split_query(xq, gates.shape[1])
    return gip.score_rows(lexical_q, gq, values, gates, pool), gip.score_rows(dense_q, gq, values, gates, pool)


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


def relative_regret(gains: np.ndarray) -> np.ndarray:
    """(W,) the share of the best weight's mean gain that each weight's mean gain falls short of, over
    ``gains`` (W, Q); all 0 when no weight gains anything."""
    means = gains.mean(axis=1)
    best = float(means.max())
    return (best - means) / best if best > 0 else np.zeros_like(means)


@dataclass(frozen=True)
class Choice:
    weight: float
    confidence: float  # the share of resampled pseudo-query sets that choose the same weight
    reason: str


def stronger_end(paraphrase: np.ndarray) -> float:
    """The dense weight of the part that finds more of the paraphrases' answers alone: 1.0 (dense) or 0.0."""
    return 1.0 if paraphrase[-1].mean() >= paraphrase[0].mean() else 0.0


def one_part_fails(paraphrase: np.ndarray) -> bool:
    """Whether one part alone finds under ``USELESS_SHARE`` of what the other finds alone on the paraphrases."""
    lexical, dense = float(paraphrase[0].mean()), float(paraphrase[-1].mean())
    return min(lexical, dense) < USELESS_SHARE * max(lexical, dense)


def worst_regret(evidence: Evidence) -> np.ndarray:
    """(W,) the larger share of its best mean nDCG@10 that each weight gives up, over the two styles."""
    return np.max([relative_regret(evidence.paraphrase), relative_regret(evidence.keyword)], axis=0)


def allowed_weights(evidence: Evidence) -> list[int]:
    """The indices into ``WEIGHTS`` the rule may choose from: within ``BOUNDS``, or any when a part fails."""
    if one_part_fails(evidence.paraphrase):
        return list(range(len(WEIGHTS)))
    return [i for i, w in enumerate(WEIGHTS) if BOUNDS[0] - 1e-9 <= w <= BOUNDS[1] + 1e-9]


def nearest_within_error(gains: np.ndarray, allowed: list[int], toward: float) -> int:
    """Of ``allowed``, the index whose mean gain is within one standard error (of the paired per-query
    difference) of the best allowed one's, nearest the weight ``toward``."""
    means = gains.mean(axis=1)
    best = max(allowed, key=lambda i: (means[i], -abs(WEIGHTS[i] - toward)))
    diff = gains[best] - gains
    stderr = diff.std(axis=1, ddof=1) / math.sqrt(gains.shape[1]) if gains.shape[1] > 1 else np.zeros(len(WEIGHTS))
    near = [i for i in allowed if diff[i].mean() <= stderr[i] + 1e-12]
    return min(near, key=lambda i: (abs(WEIGHTS[i] - toward), -means[i]))


def pick(evidence: Evidence) -> tuple[float, str]:
    """The rule: within ``BOUNDS``, the weight whose worse regret over the two styles is least, ties
    towards the stronger part; when a part fails the paraphrases, the paraphrases' best nearest the other."""
    toward = stronger_end(evidence.paraphrase)
    part = "dense" if toward == 1.0 else "lexical"
    allowed = allowed_weights(evidence)
    if one_part_fails(evidence.paraphrase):
        chosen = nearest_within_error(evidence.paraphrase, allowed, toward)
        return float(WEIGHTS[chosen]), f"the {'lexical' if toward else 'dense'} part fails the paraphrases: " \
                                       f"their best, nearest the {part} part alone"
    worst = worst_regret(evidence)
    chosen = min(allowed, key=lambda i: (round(float(worst[i]), 12), abs(WEIGHTS[i] - toward)))
    return float(WEIGHTS[chosen]), f"the least worse regret over paraphrase and keyword queries " \
                                   f"({worst[chosen]:.1%}), ties towards the {part} part"


def choose_weight(evidence: Evidence, resamples: int = RESAMPLES, seed: int = 0) -> Choice:
    """:func:`pick` and its confidence: the share of ``resamples`` bootstrap draws of the pseudo-queries
    (each passage's paraphrase and keyword query together) for which it picks the same weight."""
    weight, reason = pick(evidence)
    rng = np.random.default_rng(seed)
    count = evidence.paraphrase.shape[1]
    same = 0
    for _ in range(resamples):
        draw = rng.integers(0, count, count)
        again = Evidence(evidence.paraphrase[:, draw], evidence.keyword[:, draw], evidence.kinds, evidence.pool,
                         evidence.depth)
        same += pick(again)[0] == weight
    return Choice(weight, round(same / resamples, 3) if resamples else 0.0, reason)


def summary(evidence: Evidence) -> dict:
    """The evidence as the manifest records it: each style's nDCG@10 per weight of ``WEIGHTS`` (its ends are
    each part alone), each weight's worse regret and the weights the rule could choose from."""
    return {"paraphrase_ndcg_at_10": _rounded(evidence.paraphrase.mean(axis=1)),
            "keyword_ndcg_at_10": _rounded(evidence.keyword.mean(axis=1)),
            "worst_regret": _rounded(worst_regret(evidence)),
            "allowed": [WEIGHTS[i] for i in allowed_weights(evidence)],
            "stronger_part": "dense" if stronger_end(evidence.paraphrase) else "lexical"}


def gather(encoder: Encoder, docs: Sequence[Document], values: np.ndarray, gates: np.ndarray,
           config: AutoFusionConfig = AutoFusionConfig(), *, query_prompt: str = "",
           passage_prompt: str = "") -> Evidence | None:
    """Both styles' gains on a seeded pool of ``docs`` (row order, stored ``values``/``gates``); None when
    fewer than ``config.min_queries`` passages are long enough for a pseudo-query."""
    rng = np.random.default_rng(config.seed)
    rows = np.sort(rng.choice(len(docs), min(config.pool, len(docs)), replace=False))
    picked, cuts = [], []
    for column in rng.permutation(len(rows)):
        found = cut(docs[rows[column]], config.window, rng)
        if found is not None:
            picked.append(column)
            cuts.append(found)
        if len(picked) == config.queries:
            break
    if len(picked) < config.min_queries:
        return None
    kinds, queries, answers = zip(*cuts)
    source = np.asarray(picked)
    # each part's candidates go as deep into the pool as a search's go into the collection
    depth = max(CUTOFF, min(len(rows), math.ceil(config.candidates * len(rows) / max(len(docs), 1))))
    xq, gq = _queries(encoder, queries, query_prompt)
    answered = encode_all(encoder, [passage_prompt + a for a in answers], "passage", config.batch_size,
                          by_length=True)
    lexical, dense = part_scores(xq, gq, values, gates, rows)
    own = np.arange(len(source))
    own_lexical, own_dense = part_scores(xq, gq, answered.values, answered.gates, own)
    lexical[own, source], dense[own, source] = own_lexical[own, own], own_dense[own, own]
    paraphrase = weight_gains(lexical, dense, source, depth)
    kept = max(2 * config.window, int(WORDS_PER_TOKEN * encoder.spec.max_passage_length))
    keywords = [keyword_query(docs[rows[column]], config.window, kept, rng) for column in picked]
    lexical, dense = part_scores(*_queries(encoder, keywords, query_prompt), values, gates, rows)
    return Evidence(paraphrase, weight_gains(lexical, dense, source, depth), tuple(kinds), int(len(rows)), depth)


def choose(encoder: Encoder, docs: Sequence[Document], values: np.ndarray, gates: np.ndarray,
           config: AutoFusionConfig = AutoFusionConfig(), *, query_prompt: str = "",
           passage_prompt: str = "") -> dict:
    """The ``auto`` record of the manifest's ``fusion`` entry for an index of ``docs`` (row order) with
    passage ``values``/``gates``: the chosen method and dense weight, the evidence and a confidence."""
    start = time.perf_counter()
    evidence = gather(encoder, docs, values, gates, config, query_prompt=query_prompt, passage_prompt=passage_prompt)
    if evidence is None:
        log.warning("auto fusion: under %d passages are long enough for a pseudo-query: the equal zscore mix",
                    config.min_queries)
        return {"method": "zscore", "dense_weight": fusion.DEFAULT_DENSE_WEIGHT, "confidence": 0.0,
                "pseudo_queries": 0, "note": "too few passages long enough for a pseudo-query: the equal mix"}
    choice = choose_weight(evidence)
    seconds = time.perf_counter() - start
    log.info("auto fusion: zscore with dense weight %.1f (confidence %.2f: %s) from %d pseudo-queries of each style"
             " against %d passages (%.1f s)", choice.weight, choice.confidence, choice.reason,
             evidence.paraphrase.shape[1], evidence.pool, seconds)
    return {"method": "zscore", "dense_weight": choice.weight, "confidence": choice.confidence,
            "rule": choice.reason, "pseudo_queries": int(evidence.paraphrase.shape[1]),
            **{f"{kind}s": evidence.kinds.count(kind) for kind in ("title", "sentence", "window")},
            "pool": evidence.pool, "depth": evidence.depth, "window": config.window, "seed": config.seed,
            "weights": list(WEIGHTS), **summary(evidence), "seconds": round(seconds, 2)}


def _queries(encoder: Encoder, texts: Sequence[str], prompt: str) -> tuple[np.ndarray, np.ndarray]:
    encoded = encoder.encode(list(texts), "query", prompt=prompt)
    return encoded.values, encoded.gates


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in values]
