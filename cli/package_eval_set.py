"""An out-of-domain evaluation set from the docstrings of an installed package (sympy by default).

Built as the stdlib set (``stdlib_eval_set``): every docstring of the package's public modules,
classes, methods and functions whose summary paragraph is followed by a body splits into a query
(the summary's first sentence) and its one relevant passage (the body's first 120 words, the
qualified name left out); docstrings whose query or passage text occurs twice are dropped. A seeded
sample of the rest is the corpus, a second seeded sample of the corpus the queries. Labels come
from the docstrings' structure alone.

``--query name`` asks with keywords instead: the query is the words of the object's own name
(``read_csv`` -> "read csv", ``LinearOperator`` -> "linear operator"; names of one word are left
out) and its passage the whole docstring's first 120 words, summary included.

    python -m densehybrid.cli.package_eval_set OUT_DIR [--package sympy] [--passages 2500] [--queries 400]
        [--query summary|name]

writes ``OUT_DIR/corpus.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` (BEIR columns).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re
from collections import Counter
from pathlib import Path

from densehybrid.cli.demo_corpus import MAX_WORDS, _module_docs
from densehybrid.cli.stdlib_eval_set import MIN_PASSAGE_WORDS, unique_pairs, write_pairs


def module_names(package: str) -> list[str]:
    """The package and its public submodules at any depth, tests and benchmarks left out, sorted."""
    top = importlib.import_module(package)
    names = [package]
    for found in pkgutil.walk_packages(top.__path__, prefix=f"{package}.", onerror=lambda name: None):
        parts = found.name.split(".")
        if not any(p.startswith("_") or p in ("tests", "test", "benchmarks", "testing") for p in parts):
            names.append(found.name)
    return sorted(names)


def name_words(qualified: str) -> str:
    """The words of a qualified name's last part, lowercase: ``a.b.read_csv`` -> "read csv",
    ``a.LinearOperator`` -> "linear operator", ``a.HTTPServer`` -> "http server"."""
    last = qualified.rsplit(".", 1)[-1].replace("_", " ")
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", last)
    return " ".join(spaced.lower().split())


def name_pairs(modules: list[str]) -> list[tuple[str, str, str]]:
    """(qualified name, its name's words, the docstring's first MAX_WORDS words) of every docstring of
    ``modules`` whose name has two words or more, keeping the pairs whose query and passage are unique."""
    pairs, seen = [], set()
    for module in modules:
        for name, doc in _module_docs(module):
            if not isinstance(doc, str) or name in seen:
                continue
            seen.add(name)
            query, passage = name_words(name), " ".join(inspect.cleandoc(doc).split()[:MAX_WORDS])
            if len(query.split()) >= 2 and len(passage.split()) >= MIN_PASSAGE_WORDS:
                pairs.append((name, query, passage))
    queries = Counter(q for _, q, _ in pairs)
    passages = Counter(p for _, _, p in pairs)
    return [(n, q, p) for n, q, p in pairs if queries[q] == 1 and passages[p] == 1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--package", default="sympy")
    parser.add_argument("--passages", type=int, default=2500)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--query", choices=("summary", "name"), default="summary",
                        help="ask with the summary's first sentence, or with the words of the object's name")
    args = parser.parse_args(argv)
    make = unique_pairs if args.query == "summary" else name_pairs
    pairs = make(module_names(args.package))  # every usable docstring, uniques only
    n_passages, n_queries = write_pairs(args.out, pairs, args.passages, args.queries, args.seed)
    print(f"{args.out}: {n_passages} passages, {n_queries} queries of {len(pairs)} {args.package} docstrings")  # CLI output


if __name__ == "__main__":
    main()
