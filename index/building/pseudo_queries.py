"""Queries with a known answer, cut from a collection's own passages (no judgements needed).

- :func:`cut`, a *paraphrase*: a sentence, title or window taken out of its passage, whose rest is the
  answer, so that no word of the query is left in it to match verbatim (the inverse cloze task at the
  grain of a sentence: a sentence reads like a statement of what the passage is about, where a window
  of words cut mid-sentence is a bag of the passage's own terms, which the lexical part matches in the
  sentences around it);
- :func:`keyword_query`, a *keyword* query: a window of the passage's own words, left in the passage,
  which stays whole as its answer (every word matches);
- :func:`pseudo_query`, a window of consecutive words at a seeded position.

Paraphrases make the lexical part look as weak as it can, keyword queries as strong as it can: the
users' queries lie between.
"""

from __future__ import annotations

import re

import numpy as np

from densehybrid.index.storage.documents import Document

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# a keyword window is drawn from a passage's first words, as many as its encoding surely kept
# (wordpiece English runs at about 1.3 tokens a word)
WORDS_PER_TOKEN = 0.6


def sentences(text: str) -> list[str]:
    """``text`` split after each ``.``, ``!`` or ``?`` that a space follows, empty pieces dropped."""
    return [piece for piece in SENTENCE_END.split(text.strip()) if piece.strip()]


def pseudo_query(text: str, window: int, rng: np.random.Generator) -> str:
    """A window of ``window`` consecutive words at a seeded position (the whole text if shorter)."""
    words = text.split()
    if len(words) <= window:
        return " ".join(words)
    start = int(rng.integers(0, len(words) - window + 1))
    return " ".join(words[start:start + window])


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
    return pseudo_query(" ".join(encoded_text(doc).split()[:kept]), window, rng)


def encoded_text(doc: Document) -> str:
    """A passage's text as the index encoded it (title, then text)."""
    return f"{doc.title} {doc.text}" if doc.title else doc.text
