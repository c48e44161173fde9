"""The hits of a search answer: each hit's scores, text and explanation (``responses`` holds the answers)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Term(BaseModel):
    token_id: int
    term: str
    query_weight: float
    passage_weight: float
    contribution: float


class Explanation(BaseModel):
    terms: list[Term] = Field(description="matched lexical terms, largest contribution first")
    lexical: float = Field(description="gated (lexical) part of the score")
    semantic: float = Field(description="dense part of the score, lambda applied")
    total: float


class Hit(BaseModel):
    id: str
    score: float
    rank: int = Field(ge=1, description="position in the query's whole order: offset + 1 for the first hit of a page")
    lexical_score: float | None = Field(None, examples=[11.52], description=(
        "dhr/fusion: the exact score of the lexical part (gated inner product); absent for other kinds"))
    dense_score: float | None = Field(None, examples=[8.93], description=(
        "dhr/fusion: the exact score of the dense part (inner product, λ applied); absent for other kinds"))
    fused_score: float | None = Field(None, examples=[0.0325], description=(
        "dhr/fusion: the two parts mixed by the request's fusion method (what `score` ranks by: rrf's "
        "reciprocal-rank sum, zscore's mix, lexical + dense for lambda); absent for other kinds"))
    exact_match: bool | None = Field(None, description=(
        "auto mix: true when the query is an identifier asked alone (one token with - _ . : / $ or inner capitals) "
        "that this hit holds whole; such hits rank first, `score` the mix + 1000; absent otherwise"))
    title: str | None = None
    text: str | None = None
    explanation: Explanation | None = Field(None, description=(
        "with explain=true: matched terms and the score split (left out past max_explain_hits: see `explained`)"))
    fields: dict[str, Any] | None = Field(None, description="the payload fields asked for with `fields`")
