"""Retrieval quality (docs/indexes.md): queries and qrels in, nDCG@10 / MRR@10 / R@100 / R@1000 out.

Measures come from ``ir-measures`` (pytrec_eval underneath). Relevance grades
above 0 count as relevant for MRR and recall; grade 0 is "judged, not
relevant". Only queries with at least one judgement are evaluated (as trec_eval
does); a judged query that retrieved nothing scores 0, not "absent".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import ir_measures
from ir_measures import R, RR, nDCG

from densehybrid.index.jsonl import read_jsonl

log = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]
# report name -> ir-measures measure (RR@10 is the MRR@10 of MS MARCO)
MEASURES = {"nDCG@10": nDCG @ 10, "MRR@10": RR @ 10, "R@100": R @ 100, "R@1000": R @ 1000}


class EvalInputError(ValueError):
    """A queries, qrels or run file cannot be read."""


def read_queries(path: str | Path) -> dict[str, str]:
    """BEIR ``queries.jsonl`` (``_id``, ``text``) -> {query id: text}, in file order."""
    rows = read_jsonl(path, required=("_id", "text"), what="a query line with _id and text", error=EvalInputError)
    return {str(row["_id"]): str(row["text"]) for row in rows}


def read_judged(queries_path: str | Path, qrels_path: str | Path) -> tuple[list[str], list[str], Qrels]:
    """The ids and texts of the queries that have judgements, in file order, and the judgements."""
    queries, qrels = read_queries(queries_path), read_qrels(qrels_path)
    qids = [q for q in queries if qrels.get(q)]
    return qids, [queries[q] for q in qids], qrels


def parse_qrels_line(fields: Sequence[str]) -> tuple[str, str, int] | None:
    """BEIR ``qid docid grade`` or TREC ``qid iter docid grade`` -> triple; None for a header line."""
    if len(fields) == 3:
        qid, doc_id, grade = fields
    elif len(fields) == 4:
        qid, _, doc_id, grade = fields
    else:
        raise ValueError(f"expected 3 or 4 columns, got {len(fields)}")
    try:
        return qid, doc_id, int(float(grade))
    except ValueError:
        return None


def read_qrels(path: str | Path) -> Qrels:
    """Qrels (tab- or space-separated, BEIR or TREC columns, with or without a header line)."""
    qrels: Qrels = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                parsed = parse_qrels_line(line.split())
            except ValueError as exc:
                raise EvalInputError(f"{path}:{number}: {exc}") from exc
            if parsed is None:
                if number == 1 or not qrels:
                    continue  # header
                raise EvalInputError(f"{path}:{number}: relevance grade is not a number")
            qid, doc_id, grade = parsed
            qrels.setdefault(qid, {})[doc_id] = grade
    return qrels


def evaluate(run: Mapping[str, Mapping[str, float]], qrels: Qrels) -> dict[str, float]:
    """Mean of each measure over the judged queries: {"nDCG@10", "MRR@10", "R@100", "R@1000"}."""
    judged = {q: docs for q, docs in qrels.items() if docs}
    per_query = {name: {q: 0.0 for q in judged} for name in MEASURES}
    by_measure = {m: name for name, m in MEASURES.items()}
    present = {q: dict(docs) for q, docs in run.items() if q in judged and docs}
    for metric in ir_measures.iter_calc(list(MEASURES.values()), judged, present):
        per_query[by_measure[metric.measure]][metric.query_id] = float(metric.value)
    if not judged:
        raise EvalInputError("no judged queries to evaluate")
    return {name: sum(values.values()) / len(judged) for name, values in per_query.items()}


def to_run(query_ids: Sequence[str], ids: Sequence[Sequence[str]], scores: Sequence[Sequence[float]]) -> Run:
    return {q: dict(zip(d, s)) for q, d, s in zip(query_ids, ids, scores)}


def write_trec_run(path: str | Path, query_ids: Sequence[str], ids: Sequence[Sequence[str]],
                   scores: Sequence[Sequence[float]], tag: str) -> None:
    """TREC run format: ``qid Q0 docid rank score tag``, ranks from 1 in the given order."""
    with open(path, "w", encoding="utf-8") as f:
        for qid, doc_ids, doc_scores in zip(query_ids, ids, scores):
            for rank, (doc_id, score) in enumerate(zip(doc_ids, doc_scores), 1):
                f.write(f"{qid} Q0 {doc_id} {rank} {score:.6f} {tag}\n")


def bm25_search(doc_ids: Sequence[str], texts: Iterable[str], queries: Sequence[str], k: int = 1000
                ) -> tuple[list[list[str]], list[list[float]]]:
    """BM25 baseline (bm25s, Lucene variant, k1 = 0.9, b = 0.4 as Anserini's MS MARCO runs,
    English stop words and Snowball stemming) -> per query: ids, scores."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    corpus_tokens = bm25s.tokenize(list(texts), stopwords="en", stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(k1=0.9, b=0.4)
    retriever.index(corpus_tokens, show_progress=False)
    query_tokens = bm25s.tokenize(list(queries), stopwords="en", stemmer=stemmer, show_progress=False)
    rows, scores = retriever.retrieve(query_tokens, k=min(k, len(doc_ids)), show_progress=False, n_threads=1)
    return [[doc_ids[r] for r in q_rows] for q_rows in rows], [[float(s) for s in q] for q in scores]
