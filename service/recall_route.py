"""``POST /recall``: the first stage's recall measured on demand, on given query texts or sampled rows, with a
search's filter and breadth, against an exact scan of the same rows (what the live sampling measures on
traffic)."""

from __future__ import annotations

import functools
import time

import numpy as np
from fastapi import Request

from densehybrid.index.search.params import SearchParams
from densehybrid.index.served.stated_recall import stated
from densehybrid.service.errors import InvalidRequest
from densehybrid.service.handlers import require_index, text_options
from densehybrid.service.runtime import Runtime
from densehybrid.service.stated import requested_breadth


async def measure_recall(rt: Runtime, request: Request, body) -> dict:
    """Recall@10 of the served first stage on the body's query texts, or on a seeded sample of the index's rows,
    with the body's filter and breadth, against an exact scan of the same rows: on demand, what the live
    sampling measures on traffic."""
    index = require_index(rt)
    if index.remote:
        raise InvalidRequest("a Milvus collection's recall is not measured here: its rows live in Milvus")
    breadth, asked = requested_breadth(rt, index.first_stage, body)
    params = SearchParams(k=10, lam=body.lam, filter=body.filter, **breadth)
    measure = functools.partial(index.first_stage_recall, params=params)
    if body.queries is not None:
        recalls, timing = await rt.pipeline.encode_then(request, list(body.queries), "recall_ms", measure,
                                                        text_options(rt, "query", search=True))
        source = f"{len(body.queries)} query texts"
    else:
        started = time.perf_counter()
        rows = index.sample_rows(body.sample, body.seed)
        recalls = await rt.pipeline.on_search_threads(measure, rows)
        timing = {"recall_ms": round((time.perf_counter() - started) * 1000, 3)}
        source = f"{len(rows)} sampled rows of the index as queries (a rough guide)"
    return {"recall_at_10": round(float(np.mean(recalls)), 4), "exact_top10": round(float(np.mean(recalls == 1.0)), 4),
            "queries": len(recalls), "source": source, "per_query": [round(float(r), 4) for r in recalls],
            "first_stage": stated(index.first_stage, params, asked), "timing": timing}
