"""Choose how a fused index mixes its parts (``--fusion auto``) from the corpus alone, no judgements.

Pseudo-queries with a known answer are cut from a seeded sample of the passages, so that the answer
no longer holds the query's words verbatim (a window left in its passage would favour the lexical
part, which matches words exactly):

- a passage of several sentences gives one of them, and the answer is the passage with that
  sentence taken out (the inverse cloze task at the grain of a sentence: a sentence reads like a
  statement of what the passage is about, where a window of words cut mid-sentence is a bag of the
  passage's own terms, which the lexical part matches in the sentences around it);
- one of a single sentence but with a title gives its title as the query and its text alone as the
  answer;
- one with neither gives a window of ``window`` consecutive words at a seeded position,
  and the answer is the passage with the window taken out.

These are the *paraphrases*. The same passages also give *keyword* queries: a seeded window of
``window`` of their words, left in the passage, which is its answer as the index stores it (every
word matches, so the lexical part looks as strong as it can; the paraphrases make it look as weak).

The answers are encoded as passages and take their source's place in a pool of sampled passages;
the queries are encoded as queries. ``mix_choice`` then scores the ``zscore`` mix at each dense
weight on both styles and keeps the weight that loses least, in share of each style's best, to
whichever style the users' queries turn out closer to; a part that fails the paraphrases is dropped
unless keeping it is clearly better. The choice and its statistics go into the manifest's ``fusion``
entry; searches that ask for no method use it.

``lambda_auto`` (``--lambda auto``) is left as it was: its verbatim windows measure score scales
(the λ of the raw sum), where an exact match is what it needs; this module judges usefulness.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import Encoder
from densehybrid.encoder.batches import encode_all
from densehybrid.index.building import mix_choice
from densehybrid.index.building.lambda_auto import part_scores, pseudo_query
from densehybrid.index.search import fusion
from densehybrid.index.storage.documents import Document

log = logging.getLogger(__name__)

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# a keyword window is drawn from a passage's first words, as many as its encoding surely kept
# (wordpiece English runs at about 1.3 tokens a word)
WORDS_PER_TOKEN = 0.6


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


def sentences(text: str) -> list[str]:
    """``text`` split after each ``.``, ``!`` or ``?`` that a space follows, empty pieces dropped."""
    return [piece for piece in SENTENCE_END.split(text.strip()) if piece.strip()]


def cut(doc: Document, window: int, rng: np.random.Generator, sentence_words: tuple[int, int] = (5, 30)
        ) -> tuple[str, str, str] | None:
    """(kind, query, answer) of one passage, the first that applies:

    - ("sentence", one seeded sentence of ``sentence_words`` words, the title and the other
      sentences) when the text has such a sentence and at least ``window`` words besides it;
    - ("title", title, text) when it has a title and a text of ``window`` words or more;
    - ("window", a seeded window of ``window`` words, the words around it);

    None when the passage is too short to keep at least the window's length as its answer."""
    parts = sentences(doc.text)
    lengths = [len(p.split()) for p in parts]
    total = sum(lengths)
    usable = [i for i, n in enumerate(lengths) if sentence_words[0] <= n <= sentence_words[1] and total - n >= window]
    if len(parts) > 1 and usable:
        pick = usable[int(rng.integers(0, len(usable)))]
        return "sentence", parts[pick], " ".join([doc.title.strip()] * bool(doc.title.strip()) + parts[:pick] + parts[pick + 1:])
    if doc.title.strip() and len(doc.text.split()) >= window:
        return "title", doc.title.strip(), doc.text
    words = f"{doc.title} {doc.text}".split()
    if len(words) < 2 * window:
        return None
    start = int(rng.integers(0, len(words) - window + 1))
    return "window", " ".join(words[start:start + window]), " ".join(words[:start] + words[start + window:])


def keyword_query(doc: Document, window: int, kept: int, rng: np.random.Generator) -> str:
    """A seeded window of ``window`` consecutive words among the first ``kept`` of the passage as the
    index encoded it (title, then text), which stays whole as the query's answer."""
    return pseudo_query(" ".join(_text(doc).split()[:kept]), window, rng)


def choose(encoder: Encoder, docs: Sequence[Document], values: np.ndarray, gates: np.ndarray,
           config: AutoFusionConfig = AutoFusionConfig(), *, query_prompt: str = "",
           passage_prompt: str = "") -> dict:
    """The ``auto`` record of the manifest's ``fusion`` entry for an index of ``docs`` (row order)
    with passage ``values``/``gates``: the chosen method and dense weight, and how they were found."""
    start = time.perf_counter()
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
        log.warning("auto fusion: %d passages are long enough for a pseudo-query (under %d): the equal zscore mix",
                    len(picked), config.min_queries)
        return {"method": "zscore", "dense_weight": fusion.DEFAULT_DENSE_WEIGHT, "pseudo_queries": len(picked),
                "note": "too few passages long enough for a pseudo-query: the equal mix"}
    kinds, queries, answers = zip(*cuts)
    source = np.asarray(picked)
    # each part's candidates go as deep into the pool as a search's go into the collection
    depth = max(mix_choice.CUTOFF,
                min(len(rows), math.ceil(config.candidates * len(rows) / max(len(docs), 1))))
    gains = _paraphrase_gains(encoder, queries, answers, values, gates, rows, source, depth, config,
                              query_prompt, passage_prompt)
    kept = max(2 * config.window, int(WORDS_PER_TOKEN * encoder.spec.max_passage_length))
    keywords = [keyword_query(docs[rows[column]], config.window, kept, rng) for column in picked]
    lexical, dense = part_scores(*_queries(encoder, keywords, query_prompt), values, gates, rows)
    keyword_gains = mix_choice.weight_gains(lexical, dense, source, depth)
    weight, bounds, rule = mix_choice.style_choice(gains, keyword_gains)
    worst = np.max([mix_choice.relative_regret(g) for g in (gains, keyword_gains)], axis=0)
    seconds = time.perf_counter() - start
    log.info("auto fusion: zscore with dense weight %.1f from %d pseudo-queries of each style against %d passages"
             " (%.1f s)", weight, len(picked), len(rows), seconds)
    return {"method": "zscore", "dense_weight": weight, "rule": rule, "bounds": list(bounds),
            "pseudo_queries": len(picked), "titles": kinds.count("title"), "sentences": kinds.count("sentence"),
            "windows": kinds.count("window"),
            "pool": int(len(rows)), "depth": depth, "window": config.window, "seed": config.seed,
            "weights": list(mix_choice.WEIGHTS), "pseudo_ndcg_at_10": _rounded(gains.mean(axis=1)),
            "keyword_ndcg_at_10": _rounded(keyword_gains.mean(axis=1)), "worst_regret": _rounded(worst),
            "seconds": round(seconds, 2)}


def _text(doc: Document) -> str:
    """A passage's text as the index encoded it (title, then text)."""
    return f"{doc.title} {doc.text}" if doc.title else doc.text


def _queries(encoder: Encoder, texts: Sequence[str], prompt: str) -> tuple[np.ndarray, np.ndarray]:
    encoded = encoder.encode(list(texts), "query", prompt=prompt)
    return encoded.values, encoded.gates


def _paraphrase_gains(encoder: Encoder, queries: Sequence[str], answers: Sequence[str], values: np.ndarray,
                      gates: np.ndarray, rows: np.ndarray, source: np.ndarray, depth: int, config: AutoFusionConfig,
                      query_prompt: str, passage_prompt: str) -> np.ndarray:
    """(W, Q) gains of the paraphrases: each answer, encoded as a passage, in its source's place in the pool."""
    xq, gq = _queries(encoder, queries, query_prompt)
    answered = encode_all(encoder, [passage_prompt + a for a in answers], "passage", config.batch_size,
                          by_length=True)
    lexical, dense = part_scores(xq, gq, values, gates, rows)
    own = np.arange(len(source))
    own_lexical, own_dense = part_scores(xq, gq, answered.values, answered.gates, own)
    lexical[own, source], dense[own, source] = own_lexical[own, own], own_dense[own, own]
    return mix_choice.weight_gains(lexical, dense, source, depth)


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in values]
