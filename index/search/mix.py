"""Which mix of the lexical and dense parts a search of a ``dhr``/``fusion`` index runs with: the request's,
else the index's default, with ``auto`` standing for the mix the index chose from its corpus at build."""

from __future__ import annotations

from densehybrid.encoder.base import SCALED_KINDS
from densehybrid.index.errors import SearchError
from densehybrid.index.search import fusion
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.served import StoredIndex


def resolve_method(index: StoredIndex, method: str | None, lam: float | None) -> str:
    """The weighting a search of ``index`` uses: the one asked for; else the raw λ sum when a λ is
    given (a per-request λ keeps its meaning); else the index's default. Unscaled kinds: ``lambda``."""
    if index.spec.kind not in SCALED_KINDS:
        return "lambda"
    if method is None:
        return "lambda" if lam is not None else index.fusion_method
    if method not in fusion.FUSION_METHODS:
        raise SearchError(f"unknown fusion method {method!r}; use one of {', '.join(fusion.FUSION_METHODS)}")
    return method


def resolve_mix(index: StoredIndex, params: SearchParams) -> tuple[str, float]:
    """The method (as :func:`resolve_method`) and dense weight a search runs with; ``auto`` is the mix the
    index chose from its corpus at build, and an explicit ``dense_weight`` still wins over its weight."""
    method, weight = resolve_method(index, params.method, params.lam), params.dense_weight
    if method == "auto":
        method, chosen = index.auto_mix
        weight = chosen if weight is None else weight
    return method, index.dense_weight if weight is None else weight
