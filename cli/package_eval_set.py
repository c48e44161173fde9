"""An out-of-domain evaluation set from the docstrings of an installed package (sympy by default).

Built as the stdlib set (``stdlib_eval_set``): every docstring of the package's public modules,
classes, methods and functions whose summary paragraph is followed by a body splits into a query
(the summary's first sentence) and its one relevant passage (the body's first 120 words, the
qualified name left out); docstrings whose query or passage text occurs twice are dropped. A seeded
sample of the rest is the corpus, a second seeded sample of the corpus the queries. Labels come
from the docstrings' structure alone.

    python -m densehybrid.cli.package_eval_set OUT_DIR [--package sympy] [--passages 2500] [--queries 400]

writes ``OUT_DIR/corpus.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` (BEIR columns).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from pathlib import Path

from densehybrid.cli.stdlib_eval_set import unique_pairs, write_pairs


def module_names(package: str) -> list[str]:
    """The package and its public submodules at any depth, tests and benchmarks left out, sorted."""
    top = importlib.import_module(package)
    names = [package]
    for found in pkgutil.walk_packages(top.__path__, prefix=f"{package}.", onerror=lambda name: None):
        parts = found.name.split(".")
        if not any(p.startswith("_") or p in ("tests", "test", "benchmarks", "testing") for p in parts):
            names.append(found.name)
    return sorted(names)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--package", default="sympy")
    parser.add_argument("--passages", type=int, default=2500)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pairs = unique_pairs(module_names(args.package))  # every usable docstring, uniques only
    n_passages, n_queries = write_pairs(args.out, pairs, args.passages, args.queries, args.seed)
    print(f"{args.out}: {n_passages} passages, {n_queries} queries of {len(pairs)} {args.package} docstrings")  # CLI output


if __name__ == "__main__":
    main()
