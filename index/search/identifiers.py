"""An identifier asked alone is answered first by the passages that hold it whole (the ``auto`` mix's last step).

Users who search by an option, a configuration key or a function's name (``--preserve-timestamps``,
``PermitRootLogin``, ``SSL_CTX_new``) want the passages that name it. Neither part ranks them reliably: the
dense part reads an option string as a bag of common word pieces, and the lexical part spreads its weight over
the pieces too, so a mix ranks passages that are only about the same thing above the one that names it.
Nothing in a corpus tells whether its users will ask that way, so the choice of the mix's weight cannot see it
(the pseudo-queries are prose); the query itself shows it.

So under ``auto``, a query that :func:`looks_like_identifier` has the passages among its ``DEPTH`` best that
:func:`holds_whole` it ranked first, each group in the mix's order: a holder's score is its mix plus
``HOLDER_BONUS``, so scores still fall with the rank (runs and pages stay consistent). Measured on 19 judged
sets, three of them built after the rule was fixed (docs: indexes), it lifted option and key lookups to
0.995-1.000 nDCG@10 and cost 0.010 on a set of library names (C functions, libcurl options) whose pages
seldom repeat their own name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from densehybrid.index.search.mix import resolve_method
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.served import ServedIndex
from densehybrid.index.storage.documents import Document

Hits = TypeVar("Hits")  # a search's per-query hits: ``ids``, ``scores``, ``rows`` and maybe the parts' scores
PER_HIT = ("ids", "scores", "rows", "lexical_scores", "dense_scores")

DEPTH = 100  # the mix's best hits a query's holders are looked for among
# more than any two of the auto mix's scores differ: it mixes z-scores, and a z-score over n candidates lies
# within ±sqrt(n), of at most 2 x 10,000 candidates (2 x sqrt(20,000) < 300)
HOLDER_BONUS = 1000.0
IDENTIFIER_MARK = re.compile(r"[-_.:/$]|[a-z][A-Z]|[A-Z]{2}")


def looks_like_identifier(query: str) -> bool:
    """One token (no white space) holding ``-``, ``_``, ``.``, ``:``, ``/`` or ``$``, a lower-case letter followed
    by a capital, or two capitals in a row."""
    query = query.strip()
    return bool(query) and not any(c.isspace() for c in query) and IDENTIFIER_MARK.search(query) is not None


def holds_whole(text: str, identifier: str) -> bool:
    """Whether ``identifier`` occurs in ``text`` with no letter, digit, ``_`` or ``-`` on either side (not
    inside a longer word or option)."""
    return re.search(rf"(?<![\w-]){re.escape(identifier)}(?![\w-])", text) is not None


def holders_first(query: str, texts: Sequence[str]) -> tuple[list[int], list[bool]]:
    """The order of hits whose ``texts`` are given in the mix's order, holders of ``query`` first (positions
    into ``texts``), and whether each position of that order holds it; the mix's order, none holding, when the
    query does not look like an identifier."""
    if not looks_like_identifier(query):
        return list(range(len(texts))), [False] * len(texts)
    query = query.strip()
    holds = [holds_whole(text, query) for text in texts]
    order = [i for i, h in enumerate(holds) if h] + [i for i, h in enumerate(holds) if not h]
    return order, [holds[i] for i in order]


def applies(index: ServedIndex, params: SearchParams, queries: Sequence[str]) -> bool:
    """Whether a search of ``queries`` with ``params`` puts holders first: the ``auto`` mix of an index with a
    lexical and a dense part (reranked), and a query that looks like an identifier."""
    return (params.rerank and resolve_method(index, params.method, params.lam) == "auto"
            and any(map(looks_like_identifier, queries)))


def described(index: ServedIndex) -> dict | None:
    """What ``/info`` says of the rule for ``index``: None unless its default method is ``auto``."""
    if resolve_method(index, None, None) != "auto":
        return None
    return {"depth": DEPTH, "score_bonus": HOLDER_BONUS,
            "identifier": "one token holding - _ . : / or $, or inner capitals",
            "holds": "the title or text holds it with no letter, digit, _ or - on either side"}


def widened(params: SearchParams, rows: int) -> SearchParams:
    """The search that :func:`holders_first_page` cuts the page of ``params`` from: its hits from the first,
    at least ``DEPTH`` of them (of ``rows``)."""
    return params.but(k=min(max(params.offset + params.k, DEPTH), rows), offset=0)


def holders_first_page(found: Hits, queries: Sequence[str], documents: Callable[[list[str]], list[Document | None]],
                       offset: int, k: int) -> tuple[Hits, list[list[bool]]]:
    """``found`` (per query, the hits from the first, ``DEPTH`` or more of them where there are) with each query's
    holders among its first ``DEPTH`` moved first (:func:`holders_first`, their scores raised by
    ``HOLDER_BONUS``), cut to the page of ``k`` from ``offset``; and per query, which hits of the page hold it.
    ``documents`` reads the hits' stored documents (title and text), asked only for identifier queries."""
    cut = slice(offset, offset + k)
    page = {name: [] for name in PER_HIT if getattr(found, name) is not None}
    marks = []
    for q, query in enumerate(queries):
        count = len(found.ids[q])
        head = min(DEPTH, count)
        order, holds = list(range(count)), [False] * count
        if head and looks_like_identifier(query):
            docs = documents(list(found.ids[q][:head]))
            order[:head], holds[:head] = holders_first(query, [f"{d.title} {d.text}" if d else "" for d in docs])
        for name, out in page.items():
            values = [getattr(found, name)[q][i] for i in order]
            if name == "scores":
                values = [score + HOLDER_BONUS if held else score for score, held in zip(values, holds)]
            out.append(values[cut])
        marks.append(holds[cut])
    return dataclasses.replace(found, **page), marks
