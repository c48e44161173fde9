"""Why a passage scored what it did (``/explain``; DLR and GIP in docs/concepts.md): pure arithmetic, no vocabulary.

For one query row and one index row: the matched DLR dimensions, each as the
vocabulary id behind it (``representations.dlr_term_ids``), the query and
passage weights and their product, plus the split of the score into a lexical
part (gated dims) and a semantic part (λ · the open dims). The service turns
token ids into words with ``Encoder.term``.

Per kind: ``dhr``/``fusion`` lexical = GIP, semantic = λ·dense; ``dlr`` all
lexical; ``cls`` all semantic; ``aggretriever`` lexical = the aggregated part
(its terms are pooled, so no per-token list), semantic = the projected [CLS] part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from densehybrid.encoder import representations as R
from densehybrid.encoder.base import SCALED_KINDS, Encoded, EncoderSpec


class ExplainedRows(Protocol):
    """What an explanation reads of an index: its spec, its row count and rows by number (a served
    index's memory maps, or the rows written since, ``index.writes.live.LiveIndex.locate``)."""

    spec: EncoderSpec
    values: np.ndarray  # (N, dim), or anything that gives row ``i`` as ``values[i]``
    gates: np.ndarray | None  # (N, gated_dim) uint8 for gated kinds

    @property
    def count(self) -> int: ...


@dataclass(frozen=True)
class TermMatch:
    token_id: int
    query_weight: float
    passage_weight: float
    contribution: float
    dim: int


@dataclass(frozen=True)
class Explanation:
    terms: list[TermMatch]
    lexical: float
    semantic: float
    total: float
    lam: float


def matched_terms(q_values: np.ndarray, q_gates: np.ndarray, p_values: np.ndarray, p_gates: np.ndarray,
                  vocab_size: int) -> list[TermMatch]:
    """Gated dims where the gates agree and the product is non-zero, best contribution first.

    All arguments (D,) for one query and one passage; float64 arithmetic.
    """
    q, p = q_values.astype(np.float64), p_values.astype(np.float64)
    contribution = q * p
    dims = np.nonzero((q_gates == p_gates) & (contribution != 0))[0]
    token_ids = R.dlr_term_ids(torch.from_numpy(q_gates.astype(np.int64)), vocab_size).numpy()
    order = sorted(dims, key=lambda j: (-contribution[j], int(token_ids[j])))
    return [TermMatch(int(token_ids[j]), float(q[j]), float(p[j]), float(contribution[j]), int(j)) for j in order]


def explain(query: Encoded, index: ExplainedRows, row: int, *, lam: float, vocab_size: int) -> Explanation:
    """Explain the score of index row ``row`` for a single encoded query (raw, unscaled values)."""
    if len(query) != 1:
        raise ValueError(f"explain takes one query row, got {len(query)}")
    if not 0 <= row < index.count:
        raise IndexError(f"row {row} out of range for an index of {index.count}")
    spec = index.spec
    vocab_size = vocab_size or spec.vocab_size or 0
    q = query.values[0].astype(np.float64)
    p = np.asarray(index.values[row], dtype=np.float64)
    width = (spec.agg_dim or 0) if spec.kind == "aggretriever" else spec.gated_dim  # the leading lexical dims
    lam = lam if spec.kind in SCALED_KINDS else 1.0
    terms: list[TermMatch] = []
    if spec.gated_dim:
        q_gates, p_gates = query.gates[0], np.asarray(index.gates[row])
        terms = matched_terms(q[:width], q_gates, p[:width], p_gates, vocab_size)
        lexical = float(sum(t.contribution for t in terms))
    else:
        lexical = float(q[:width] @ p[:width])
    semantic = float(lam * (q[width:] @ p[width:]))
    return Explanation(terms, lexical, semantic, lexical + semantic, lam)
