"""The search page at ``GET /``: a plain HTML form over ``/search`` (no JavaScript, no CDN).

The page runs the same handler as ``POST /search`` with ``return_text`` and
``explain`` on, so the hits, the stage times and the lexical/semantic split
are the API's own. Matched query terms (the lexical part of the score, as
``/explain`` computes it) are marked in the title and text on the words they
make up: a matched term, alone or followed by matched subword pieces.

Jinja2 autoescapes every value: queries and passages are text, never markup.
With an API key set the page is behind the key like every other route but
/health, /ready and /metrics (a browser reaches it through a proxy that adds
the header).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import jinja2
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ValidationError

from densehybrid.service import handlers
from densehybrid.service.errors import ServiceError
from densehybrid.service.runtime import Runtime
from densehybrid.service.schemas import request_models

ASSETS_PATH = "/page-assets"
# the page needs nothing but its own stylesheet: no scripts at all, no inline styles, no other origin
CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                           "base-uri 'none'; frame-ancestors 'none'")
SHARE_KINDS = frozenset({"dhr", "fusion", "aggretriever"})  # kinds whose score has both a lexical and a dense part
_HERE = Path(__file__).parent
_templates = Jinja2Templates(env=jinja2.Environment(
    loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined))
_WORD = re.compile(r"\w+")
_WORDS = re.compile(r"(\w+)")


def highlight(text: str, terms: Iterable[str]) -> list[tuple[str, bool]]:
    """``text`` cut into ``(part, marked)`` pieces, joined back it is ``text``.

    A word is marked when it is a matched term followed by zero or more matched
    subword pieces (``late`` + ``##ncy`` marks "latency"), case-insensitively.
    """
    heads = {t.lower() for t in terms if _WORD.fullmatch(t)}
    tails = {t[2:].lower() for t in terms if t.startswith("##") and _WORD.fullmatch(t[2:])}
    parts: list[tuple[str, bool]] = []
    for i, part in enumerate(_WORDS.split(text)):
        marked = i % 2 == 1 and _composed(part.lower(), heads, tails)
        if parts and not marked and not parts[-1][1]:
            parts[-1] = (parts[-1][0] + part, False)
        elif part:
            parts.append((part, marked))
    return parts


def _composed(word: str, heads: set[str], tails: set[str]) -> bool:
    """Whether ``word`` is one of ``heads`` followed by any number of ``tails`` (linear in len(word) x len(tails))."""
    ends = [False] * (len(word) + 1)
    for head in heads:
        if word.startswith(head):
            ends[len(head)] = True
    for at in range(1, len(word)):
        if ends[at]:
            for tail in tails:
                if word.startswith(tail, at):
                    ends[at + len(tail)] = True
    return ends[-1] and bool(word)


def shares(lexical: float, semantic: float) -> dict[str, float]:
    """Each part's share of the score by magnitude (the parts can have opposite signs); they sum to 1."""
    size = abs(lexical) + abs(semantic)
    if size == 0:
        return {"lexical": 0.0, "semantic": 0.0}
    return {"lexical": abs(lexical) / size, "semantic": abs(semantic) / size}


def _hit_view(hit: dict, kind: str) -> dict:
    explanation = hit.get("explanation")  # none past max_explain_hits: nothing to mark or split
    terms = [t["term"] for t in explanation["terms"]] if explanation else []
    return {"id": hit["id"], "score": hit["score"], "terms": terms,
            "title": highlight(hit.get("title") or "", terms), "text": highlight(hit.get("text") or "", terms),
            "shares": shares(explanation["lexical"], explanation["semantic"])
            if explanation and kind in SHARE_KINDS else None}


async def _search(rt: Runtime, request: Request, SearchRequest: type[BaseModel], query: str,
                  k: int) -> tuple[dict, int]:
    """The page's context and status for one query: hits and times, or the error the API would give."""
    try:
        body = SearchRequest(query=query, k=k, return_text=True, explain=True)
        found = await handlers.search(rt, request, body)
    except ValidationError as exc:
        return {"error": "; ".join(e["msg"] for e in exc.errors())}, 422
    except ServiceError as exc:
        return {"error": exc.message}, exc.status
    kind = found["index"]["kind"]
    return {"hits": [_hit_view(hit, kind) for hit in found["results"]], "timing": found["timing"],
            "explained": found["explained"]}, 200


_HTML = {"text/html": {"schema": {"type": "string"}}}
_HTML_ERROR = {"content": _HTML}
_PAGE_RESPONSES = {
    200: {"description": "the search page, with hits when `q` is given"},
    413: {**_HTML_ERROR, "description": "the hits' titles and texts over max_return_text_bytes: the page says so"},
    422: {"content": {**_HTML, "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
          "description": "`q` or `k` out of range (a JSON error), or a search the page refused (the page)"},
    429: {**_HTML_ERROR, "description": "encoder queue full: the page says so"},
    503: {**_HTML_ERROR, "description": "not ready or timed out: the page says so"},
}


def build_page_router(rt: Runtime) -> APIRouter:
    router = APIRouter()
    SearchRequest = request_models(rt.settings.limits, handlers.served_prompts(rt)).search

    # in the schema: ``/`` also takes POST (TEI's embed), and a 405 there lists both methods in ``Allow``
    @router.get("/", response_class=HTMLResponse, tags=["page"], responses=_PAGE_RESPONSES)
    async def search_page(request: Request, q: str = Query("", max_length=2000),
                          k: int = Query(10, ge=1, le=rt.settings.max_k)) -> HTMLResponse:
        context, status = {"hits": [], "timing": None, "error": None, "explained": None}, 200
        if rt.index is not None and q.strip():
            found, status = await _search(rt, request, SearchRequest, q, k)
            context.update(found)
        index = None if rt.index is None else {"name": rt.index.name, "documents": rt.index.count}
        response = _templates.TemplateResponse(request, "search_page.html", {
            **context, "query": q, "k": k, "max_k": rt.settings.max_k, "index": index,
            "kind": rt.encoder.spec.kind, "assets": ASSETS_PATH}, status_code=status)
        response.headers["content-security-policy"] = CONTENT_SECURITY_POLICY
        return response

    return router


def install_search_page(app: FastAPI, rt: Runtime) -> None:
    app.mount(ASSETS_PATH, StaticFiles(directory=_HERE / "static"), name="page-assets")
    app.include_router(build_page_router(rt))
