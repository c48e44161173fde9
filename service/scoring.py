"""Scores of passages for a query with the served model's own score (the TEI and Cohere rerank routes)."""

from __future__ import annotations

import time

import numpy as np
from fastapi import Request

from densehybrid.encoder.base import Encoded
from densehybrid.index.search import gip
from densehybrid.service.pipeline import Pipeline, TextOptions, ms, record


async def score(pipeline: Pipeline, request: Request, query: str, texts: list[str], *, lam: float,
                query_options: TextOptions = TextOptions(), passage_options: TextOptions = TextOptions()) -> np.ndarray:
    """Scores of ``texts`` (as passages) for ``query``: the gated inner product for kinds with gates, the inner
    product otherwise (the index's scores for the same pair). Both encodes go through the pipeline; the
    scoring runs on a search thread."""
    started = time.perf_counter()
    asked = await pipeline.encode(request, [query], "query", query_options)
    passages = await pipeline.encode(request, texts, "passage", passage_options)
    scoring = time.perf_counter()
    scores = await pipeline.on_search_threads(_score_passages, asked.encoded, passages.encoded,
                                              pipeline.encoder.spec.gated_dim, lam)
    stages = ("queue_ms", "tokenize_ms", "encode_ms")
    record(request, {**{s: round(asked.timing[s] + passages.timing[s], 3) for s in stages},
                     "score_ms": ms(time.perf_counter() - scoring), "total_ms": ms(time.perf_counter() - started)})
    return scores


def _score_passages(query: Encoded, passages: Encoded, gated_dim: int, lam: float) -> np.ndarray:
    xq = gip.scale_queries(query.values, gated_dim, lam)
    return gip.exhaustive(xq, query.gates, passages.values, passages.gates)[0]
