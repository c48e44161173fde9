"""An out-of-domain evaluation set with labels from the docstrings' own structure (no judging, no tuning).

Every stdlib docstring (``demo_corpus``'s modules, classes, methods and functions, in its fixed
order) whose summary paragraph is followed by a body splits into a query and its one relevant
passage: the query is the summary's first sentence, the passage the body (first 120 words, the
qualified name left out so that neither part can match it). Docstrings whose query or passage
text occurs twice are dropped (an answer must be unique). A seeded sample of the rest is the
corpus; a second seeded sample of the corpus gives the queries.

    python -m densehybrid.cli.stdlib_eval_set OUT_DIR [--passages 1200] [--queries 400] [--seed 0]

writes ``OUT_DIR/corpus.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` (BEIR columns).
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import re
from collections import Counter
from pathlib import Path

from densehybrid.cli.demo_corpus import MAX_WORDS, _module_docs, _module_names

MIN_QUERY_WORDS = 4
MIN_PASSAGE_WORDS = 8


def split_docstring(doc: str) -> tuple[str, str] | None:
    """A docstring -> (first sentence of its summary paragraph, its body's first MAX_WORDS words), or None."""
    summary, sep, body = inspect.cleandoc(doc).partition("\n\n")
    if not sep:
        return None
    query = re.split(r"(?<=\.)\s", " ".join(summary.split()), maxsplit=1)[0]
    passage = " ".join(body.split()[:MAX_WORDS])
    if len(query.split()) < MIN_QUERY_WORDS or len(passage.split()) < MIN_PASSAGE_WORDS:
        return None
    return query, passage


def unique_pairs(modules: list[str]) -> list[tuple[str, str, str]]:
    """(qualified name, query, passage) of every usable docstring of ``modules``, in order, keeping only the
    pairs whose query and whose passage no other pair shares (a duplicate would have two right answers)."""
    pairs, seen = [], set()
    for module in modules:
        for name, doc in _module_docs(module):
            split = split_docstring(doc) if isinstance(doc, str) else None  # some classes' __doc__ is a property
            if split is not None and name not in seen:
                seen.add(name)
                pairs.append((name, *split))
    queries = Counter(q.lower() for _, q, _ in pairs)
    passages = Counter(p for _, _, p in pairs)
    return [(n, q, p) for n, q, p in pairs if queries[q.lower()] == 1 and passages[p] == 1]


def write_set(out: Path, passages: int, queries: int, seed: int) -> tuple[int, int]:
    """The set of every usable stdlib docstring, in demo_corpus's order (:func:`write_pairs`)."""
    return write_pairs(out, unique_pairs(_module_names()), passages, queries, seed)


def write_pairs(out: Path, pairs: list[tuple[str, str, str]], passages: int, queries: int,
                seed: int) -> tuple[int, int]:
    """A seeded sample of ``pairs`` (name, query, passage) as the corpus, a second one of it as the queries."""
    corpus = sorted(random.Random(seed).sample(range(len(pairs)), min(passages, len(pairs))))
    asked = sorted(random.Random(seed + 1).sample(corpus, min(queries, len(corpus))))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i in corpus:
            f.write(json.dumps({"_id": pairs[i][0], "title": "", "text": pairs[i][2]}, ensure_ascii=False) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for i in asked:
            f.write(json.dumps({"_id": f"q{i}", "text": pairs[i][1]}, ensure_ascii=False) + "\n")
    with open(out / "qrels.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for i in asked:
            f.write(f"q{i}\t{pairs[i][0]}\t1\n")
    return len(corpus), len(asked)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--passages", type=int, default=1200)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n_passages, n_queries = write_set(args.out, args.passages, args.queries, args.seed)
    print(f"{args.out}: {n_passages} passages, {n_queries} queries")  # CLI output


if __name__ == "__main__":
    main()
